"""Hypothesis strategies that garble real captures the ways a broken server or proxy does.

Seeds are the real vLLM answers in tests/fixtures (never invented shapes): random garbage alone
rarely gets past the first check of a parser, while a capture with one value changed walks the
parser all the way to the number it chokes on.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

TESTS = Path(__file__).parent.parent
FIXTURES = TESTS / "fixtures" / "vllm-cpu"
DEV_FIXTURES = TESTS / "fixtures" / "vllm-cpu-dev"

# Every number-shaped string a server or a broken proxy has been seen to send, plus the ones Python
# parses in surprising ways (underscores, other scripts' digits, more digits than int() allows).
WEIRD_TEXT = ["inf", "-inf", "+Inf", "Infinity", "nan", "NaN", "-nan", "-1", "-0", "0", "0.0", "1e400", "-1e400",
              "1e-400", "1e30", "1e12", "1000000000001", "9" * 30, "9" * 5000, "0x10", "1_000", "١٢٣", "１２",
              "", " ", "None", "null", "true", "1.5", "2.5e3", "+5", " 7 ", "\x00", "🙂", "1\n2", "\\", '"',
              "4294967296", "18446744073709551616", "-9223372036854775809"]

# JSON scalars, including what the stdlib decoder accepts and orjson refuses (NaN, huge integers,
# lone surrogates): the client may be handed either.
json_scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(), st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 10**12 + 1, 2**63, 2**64, -(2**63) - 1, 1e308, -1e308, 5e-324, 1.5]),
    st.text(max_size=20), st.sampled_from(WEIRD_TEXT), st.sampled_from(["\ud800", "a\udfffb"]),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def nested(depth: int) -> Any:
    """A list nested `depth` deep: past orjson's dump limit (255) and Python's recursion limit."""
    out: Any = []
    for _ in range(depth):
        out = [out]
    return out


# Built afresh per draw: a mutation writes into the tree it is given, and a shared one would change
# what later examples start from (hypothesis then sees the strategy as flaky).
garbage = st.one_of(json_values, st.sampled_from([300, 1100]).map(nested),
                    st.just(260).map(lambda depth: {"a": nested(depth)}))


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def dump(value: Any) -> bytes:
    """JSON as a careless server writes it: NaN and Infinity literals, huge ints, escaped surrogates."""
    try:
        return json.dumps(value, allow_nan=True).encode()
    except (RecursionError, ValueError):  # deeper than json can write (or an int past its digit limit)
        return b"[" * 2000


def _paths(value: Any, prefix: tuple[Any, ...] = (), out: list[tuple[Any, ...]] | None = None,
           depth: int = 0) -> list[tuple[Any, ...]]:
    """Every path to a node in a JSON tree (bounded, so a huge capture still yields quickly)."""
    out = [] if out is None else out
    out.append(prefix)
    if depth > 12 or len(out) > 4000:
        return out
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        _paths(child, (*prefix, key), out, depth + 1)
    return out


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


def _swap(value: Any) -> list[Any]:
    """The same value in the wrong JSON type."""
    return [str(value), [value], {"value": value}, None, value is None, 0, -1, float("inf")]


@st.composite
def mutated_json(draw: st.DrawFn, base: Any, max_mutations: int = 4) -> Any:
    """`base` (a parsed capture) with a few nodes deleted, replaced, retyped, duplicated or nested."""
    value = json.loads(json.dumps(base))  # a deep copy the mutations may trample
    for _ in range(draw(st.integers(1, max_mutations))):
        paths = _paths(value)
        path = draw(st.sampled_from(paths))
        node = _get(value, path)
        op = draw(st.sampled_from(["replace", "swap", "delete", "dup", "empty", "weird", "nest"]))
        if op == "replace":
            new = draw(garbage)
        elif op == "swap":
            new = draw(st.sampled_from(_swap(node)))
        elif op == "weird":
            new = draw(st.one_of(st.sampled_from(WEIRD_TEXT), json_scalars))
        elif op == "empty":
            new = draw(st.sampled_from([[], {}, "", None]))
        elif op == "nest":
            new = {"x": node} if draw(st.booleans()) else [node, node]
        elif op == "dup" and isinstance(node, list) and node:
            new = node + [node[draw(st.integers(0, len(node) - 1))]] * draw(st.integers(1, 3))
        elif op == "delete" and path:
            parent = _get(value, path[:-1])
            del parent[path[-1]]
            continue
        else:
            continue
        if not path:
            value = new
        else:
            _get(value, path[:-1])[path[-1]] = new
    return value


@st.composite
def mutated_bytes(draw: st.DrawFn, body: bytes) -> bytes:
    """Raw bytes as a cut or corrupting connection delivers them: truncated, with bytes flipped or
    invalid UTF-8 spliced in."""
    op = draw(st.sampled_from(["truncate", "flip", "splice", "none"]))
    if op == "truncate" and body:
        return body[: draw(st.integers(0, len(body) - 1))]
    if op == "flip" and body:
        i = draw(st.integers(0, len(body) - 1))
        return body[:i] + bytes([draw(st.integers(0, 255))]) + body[i + 1:]
    if op == "splice":
        i = draw(st.integers(0, len(body)))
        junk = draw(st.sampled_from([b"\xff\xfe", b"\xc3", b"\x00", b"\xed\xa0\x80", "🙂".encode(), b"\r", b"\n\n"]))
        return body[:i] + junk + body[i:]
    return body


def json_body(base: Any) -> st.SearchStrategy[bytes]:
    """A capture's body as a faulty server sends it: mutated JSON, then maybe broken bytes; or junk."""
    structured = mutated_json(base).map(dump)
    return st.one_of(
        structured,
        structured.flatmap(mutated_bytes),
        garbage.map(dump),
        st.binary(max_size=64),
        st.sampled_from([b"", b"null", b"[]", b"{}", b'"x"', b"NaN", b"<html>502</html>", b"[" * 5000,
                         b'{"a":' * 1200, b"1" + b"0" * 5000]),
    )


