"""Async client for one vLLM OpenAI-compatible server (httpx; one connection pool per server).

Retries: only where a retry is safe. GETs and /tokenize are idempotent and retried on connect
errors and 502/503/504; generation requests are retried only when the server never saw them: the
connection was refused, or a kept-alive connection was closed under the request before any answer
(the server's keep-alive timeout racing the send, once, on a new connection, as Go's net/http
does); never after a 5xx, so a crash is reported, not hidden.

Streams go through kvprobe.server.streaming (asyncio protocols + httptools' C parser) unless a test
transport is given or a proxy applies: httpx parses HTTP in pure Python (h11), which made the
client, not the server, the bottleneck at a few hundred streams (benchmarks/client_overhead.py).
Both paths feed the same SSE parser, and every event of one network read gets that read's arrival
time.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import httptools
import httpx
import orjson

from kvprobe import settings
from kvprobe.errors import AuthError, ServerError, Unreachable, Unreadable
from kvprobe.server.streaming import NoResponse, StreamPool, proxied

if TYPE_CHECKING:
    from kvprobe.config import Server

_RETRY_STATUS = {502, 503, 504}


class Chunk(NamedTuple):
    """One streamed event: monotonic arrival time and what it carried. A tuple, not a dataclass:
    the garbage collector stops tracking tuples of floats and strings, so thousands of live streams
    do not make every collection slower."""

    t: float
    reasoning: str = ""
    content: str = ""


@dataclass
class Generation:
    """A finished (or failed) chat or completion, streamed or not."""

    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    t_start: float = 0.0
    t_end: float = 0.0
    chunks: list[Chunk] = field(default_factory=list)
    complete: bool = False  # the server said it was done ([DONE] or a full response)
    error: str | None = None
    status: int | None = None
    # vLLM sends a failure inside a started stream as an error event under HTTP 200, with the status it would have
    # answered ({"error": {"type": "InternalServerError", "code": 500}}): the status line alone hides a server fault.
    stream_error_code: int | None = None
    system_fingerprint: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.complete

    @property
    def token_times(self) -> list[float]:
        """When each chunk carrying reasoning or content arrived."""
        return [c.t for c in self.chunks if c.reasoning or c.content]

    @property
    def ttft(self) -> float | None:
        """Seconds to the first token of reasoning or content."""
        first = next((c.t for c in self.chunks if c.reasoning or c.content), None)
        return None if first is None else first - self.t_start

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.token_times)]

    @property
    def e2e(self) -> float:
        return self.t_end - self.t_start

    @property
    def text(self) -> str:
        return self.reasoning + self.content


def _reasoning_of(obj: dict[str, Any]) -> str:
    # vLLM >= 0.17 sends `reasoning`; older servers and some proxies send `reasoning_content`.
    return _text(obj.get("reasoning") or obj.get("reasoning_content"))


def _text(value: Any, what: str = "a text field") -> str:
    """A text field of an answer: null is empty; anything but a string is garbage."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{what} is {type(value).__name__}, not a string")
    return value


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not a JSON object")
    return value


def _loads(content: bytes) -> Any:
    """A JSON body, with orjson rather than httpx's json.loads: the stdlib decoder takes NaN, a lone
    surrogate and a 400-digit int (each a traceback when the run directory is written) and raises
    RecursionError, not ValueError, on `[[[[...`. orjson refuses them all with a ValueError; it
    reads an int past 64 bits as a float, which the number checks then judge."""
    return orjson.loads(content)


def _error_text(resp: httpx.Response) -> str:
    """The server's own words about an error, as one line (it ends a line kvprobe prints)."""
    try:
        body = _loads(resp.content)
    except ValueError:
        return _line(resp.text) or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return _line(err.get("message") or err)
        return _line(err)
    return _line(body)


def _line(value: Any, limit: int = 500) -> str:
    # An HTML page or a pretty-printed body spans lines; str() of a list nested 1000 deep raises
    # RecursionError, so only orjson's flat rendering is used for what is not a string.
    if not isinstance(value, str):
        try:
            value = orjson.dumps(value).decode()
        except TypeError:
            value = f"({type(value).__name__} nested too deep to show)"
    return " ".join(value[: limit * 4].split())[:limit]


