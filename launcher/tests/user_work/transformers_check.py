"""The final checkpoint of a user's run, read by transformers (the oracle).

    transformers_check.py CHECKPOINT SCORED_JSONL SERVER_DIR N

For the first N rollouts recorded in SCORED_JSONL (`launcher up --record-batches`):
- renders the rollout's prompt with the checkpoint's own tokenizer and chat
  template (`apply_chat_template`, tools listed by the MCP server in SERVER_DIR
  through the `mcp` client, as OpenAI function schemas, in its order) and exits 1 unless the
  text equals the prompt rlmesh rendered in the run;
- prints one JSON line per rollout, `{"token_ids", "logprobs"}`: transformers'
  log-probability of each next token of the whole rollout under the checkpoint,
  for the caller to compare with `launcher score` on the same ids.
"""
import asyncio
import json
import sys

import torch
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from transformers import AutoModelForCausalLM, AutoTokenizer


async def server_tools(server_dir):
    params = StdioServerParameters(command=sys.executable, args=["tools.py"], cwd=server_dir)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            listed = (await session.list_tools()).tools
    return [{"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.input_schema}} for t in listed]


def prompt_messages(task):
    if task.get("messages"):
        return [{k: v for k, v in m.items() if v is not None} for m in task["messages"]]
    return [{"role": "user", "content": task["prompt"]}]


def main():
    checkpoint, scored, server_dir, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    rows = [json.loads(line) for line in open(scored)][:n]
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    tools = asyncio.run(server_tools(server_dir))
    for row in rows:
        task, traj = row["task"], row["trajectory"]
        # Every tool of the run is shown (a row's `tools` is what the rubric accepts).
        text = tokenizer.apply_chat_template(prompt_messages(task), tools=tools or None, add_generation_prompt=True, tokenize=False)
        if text != traj["rendered_prompt"]:
            print(f"task {task['id']}: transformers renders\n{text!r}\nrlmesh rendered\n{traj['rendered_prompt']!r}", file=sys.stderr)
            sys.exit(1)
        ids = traj["token_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        print(json.dumps({"token_ids": ids, "logprobs": logprobs.tolist()}))


main()
