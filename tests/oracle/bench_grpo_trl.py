"""The peer of `launcher bench grpo`: the same RL work in Hugging Face TRL's
GRPOTrainer (tools=[calculator], the process reward ported to Python), timed
per optimizer step.

usage:
  bench_grpo_trl.py            stdin: the spec (one JSON object); last stdout line: the result (one JSON object)
  bench_grpo_trl.py --score    stdin: JSONL {"reward": "process"|"final_only", "task": {...}, "messages": [...]};
                               stdout: JSONL {"total", "components"} (the Python port of `launcher reward`)

The spec:
  {"model_dir", "out_dir", "threads", "seed", "steps", "gradient_checkpointing", "save_model",
   "group_size", "groups_per_step", "lr", "temperature", "max_turns", "max_new_tokens",
   "clip_eps", "kl_coef", "scale_rewards", "max_grad_norm", "tools": ["calculator"],
   "reward": "process" | "final_only" (optional, default "process"),
   "tasks": [Task, ...]  (steps * groups_per_step tasks, one group each, trained in this order),
   "max_tokens": int (optional; rlmesh's rollout budget after the prompt, default
                  max_new_tokens * max_turns + 256 as `launcher up` sets it)}

What is ported from rlmesh, line by line (names are the Rust functions):
  - the calculator (core/src/tools/calculator.rs: calculate, format_number) with the
    argument check of its schema (tools/schema.rs: validate, describe), the error
    results (tools/tool.rs: CallError, error_result) and the execution limits of a
    run (tools/execute.rs: the per-turn call cap, truncate_output);
  - the process reward on a transformers-format conversation
    (reward/transcript.rs: Transcript::from_messages; reward/process.rs: process_reward, final_only_reward;
    reward/answer.rs: answers_match, loose_eq), with serde_json's number and equality
    semantics (an integer is not equal to the float with the same value).

Times (step_end_seconds, start_seconds) are seconds since the script started (time.perf_counter):
start_seconds just before step 1 (its on_step_begin: before its generation), step_end_seconds[k] at
the on_step_end of step k + 1 (after its optimizer step); steps_per_s = (steps - 1) / (last - first
step end), so the first step (one-time costs) is left out.

phase_seconds (totals over all steps; phase_seconds_after_first over steps 2.., the steps
steps_per_s counts; phase_seconds_per_step per step): generate = transformers' generate calls
(every turn); tools = TRL's tool loop less its generate calls (parsing, running the tools, the
tool-result suffixes); reward = TRL's _calculate_rewards (the Python reward, writing
completions.jsonl); train = the step less generation-and-scoring (log-prob forward, backward,
clipping, AdamW); other = the rest of generation-and-scoring (padding, advantages, metrics).

out_dir/completions.jsonl: one line per rollout, {"step", "task_index", "task", "messages" (the
conversation in transformers' format, as `launcher reward` reads it), "python_reward" ({"total",
"components"}), "trailing_calls_executed" (see UNEQUAL: max_turns)}.

Progress goes to stderr; everything TRL or transformers print goes there too.
"""
import json
import math
import os
import re
import shutil
import sys
import time
from decimal import Decimal
from typing import Literal

T0 = time.perf_counter()

# ---------------------------------------------------------------------------
# JSON with serde_json's semantics
# ---------------------------------------------------------------------------


class JsonError(ValueError):
    """Text serde_json would not parse."""


_I64_MIN, _U64_MAX = -(1 << 63), (1 << 64) - 1
_I64_MAX = (1 << 63) - 1


def _parse_int(s):
    try:
        v = int(s)
    except ValueError as e:  # more digits than Python converts: far beyond f64 anyway
        raise JsonError("number out of range") from e
    if v == 0 and s.startswith("-"):
        return -0.0  # serde_json reads `-0` as the float -0.0
    if _I64_MIN <= v <= _U64_MAX:
        return v
    f = float(s)  # serde_json reads integers beyond u64/i64 as f64
    if math.isinf(f):
        raise JsonError("number out of range")
    return f


def _parse_float(s):
    f = float(s)
    if math.isinf(f):
        raise JsonError("number out of range")
    return f


def _parse_constant(s):
    raise JsonError(f"{s} is not JSON")


def _check_serde(v, depth=0):
    if isinstance(v, (list, dict)):
        if depth >= 127:  # serde_json's recursion limit (128 levels of remaining depth)
            raise JsonError("recursion limit exceeded")
        items = v.items() if isinstance(v, dict) else enumerate(v)
        for k, x in items:
            if isinstance(k, str):
                _check_str(k)
            _check_serde(x, depth + 1)
    elif isinstance(v, str):
        _check_str(v)


def _check_str(s):
    if any(0xD800 <= ord(c) <= 0xDFFF for c in s):
        raise JsonError("lone surrogate in hex escape")


def serde_loads(text):
    """`serde_json::from_str::<Value>`: int / float / bool / None / str / list / dict, numbers kept apart as serde does."""
    try:
        v = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except RecursionError as e:
        raise JsonError("recursion limit exceeded") from e
    except json.JSONDecodeError as e:
        raise JsonError(str(e)) from e
    _check_serde(v)
    return v