class Client:
    """One server's connection pool and every endpoint kvprobe uses."""

    def __init__(
        self,
        name: str,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        headers: dict[str, str] | None = None,
        max_connections: int = 512,
        transport: httpx.AsyncBaseTransport | None = None,
        retries: int = 3,
        backoff_s: float = 0.5,
        unset_key_env: str | None = None,
    ):
        self.name = name
        # The api_key_env variable the environment left unset: a 401 then names it, not just "the key".
        self.unset_key_env = unset_key_env
        self.url = url.rstrip("/").removesuffix("/v1")
        self.retries = retries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        hdrs = dict(headers or {}) | settings.auth_header(api_key)
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=hdrs,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=transport,
        )
        # A test transport answers streams too; otherwise they use the fast pool (see the module doc).
        self._pool: StreamPool | None = None
        if transport is None and not proxied(self.url):
            self._pool = StreamPool(self.url, hdrs, max_connections=max_connections, timeout_s=timeout_s)
        self.model: str | None = None

    @classmethod
    def for_server(cls, server: Server, transport: httpx.AsyncBaseTransport | None = None) -> Client:
        """The client of one [[server]] table (its key from the environment)."""
        return cls(server.name, server.url, api_key=server.api_key(), timeout_s=server.timeout_s,
                   headers=server.headers, transport=transport, unset_key_env=server.unset_key_env())

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._pool is not None:
            await self._pool.aclose()

    @property
    def stream_pool(self) -> StreamPool | None:
        """The pool streamed requests go through (None: through httpx, a proxy applies)."""
        return self._pool

    # -- plumbing ---------------------------------------------------------------------------

    def _fail(self, resp: httpx.Response, path: str) -> ServerError:
        text = _error_text(resp)
        if resp.status_code in (401, 403):
            fix = (f"{self.unset_key_env} (api_key_env) is not set: export it with {self.name}'s API key"
                   if self.unset_key_env else "check the API key (api_key_env)")
            return AuthError(self.name, f"{text or 'unauthorized'}: {fix}", status=resp.status_code, path=path)
        return ServerError(self.name, text, status=resp.status_code, path=path)

    def _unreachable(self, exc: Exception, path: str) -> Unreachable:
        """No answer. A server that took the request and then stalled is not down: say which it was."""
        kind = type(exc).__name__
        if isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout | NoResponse):
            return Unreachable(self.name, f"{self.url}{path}: no response within {self.timeout_s:g} s ({kind})",
                               path=path)
        if isinstance(exc, httpx.PoolTimeout):
            return Unreachable(self.name, f"{self.url}{path}: no free connection within {self.timeout_s:g} s "
                                          f"({kind})", path=path)
        detail = str(exc) or kind
        if isinstance(exc, httpx.TimeoutException | TimeoutError):
            detail = f"timed out connecting ({kind})"
        return Unreachable(self.name, f"cannot reach {self.url}{path}: {detail}", path=path)

    async def _request(self, method: str, path: str, *, idempotent: bool, **kw: Any) -> httpx.Response:
        attempts = max(1, self.retries)
        for attempt in range(1, attempts + 1):
            last = attempt == attempts
            try:
                resp = await self._send(method, path, **kw)
            except httpx.TransportError as exc:
                # Refused before sending (ConnectError) is safe to retry whatever the method.
                if last or not (idempotent or isinstance(exc, httpx.ConnectError)):
                    raise self._unreachable(exc, path) from None
            else:
                if not (resp.status_code in _RETRY_STATUS and idempotent and not last):
                    if resp.status_code >= 400:
                        raise self._fail(resp, path)
                    return resp
            await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One attempt. A request the server never read (a kept-alive connection it closed as idle
        just as the request went out) goes once more, on a new connection."""
        trace = _ConnectionTrace()
        try:
            return await self._http.request(method, path, extensions={"trace": trace}, **kw)
        except httpx.TransportError as exc:
            if not trace.closed_before_answer(exc):
                raise
        return await self._http.request(method, path, **kw)

    def _json(self, resp: httpx.Response, path: str) -> Any:
        try:
            return _loads(resp.content)
        except ValueError:
            raise ServerError(self.name, f"not JSON: {resp.text[:200]!r}", path=path) from None

    async def _get_json(self, path: str) -> Any:
        return self._json(await self._request("GET", path, idempotent=True), path)

    async def _post_json(self, path: str, body: dict[str, Any], *, idempotent: bool) -> Any:
        resp = await self._request("POST", path, idempotent=idempotent, content=orjson.dumps(body),
                                   headers={"content-type": "application/json"})
        return self._json(resp, path)

    # -- introspection ----------------------------------------------------------------------

    async def health(self) -> bool:
        await self._request("GET", "/health", idempotent=True)
        return True

    def _unreadable(self, path: str, what: str) -> Unreadable:
        return Unreadable(f"{self.name}: {path} {what}", server=self.name, path=path)

    async def version(self) -> str | None:
        try:
            data = await self._get_json("/version")
        except ServerError as exc:
            if exc.status == 404:
                return None
            raise
        version = data.get("version") if isinstance(data, dict) else None
        return version if isinstance(version, str) else None

    async def models(self) -> list[dict[str, Any]]:
        body = await self._get_json("/v1/models")
        data = (body.get("data") or []) if isinstance(body, dict) else None
        if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
            raise self._unreadable("/v1/models", "is not a list of models with string ids")
        if data and self.model is None:
            self.model = data[0]["id"]
        return data

    async def metrics_text(self) -> str:
        return (await self._request("GET", "/metrics", idempotent=True)).text

    async def tokenize(
        self,
        *,
        prompt: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        add_special_tokens: bool | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of a prompt, or of chat messages after the server's chat template."""
        if (prompt is None) == (messages is None):
            raise ValueError("give exactly one of prompt= or messages=")
        body: dict[str, Any] = {"model": self.model} if self.model else {}
        if prompt is not None:
            body |= {"prompt": prompt, "add_special_tokens": True if add_special_tokens is None else add_special_tokens}
        else:
            body |= {"messages": messages, "add_generation_prompt": add_generation_prompt,
                     "add_special_tokens": bool(add_special_tokens)}
            if chat_template_kwargs:
                body["chat_template_kwargs"] = chat_template_kwargs
        data = await self._post_json("/tokenize", body, idempotent=True)
        tokens = data.get("tokens") if isinstance(data, dict) else None
        # Token ids go back into prompts and into max(): a string or a float among them is garbage.
        if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
            raise self._unreadable("/tokenize", "did not answer a list of token ids")
        return tokens

    async def tokenizer_info(self) -> dict[str, Any] | None:
        """GET /tokenizer_info (vLLM with --enable-tokenizer-info-endpoint); None when not offered."""
        try:
            return await self._get_json("/tokenizer_info")
        except ServerError as exc:
            if exc.status in (404, 405, 501):
                return None
            raise

    async def detokenize(self, tokens: list[int]) -> str:
        body: dict[str, Any] = {"tokens": tokens} | ({"model": self.model} if self.model else {})
        data = await self._post_json("/detokenize", body, idempotent=True)
        text = data.get("prompt") if isinstance(data, dict) else None
        if not isinstance(text, str):
            raise self._unreadable("/detokenize", "did not answer a prompt string")
        return text

    async def server_info(self) -> dict[str, Any] | None:
        """The full engine config (`/server_info?config_format=json`), served only when the server runs
        with VLLM_SERVER_DEV_MODE=1; None otherwise."""
        try:
            data = await self._get_json("/server_info?config_format=json")
        except ServerError as exc:
            if exc.status in (404, 405):
                return None
            raise
        return data if isinstance(data, dict) and isinstance(data.get("vllm_config"), dict) else None

    async def reset_prefix_cache(self) -> bool:
        """True when the server reset its prefix cache; False when it does not offer the endpoint."""
        try:
            await self._request("POST", "/reset_prefix_cache", idempotent=True)
        except ServerError as exc:
            if exc.status in (404, 405):
                return False
            raise
        return True

    # -- generation -------------------------------------------------------------------------

    def _with_model(self, body: dict[str, Any]) -> dict[str, Any]:
        return body if "model" in body or not self.model else {"model": self.model, **body}

    async def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        """Raw /v1/completions JSON (non-streaming); raises ServerError on failure."""
        return await self._post_json("/v1/completions", self._with_model(body), idempotent=False)

    async def chat(self, body: dict[str, Any]) -> Generation:
        """A non-streaming chat completion; failures come back in Generation.error."""
        gen = Generation(t_start=time.perf_counter())
        try:
            data = await self._post_json("/v1/chat/completions", self._with_model(body), idempotent=False)
        except ServerError as exc:
            gen.t_end, gen.error, gen.status = time.perf_counter(), str(exc), exc.status
            return gen
        gen.t_end = time.perf_counter()
        try:
            _apply_message(gen, data)
        except ValueError as exc:
            gen.error = f"{self.name}: /v1/chat/completions: unreadable answer: {exc}"
            return gen
        gen.complete = True
        return gen

    async def stream_chat(self, body: dict[str, Any]) -> Generation:
        return await self._stream("/v1/chat/completions", body)

    async def stream_completions(self, body: dict[str, Any]) -> Generation:
        return await self._stream("/v1/completions", body)

    async def _stream(self, path: str, body: dict[str, Any]) -> Generation:
        body = self._with_model({**body, "stream": True})
        body.setdefault("stream_options", {"include_usage": True})
        payload = orjson.dumps(body)
        gen = Generation(t_start=time.perf_counter())
        feed = _SseFeed(gen, f"{self.name}: {path}")
        try:
            if self._pool is not None:
                status, error_body = await self._pool.post(path, payload, feed.feed)
                if status >= 400:
                    err = self._fail(httpx.Response(status, content=error_body), path)
                    gen.error, gen.status = str(err), err.status
            else:
                await self._stream_httpx(path, payload, gen, feed)
        except (httpx.TransportError, OSError, TimeoutError, httptools.HttpParserError) as exc:
            if not feed.done:  # after [DONE] the answer is whole, whatever happens to the connection
                gen.error = str(self._unreachable(exc, path)) if not gen.chunks else self._cut(exc, path, gen)
        finally:
            gen.t_end = time.perf_counter()
            feed.close()
        if not gen.complete and gen.error is None:
            gen.error = f"{self.name}: {path}: stream ended before [DONE] after {len(gen.chunks)} chunks"
        return gen

    def _cut(self, exc: Exception, path: str, gen: Generation) -> str:
        kind = type(exc).__name__
        if isinstance(exc, httpx.ReadTimeout | NoResponse):
            return (f"{self.name}: {path}: stream stalled after {len(gen.chunks)} chunks: no data within "
                    f"{self.timeout_s:g} s ({kind})")
        return f"{self.name}: {path}: stream cut after {len(gen.chunks)} chunks ({kind})"

    async def _stream_httpx(self, path: str, payload: bytes, gen: Generation, feed: _SseFeed) -> None:
        async with self._http.stream("POST", path, content=payload,
                                     headers={"content-type": "application/json"}) as resp:
            if resp.status_code >= 400:
                await resp.aread()
                err = self._fail(resp, path)
                gen.error, gen.status = str(err), err.status
                return
            async for data in resp.aiter_bytes():
                if feed.feed(data, time.perf_counter()):
                    return


