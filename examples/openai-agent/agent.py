"""A tool-calling agent written with the stock OpenAI client: rlmesh trains it as it is.

rlmesh starts it once per rollout with OPENAI_BASE_URL and OPENAI_API_KEY set
and the task's JSON row on stdin; its last line is {"answer": ...}.
"""
import json
import sys

from openai import OpenAI

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Compute a + b, a - b, a * b or a / b.",
    "parameters": {"type": "object", "required": ["operation", "a", "b"], "properties": {
        "operation": {"type": "string", "enum": ["add", "subtract", "multiply", "divide"]},
        "a": {"type": "number"}, "b": {"type": "number"}}}}}
OPS = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b, "divide": lambda a, b: a / b}


def calculator(operation, a, b):
    try:
        return str(OPS[operation](float(a), float(b)))
    except Exception as e:  # the model sees the error, as with the built-in tool
        return f"error: {e}"


task = json.loads(sys.stdin.readline())
prompt = task["prompt"]
messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY come from rlmesh
for _turn in range(4):
    reply = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR], max_tokens=128).choices[0]
    messages.append(reply.message.model_dump(exclude_none=True))
    if reply.finish_reason != "tool_calls":
        break
    for call in reply.message.tool_calls:
        try:
            result = calculator(**json.loads(call.function.arguments))
        except (TypeError, ValueError) as e:
            result = f"error: {e}"
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
print(json.dumps({"answer": messages[-1].get("content") or ""}))
