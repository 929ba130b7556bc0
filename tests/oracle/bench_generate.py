"""The peer of `launcher bench generate`: transformers' greedy `generate` on the
same weights, prompts, threads and batch. Prints one JSON line:
{"tokens_per_s": [...per repeat...], "peak_rss_mib": float}

usage: bench_generate.py --model DIR --new-tokens N --threads T --repeats R  (stdin: {"prompts": [[ids]]})
"""
import argparse
import json
import resource
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    prompts = json.load(sys.stdin)["prompts"]
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    ids = torch.tensor(prompts)
    mask = torch.ones_like(ids)
    kw = dict(attention_mask=mask, do_sample=False, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens)
    with torch.inference_mode():
        model.generate(ids, **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        rates = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            out = model.generate(ids, **kw)
            dt = time.perf_counter() - t
            assert out.shape[1] - ids.shape[1] == a.new_tokens
            rates.append(ids.shape[0] * a.new_tokens / dt)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"tokens_per_s": rates, "peak_rss_mib": peak}))


if __name__ == "__main__":
    main()