class _ConnectionTrace:
    """httpcore's trace events of one request, to tell the keep-alive race from a server fault."""

    def __init__(self) -> None:
        self.events: set[str] = set()

    async def __call__(self, event: str, info: dict[str, Any]) -> None:
        self.events.add(event)

    def closed_before_answer(self, exc: httpx.TransportError) -> bool:
        """Sent on a kept-alive connection (no new connect), which then closed or reset before any
        answer byte: the server had closed it as idle and never read the request. A test transport
        sends no events, so it is never taken for this."""
        seen = self.events
        return (isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError)
                and "http11.send_request_headers.started" in seen
                and "connection.connect_tcp.started" not in seen
                and "http11.receive_response_headers.complete" not in seen)


def _apply_message(gen: Generation, data: Any) -> None:
    """A non-streaming chat answer into `gen`; ValueError when its shape is not an answer's."""
    data = _object(data, "the answer")
    choices = data.get("choices") or [{}]
    if not isinstance(choices, list):
        raise ValueError("choices is not a list")
    choice = _object(choices[0], "choices[0]")
    message = _object(choice.get("message") or {}, "choices[0].message")
    gen.content = _text(message.get("content"))
    gen.reasoning = _reasoning_of(message)
    gen.finish_reason = _text(choice.get("finish_reason"), "finish_reason") or None
    usage = data.get("usage")
    gen.usage = usage if isinstance(usage, dict) else None
    fingerprint = data.get("system_fingerprint")
    gen.system_fingerprint = fingerprint if isinstance(fingerprint, str) else None


