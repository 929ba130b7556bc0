"""The PyTorch side of rlmesh's learner tests and benchmark: the same losses,
gradients and optimizer step written directly in PyTorch (TRL's formulas),
on transformers models.

  formulas  (stdin: {"logp","behaviour","ref","adv","mask","values","old_values","returns": [[...]], "config": {...}})
            -> per-token terms, aggregation weights, loss and d loss / d logp, d loss / d values
  step      (stdin: {"model": DIR, "batch": {...}, "objective": "policy"|"sft", "config": {...}, "out": FILE})
            -> one optimizer step (AdamW state from DIR/optimizer.safetensors when present);
               writes gradients ("grad.NAME") and new parameters ("param.NAME") to FILE
  bench     (stdin: like step plus "iters", "warmup", "threads", "device", "dtype", "micro_batch")
            -> {"seconds": [...], "median_s": s, "tokens_per_s": x, "computed_tokens": n}
            "micro_batch": rows per forward pass, each micro-batch padded to its longest row
            and the gradient accumulated (as TRL pads and accumulates); default: the whole batch.
            "logits_to_keep": true projects onto the vocabulary only from the first trained
            position of each micro-batch (TRL's logits_to_keep); default: every position.
"""
import json
import math
import os
import sys
import time

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def ppo_clip(logp, behaviour, adv, c):
    ratio = torch.exp(logp - behaviour)
    coef_1 = ratio.clamp(max=c["tis_cap"]) if c.get("tis_cap") is not None else ratio
    coef_2 = ratio.clamp(1 - c["eps_low"], 1 + c["eps_high"])
    loss = -torch.min(coef_1 * adv, coef_2 * adv)
    if c.get("dual_clip") is not None:
        loss = torch.where(adv < 0, torch.min(loss, -c["dual_clip"] * adv), loss)
    clipped = ((ratio < 1 - c["eps_low"]) & (adv < 0)) | ((ratio > 1 + c["eps_high"]) & (adv > 0))
    return loss, ratio, clipped


def kl_penalty(logp, ref, est):
    if est == "k1":
        return logp - ref
    if est == "k2":
        return 0.5 * (logp - ref) ** 2
    d = ref - logp
    return torch.exp(d) - d - 1


def value_loss(v, old, ret, clip):
    vclip = old + (v - old).clamp(-clip, clip)
    return 0.5 * torch.max((v - ret) ** 2, (vclip - ret) ** 2)


def weights(mask, mode, sequences, tokens, max_len):
    if mode == "grpo":
        return mask / mask.sum(-1, keepdim=True).clamp(min=1) / max(sequences, 1)
    if mode in ("bnpo", "dapo"):
        return mask / max(tokens, 1)
    return mask / (max(sequences, 1) * max(max_len, 1))


def objective(c, mask, logp, entropy, beh=None, adv=None, ref=None, values=None, old_values=None, returns=None, sft=False, totals=None):
    """The total loss and its parts, on the whole batch (or a micro-batch of it, with the whole batch's (sequences, tokens))."""
    b, tokens = totals if totals is not None else (mask.shape[0], mask.sum().item())
    out = {}
    if sft:
        w = weights(mask, "bnpo", b, tokens, 0)
        total = (-logp * w).sum()
        out.update(policy_loss=total.item())
    else:
        w = weights(mask, c["aggregation"], b, tokens, c.get("max_completion_length", 0))
        loss, ratio, clipped = ppo_clip(logp, beh, adv, c["clip"])
        total = (loss * w).sum()
        out.update(policy_loss=total.item())
        m = mask.bool()
        out.update(clip_fraction=(clipped.float() * mask).sum().item() / max(tokens, 1),
                   ratio_mean=(ratio.detach() * mask).sum().item() / max(tokens, 1),
                   ratio_min=ratio.detach()[m].min().item(), ratio_max=ratio.detach()[m].max().item())
        kl = c.get("kl")
        if kl is not None:
            k = kl_penalty(logp, ref, kl["estimator"])
            out["kl"] = (k.detach() * mask).sum().item() / max(tokens, 1)
            if kl["placement"] == "loss":
                total = total + kl["beta"] * (k * w).sum()
        if c.get("entropy_coef", 0.0):
            total = total - c["entropy_coef"] * (entropy * w).sum()
        if c.get("value") is not None:
            vl = (value_loss(values, old_values, returns, c["value"]["clip"]) * w).sum()
            out["value_loss"] = vl.item()
            total = total + c["value"]["coef"] * vl
    out["entropy"] = (entropy.detach() * mask).sum().item() / max(tokens, 1)
    out["loss"] = total.item()
    return total, out


