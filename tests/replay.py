"""Replay real vLLM captures (tests/fixtures/vllm-cpu) through httpx.MockTransport.

`Replay(dir)` answers each (method, path) with a captured response; tests override routes to
inject faults (500, 401, malformed /metrics, a server that dies after /health)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-cpu"

Handler = Callable[[httpx.Request], httpx.Response]


def capture(server: str, name: str) -> bytes:
    """Raw response body of capture `name` in `server` (any extension)."""
    base = FIXTURES / server
    for candidate in (f"{name}.response.json", f"{name}.response.txt", f"{name}.response.sse",
                      f"{name}.txt", f"{name}.json"):
        path = base / candidate
        if path.exists():
            return path.read_bytes()
    raise FileNotFoundError(f"no capture {server}/{name}")


def _respond(body: bytes, status: int = 200, sse: bool = False) -> httpx.Response:
    ctype = "text/event-stream" if sse else ("application/json" if body[:1] in (b"{", b"[") else "text/plain")
    return httpx.Response(status, content=body, headers={"content-type": ctype})


class Replay:
    """A fake server built only from one capture folder; routes can be overridden per test."""

    def __init__(self, server: str = "auto-8101", metrics: str = "metrics_fresh"):
        self.server = server
        self.calls: list[tuple[str, str]] = []
        self.routes: dict[tuple[str, str], Handler] = {
            ("GET", "/health"): lambda r: httpx.Response(200),
            ("GET", "/version"): self._file("version", fallback=b'{"version":"0.32.0"}'),
            ("GET", "/v1/models"): self._file("models"),
            ("GET", "/metrics"): self._file(metrics),
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/detokenize"): self._file("detokenize"),
            ("POST", "/v1/completions"): self._file("completions_gen16"),
            ("POST", "/v1/chat/completions"): self._chat,
        }

    def _file(self, name: str, fallback: bytes | None = None) -> Handler:
        def handler(request: httpx.Request) -> httpx.Response:
            try:
                return _respond(capture(self.server, name))
            except FileNotFoundError:
                if fallback is None:
                    return httpx.Response(404, json={"detail": "Not Found"})
                return _respond(fallback)
        return handler

    def _tokenize(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if "messages" in body:
            return _respond(capture(self.server, "tokenize_chat"))
        # The captured answer is for a short prompt; scale it to the prompt's length so long
        # prompts get a long token list, as a real server would.
        real = json.loads(capture(self.server, "tokenize_prompt"))
        n = max(1, len(body.get("prompt", "")) // 4)
        tokens = (real["tokens"] * (n // len(real["tokens"]) + 1))[:n]
        return httpx.Response(200, json={**real, "count": len(tokens), "tokens": tokens})

    def _chat(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body.get("stream"):
            return _respond(capture(self.server, "chat_stream"), sse=True)
        return _respond(capture(self.server, "chat"))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        key = (request.method, request.url.path)
        self.calls.append(key)
        handler = self.routes.get(key)
        if handler is None:
            return httpx.Response(404, json={"detail": "Not Found"})
        return handler(request)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


class MultiReplay:
    """Several fake servers behind one transport, told apart by host:port."""

    def __init__(self, servers: dict[str, Replay | Handler]):
        self.servers = servers  # "127.0.0.1:8101" -> Replay

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = f"{request.url.host}:{request.url.port}"
        target = self.servers.get(host)
        if target is None:
            raise httpx.ConnectError(f"All connection attempts failed ({host})", request=request)
        return target(request)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


DEV_FIXTURES = Path(__file__).parent / "fixtures" / "vllm-cpu-dev"


def dev_server_info(name: str) -> dict:
    """A real /server_info?config_format=json from a dev-mode server (`auto` or `fp8`)."""
    return json.loads((DEV_FIXTURES / f"server_info-{name}.json").read_text())


def on_avx2(info: dict) -> dict:
    """The same capture as the AVX2 hosts look (AMD EPYC family 25 model 1): no avx512*/amx* flags."""
    lines = []
    for line in info["system_env"]["cpu_info"].splitlines():
        key, _, value = line.partition(":")
        if key == "Model":
            line = f"{key}:{' ' * 35}1"
        elif key == "Flags":
            line = f"{key}: " + " ".join(f for f in value.split() if not f.startswith(("avx512", "amx")))
        lines.append(line)
    return {**info, "system_env": {**info["system_env"], "cpu_info": "\n".join(lines)}}


# The two captured servers (auto-8101, fp8-8102) as a servers.toml.
SERVERS_TOML = """
[[server]]
name = "auto"
url = "http://127.0.0.1:8101"
role = "reference"

[[server]]
name = "fp8"
url = "http://127.0.0.1:8102"
"""