def sanitize(v):
    """What serde_json writes for a Python value: non-finite floats become null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: sanitize(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [sanitize(x) for x in v]
    return v


def dumps(v):
    """JSON text as serde_json reads it back into the same value (`", "` / `": "` separators, UTF-8)."""
    return json.dumps(sanitize(v), ensure_ascii=False)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v):
    return is_int(v) or isinstance(v, float)


def json_eq(a, b):
    """`serde_json::Value == Value`: same type; integers and floats never equal; maps ignore order."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if is_int(a) or is_int(b):
        return is_int(a) and is_int(b) and a == b
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, float) and isinstance(b, float) and a == b
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(json_eq(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) or isinstance(b, dict):
        return (isinstance(a, dict) and isinstance(b, dict) and len(a) == len(b)
                and all(k in b and json_eq(v, b[k]) for k, v in a.items()))
    return a == b  # str / None


def ryu_f64(f):
    """serde_json's text of a finite f64 (ryu's shortest round trip: `1e20`, `1.5e-7`, `0.0001`, `17.0`)."""
    if f == 0.0:
        return "-0.0" if math.copysign(1.0, f) < 0 else "0.0"
    sign = "-" if f < 0 else ""
    t = Decimal(repr(abs(f))).as_tuple()
    all_digits = "".join(map(str, t.digits))
    digits = all_digits.rstrip("0")
    k = t.exponent + (len(all_digits) - len(digits))  # value = int(digits) * 10^k
    length = len(digits)
    kk = length + k
    if 0 <= k and kk <= 16:
        return sign + digits + "0" * k + ".0"
    if 0 < kk <= 16:
        return sign + digits[:kk] + "." + digits[kk:]
    if -5 < kk <= 0:
        return sign + "0." + "0" * (-kk) + digits
    exp = kk - 1
    if length == 1:
        return f"{sign}{digits}e{exp}"
    return f"{sign}{digits[0]}.{digits[1:]}e{exp}"


def to_json_text(v):
    """`serde_json::Value::to_string` (compact)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if is_int(v):
        return str(v)
    if isinstance(v, float):
        return ryu_f64(v) if math.isfinite(v) else "null"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ",".join(to_json_text(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + to_json_text(x) for k, x in v.items()) + "}"
    raise TypeError(f"not a JSON value: {type(v).__name__}")


# Rust's `str::trim` (Unicode White_Space), which differs from Python's `str.strip()` (U+001C..U+001F).
RUST_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


def rtrim(s):
    return s.strip(RUST_WS)


def rust_lower(s):
    return s.lower()


def is_ascii_digit(c):
    return "0" <= c <= "9"


def is_alphanumeric(c):
    return c.isalnum()


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def eq_ignore_ascii_case(a, b):
    return a.translate(_ASCII_LOWER) == b.translate(_ASCII_LOWER)


# ---------------------------------------------------------------------------
# The calculator (core/src/tools/calculator.rs, schema.rs, tool.rs, execute.rs, parse.rs)
# ---------------------------------------------------------------------------

CALCULATOR_OPERATIONS = ["add", "subtract", "multiply", "divide", "power"]
CALCULATOR_PARAMS = ["operation", "a", "b"]
# The run's execution limits (actors/src/controller/run.rs: ExecLimits { timeout_ms: 2000, max_output_bytes: 2048, max_calls_per_turn: 4 }).
MAX_OUTPUT_BYTES = 2048
MAX_CALLS_PER_TURN = 4
SIGNIFICANT_DIGITS = 10


class ToolFailure(Exception):
    """A call that did not produce a result; str() is the CallError text."""


def error_result(message):
    """`{"error": "<message>"}` (tools/tool.rs: error_result)."""
    return '{"error": ' + json.dumps(message, ensure_ascii=False) + "}"


def truncate_output(text, max_bytes=MAX_OUTPUT_BYTES):
    b = text.encode("utf-8")
    if len(b) <= max_bytes:
        return text
    cut = max_bytes
    while cut > 0 and (b[cut] & 0xC0) == 0x80:  # back off to a character boundary
        cut -= 1
    removed = len(b) - cut
    return b[:cut].decode("utf-8") + f"…[truncated {removed} bytes]"


def describe(v):
    """A short description of a JSON value for error messages (schema.rs: describe)."""
    if v is None:
        return "null"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, bool):
        kind = "a boolean"
    elif isinstance(v, float):
        kind = "a decimal number"
    elif is_int(v):
        kind = "an integer"
    else:
        kind = "a string"
    text = to_json_text(v)
    b = text.encode("utf-8")
    if len(b) > 40:
        cut = 40
        while cut > 0 and (b[cut] & 0xC0) == 0x80:
            cut -= 1
        text = b[:cut].decode("utf-8") + "…"
    return f"{kind} ({text})"


def validate_calculator(arguments):
    """The reason the arguments break the calculator's schema, or None (schema.rs: validate on its parameters)."""
    if not isinstance(arguments, dict):
        return "arguments must be a JSON object"
    for r in CALCULATOR_PARAMS:
        if r not in arguments:
            return f'missing required argument "{r}"'
    for k, v in arguments.items():
        if k == "operation":
            if not isinstance(v, str):
                return f'argument "operation": expected string, got {describe(v)}'
            if v not in CALCULATOR_OPERATIONS:
                choices = ", ".join(json.dumps(c) for c in CALCULATOR_OPERATIONS)
                return f'argument "operation": expected one of [{choices}], got {describe(v)}'
        elif k in ("a", "b"):
            if not is_number(v):
                return f'argument "{k}": expected number, got {describe(v)}'
        else:
            return f'unexpected argument "{k}" (expected: {", ".join(CALCULATOR_PARAMS)})'
    return None


def _as_i64(n):
    return n if is_int(n) and _I64_MIN <= n <= _I64_MAX else None


def _in_i64(v):
    return v if _I64_MIN <= v <= _I64_MAX else None


def _checked_pow(x, e):
    if x in (0, 1, -1) or e == 0:
        return _in_i64(x ** e)
    if e > 63:  # |x| >= 2: 2^64 overflows i64 already
        return None
    return _in_i64(x ** e)


def _rust_div_exact(x, y):
    q = abs(x) // abs(y)
    return q if (x >= 0) == (y >= 0) else -q


def format_number(v):
    """calculator.rs: format_number."""
    if not math.isfinite(v):
        raise ToolFailure("the result is not a finite number")
    try:
        v = float(f"{v:.{SIGNIFICANT_DIGITS - 1}e}")
    except ValueError:
        pass
    if v == 0.0:
        return "0"
    if v == math.floor(v) and abs(v) < 1e16:
        return f"{v:.0f}"
    return _rust_display_f64(v)


def _rust_display_f64(v):
    """`f64` Display: shortest round trip, never an exponent (`1e20` → `100000000000000000000`)."""
    s = format(Decimal(repr(v)), "f")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s


def calculate(op, a, b):
    """calculator.rs: calculate. Returns the result text or raises ToolFailure."""
    x, y = _as_i64(a), _as_i64(b)
    if x is not None and y is not None:
        exact = None
        if op == "add":
            exact = _in_i64(x + y)
        elif op == "subtract":
            exact = _in_i64(x - y)
        elif op == "multiply":
            exact = _in_i64(x * y)
        elif op == "divide":
            if y == -1 and x == _I64_MIN:  # Rust's `x % y` panics here; the executor reports the panic
                raise ToolFailure('tool "calculator" crashed: attempt to calculate the remainder with overflow')
            if y != 0 and x % y == 0:
                exact = _in_i64(_rust_div_exact(x, y))
        elif op == "power":
            if 0 <= y <= 0xFFFFFFFF:
                exact = _checked_pow(x, y)
        if exact is not None:
            return str(exact)
    x, y = float(a), float(b)
    if op == "add":
        v = x + y
    elif op == "subtract":
        v = x - y
    elif op == "multiply":
        v = x * y
    elif op == "divide":
        if y == 0.0:
            raise ToolFailure("division by zero")
        v = x / y
    else:  # power
        if x == 0.0 and y < 0.0:
            raise ToolFailure("zero cannot be raised to a negative power")
        try:
            v = math.pow(x, y)
        except ValueError:
            v = math.nan  # C pow: a negative base to a fractional power
        except OverflowError:
            v = math.inf
    return format_number(v)


TOOL_NAMES = ["calculator"]


def rlmesh_call(name, arguments, index_in_turn=0, tools=None):
    """The content of the tool message rlmesh writes for one call (parse.rs: parse_block's checks, execute.rs: execute_calls)."""
    tools = TOOL_NAMES if tools is None else tools
    try:
        if index_in_turn >= MAX_CALLS_PER_TURN:
            raise ToolFailure(f"call not executed: at most {MAX_CALLS_PER_TURN} tool calls run per turn")
        if not isinstance(name, str) or name == "":
            raise ToolFailure(f'malformed tool call: "name" must be a non-empty string, got {describe(name)}')
        if name not in tools:
            raise ToolFailure(f'unknown tool "{name}" (available: {", ".join(tools)})')
        reason = validate_calculator(arguments)
        if reason is not None:
            raise ToolFailure(f'invalid arguments for "{name}": {reason}')
        return truncate_output(calculate(arguments["operation"], arguments["a"], arguments["b"]))
    except ToolFailure as e:
        return error_result(truncate_output(str(e)))


def normalize_arguments(arguments):
    """Arguments as rlmesh would read them: their JSON text through serde_json's number rules."""
    try:
        return serde_loads(dumps(arguments))
    except (JsonError, TypeError, ValueError):
        return arguments


# transformers' get_json_schema of this function is byte for byte rlmesh's ToolSpec::json_schema of the calculator
# (same keys in the same order). It must have no return annotation: `-> str` adds "return": {"type": "string"}.
def calculator(operation: Literal["add", "subtract", "multiply", "divide", "power"], a: float, b: float):
    """
    Perform one arithmetic operation on two numbers.

    Args:
        operation: The operation to perform.
        a: The first operand.
        b: The second operand.
    """
    return rlmesh_call("calculator", normalize_arguments({"operation": operation, "a": a, "b": b}))


class RlmeshTools(dict):
    """A per-rollout tool table for TRL's tool loop: every name resolves, so that unknown
    tools, bad arguments and the per-turn cap get rlmesh's error results (not TRL's
    `{'error': ...}` Python repr), and arguments are checked as rlmesh checks them."""

    def __init__(self):
        super().__init__()
        self.calls_this_turn = 0

    def __contains__(self, name):
        return True

    def __getitem__(self, name):
        def call(**kwargs):
            i = self.calls_this_turn
            self.calls_this_turn += 1
            return rlmesh_call(name, normalize_arguments(dict(kwargs)), index_in_turn=i)

        return call

    def get(self, name, default=None):
        return self[name]


# ---------------------------------------------------------------------------
# The process reward on messages (reward/transcript.rs, process.rs, answer.rs)
# ---------------------------------------------------------------------------

OPEN, CLOSE = "<tool_call>", "</tool_call>"
PROCESS_COMPONENTS = ["format_ok", "correct_tool", "correct_arguments", "execution_success", "final_correct", "repeated_call", "no_call"]
NUMERIC_TOLERANCE = 1e-9
TRAILING = ".,;:!?\"'`*)]}$"


class Call:
    __slots__ = ("name", "arguments", "outcome")

    def __init__(self, name, arguments):
        self.name, self.arguments, self.outcome = name, arguments, None  # outcome: (result, success)


class Malformed:
    __slots__ = ("reason",)

    def __init__(self, reason):
        self.reason = reason


class Transcript:
    def __init__(self):
        self.turns = []  # each a list of blocks: list[Call] (a well-shaped block) or Malformed
        self.open_tags = self.close_tags = self.tool_responses = 0
        self.final_answer = ""

    def blocks(self):
        return [b for t in self.turns for b in t]

    def calls(self):
        return [c for b in self.blocks() if not isinstance(b, Malformed) for c in b]

    def has_repeated_call(self):
        calls = self.calls()
        return any(p.name == c.name and json_eq(p.arguments, c.arguments) for i, c in enumerate(calls) for p in calls[:i])


def result_is_error(result):
    t = rtrim(result)
    try:
        v = serde_loads(t)
    except JsonError:
        v = None
    if isinstance(v, dict):
        return "error" in v
    return rust_lower(t).startswith("error")


def block_from_json(v):
    if isinstance(v, list):
        if not v:
            return Malformed("empty list of calls")
        items = v
    else:
        items = [v]
    calls = []
    for item in items:
        if not isinstance(item, dict):
            return Malformed('expected a JSON object {"name", "arguments"}')
        name = item.get("name")
        if not isinstance(name, str):
            return Malformed('expected a string "name"')
        args = item.get("arguments")
        if not isinstance(args, dict):
            return Malformed('expected an object "arguments"')
        calls.append(Call(name, args))
    return calls


def block_from_text(body):
    try:
        v = serde_loads(rtrim(body))
    except JsonError as e:
        return Malformed(f"invalid JSON: {e}")
    return block_from_json(v)


def parse_blocks(text):
    open_tags, close_tags = text.count(OPEN), text.count(CLOSE)
    blocks, outside, rest = [], [], text
    while True:
        i = rest.find(OPEN)
        if i < 0:
            break
        outside.append(rest[:i])
        body = rest[i + len(OPEN):]
        next_open = body.find(OPEN)
        j = body.find(CLOSE)
        if j >= 0 and (next_open < 0 or j < next_open):
            blocks.append(block_from_text(body[:j]))
            rest = body[j + len(CLOSE):]
        else:
            end = next_open if next_open >= 0 else len(body)
            blocks.append(Malformed(f"{OPEN} without {CLOSE}"))
            rest = body[end:]
    outside.append(rest)
    return blocks, open_tags, close_tags, "".join(outside).replace(CLOSE, "")


def transcript_from_messages(messages):
    """Transcript::from_messages."""
    out, results, last_text = Transcript(), [], ""
    for m in messages:
        role = m.get("role")
        if role == "assistant":
            content = m.get("content") or ""
            blocks, o, c, outside = parse_blocks(content)
            out.open_tags += o
            out.close_tags += c
            if o + c == 0:
                for tc in m.get("tool_calls") or []:
                    f = tc["function"]
                    args = f.get("arguments")
                    if isinstance(args, str):
                        try:
                            args = serde_loads(args)
                        except JsonError:
                            pass
                    blocks.append(block_from_json({"name": f.get("name"), "arguments": args}))
                    out.open_tags += 1
                    out.close_tags += 1
            last_text = outside
            out.turns.append(blocks)
        elif role == "tool" and out.turns:
            results.append(m.get("content") or "")
    out.tool_responses = len(results)
    out.final_answer = rtrim(last_text)
    for call, result in zip(out.calls(), results):
        call.outcome = (result, not result_is_error(result))
    return out


def _grouped_thousands(t):
    body = t.lstrip("-+")
    int_part = body.split(".")[0]
    groups = int_part.split(",")
    return (len(groups) > 1 and groups[0] != "" and len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:])
            and all(all(is_ascii_digit(ch) for ch in g) for g in groups))


