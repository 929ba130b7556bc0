"""`launcher serve` called by the stock `openai` Python client, checked against
transformers on the same weights and chat template.

  python serve_openai.py CASE --base-url URL --model DIR --template FILE

Each case raises (exit 1, with the reason) when the endpoint is wrong, and
prints one JSON object of what it saw (exit 0). Cases: chat, tools, stream,
n, logprobs, completions, errors, auth, busy, batch, smoke.
"""
import argparse
import concurrent.futures as cf
import json
import os
import sys
import time

import urllib.error
import urllib.request
import openai
from openai import OpenAI

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Compute a + b, a - b, a * b or a / b.",
        "parameters": {
            "type": "object",
            "properties": {
                "operation": {"type": "string", "enum": ["add", "subtract", "multiply", "divide"]},
                "a": {"type": "number"},
                "b": {"type": "number"},
            },
            "required": ["operation", "a", "b"],
        },
    },
}


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


class Oracle:
    """transformers on the same directory and template."""

    def __init__(self, model_dir, template):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(int(os.environ.get("RLMESH_ORACLE_THREADS", "2")))
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
        self.template = open(template).read()

    def prompt_ids(self, messages, tools=None):
        # As vLLM does before rendering: tool-call arguments (JSON strings on the wire) become objects.
        msgs = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [
                    {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}} for c in m["tool_calls"]
                ]
            if m.get("content") is None:
                m["content"] = ""
            msgs.append(m)
        text = self.tok.apply_chat_template(msgs, tools=tools, chat_template=self.template, tokenize=False, add_generation_prompt=True)
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def greedy(self, ids, max_new_tokens):
        t = self.torch.tensor([ids])
        with self.torch.no_grad():
            out = self.model.generate(t, attention_mask=self.torch.ones_like(t), do_sample=False, max_new_tokens=max_new_tokens,
                                      eos_token_id=self.tok.eos_token_id, pad_token_id=self.tok.eos_token_id, top_p=None, top_k=None, temperature=None)
        return out[0, len(ids):].tolist()

    def logprobs(self, ids, completion):
        seq = self.torch.tensor([ids + completion])
        with self.torch.no_grad():
            logp = self.model(seq).logits[0].float().log_softmax(-1)
        return [logp[len(ids) + k - 1, t].item() for k, t in enumerate(completion)]


class Raw:
    """A plain HTTP answer: status, text, JSON."""

    def __init__(self, status, text):
        self.status_code, self.text = status, text

    def json(self):
        return json.loads(self.text)


def http(method, url, body=None):
    """A request without the OpenAI client (bodies it would not send)."""
    req = urllib.request.Request(url, data=body, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return Raw(r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        return Raw(e.code, e.read().decode())


def client(a, **kw):
    return OpenAI(base_url=a.base_url, api_key=kw.pop("api_key", "unused"), max_retries=0, timeout=300, **kw)


def model_id(c):
    models = c.models.list().data
    expect(len(models) == 1 and models[0].object == "model", f"one model listed: {models}")
    return models[0].id


def case_chat(a):
    """Greedy chat equals transformers' generate; return_token_ids are the ids it sampled."""
    c, o = client(a), Oracle(a.model, a.template)
    m = model_id(c)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    r = c.chat.completions.create(model=m, messages=messages, temperature=0, max_tokens=24, extra_body={"return_token_ids": True})
    ch = r.choices[0]
    prompt = o.prompt_ids(messages)
    expect(r.prompt_token_ids == prompt, f"prompt ids {r.prompt_token_ids} != transformers' {prompt}")
    want = o.greedy(prompt, 24)
    expect(ch.token_ids == want, f"greedy ids {ch.token_ids} != transformers' {want}")
    text = o.tok.decode([t for t in want if t != o.tok.eos_token_id], skip_special_tokens=True)
    expect(ch.message.content == text, f"content {ch.message.content!r} != transformers' {text!r}")
    expect(ch.finish_reason == ("stop" if want[-1] == o.tok.eos_token_id else "length"), f"finish {ch.finish_reason}")
    expect(r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(want), f"usage {r.usage}")
    expect(r.object == "chat.completion" and r.id.startswith("chatcmpl-"), f"{r.object} {r.id}")
    return {"content": ch.message.content, "tokens": len(want)}


def few_shot():
    """A conversation in which SmolLM2-135M calls the tool greedily (three worked examples)."""
    msgs = [{"role": "system", "content": "Always answer by calling the calculator tool."}]
    for i, (op, x, y) in enumerate([("add", 3, 4), ("multiply", 5, 6), ("subtract", 9, 2)]):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "calculator", "arguments": json.dumps({"operation": op, "a": x, "b": y})}}
        msgs += [
            {"role": "user", "content": f"Use the calculator: {op} {x} and {y}."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "x"},
            {"role": "assistant", "content": "Done."},
        ]
    return msgs + [{"role": "user", "content": "Use the calculator: multiply 12 and 9."}]


