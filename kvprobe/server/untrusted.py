"""Numbers a server sent, checked where they are read.

A server is not trusted to send sane numbers: a /metrics label of "inf", a max_model_len of 1e30 or a
usage count sent as a string must end as one line naming the field, never as a traceback (int(inf)
raises OverflowError) nor as a measurement built on it. Every int() or float() of server data goes
through `number`.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from kvprobe.errors import Unreadable

# Beyond any real KV pool or request, and small enough that arithmetic on it stays exact (float64
# holds every integer up to 2**53).
MAX_TOKENS = 10**12
# The longest context a model serves today is 10M tokens; a smoke prompt is built from this number.
MAX_MODEL_LEN = 10**8
# A logprob is at most 0; float rounding in a server's log-softmax may overshoot by a hair. vLLM
# floors every logprob it sends at -9999.0 (-inf is not JSON); far below that is garbage, and an
# unbounded one lets a sum of logprobs or a KL term (p * (lp - lq)) overflow to inf.
LOGPROB_MIN = -1e4
LOGPROB_MAX = 1e-3


def _parse(value: Any, text: bool) -> float | int | None:
    """The number in `value`, or None when it is not one (bool is not a number; a string only if `text`)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if text and isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
        try:
            return float(value)
        except ValueError:
            return None
    return None


# A value is quoted in the message, and a server may send a megabyte of it: enough to recognise it.
_QUOTE = 60


def _quote(value: Any) -> str:
    """`value` as the message shows it: repr, cut short. Python refuses to print an int of more than
    4300 digits (and would take a while on one of a million), so a huge one is described instead."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"(an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits)"
    text = repr(value)
    return text if len(text) <= _QUOTE else f"{text[:_QUOTE]}... ({len(text)} characters)"


def _show(limit: float) -> str:
    return f"{int(limit):,}" if float(limit).is_integer() else f"{limit:g}"


def number(value: Any, what: str, *, integer: bool = False, minimum: float | None = None,
           maximum: float | None = None, text: bool = False) -> Any:
    """`value` as a finite number within [minimum, maximum] (an int when `integer`); else Unreadable
    naming `what` ("fp8: /v1/models max_model_len"). `text`: the value is a string by nature (a
    Prometheus label), so "1048576" is read; in JSON a number sent as a string is not a number."""
    if value is None:
        raise Unreadable(f"{what} is missing")
    parsed = _parse(value, text)
    if parsed is None:
        kind = "" if text or not isinstance(value, str) else " (a string)"
        raise Unreadable(f"{what} {_quote(value)} is not a number{kind}")
    if isinstance(parsed, float):
        if not math.isfinite(parsed):
            raise Unreadable(f"{what} {_quote(value)} is not a finite number")
        if integer and not parsed.is_integer():
            raise Unreadable(f"{what} {_quote(value)} is not a whole number")
    if minimum is not None and parsed < minimum:
        raise Unreadable(f"{what} {_quote(value)} is below {_show(minimum)}")
    if maximum is not None and parsed > maximum:
        raise Unreadable(f"{what} {_quote(value)} is absurdly large (over {_show(maximum)})")
    # An int past float's range passes the bounds above when one is open (a logprob has no minimum)
    # and would raise OverflowError in float(), or poison every sum it joins.
    if isinstance(parsed, int) and abs(parsed) > sys.float_info.max:
        raise Unreadable(f"{what} {_quote(value)} is beyond any number a float holds")
    return int(parsed) if integer else float(parsed)


def logprob(value: Any, what: str) -> float:
    """A log-probability: finite, in [LOGPROB_MIN, LOGPROB_MAX]."""
    return number(value, what, minimum=LOGPROB_MIN, maximum=LOGPROB_MAX)


def count(value: Any, what: str, *, maximum: float = MAX_TOKENS, text: bool = False) -> int:
    """A count of tokens, blocks or requests: a whole number, 0 or more."""
    return number(value, what, integer=True, minimum=0, maximum=maximum, text=text)


def optional_count(data: Any, key: str, what: str, *, maximum: float = MAX_TOKENS) -> int | None:
    """data[key] as a count; None when the server left it out (Unreadable when it sent garbage)."""
    value = data.get(key) if isinstance(data, dict) else None
    return None if value is None else count(value, f"{what}.{key}", maximum=maximum)


def check_logprobs(server: str, outputs: Any, ctxlens: list[int]) -> None:
    """Unreadable unless `outputs` has the shape lm-eval's parse_logprobs reads, with finite logprobs
    at the positions it sums (each choice's token_logprobs[ctxlen:-1])."""
    where = f"{server}: /v1/completions"
    for out in outputs if isinstance(outputs, list) else [outputs]:
        choices = out.get("choices") if isinstance(out, dict) else None
        if not isinstance(choices, list) or not all(
                isinstance(c, dict) and type(c.get("index")) is int and isinstance(c.get("logprobs"), dict)
                for c in choices):
            raise Unreadable(f"{where}: the answer has no choices with an index and logprobs", server=server)
        for choice, ctxlen in zip(sorted(choices, key=lambda c: c["index"]), ctxlens, strict=False):
            logprobs = choice["logprobs"]
            token_logprobs, top = logprobs.get("token_logprobs"), logprobs.get("top_logprobs")
            if not isinstance(token_logprobs, list) or not isinstance(top, list):
                raise Unreadable(f"{where}: logprobs has no token_logprobs and top_logprobs lists", server=server)
            for i in range(ctxlen, len(token_logprobs) - 1):
                logprob(token_logprobs[i], f"{where} logprobs.token_logprobs[{i}]")
            # lm-eval compares each token's logprob with max(top.values()): an empty entry or a
            # string among the values is a ValueError or TypeError inside it.
            for i, entry in enumerate(top[ctxlen:-1], ctxlen):
                if not isinstance(entry, dict) or not entry:
                    raise Unreadable(f"{where}: logprobs.top_logprobs[{i}] is not an object of token logprobs",
                                     server=server)
                for token, value in entry.items():
                    logprob(value, f"{where} logprobs.top_logprobs[{i}][{token[:40]!r}]")