_RUST_F64 = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")


def parse_number(text):
    """answer.rs: parse_number."""
    t = rtrim(text).rstrip(".")
    if not any(is_ascii_digit(c) for c in t) or not all(is_ascii_digit(c) or c in "+-.,eE" for c in t):
        return None
    cleaned = t.replace(",", "") if _grouped_thousands(t) else t
    if not _RUST_F64.match(cleaned):
        return None
    v = float(cleaned)
    return v if math.isfinite(v) else None


def _close(a, b):
    return abs(a - b) <= NUMERIC_TOLERANCE


def _normalise(text):
    return rust_lower(rtrim(rtrim(text).rstrip(TRAILING)))


def _last_number(text):
    chars = list(text)
    last, i, n = None, 0, len(chars)
    while i < n:
        if is_ascii_digit(chars[i]):
            start = i
            if start > 0 and chars[start - 1] == "-" and (start < 2 or not is_alphanumeric(chars[start - 2])):
                start -= 1
            end = i
            while end < n and (is_ascii_digit(chars[end]) or (chars[end] in ".," and end + 1 < n and is_ascii_digit(chars[end + 1]))):
                end += 1
            token = "".join(chars[start:end])
            last = parse_number(token)
            if last is None:
                last = parse_number(token.replace(",", ""))
            i = end
        else:
            i += 1
    return last