def formulas(req):
    t = lambda k: torch.tensor(req[k], dtype=torch.float64) if req.get(k) is not None else None
    c = req["config"]
    logp = t("logp").requires_grad_(True)
    mask, beh, adv = t("mask"), t("behaviour"), t("adv")
    loss, ratio, clipped = ppo_clip(logp, beh, adv, c["clip"])
    out = {"pg": loss.tolist(), "ratio": ratio.tolist(), "clipped": clipped.double().tolist()}
    b, tokens = mask.shape[0], mask.sum().item()
    out["weights"] = {m: weights(mask, m, b, tokens, c.get("max_completion_length", 0)).tolist() for m in ("grpo", "bnpo", "dapo", "dr_grpo")}
    for est in ("k1", "k2", "k3"):
        out[est] = kl_penalty(logp, t("ref"), est).tolist()
    values = t("values").requires_grad_(True)
    out["value"] = value_loss(values, t("old_values"), t("returns"), c["value"]["clip"]).tolist()
    w = weights(mask, c["aggregation"], b, tokens, c.get("max_completion_length", 0))
    total = (loss * w).sum() + c["kl"]["beta"] * (kl_penalty(logp, t("ref"), c["kl"]["estimator"]) * w).sum() \
        + c["value"]["coef"] * (value_loss(values, t("old_values"), t("returns"), c["value"]["clip"]) * w).sum()
    total.backward()
    out.update(loss=total.item(), grad_logp=logp.grad.tolist(), grad_values=values.grad.tolist())
    return out


def pad(rows, t, shift, dtype=torch.float32):
    out = torch.zeros(len(rows), t - 1 if shift else t, dtype=dtype)
    for i, r in enumerate(rows):
        r = r[1:] if shift else r
        out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