def case_tools(a):
    """A call parsed into tool_calls (finish tool_calls), then the round trip with its result."""
    c, o = client(a), Oracle(a.model, a.template)
    m = model_id(c)
    messages = few_shot()
    r = c.chat.completions.create(model=m, messages=messages, tools=[CALCULATOR], temperature=0, max_tokens=60, extra_body={"return_token_ids": True})
    ch = r.choices[0]
    expect(r.prompt_token_ids == o.prompt_ids(messages, [CALCULATOR]), "prompt with tools and tool messages renders as transformers renders it")
    expect(ch.finish_reason == "tool_calls", f"finish {ch.finish_reason}: {ch.message}")
    call = ch.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    expect(call.type == "function" and call.function.name == "calculator" and args == {"operation": "multiply", "a": 12, "b": 9}, f"call {call}")
    expect(ch.token_ids == o.greedy(r.prompt_token_ids, 60), "the call's tokens are transformers' greedy tokens")
    # The round trip: the call and its result go back; the prompt extends the last one.
    messages2 = messages + [ch.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "108"}]
    r2 = c.chat.completions.create(model=m, messages=messages2, tools=[CALCULATOR], temperature=0, max_tokens=30, extra_body={"return_token_ids": True})
    expect(r2.prompt_token_ids == o.prompt_ids(messages2, [CALCULATOR]), "round-trip prompt renders as transformers renders it")
    expect(r2.prompt_token_ids[: len(r.prompt_token_ids) + len(ch.token_ids)] == r.prompt_token_ids + ch.token_ids, "the round trip's prompt extends prompt + sampled ids")
    # tool_choice none: no tools rendered, no calls parsed.
    r3 = c.chat.completions.create(model=m, messages=messages, tools=[CALCULATOR], tool_choice="none", temperature=0, max_tokens=60, extra_body={"return_token_ids": True})
    expect(r3.prompt_token_ids == o.prompt_ids(messages), "tool_choice none renders no tools")
    expect(r3.choices[0].finish_reason != "tool_calls" and not r3.choices[0].message.tool_calls, f"tool_choice none: {r3.choices[0]}")
    return {"call": args, "after": r2.choices[0].message.content}


