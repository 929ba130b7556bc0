"""A bare MCP server over stdio, without the SDK, that publishes whatever tool
list it is given (for tests of what a badly made server sends):

    python raw_server.py '<JSON list of tools>'
"""
import json
import sys

tools = json.loads(sys.argv[1])
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    if msg["method"] == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "raw", "version": "0"}}
    elif msg["method"] == "tools/list":
        result = {"tools": tools}
    else:
        result = {"content": [{"type": "text", "text": "ok"}]}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