class Setup:
    def __init__(self, req, device, dtype):
        d = req["model"]
        self.model = AutoModelForCausalLM.from_pretrained(d, dtype=dtype).to(device)
        self.model.train()
        self.c = req["config"]
        self.sft = req["objective"] == "sft"
        named = dict(self.model.named_parameters())
        self.vhead = None
        if self.c.get("value") is not None:
            self.vhead = torch.nn.Linear(self.model.config.hidden_size, 1).to(device)
            vh = load_file(os.path.join(d, "value_head.safetensors"))
            with torch.no_grad():
                self.vhead.weight.copy_(vh["v_head.summary.weight"])
                self.vhead.bias.copy_(vh["v_head.summary.bias"])
            named["v_head.summary.weight"] = self.vhead.weight
            named["v_head.summary.bias"] = self.vhead.bias
        state_path = os.path.join(d, "state.json")
        order = json.load(open(state_path))["params"] if os.path.exists(state_path) else sorted(named)
        self.names = order
        self.params = [named[n] for n in order]
        o = self.c["optim"]
        decay = [p for p in self.params if p.dim() >= 2]
        rest = [p for p in self.params if p.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
                                     lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                                     fused=bool(req.get("fused_adamw", False)) or None)
        opt_path = os.path.join(d, "optimizer.safetensors")
        if os.path.exists(opt_path):
            st = load_file(opt_path)
            steps = json.load(open(state_path))["optimizer_steps"]
            off = 0
            for p in self.params:
                n = p.numel()
                self.opt.state[p] = {"step": torch.tensor(float(steps)),
                                     "exp_avg": st["exp_avg"][off:off + n].view_as(p).clone().to(device),
                                     "exp_avg_sq": st["exp_avg_sq"][off:off + n].view_as(p).clone().to(device)}
                off += n
        seqs = req["batch"]["sequences"]
        self.tokens = sum(len(s["token_ids"]) for s in seqs)
        rows = int(req.get("micro_batch") or len(seqs))
        self.logits_from_first_trained = bool(req.get("logits_to_keep", False))
        self.micro = [self.tensors(seqs[i:i + rows], device) for i in range(0, len(seqs), rows)]
        self.computed_tokens = sum(m["ids"].numel() for m in self.micro)
        self.totals = (len(seqs), sum(sum(s["loss_mask"][1:]) for s in seqs))

    def tensors(self, seqs, device):
        t = max(len(s["token_ids"]) for s in seqs)
        col = lambda k: pad([s[k] for s in seqs], t, True).to(device) if all(s.get(k) is not None for s in seqs) else None
        return dict(ids=pad([s["token_ids"] for s in seqs], t, False, torch.long).to(device),
                    valid=pad([[1] * len(s["token_ids"]) for s in seqs], t, False, torch.long).to(device),
                    mask=col("loss_mask"),
                    extra={} if self.sft else dict(beh=col("behaviour_logprobs"), adv=col("advantages"), ref=col("ref_logprobs"),
                                                   old_values=col("values"), returns=col("returns")))

    def step(self):
        self.opt.zero_grad(set_to_none=False)
        out = {}
        for m in self.micro:
            ids, valid = m["ids"], m["valid"]
            pos = (valid.cumsum(1) - 1).clamp(min=0)
            h = self.model.model(input_ids=ids, attention_mask=valid, position_ids=pos).last_hidden_state[:, :-1]
            # As TRL's logits_to_keep: the vocabulary projection only from the first position any
            # row trains (the prompt's logits are never read); 0 elsewhere, masked out.
            keep = int(m["mask"].any(0).nonzero()[0].item()) if self.logits_from_first_trained and m["mask"].any() else 0
            lp = self.model.lm_head(h[:, keep:]).float().log_softmax(-1)
            logp = lp.gather(-1, ids[:, 1 + keep:].unsqueeze(-1)).squeeze(-1)
            if keep:
                logp = torch.nn.functional.pad(logp, (keep, 0))
            if self.c.get("entropy_coef", 0.0) and not self.sft:
                entropy = -(lp.exp() * lp).sum(-1)
            else:
                with torch.no_grad():
                    entropy = -(lp.exp() * lp).sum(-1)
            if keep:
                entropy = torch.nn.functional.pad(entropy, (keep, 0))
            values = self.vhead(h.float()).squeeze(-1) if self.vhead is not None else None
            total, part = objective(self.c, m["mask"], logp, entropy, values=values, sft=self.sft,
                                    totals=self.totals if len(self.micro) > 1 else None, **m["extra"])
            total.backward()
            for k, v in part.items():
                out[k] = out.get(k, 0.0) + v if k in ("loss", "policy_loss", "value_loss") or len(self.micro) == 1 else v
        max_norm = self.c.get("max_grad_norm")
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm if max_norm is not None else float("inf"))
        out["grad_norm"] = norm.item()
        self.opt.step()
        return out


def step(req):
    torch.set_num_threads(int(os.environ.get("RLMESH_ORACLE_THREADS", "2")))
    s = Setup(req, "cpu", torch.float32)
    out = s.step()
    tensors = {}
    for n, p in zip(s.names, s.params):
        tensors["grad." + n] = p.grad.detach().clone().contiguous()
        tensors["param." + n] = p.detach().clone().contiguous()
    save_file(tensors, req["out"])
    return out


def bench(req):
    torch.set_num_threads(req.get("threads", 2))
    device = req.get("device", "cpu")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[req.get("dtype", "float32")]
    s = Setup(req, device, dtype)
    times = []
    for i in range(req["warmup"] + req["iters"]):
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        s.step()
        if device != "cpu":
            torch.cuda.synchronize()
        if i >= req["warmup"]:
            times.append(time.perf_counter() - t0)
    med = sorted(times)[len(times) // 2]
    return {"seconds": times, "median_s": med, "tokens_per_s": s.tokens / med, "computed_tokens": s.computed_tokens}


def main():
    cmd = sys.argv[1]
    req = json.load(sys.stdin)
    out = {"formulas": formulas, "step": step, "bench": bench}[cmd](req)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
