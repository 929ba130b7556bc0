"""A tool-calling agent written with the stock OpenAI client: rlmesh trains it as it is.

rlmesh starts it once per rollout with OPENAI_BASE_URL and OPENAI_API_KEY set
and the task's JSON row on stdin; its last line is {"answer": ...}. The
calculator is the built-in one's twin (same schema, same result text), so the
recipe's warm-up teaches this program's tool too.
"""
import json
import sys

from openai import OpenAI

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Perform one arithmetic operation on two numbers.",
    "parameters": {"type": "object", "properties": {
        "operation": {"type": "string", "enum": ["add", "subtract", "multiply", "divide", "power"], "description": "The operation to perform."},
        "a": {"type": "number", "description": "The first operand."},
        "b": {"type": "number", "description": "The second operand."}},
        "required": ["operation", "a", "b"]}}}
OPS = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b,
       "divide": lambda a, b: a / b, "power": lambda a, b: a ** b}


def calculator(operation, a, b):
    try:
        if isinstance(a, int) and isinstance(b, int) and (operation != "divide" or (b and a % b == 0)):
            return str(a // b if operation == "divide" else OPS[operation](a, b))
        v = float(f"{OPS[operation](float(a), float(b)):.9e}")  # 10 significant digits, as a pocket calculator
        return str(int(v)) if v == int(v) and abs(v) < 1e16 else repr(v)
    except Exception as e:  # the model sees the error, as with the built-in tool
        return json.dumps({"error": str(e)})


task = json.loads(sys.stdin.readline())
prompt = task["prompt"]
messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY come from rlmesh
for _turn in range(3):
    reply = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR], max_tokens=48).choices[0]
    messages.append(reply.message.model_dump(exclude_none=True))
    if reply.finish_reason != "tool_calls":
        break
    for call in reply.message.tool_calls:
        try:
            result = calculator(**json.loads(call.function.arguments))
        except (TypeError, ValueError) as e:
            result = json.dumps({"error": str(e)})
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
print(json.dumps({"answer": messages[-1].get("content") or ""}))
