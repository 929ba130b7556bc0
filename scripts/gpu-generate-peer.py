"""The peer of `gpu_check generate` (actors/examples/gpu_check.rs): transformers'
greedy `generate` on the same weights, prompts (the same LCG), dtypes and batch
sizes, on CUDA (or CPU). Reports end-to-end tokens/s and decode tokens/s
estimated as B*(N-1) / (t(N) - t(1)), exactly as the Rust side does.
Last line: {"check": "generate-peer", "rows": [...]}

usage: gpu-generate-peer.py --models DIR[,DIR] [--device cuda] [--dtypes bf16,f32] [--batch 1,8,32]
                            [--new-tokens 128] [--prompt-len 32] [--repeats 3]
"""
import argparse
import json
import os
import statistics
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "f32": torch.float32, "float32": torch.float32}
MASK = (1 << 64) - 1


def prompts(batch, length, vocab, seed):
    s, out = seed, []
    for _ in range(batch):
        row = []
        for _ in range(length):
            s = (s * 6364136223846793005 + 1442695040888963407) & MASK
            row.append(3 + (s >> 33) % (vocab - 3))
        out.append(row)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtypes", default="bf16,f32")
    p.add_argument("--batch", default="1,8,32")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    print(f"transformers {transformers.__version__} generate on {a.device}: greedy, prompt {a.prompt_len}, "
          f"{a.new_tokens} new tokens, median of {a.repeats}", flush=True)
    print(f"{'model':<16} {'dtype':>5} {'batch':>5} {'e2e tok/s':>14} {'decode tok/s':>14} {'prefill ms':>11}", flush=True)
    rows = []
    for d in a.models.split(","):
        name = os.path.basename(d.rstrip("/"))
        for dt in a.dtypes.split(","):
            model = AutoModelForCausalLM.from_pretrained(d, dtype=DTYPES[dt]).to(dev).eval()
            model.generation_config.eos_token_id = None
            model.generation_config.pad_token_id = 0
            for b in [int(x) for x in a.batch.split(",")]:
                ids = torch.tensor(prompts(b, a.prompt_len, model.config.vocab_size, 17 + b), device=dev)
                mask = torch.ones_like(ids)

                def run(n):
                    sync()
                    t = time.perf_counter()
                    out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n)
                    sync()
                    assert out.shape[1] - ids.shape[1] == n
                    return time.perf_counter() - t

                with torch.inference_mode():
                    run(4)  # warm-up
                    one, full = [], []
                    for _ in range(a.repeats):
                        one.append(run(1))
                        full.append(run(a.new_tokens))
                tf, t1 = statistics.median(full), statistics.median(one)
                e2e = b * a.new_tokens / tf
                decode = b * (a.new_tokens - 1) / max(tf - t1, 1e-9)
                print(f"{name:<16} {dt:>5} {b:>5} {e2e:>14.1f} {decode:>14.1f} {t1 * 1e3:>11.2f}", flush=True)
                rows.append({"model": name, "dtype": dt, "batch": b, "e2e_tokens_per_s": e2e, "decode_tokens_per_s": decode,
                             "prefill_plus_one_ms": t1 * 1e3, "full_s": full, "one_s": one})
            del model
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    print(json.dumps({"check": "generate-peer", "ok": True, "device": a.device, "torch": torch.__version__,
                      "transformers": transformers.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