def answers_match(reply, expected):
    """answer.rs: answers_match."""
    reply_n, expected_n = _normalise(reply), _normalise(expected)
    if expected_n == "":
        return False
    if reply_n == expected_n:
        return True
    expected_num = parse_number(expected_n)
    reply_num = parse_number(reply_n)
    if reply_num is not None and expected_num is not None:
        return _close(reply_num, expected_num)
    if reply_n.endswith(expected_n):
        prefix = reply_n[: len(reply_n) - len(expected_n)]
        if not (prefix and (is_alphanumeric(prefix[-1]) or prefix[-1] in ".-")):
            return True
    r = _last_number(reply_n)
    return expected_num is not None and r is not None and _close(expected_num, r)


def _as_bool(v):
    if isinstance(v, bool):
        return v
    if is_number(v):
        f = float(v)
        return True if f == 1.0 else False if f == 0.0 else None
    if isinstance(v, str):
        s = rust_lower(rtrim(v))
        return True if s in ("true", "1") else False if s in ("false", "0") else None
    return None


def _as_number(v):
    if isinstance(v, bool):
        return None
    if is_number(v):
        return float(v)
    if isinstance(v, str):
        return parse_number(v)
    return None


def loose_eq(a, b):
    """answer.rs: loose_eq."""
    x, y = _as_bool(a), _as_bool(b)
    if x is not None and y is not None and (isinstance(a, bool) or isinstance(b, bool)):
        return x == y
    a_ns = isinstance(a, str) or is_number(a)
    b_ns = isinstance(b, str) or is_number(b)
    if isinstance(a, str) and isinstance(b, str) and eq_ignore_ascii_case(rtrim(a), rtrim(b)):
        return True
    if a_ns and b_ns:
        p, q = _as_number(a), _as_number(b)
        return p is not None and q is not None and _close(p, q)
    return json_eq(a, b)