class _SseFeed:
    """Incremental SSE parser: bytes in, `data:` events applied to a Generation.

    Each `data:` line is one JSON event; `[DONE]` marks the stream complete. Pieces of text are
    collected in lists and joined once (string += per token is quadratic on long outputs)."""

    __slots__ = ("_content", "_reasoning", "buf", "done", "gen", "where")

    def __init__(self, gen: Generation, where: str = "stream"):
        self.gen = gen
        self.where = where  # "server: path", for the error line
        self.buf = b""
        self.done = False  # nothing more is read: [DONE] came, or an event that cannot be read
        self._content: list[str] = []
        self._reasoning: list[str] = []

    def feed(self, data: bytes, now: float) -> bool:
        """Take one network read that arrived at `now`; True once [DONE] was seen."""
        if self.done:
            return True
        lines = (self.buf + data if self.buf else data).split(b"\n")
        self.buf = lines.pop()
        gen, loads = self.gen, orjson.loads
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                gen.complete = self.done = True
                self.buf = b""
                return True
            if payload:
                try:
                    _apply_event(gen, loads(payload), now, self._reasoning, self._content, self.where)
                except ValueError as exc:  # orjson's decode error is one too
                    # Never raise: with the stream pool this runs inside the protocol's callback.
                    gen.error = f"{self.where}: unreadable stream event {bytes(payload[:80])!r}: {exc}"
                    self.done = True
                    self.buf = b""
                    return True
        return False

    def close(self) -> None:
        self.gen.reasoning = "".join(self._reasoning)
        self.gen.content = "".join(self._content)