def case_stream(a):
    """Streamed deltas add up to the unstreamed answer; finish reason and usage at the end."""
    c = client(a)
    m = model_id(c)
    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    whole = c.chat.completions.create(model=m, messages=messages, temperature=0, max_tokens=30)
    chunks = list(c.chat.completions.create(model=m, messages=messages, temperature=0, max_tokens=30, stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    expect(text == whole.choices[0].message.content, f"streamed {text!r} != {whole.choices[0].message.content!r}")
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    expect(finishes == [whole.choices[0].finish_reason], f"finish reasons {finishes}")
    expect(chunks[0].choices[0].delta.role == "assistant", "the first chunk carries the role")
    expect(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens, f"usage {chunks[-1].usage}")
    # Tool calls stream too.
    calls = [tc for ch in c.chat.completions.create(model=m, messages=few_shot(), tools=[CALCULATOR], temperature=0, max_tokens=60, stream=True)
             for tc in (ch.choices[0].delta.tool_calls or [] if ch.choices else [])]
    expect(len(calls) == 1 and calls[0].function.name == "calculator", f"streamed calls {calls}")
    return {"chunks": len(chunks), "text": text}


def case_n(a):
    """n samples with a seed: n choices; the same seed gives the same samples."""
    c = client(a)
    m = model_id(c)
    kw = dict(model=m, messages=[{"role": "user", "content": "Name a colour."}], temperature=1.0, max_tokens=12, n=4, seed=7, extra_body={"return_token_ids": True})
    r1, r2 = c.chat.completions.create(**kw), c.chat.completions.create(**kw)
    expect([ch.index for ch in r1.choices] == [0, 1, 2, 3], f"indices {[ch.index for ch in r1.choices]}")
    ids1, ids2 = [ch.token_ids for ch in r1.choices], [ch.token_ids for ch in r2.choices]
    expect(ids1 == ids2, "the same seed samples the same tokens")
    expect(len({tuple(x) for x in ids1}) > 1, f"four samples at temperature 1 are not all the same: {ids1}")
    r3 = c.chat.completions.create(**{**kw, "seed": 8})
    expect([ch.token_ids for ch in r3.choices] != ids1, "another seed samples otherwise")
    return {"samples": [ch.message.content for ch in r1.choices]}


def case_logprobs(a):
    """Log-probs of greedy tokens equal transformers' log-softmax; top_logprobs rank them first."""
    c, o = client(a), Oracle(a.model, a.template)
    m = model_id(c)
    messages = [{"role": "user", "content": "Count from one to five."}]
    r = c.chat.completions.create(model=m, messages=messages, temperature=0, max_tokens=16, logprobs=True, top_logprobs=3, extra_body={"return_token_ids": True})
    ch = r.choices[0]
    want = o.logprobs(r.prompt_token_ids, ch.token_ids)
    got = [e.logprob for e in ch.logprobs.content]
    expect(len(got) == len(want), f"{len(got)} log-probs for {len(want)} tokens")
    worst = max(abs(x - y) for x, y in zip(got, want))
    expect(worst < 2e-3, f"log-probs differ from transformers' by up to {worst}")
    for e, t in zip(ch.logprobs.content, ch.token_ids):
        expect(len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token, f"top_logprobs {e.top_logprobs} for {e.token!r}")
        expect(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob, "top_logprobs best first")
    return {"max_abs_diff": worst}


def case_completions(a):
    """Text completions: greedy equals transformers; legacy logprobs; prompts as ids; echo."""
    c, o = client(a), Oracle(a.model, a.template)
    m = model_id(c)
    prompt = "The three primary colours are"
    r = c.completions.create(model=m, prompt=prompt, temperature=0, max_tokens=16, logprobs=2, extra_body={"return_token_ids": True})
    ch = r.choices[0]
    ids = o.tok(prompt, add_special_tokens=False)["input_ids"]
    want = o.greedy(ids, 16)
    expect(ch.prompt_token_ids == ids and ch.token_ids == want, f"ids {ch.token_ids} != transformers' {want}")
    expect(ch.text == o.tok.decode([t for t in want if t != o.tok.eos_token_id], skip_special_tokens=True), f"text {ch.text!r}")
    worst = max(abs(x - y) for x, y in zip(ch.logprobs.token_logprobs, o.logprobs(ids, want)))
    expect(worst < 2e-3 and len(ch.logprobs.top_logprobs[0]) == 2, f"logprobs off by {worst}")
    r2 = c.completions.create(model=m, prompt=[ids, ids[:3]], temperature=0, max_tokens=8, echo=True)
    expect(len(r2.choices) == 2 and r2.choices[0].text.startswith(prompt), f"two prompts as ids, echoed: {r2.choices}")
    streamed = "".join(x.choices[0].text for x in c.completions.create(model=m, prompt=prompt, temperature=0, max_tokens=16, stream=True) if x.choices)
    expect(streamed == ch.text, f"streamed {streamed!r} != {ch.text!r}")
    return {"text": ch.text}


def status_of(fn):
    try:
        fn()
    except openai.APIStatusError as e:
        body = e.response.json()
        expect(set(body["error"]) >= {"message", "type", "param", "code"}, f"OpenAI-shaped error body: {body}")
        return e.status_code, body["error"]
    raise AssertionError("the request succeeded")


def case_errors(a):
    """400 (bad fields, context overflow, bad JSON), 404 (model, route), 413 (body)."""
    c = client(a)
    m = model_id(c)
    hi = [{"role": "user", "content": "hi"}]
    out = {}
    out["temperature"] = status_of(lambda: c.chat.completions.create(model=m, messages=hi, temperature=-1))
    out["n"] = status_of(lambda: c.chat.completions.create(model=m, messages=hi, n=0))
    out["role"] = status_of(lambda: c.chat.completions.create(model=m, messages=[{"role": "wizard", "content": "x"}]))
    out["no_messages"] = status_of(lambda: c.chat.completions.create(model=m, messages=[]))
    out["overflow"] = status_of(lambda: c.chat.completions.create(model=m, messages=hi, max_tokens=10_000_000))
    out["long_prompt"] = status_of(lambda: c.chat.completions.create(model=m, messages=[{"role": "user", "content": "word " * 9000}], max_tokens=4))
    out["top_logprobs"] = status_of(lambda: c.chat.completions.create(model=m, messages=hi, logprobs=True, top_logprobs=21))
    out["model"] = status_of(lambda: c.chat.completions.create(model="no-such-model", messages=hi))
    for k in ["temperature", "n", "role", "no_messages", "overflow", "long_prompt", "top_logprobs"]:
        expect(out[k][0] == 400, f"{k}: {out[k]}")
    expect(out["overflow"][1]["code"] == "context_length_exceeded" and out["long_prompt"][1]["code"] == "context_length_exceeded", "overflow code")
    expect(out["model"][0] == 404 and out["model"][1]["code"] == "model_not_found", f"model: {out['model']}")
    raw = http("POST", a.base_url + "/chat/completions", b"{not json")
    expect(raw.status_code == 400 and "error" in raw.json(), f"bad JSON: {raw.status_code} {raw.text}")
    route = http("GET", a.base_url + "/no/such/route")
    expect(route.status_code == 404 and route.json()["error"]["code"] == "not_found", f"route: {route.status_code}")
    big = http("POST", a.base_url + "/chat/completions", json.dumps({"model": m, "messages": [{"role": "user", "content": "x" * (3 << 20)}]}).encode())
    expect(big.status_code == 413 and big.json()["error"]["type"] == "invalid_request_error", f"413: {big.status_code} {big.text[:200]}")
    return {k: v[0] for k, v in out.items()}


def case_auth(a):
    """401 without the key or with another; the key opens it."""
    m = model_id(client(a, api_key=a.key))
    code, err = status_of(lambda: client(a, api_key="wrong-key").chat.completions.create(model=m, messages=[{"role": "user", "content": "hi"}], max_tokens=2))
    expect(code == 401 and err["code"] == "invalid_api_key", f"wrong key: {code} {err}")
    # The client will not send without a key: a plain request with none.
    bare = http("POST", a.base_url + "/chat/completions", json.dumps({"model": m, "messages": [{"role": "user", "content": "hi"}]}).encode())
    expect(bare.status_code == 401 and bare.json()["error"]["code"] == "invalid_api_key", f"no key: {bare.status_code} {bare.text}")
    r = client(a, api_key=a.key).chat.completions.create(model=m, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    return {"ok": r.choices[0].finish_reason}


def case_busy(a):
    """With --max-in-flight 1: a second request while one runs gets 429."""
    c = client(a)
    m = model_id(c)
    with cf.ThreadPoolExecutor(2) as pool:
        long = pool.submit(lambda: c.chat.completions.create(model=m, messages=[{"role": "user", "content": "Tell a long story."}], temperature=0, max_tokens=200))
        time.sleep(0.5)
        code, err = status_of(lambda: c.chat.completions.create(model=m, messages=[{"role": "user", "content": "hi"}], max_tokens=2))
        expect(code == 429 and err["code"] == "rate_limit_exceeded", f"{code} {err}")
        long.result()
    return {"status": code}


def batch_rows(base_url):
    text = http("GET", base_url.removesuffix("/v1") + "/metrics").text
    vals = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l.startswith("rlmesh_serve_batch_rows_")}
    return vals["rlmesh_serve_batch_rows_count"], vals["rlmesh_serve_batch_rows_sum"]


def case_batch(a):
    """Two concurrent requests share one engine call and answer as they do alone."""
    c = client(a)
    m = model_id(c)
    prompts = [[{"role": "user", "content": "What is the capital of Italy?"}], [{"role": "user", "content": "Name three fruits, please."}]]
    go = lambda msgs: c.chat.completions.create(model=m, messages=msgs, temperature=0, max_tokens=20, extra_body={"return_token_ids": True})
    before = batch_rows(a.base_url)
    with cf.ThreadPoolExecutor(2) as pool:
        together = list(pool.map(go, prompts))
    after = batch_rows(a.base_url)
    expect(after[0] - before[0] == 1 and after[1] - before[1] == 2, f"one engine call of two rows: {before} -> {after}")
    alone = [go(p) for p in prompts]
    expect(batch_rows(a.base_url)[0] - after[0] == 2, "sequential requests: two calls")
    for t, s in zip(together, alone):
        expect(t.choices[0].token_ids == s.choices[0].token_ids, f"batched {t.choices[0].token_ids} != alone {s.choices[0].token_ids}")
    return {"batched": [t.choices[0].message.content for t in together]}


def case_smoke(a):
    """Any model answers: the model list, a chat with a tool offered, a text completion."""
    c = client(a)
    m = model_id(c)
    r = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "What is 17 times 24?"}], tools=[CALCULATOR], temperature=0, max_tokens=24)
    ch = r.choices[0]
    expect(ch.finish_reason in ("stop", "length", "tool_calls") and r.usage.completion_tokens > 0, f"chat: {r}")
    t = c.completions.create(model=m, prompt="17 times 24 is", temperature=0, max_tokens=8)
    expect(t.usage.completion_tokens > 0, f"completion: {t}")
    return {"finish": ch.finish_reason, "tokens": r.usage.completion_tokens}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("case")
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--template", required=True)
    p.add_argument("--key", default="")
    a = p.parse_args()
    print(json.dumps(globals()["case_" + a.case](a)))


if __name__ == "__main__":
    sys.exit(main())