def _gold_flat(task):
    return [g for step in task.get("gold_tool_calls") or [] for g in step]


def _same_arguments(predicted, gold):
    if not isinstance(predicted, dict) or not isinstance(gold, dict):
        return False
    return len(predicted) == len(gold) and all(k in predicted and loose_eq(predicted[k], gv) for k, gv in gold.items())


def process_reward(task, t):
    """process.rs: process_reward → {"total", "components"} as `launcher reward` prints it."""
    blocks = t.blocks()
    format_ok = 1.0 if (t.open_tags == t.close_tags and all(not isinstance(b, Malformed) for b in blocks) and t.final_answer != "") else 0.0
    expected = task.get("expected_answer")
    final_correct = None if expected is None else (1.0 if answers_match(t.final_answer, expected) else 0.0)
    calls = t.calls()
    if task.get("requires_tool"):
        called = {c.name for c in calls}
        gold = _gold_flat(task)
        gold_names = {g.get("name") for g in gold}
        allowed = task.get("allowed_tools") or []
        if not gold_names:
            correct_tool = 1.0 if (called and all(not allowed or n in allowed for n in called)) else 0.0
        else:
            correct_tool = 1.0 if called == gold_names else 0.0
        if not gold:
            correct_arguments = None
        else:
            used = [False] * len(calls)
            all_matched = True
            for g in gold:
                found = None
                for i, c in enumerate(calls):
                    if not used[i] and c.name == g.get("name") and _same_arguments(c.arguments, g.get("arguments", {})):
                        found = i
                        break
                if found is None:
                    all_matched = False
                    break
                used[found] = True
            correct_arguments = 1.0 if all_matched else 0.0
        execution = 1.0 if (calls and all(c.outcome is not None and c.outcome[1] for c in calls)) else 0.0
        repeated = 1.0 if t.has_repeated_call() else 0.0
        parts = [(0.10, format_ok), (0.20, correct_tool), (0.20, correct_arguments), (0.20, execution), (0.30, final_correct), (-0.25, repeated)]
        values = [format_ok, correct_tool, correct_arguments, execution, final_correct, repeated, None]
    else:
        no_call = 1.0 if not blocks else 0.0
        parts = [(0.20, format_ok), (0.30, no_call), (0.50, final_correct)]
        values = [format_ok, None, None, None, final_correct, None, no_call]
    total = 0.0
    for w, v in parts:
        if v is not None:
            total += w * v
    return {"total": total, "components": dict(zip(PROCESS_COMPONENTS, values))}


def final_only_reward(task, t):
    """process.rs: final_only_reward (0.10·format_ok + 0.90·final_correct)."""
    blocks = t.blocks()
    format_ok = 1.0 if (t.open_tags == t.close_tags and all(not isinstance(b, Malformed) for b in blocks) and t.final_answer != "") else 0.0
    expected = task.get("expected_answer")
    final_correct = None if expected is None else (1.0 if answers_match(t.final_answer, expected) else 0.0)
    total = 0.0
    for w, v in ((0.10, format_ok), (0.90, final_correct)):
        if v is not None:
            total += w * v
    return {"total": total, "components": {"format_ok": format_ok, "final_correct": final_correct}}