def _apply_error_event(gen: Generation, err: Any, where: str) -> None:
    """An error event in a stream that began with HTTP 200 (vLLM: the engine failed mid-generation, then [DONE])."""
    message = err.get("message") if isinstance(err, dict) else err
    code = err.get("code") if isinstance(err, dict) else None
    if isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599:
        gen.stream_error_code = code
    said = f" (code {gen.stream_error_code})" if gen.stream_error_code is not None else ""
    gen.error = f"{where}: an error event in the stream{said}: {message}"


def _apply_event(gen: Generation, event: Any, now: float, reasoning_parts: list[str],
                 content_parts: list[str], where: str = "the stream") -> None:
    """One `data:` event into `gen`; ValueError when it is not the shape of one."""
    event = _object(event, "the event")
    choices = event.get("choices")
    if not choices:
        if "error" in event:
            _apply_error_event(gen, event["error"], where)
            return
        choices = ()
    if not isinstance(choices, list | tuple):
        raise ValueError("choices is not a list")
    if isinstance(usage := event.get("usage"), dict) and usage:
        gen.usage = usage
    if isinstance(fingerprint := event.get("system_fingerprint"), str) and fingerprint:
        gen.system_fingerprint = fingerprint
    for choice in choices:
        choice = _object(choice, "a choice")
        delta = choice.get("delta")
        if delta is None:  # completions stream
            reasoning, content = "", _text(choice.get("text"))
        else:
            delta = _object(delta, "a delta")
            reasoning = _reasoning_of(delta)
            content = _text(delta.get("content"))
        gen.chunks.append(Chunk(now, reasoning, content))
        if reasoning:
            reasoning_parts.append(reasoning)
        if content:
            content_parts.append(content)
        # Scored against "length" and written to every event: a list or object there is garbage.
        if finish := _text(choice.get("finish_reason"), "finish_reason"):
            gen.finish_reason = finish