# -- line-oriented text (Prometheus, SSE) -------------------------------------------------------

_LABEL = re.compile(r'(\w+)="([^"]*)"')


@st.composite
def mutated_lines(draw: st.DrawFn, text: str, max_mutations: int = 6) -> str:
    """A line protocol's text with lines dropped, duplicated, swapped for junk, label values or sample
    values replaced by weird numbers, and the whole maybe truncated."""
    lines = text.split("\n")
    for _ in range(draw(st.integers(1, max_mutations))):
        if not lines:
            lines = [""]
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["drop", "dup", "junk", "label", "label", "value", "value", "cut", "swap"]))
        line = lines[i]
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, line)
        elif op == "junk":
            lines[i] = draw(st.one_of(st.text(max_size=40), st.sampled_from(WEIRD_TEXT)))
        elif op == "label" and (labels := list(_LABEL.finditer(line))):
            m = labels[draw(st.integers(0, len(labels) - 1))]
            new = draw(st.one_of(st.sampled_from(WEIRD_TEXT), st.text(max_size=10)))
            new = new.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
            lines[i] = line[: m.start(2)] + new + line[m.end(2):]
        elif op == "value" and " " in line and not line.startswith("#"):
            head, _, _ = line.rpartition(" ")
            lines[i] = f"{head} {draw(st.sampled_from(WEIRD_TEXT))}"
        elif op == "cut" and line:
            lines[i] = line[: draw(st.integers(0, len(line) - 1))]
        elif op == "swap" and len(lines) > 1:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], line
    out = "\n".join(lines)
    if draw(st.integers(0, 9)) == 0:
        out = out[: draw(st.integers(0, len(out)))]
    return out


def one_line(exc: BaseException, *names: str) -> str:
    """The refusal's message, checked to be what the user reads: one non-empty line, naming the server
    or field (any of `names`)."""
    text = str(exc)
    assert text.strip(), f"{type(exc).__name__} with an empty message"
    assert "\n" not in text, f"a refusal spans lines: {text!r}"
    assert not names or any(n in text for n in names), f"{text!r} names none of {names}"
    assert len(text) < 2000, f"a refusal of {len(text)} characters"
    return text
