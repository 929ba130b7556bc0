"""The transformers side of rlmesh's oracle tests and benchmarks.

Each subcommand reads JSON arguments and prints JSON, so Rust tests can compare
rlmesh against Hugging Face transformers on the same weights.

  make-tiny  --out DIR --arch qwen2|llama --tied 0|1 --bias 0|1 --seed N --tokenizer DIR [--template FILE] [sizes]
  logprobs   --model DIR   (stdin: {"sequences": [[ids...], ...]})  -> {"logprobs": [[...], ...]}
  render     --model DIR   (stdin: {"messages": [...], "tools": [...]|null, "add_generation_prompt": bool})
  generate   --model DIR   (stdin: {"prompts": [[ids...]], "max_new_tokens": N})  greedy, one prompt at a time
"""
import argparse
import json
import os
import shutil
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(int(os.environ.get("RLMESH_ORACLE_THREADS", "2")))


def make_tiny(a):
    torch.manual_seed(a.seed)
    common = dict(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=bool(a.tied),
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    if a.arch == "qwen2":
        cfg = transformers.Qwen2Config(rope_theta=a.rope_theta, **common)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(rope_theta=a.rope_theta, attention_bias=bool(a.bias), mlp_bias=bool(a.bias), head_dim=a.head_dim or None, **common)
        model = transformers.LlamaForCausalLM(cfg)
    # Random init scaled up a little so log-probs are far from uniform.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    model.eval()
    model.save_pretrained(a.out, safe_serialization=True)
    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    if a.template:
        with open(a.template) as f:
            tok.chat_template = f.read()
    tok.save_pretrained(a.out)
    # transformers 5 picks the tokenizer class from the model type (a qwen2 model gets
    # Qwen2's pre-tokenizer whatever tokenizer.json says); re-save so tokenizer.json
    # holds exactly the pipeline transformers runs, as a real checkpoint's does.
    AutoTokenizer.from_pretrained(a.out).save_pretrained(a.out)
    gen = os.path.join(a.tokenizer, "generation_config.json")
    if os.path.exists(gen):
        shutil.copy(gen, os.path.join(a.out, "generation_config.json"))
    print(json.dumps({"ok": True}))


def load(a):
    return AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()


def logprobs(a):
    model = load(a)
    req = json.load(sys.stdin)
    out = []
    with torch.no_grad():
        for seq in req["sequences"]:
            ids = torch.tensor([seq])
            logits = model(ids).logits.float()
            lp = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
            out.append(lp.tolist())
    print(json.dumps({"logprobs": out}))


def render_one(tok, req):
    kwargs = {"tools": req.get("tools")} if req.get("tools") is not None else {}
    text = tok.apply_chat_template(req["messages"], tokenize=False, add_generation_prompt=req.get("add_generation_prompt", False), **kwargs)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return {"text": text, "token_ids": ids}


def render(a):
    """One request, or {"requests": [...]} for several (one interpreter start)."""
    tok = AutoTokenizer.from_pretrained(a.model)
    req = json.load(sys.stdin)
    if "requests" in req:
        out = {"results": [render_one(tok, r) for r in req["requests"]]}
    else:
        out = render_one(tok, req)
    print(json.dumps(out, ensure_ascii=False))


def generate(a):
    model = load(a)
    req = json.load(sys.stdin)
    out = []
    with torch.no_grad():
        for p in req["prompts"]:
            ids = torch.tensor([p])
            g = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=req["max_new_tokens"],
                               eos_token_id=req.get("eos_token_id"), pad_token_id=0)
            out.append(g[0, len(p):].tolist())
    print(json.dumps({"tokens": out}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cmd")
    p.add_argument("--model")
    p.add_argument("--out")
    p.add_argument("--arch", default="qwen2")
    p.add_argument("--tied", type=int, default=1)
    p.add_argument("--bias", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer")
    p.add_argument("--template")
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--hidden", type=int, default=48)
    p.add_argument("--intermediate", type=int, default=100)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=0)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    a = p.parse_args()
    {"make-tiny": make_tiny, "logprobs": logprobs, "render": render, "generate": generate}[a.cmd](a)


if __name__ == "__main__":
    main()
