"""Throughput of `launcher serve` with the stock openai client: N greedy chat
requests one after another, then all at once (batched by the endpoint), and
transformers' generate on the same prompts one at a time (the oracle's peer).

  python bench_serve.py --base-url URL --model DIR --template FILE [--requests 8] [--max-tokens 32]
Prints one JSON object: tokens/s of each and the ratios.
"""
import argparse
import concurrent.futures as cf
import json
import os
import time

from openai import OpenAI

p = argparse.ArgumentParser()
p.add_argument("--base-url", required=True)
p.add_argument("--model", required=True)
p.add_argument("--template", required=True)
p.add_argument("--requests", type=int, default=8)
p.add_argument("--max-tokens", type=int, default=32)
a = p.parse_args()
c = OpenAI(base_url=a.base_url, api_key="unused", max_retries=0, timeout=600)
m = c.models.list().data[0].id
topics = ["the sea", "a mountain", "bread", "a violin", "rain", "a library", "chess", "a bicycle", "snow", "coffee", "a river", "the moon"]
prompts = [[{"role": "user", "content": f"Write a short paragraph about {topics[i % len(topics)]}."}] for i in range(a.requests)]
go = lambda msgs: c.chat.completions.create(model=m, messages=msgs, temperature=0, max_tokens=a.max_tokens, extra_body={"return_token_ids": True})
go(prompts[0])  # warm-up
t = time.perf_counter()
seq = [go(x) for x in prompts]
t_seq = time.perf_counter() - t
t = time.perf_counter()
with cf.ThreadPoolExecutor(len(prompts)) as pool:
    conc = list(pool.map(go, prompts))
t_conc = time.perf_counter() - t
tokens = sum(r.usage.completion_tokens for r in seq)
out = {"requests": a.requests, "max_tokens": a.max_tokens, "tokens": tokens,
       "sequential_tok_s": tokens / t_seq, "concurrent_tok_s": sum(r.usage.completion_tokens for r in conc) / t_conc}
out["concurrent_over_sequential"] = out["concurrent_tok_s"] / out["sequential_tok_s"]
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
torch.set_num_threads(int(os.environ.get("RLMESH_ORACLE_THREADS", "2")))
tok = AutoTokenizer.from_pretrained(a.model)
model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
ids = [torch.tensor([r.prompt_token_ids]) for r in seq]
with torch.no_grad():
    model.generate(ids[0], attention_mask=torch.ones_like(ids[0]), do_sample=False, max_new_tokens=4, pad_token_id=tok.eos_token_id)
    t = time.perf_counter()
    hf_tokens = 0
    for x in ids:
        g = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=a.max_tokens, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
        hf_tokens += g.shape[1] - x.shape[1]
    t_hf = time.perf_counter() - t
out["transformers_sequential_tok_s"] = hf_tokens / t_hf
out["sequential_over_transformers"] = out["sequential_tok_s"] / out["transformers_sequential_tok_s"]
out["concurrent_over_transformers"] = out["concurrent_tok_s"] / out["transformers_sequential_tok_s"]
print(json.dumps(out))