REWARDS = {"process": process_reward, "final_only": final_only_reward}


def score_messages(task, messages, kind="process"):
    if kind not in REWARDS:
        raise SystemExit(f"reward {kind!r}: only {sorted(REWARDS)} are ported")
    return REWARDS[kind](task, transcript_from_messages(messages))


# ---------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def task_messages(task):
    """The prompt of a task as rlmesh renders it: the user prompt only (the template adds its default system message)."""
    return [{"role": "user", "content": task.get("prompt", "")}]


def run(spec, real_stdout):
    import datasets
    import torch
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    threads = int(spec.get("threads", 1))
    torch.set_num_threads(threads)
    out_dir = spec["out_dir"]
    os.makedirs(out_dir, exist_ok=True)
    steps, gps, G = int(spec["steps"]), int(spec["groups_per_step"]), int(spec["group_size"])
    tasks = spec["tasks"]
    if len(tasks) != steps * gps:
        raise SystemExit(f"spec: {len(tasks)} tasks, expected steps * groups_per_step = {steps * gps}")
    if list(spec.get("tools", ["calculator"])) != ["calculator"]:
        raise SystemExit(f"spec: tools {spec.get('tools')!r}: only [\"calculator\"] is ported")
    max_turns, max_new = int(spec["max_turns"]), int(spec["max_new_tokens"])
    max_tokens = int(spec.get("max_tokens") or max_new * max_turns + 256)
    scale = spec.get("scale_rewards", "group")
    reward_kind = spec.get("reward", "process")
    if reward_kind not in REWARDS:
        raise SystemExit(f"spec: reward {reward_kind!r}: only {sorted(REWARDS)} are ported")

    model_dir = spec["model_dir"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # Our template writes calls as Qwen2.5 does (`<tool_call>\n{json}\n</tool_call>`), but it is not one of the
    # templates TRL recognises (add_response_schema would refuse it): set the Qwen3 response template, which parses
    # exactly that format (plus an optional <think> block).
    tokenizer.response_template = qwen3_template
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    # The rendered prompts, exactly as TRL renders them (_tokenize_prompts: tools=self.tools, add_generation_prompt).
    rendered = [tokenizer.apply_chat_template(task_messages(t), tools=[calculator], add_generation_prompt=True, tokenize=False)
                for t in tasks]

    ds = datasets.Dataset.from_dict({
        "prompt": [task_messages(t) for t in tasks],
        "task_index": list(range(len(tasks))),
        "task_json": [dumps(t) for t in tasks],  # JSON text: Arrow would unify int/float argument types
    })

    completions_path = os.path.join(out_dir, "completions.jsonl")
    completions_file = open(completions_path, "w", encoding="utf-8")
    eos_ids = None  # set once the trainer exists
    seen_order = []

    def process_reward_func(prompts, completions, completion_ids, task_index, task_json, trainer_state, **_):
        step = trainer_state.global_step + 1
        rewards = []
        for prompt, completion, ids, ti, tj in zip(prompts, completions, completion_ids, task_index, task_json):
            seen_order.append(ti)
            task = serde_loads(tj)
            messages = [dict(m) for m in prompt] + [dict(m) for m in completion]
            trailing = False
            last = messages[-1]
            # Calls of the last turn TRL ran (max_tool_calling_iterations reached, or the results did not fit):
            # rlmesh executes them and records them as steps, so run them here as well (not for a turn cut short).
            if last.get("role") == "assistant" and last.get("tool_calls") and ids and ids[-1] in eos_ids:
                for i, tc in enumerate(last["tool_calls"]):
                    f = tc.get("function", {})
                    result = rlmesh_call(f.get("name"), normalize_arguments(f.get("arguments")), index_in_turn=i)
                    messages.append({"role": "tool", "name": f.get("name"), "content": result})
                trailing = True
            text = dumps(messages)
            scored = score_messages(task, serde_loads(text), reward_kind)
            completions_file.write('{"step": %d, "task_index": %d, "task": %s, "messages": %s, "python_reward": %s, "trailing_calls_executed": %s}\n'
                                   % (step, ti, dumps(task), text, dumps(scored), "true" if trailing else "false"))
            rewards.append(scored["total"])
        completions_file.flush()
        return rewards

    process_reward_func.__name__ = f"{reward_kind}_reward"

    config_fields = dict(
        output_dir=os.path.join(out_dir, "trl"),
        seed=int(spec.get("seed", 0)),
        max_steps=steps,
        num_train_epochs=1,
        per_device_train_batch_size=G * gps,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=G,
        num_iterations=1,
        shuffle_dataset=False,
        learning_rate=float(spec["lr"]),
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=float(spec.get("max_grad_norm", 1.0)),
        beta=float(spec.get("kl_coef", 0.0)),
        epsilon=float(spec.get("clip_eps", 0.2)),
        loss_type="grpo",
        scale_rewards=scale,
        temperature=float(spec.get("temperature", 1.0)),
        top_p=1.0,
        top_k=0,
        max_completion_length=max_tokens,
        generation_kwargs={"max_new_tokens": max_new},
        max_tool_calling_iterations=max_turns - 1,
        mask_truncated_completions=False,
        disable_dropout=True,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=bool(spec.get("gradient_checkpointing", False)),
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        log_completions=False,
    )
    # transformers 5.23 renamed gradient_checkpointing to activation_checkpointing (the old name warns);
    # GRPOConfig defaults it to True, so set it explicitly either way.
    import dataclasses

    if "activation_checkpointing" in {f.name for f in dataclasses.fields(GRPOConfig)}:
        config_fields["activation_checkpointing"] = config_fields.pop("gradient_checkpointing")
    args = GRPOConfig(**config_fields)

    phase = {"generate": 0.0, "tools": 0.0, "reward": 0.0, "score": 0.0}
    per_step = []  # one dict per step
    gen_tokens = []

    class BenchTrainer(GRPOTrainer):
        """GRPOTrainer with timers around generation, the tool loop and the reward, a token count, and
        rlmesh's tool results (see RlmeshTools)."""

        def _generate_single_turn(self, *a, **k):
            for d in getattr(self, "_sync_tool_dicts", None) or []:
                if isinstance(d, RlmeshTools):
                    d.calls_this_turn = 0  # a new turn starts after each generation
            t = time.perf_counter()
            out = super()._generate_single_turn(*a, **k)
            phase["generate"] += time.perf_counter() - t
            return out

        def _tool_call_loop(self, *a, **k):
            t, g = time.perf_counter(), phase["generate"]
            out = super()._tool_call_loop(*a, **k)
            phase["tools"] += (time.perf_counter() - t) - (phase["generate"] - g)
            return out

        def _calculate_rewards(self, *a, **k):
            t = time.perf_counter()
            out = super()._calculate_rewards(*a, **k)
            phase["reward"] += time.perf_counter() - t
            return out

        def _generate(self, prompts):
            if self.tools:
                self._sync_tool_dicts = [RlmeshTools() for _ in self._sync_tool_dicts]
                self._async_tool_dicts = [{} for _ in self._async_tool_dicts]
            out = super()._generate(prompts)
            completion_ids, tool_mask = out[1], out[2]
            if tool_mask is None:
                gen_tokens.append(sum(len(c) for c in completion_ids))
            else:
                gen_tokens.append(sum(sum(m) for m in tool_mask))
            return out

        def _generate_and_score_completions(self, inputs):
            t = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            phase["score"] += time.perf_counter() - t
            return out

    times = {"begin": [], "end": []}
    snap = {}

    class Timer(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):
            m = model if model is not None else trainer.model
            ckpt = any(getattr(x, "gradient_checkpointing", False) is True for x in m.modules())
            times["checkpointing"] = ckpt
            log(f"[trl] activation checkpointing {'on' if ckpt else 'off'}")

        def on_step_begin(self, args, state, control, **kw):
            times["begin"].append(time.perf_counter() - T0)
            snap.update(phase)

        def on_step_end(self, args, state, control, **kw):
            now = time.perf_counter() - T0
            times["end"].append(now)
            d = {k: phase[k] - snap.get(k, 0.0) for k in phase}
            step_s = now - times["begin"][-1]
            row = {"generate": d["generate"], "tools": d["tools"], "reward": d["reward"],
                   "train": step_s - d["score"], "other": d["score"] - d["generate"] - d["tools"] - d["reward"], "step": step_s}
            per_step.append(row)
            log(f"[trl] step {state.global_step}/{steps}: {step_s:.2f}s (generate {row['generate']:.2f}, tools {row['tools']:.2f}, "
                f"reward {row['reward']:.2f}, train {row['train']:.2f}), {gen_tokens[-1] if gen_tokens else 0} generated tokens")

    trainer = BenchTrainer(
        model=model,
        reward_funcs=[process_reward_func],
        args=args,
        train_dataset=ds,
        processing_class=tokenizer,
        tools=[calculator],
        callbacks=[Timer()],
    )
    eos_ids = set(trainer.eos_token_ids)
    if trainer.generation_config.max_new_tokens != max_new:
        raise SystemExit(f"TRL generates {trainer.generation_config.max_new_tokens} tokens per turn, not {max_new}")
    log(f"[trl] per-turn cap {trainer.generation_config.max_new_tokens} tokens, completion cap {trainer.max_completion_length}, "
        f"stop ids {sorted(eos_ids)}, tool iterations {trainer.max_tool_calling_iterations}")
    log(f"[trl] trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, "
        f"{threads} threads: {steps} steps of {gps} groups x {G}")
    trainer.train()
    completions_file.close()
    try:
        os.rmdir(args.output_dir)  # nothing is saved there (save_strategy "no")
    except OSError:
        pass

    expected_order = [i for i in range(len(tasks)) for _ in range(G)]
    if seen_order != expected_order:
        raise SystemExit("TRL did not train the tasks in the given order, each repeated group_size times")

    saved = None
    if spec.get("save_model"):
        saved = os.path.join(out_dir, "model")
        save_policy(trainer.model, model_dir, saved)

    end = times["end"]
    sps = (steps - 1) / (end[-1] - end[0]) if steps > 1 and end[-1] > end[0] else None
    result = {
        "trl_version": trl.__version__,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "threads": threads,
        "steps": steps,
        "step_end_seconds": end,
        "start_seconds": times["begin"][0],
        "steps_per_s": sps,
        "generated_tokens": gen_tokens,
        "rendered_prompts": rendered,
        "completions": completions_path,
        "model_dir": saved,
        "activation_checkpointing": times.get("checkpointing"),
        "phase_seconds": {k: sum(r[k] for r in per_step) for k in ("generate", "tools", "reward", "train", "other")},
        "phase_seconds_after_first": {k: sum(r[k] for r in per_step[1:]) for k in ("generate", "tools", "reward", "train", "other")},
        "phase_seconds_per_step": per_step,
        "config": {k: v for k, v in config_fields.items() if k != "output_dir"},
        "unequal": UNEQUAL + ([] if args.beta == 0 else [
            f"kl_coef {args.beta}: TRL adds beta times the k3 estimator per token against a frozen copy of the "
            "initial policy; not checked against rlmesh's KL term."]),
    }
    real_stdout.write(json.dumps(result) + "\n")
    real_stdout.flush()


def save_policy(model, model_dir, out):
    """The trained weights under the tensor names, dtypes and config of model_dir (as rlmesh wrote them), plus its
    tokenizer files and chat template."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    for name in os.listdir(model_dir):
        src = os.path.join(model_dir, name)
        if os.path.isfile(src) and name != "model.safetensors":
            shutil.copy(src, os.path.join(out, name))
    import torch

    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
    state = model.state_dict()
    tensors = {}
    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        meta = f.metadata() or {"format": "pt"}
        for k in f.keys():
            if k not in state:
                raise SystemExit(f"saving the policy: tensor {k} of {model_dir} is not in the trained model")
            dtype = dtypes.get(f.get_slice(k).get_dtype(), torch.float32)
            tensors[k] = state[k].detach().to(dtype).contiguous().clone()
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata=meta)
    os.chmod(os.path.join(out, "model.safetensors"), 0o644)


UNEQUAL = [
    "max_completion_length: TRL caps the whole multi-turn completion (generated and tool-result tokens) with one "
    "number; set to rlmesh's rollout budget after the prompt (max_tokens = max_new_tokens * max_turns + 256, as "
    "`launcher up` sets it); the per-turn cap of max_new_tokens is TRL's generation_kwargs.max_new_tokens (equal). "
    "TRL truncates the last turn to fit the budget and drops tool results that would not fit; rlmesh ends the "
    "rollout when the results leave no room for one token.",
    "turn cut by max_new_tokens: rlmesh ends the rollout and does not execute its calls; TRL parses the cut text "
    "(the Qwen3 response template accepts a <tool_call> block without </tool_call> at the end of the text), executes "
    "any call it found and generates the next turn.",
    "malformed tool call: TRL's parse_response falls back to plain text for the whole turn when any block is "
    "malformed (invalid JSON, no name, a list, an unclosed block before <|im_end|>), so no call of that turn runs and "
    "the rollout ends there; rlmesh runs the well-formed blocks, answers each malformed one with "
    "{\"error\": \"malformed tool call: ...\"} and continues to the next turn.",
    "argument typing: transformers' parse_response(tools=...) casts arguments with the schema (\"a\": \"17\" becomes "
    "17 and runs; rlmesh answers 'expected number, got a string'); a missing or null \"arguments\" becomes {} (our "
    "tool answers 'missing required argument \"operation\"'; rlmesh: 'malformed tool call: missing \"arguments\"').",
    "max_turns: TRL's max_tool_calling_iterations = max_turns - 1 stops before executing the calls of turn max_turns; "
    "this script executes them after the loop (for the reward) and appends their tool messages to the recorded "
    "conversation (trailing_calls_executed), as rlmesh executes them and records them as steps. The model never "
    "sees those results in either system.",
    "reward view: the Python port scores the transformers-format conversation (Transcript::from_messages, what "
    "`launcher reward` scores); rlmesh's training reward reads the trajectory (Transcript::from_trajectory), which "
    "for a malformed block counts a failed call as well as a malformed block. Equal for well-formed rollouts.",
    "tool limits: rlmesh's per-turn cap of 4 calls and 2048-byte output cap are ported into the tool table; its "
    "2000 ms time limit is not (the calculator cannot hang).",
    "<think>...</think> in an assistant turn becomes reasoning_content under the Qwen3 response template (not part "
    "of content, so not of the final answer); rlmesh keeps it in the content.",
    "importance ratio: TRL samples and trains with the same weights (num_iterations 1: ratio 1, clipping inert); "
    "rlmesh's one_step_off mode trains on rollouts one policy version old (equal in sync mode).",
    "precision: TRL holds rewards and advantages in float32 (rewards_per_func); rlmesh computes them in f64.",
    "sampling: a different sampler and random stream (transformers generate, torch RNG seeded with seed), so the "
    "rollouts differ sample by sample; the distribution is the same (temperature, top_p 1, top_k off).",
    "batching: TRL generates each turn for all live rollouts of the step in one left-padded generate call (the "
    "batch waits for its longest rollout), and computes log-probs and gradients for the whole right-padded step "
    "batch in one forward/backward, with per-token entropies for its logs; rlmesh batches differently "
    "(throughput only).",
]


def score_main():
    for line in sys.stdin:
        if not line.strip():
            continue
        row = serde_loads(line)
        print(dumps(score_messages(row["task"], row["messages"], row.get("reward", "process"))))


def main():
    if "--score" in sys.argv[1:]:
        score_main()
        return
    spec = serde_loads(sys.stdin.read())
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # TRL/transformers print logs to stdout: keep stdout for the one result line
    try:
        run(spec, real_stdout)
    finally:
        sys.stdout = real_stdout


if __name__ == "__main__":
    main()
