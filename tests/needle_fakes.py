"""Fakes for the needle unit tests, shaped on the real captures in tests/fixtures/vllm-cpu.

- `ToyTokenizer`: a deterministic stand-in for a byte-level BPE with a ChatML template like
  needle-llama's (`<|im_start|>user\\n{content}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n`), served
  as POST /tokenize in both the prompt and the messages form. Words split into pieces of up to 4
  letters, so trimming a character can change the count by 0 or 1, as with a real BPE.
- `NeedleModel`: answers chat requests the way needle-llama does on a reasoning-parser server
  (fact restated in `reasoning`, value in `content`), or like a model that lost retrieval, by
  rewriting the fields of the real deepseek_r1 capture (non-streamed and streamed).
"""

from __future__ import annotations

import copy
import json
import re
import zlib
from collections.abc import Callable

import httpx
from replay import FIXTURES, Replay

REASONING_DIR = "reasoning-deepseek_r1-8104"
_PIECE = re.compile(r" ?[A-Za-z]{1,4}| ?\d{1,3}| ?[^\sA-Za-z\d]|\s+(?!\S)|\s+")
_IM_START, _IM_END, _THINK = 1, 2, 3


class ToyTokenizer:
    def __init__(self, max_model_len: int = 8192):
        self.max_model_len = max_model_len
        self.calls = 0

    @staticmethod
    def text_ids(text: str) -> list[int]:
        return [zlib.crc32(p.encode()) % 40000 + 10 for p in _PIECE.findall(text)]

    def chat_ids(self, content: str, generation_prompt: bool = True) -> list[int]:
        ids = [_IM_START, *self.text_ids("user\n"), *self.text_ids(content), _IM_END, *self.text_ids("\n")]
        if generation_prompt:
            ids += [_IM_START, *self.text_ids("assistant\n"), _THINK, *self.text_ids("\n")]
        return ids

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        body = json.loads(request.content)
        if "messages" in body:
            content = "".join(m["content"] for m in body["messages"])
            ids = self.chat_ids(content, body.get("add_generation_prompt", True))
        else:
            ids = self.text_ids(body["prompt"])
        return httpx.Response(200, json={"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids,
                                         "token_strs": None})


def capture_json(name: str, server: str = REASONING_DIR) -> dict:
    return json.loads((FIXTURES / server / f"{name}.response.json").read_text())


def capture_sse(name: str, server: str = REASONING_DIR) -> list[dict | None]:
    """The `data:` events of a captured stream; None stands for [DONE]."""
    events: list[dict | None] = []
    for line in (FIXTURES / server / f"{name}.response.sse").read_text().splitlines():
        if line.startswith("data:"):
            payload = line[5:].strip()
            events.append(None if payload == "[DONE]" else json.loads(payload))
    return events


def sse_bytes(events: list[dict | None]) -> bytes:
    return "".join(f"data: {'[DONE]' if e is None else json.dumps(e)}\n\n" for e in events).encode()


def json_answer(reasoning: str | None, content: str | None, finish: str, completion_tokens: int,
                prompt_tokens: int) -> dict:
    """The real deepseek_r1 non-streamed capture with its answer fields replaced."""
    data = capture_json("chat")
    choice = data["choices"][0]
    choice["message"]["reasoning"] = reasoning
    choice["message"]["content"] = content
    choice["finish_reason"] = finish
    data["usage"].update(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                         total_tokens=prompt_tokens + completion_tokens)
    return data


def sse_answer(reasoning: str | None, content: str | None, finish: str, completion_tokens: int,
               prompt_tokens: int) -> list[dict | None]:
    """The real deepseek_r1 stream, re-cut: role chunk, reasoning deltas, content deltas, the
    finish_reason on the last delta, the usage chunk, [DONE]."""
    events = capture_sse("chat_stream")
    role, delta_tpl, usage = events[0], events[1], events[-2]
    assert delta_tpl is not None and usage is not None and usage["choices"] == []
    chunks = []
    for field, text in (("reasoning", reasoning), ("content", content)):
        for piece in re.findall(r"\S+\s*|\s+", text or ""):
            chunk = copy.deepcopy(delta_tpl)
            chunk["choices"][0]["delta"] = {field: piece}
            chunks.append(chunk)
    if not chunks:
        chunks.append(copy.deepcopy(delta_tpl))
    chunks[-1]["choices"][0]["finish_reason"] = finish
    usage = copy.deepcopy(usage)
    usage["usage"].update(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                          total_tokens=prompt_tokens + completion_tokens)
    return [role, *chunks, usage, None]


_NEEDLE = re.compile(r"One of the special magic numbers for (\S+) is: (\d+)\.")
_QUESTION = re.compile(r"What is the special magic number for (\S+) mentioned in the provided text\?$")


class NeedleModel:
    """A chat route. mode "retrieves": answers like needle-llama; "lost": rambles without the value
    and stops; "rambles": runs into max_tokens without the value."""

    def __init__(self, tokenizer: ToyTokenizer, mode: str = "retrieves"):
        self.tokenizer = tokenizer
        self.mode = mode
        self.bodies: list[dict] = []
        self.fail_after: int | None = None  # answer 500 from this request on (a dying engine)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        if self.fail_after is not None and len(self.bodies) > self.fail_after:
            return httpx.Response(500, json={"error": {"message": "EngineCore encountered an issue. See stack "
                                                                  "trace (above) for the root cause.",
                                                       "type": "Internal Server Error", "code": 500}})
        content = body["messages"][-1]["content"]
        prompt_tokens = len(self.tokenizer.chat_ids(content))
        key = _QUESTION.search(content).group(1)
        value = dict(_NEEDLE.findall(content)).get(key, "0")
        if self.mode == "retrieves":
            reasoning = f"One of the special magic numbers for {key} is: {value}.\n"
            answer, finish, used = f"\n\n{value}", "stop", 31
        elif self.mode == "lost":
            reasoning, answer, finish, used = "is the attribute\n\n\nWhich access key does scoped have?", "", "stop", 40
        else:
            reasoning, answer, finish, used = "\n" * 200, None, "length", body["max_tokens"]
        if body.get("stream"):
            return httpx.Response(200, content=sse_bytes(sse_answer(reasoning, answer, finish, used, prompt_tokens)),
                                  headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=json_answer(reasoning, answer or None, finish, used, prompt_tokens))


def fake_server(model: NeedleModel | Callable[[httpx.Request], httpx.Response],
                tokenizer: ToyTokenizer | None) -> Replay:
    """A replayed vLLM (health, version, models, metrics from auto-8101) with a toy tokenizer
    (None: no /tokenize, as behind some gateways) and a needle-answering chat route."""
    replay = Replay("auto-8101")
    if tokenizer is None:
        replay.routes[("POST", "/tokenize")] = lambda r: httpx.Response(404, json={"detail": "Not Found"})
    else:
        replay.routes[("POST", "/tokenize")] = tokenizer
    replay.routes[("POST", "/v1/chat/completions")] = model
    return replay
