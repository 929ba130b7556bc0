"""A verifier: rlmesh's `[[reward_function]] command` protocol, JSON lines.

Each request line is {"id", "task", "messages", "completion"}; the answer is
{"id", "score"} (null: does not apply) or {"id", "error"} (could not score).
This one checks the final reply against the catalogue itself, so it does not
trust the task file's answer: 1 when the reply states the right figure, with
nothing else numeric that contradicts it, 0 otherwise.
"""
import json
import re
import sys

from catalogue import CATALOGUE


def score(task: dict, completion: str):
    info = task.get("info") or {}
    item, asked = info.get("item"), info.get("asks")
    if item is None:  # a task without a catalogue question: does not apply
        return None
    want = f"{CATALOGUE[item]['price']:.2f}" if asked == "price" else str(CATALOGUE[item]["stock"])
    numbers = re.findall(r"\d+(?:\.\d+)?", completion)
    return 1.0 if numbers and all(n == want or float(n) == float(want) for n in numbers) else 0.0


for line in sys.stdin:
    req = json.loads(line)
    try:
        out = {"id": req["id"], "score": score(req["task"], req["completion"])}
    except Exception as e:  # noqa: BLE001 - any failure is "could not score", never 0
        out = {"id": req["id"], "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out), flush=True)
