"""Writes train.jsonl (tasks) and sft.jsonl (warm-up conversations).

    python3 make_data.py

The tasks ask a price or a stock count (the tools know them) or ask the model
to repeat a word (no tool needed). The warm-up conversations use a third of
the items only; RL and the held-out split draw from all of them.
"""
import json
import random

from catalogue import CATALOGUE, ITEMS

PRICE = ["How much does one {item} cost?", "What is the price of a {item}?", "What does a single {item} cost in the shop?"]
STOCK = ["How many {item} units are in stock?", "Check how many {item} units the shop has.", "What is the stock of {item}?"]
WORDS = ["orange", "river", "castle", "forest", "planet", "silver", "window", "garden", "rocket", "violin"]
SAY = ["Reply with only the word {word}.", "Say {word} and nothing else."]


def task(rng, items):
    r = rng.random()
    if r < 0.2:
        word = rng.choice(WORDS)
        return {"prompt": rng.choice(SAY).format(word=word), "answer": word, "tools": [], "requires_tool": False, "info": {}}
    item = rng.choice(items)
    asks = "price" if r < 0.6 else "stock"
    q = rng.choice(PRICE if asks == "price" else STOCK).format(item=item)
    answer = f"{CATALOGUE[item]['price']:.2f}" if asks == "price" else str(CATALOGUE[item]["stock"])
    return {"prompt": q, "answer": answer, "tools": [asks], "requires_tool": True, "info": {"item": item, "asks": asks}}


def conversation(t):
    msgs = [{"role": "user", "content": t["prompt"]}]
    if not t["requires_tool"]:
        return {"messages": msgs + [{"role": "assistant", "content": t["answer"]}]}
    item, asks = t["info"]["item"], t["info"]["asks"]
    call = {"id": "c1", "type": "function", "function": {"name": asks, "arguments": {"item": item}}}
    reply = f"One {item} costs {t['answer']} dollars." if asks == "price" else f"The shop has {t['answer']} {item} units in stock."
    return {"messages": msgs + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": t["answer"]},
        {"role": "assistant", "content": reply},
    ]}


def main():
    rng = random.Random(0)
    with open("train.jsonl", "w") as f:
        for i in range(400):
            f.write(json.dumps({"id": f"shop-{i}", **task(rng, ITEMS)}) + "\n")
    with open("sft.jsonl", "w") as f:
        for _ in range(300):
            f.write(json.dumps(conversation(task(rng, ITEMS[::3]))) + "\n")


if __name__ == "__main__":
    main()
