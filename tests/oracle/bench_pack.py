"""The peer of `launcher bench pack`: one policy version as a safetensors image
in memory, the way Python trainers make one from a model (the parameters in
float32, `safetensors.torch.save` to bytes), on the same weights. Prints one
JSON line: {"seconds": [...per repeat...], "bytes": n}. With --out, the last
image is also written there (untimed), so the caller can compare it with its own.

usage: bench_pack.py --model DIR --repeats R [--warmup W] [--threads T] [--out FILE]
"""
import argparse
import json
import time

import torch
from safetensors.torch import save
from transformers import AutoModelForCausalLM
from transformers.utils import logging


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    seconds, image = [], b""
    with torch.no_grad():
        for i in range(a.warmup + a.repeats):
            del image
            t = time.perf_counter()
            image = save({name: p.detach().float().contiguous() for name, p in model.named_parameters()})
            dt = time.perf_counter() - t
            if i >= a.warmup:
                seconds.append(dt)
    if a.out:
        with open(a.out, "wb") as f:
            f.write(image)
    print(json.dumps({"seconds": seconds, "bytes": len(image)}))


if __name__ == "__main__":
    main()
