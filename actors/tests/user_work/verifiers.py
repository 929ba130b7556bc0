"""Verifiers for rlmesh's tests, speaking the [[reward_function]] protocol.

    python3 verifiers.py good | crash | sleep | garbage

good: 1.0 when the completion holds the task's answer, else 0.0;
crash: exits at its first request; sleep: never answers in time;
garbage: answers a line that is not a response.
"""
import json
import sys
import time

kind = sys.argv[1]
for line in sys.stdin:
    req = json.loads(line)
    if kind == "crash":
        sys.exit(3)
    if kind == "sleep":
        time.sleep(60)
    if kind == "garbage":
        print("not json at all", flush=True)
        continue
    answer = str(req["task"].get("answer") or "")
    print(json.dumps({"id": req["id"], "score": 1.0 if answer and answer in req["completion"] else 0.0}), flush=True)
