"""Counting a chat prompt's tokens: with the server's own /tokenize (messages form, so the chat
template is counted exactly) or, where no server has one, a tiktoken estimate marked approximate.

kvprobe downloads nothing at run time: tiktoken normally fetches its encoding file on first use,
so here it may only read a copy already in its cache; without one the error says what to do.
"""

from __future__ import annotations

from typing import Any, Protocol

from kvprobe.errors import TokenizerUnavailable
from kvprobe.server.client import Client
from kvprobe.settings import tiktoken_cache_dir


class Encoder(Protocol):
    name: str
    approximate: bool

    async def encode(self, content: str, *, generation_prompt: bool = True) -> list[int]:
        """Token ids of one user message `content` after the chat template."""
        ...


def _messages(content: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


class ServerEncoder:
    """The server's tokenizer and chat template, through POST /tokenize (messages form)."""

    approximate = False

    def __init__(self, client: Client):
        self.client = client
        self.name = client.name

    async def encode(self, content: str, *, generation_prompt: bool = True) -> list[int]:
        return await self.client.tokenize(messages=_messages(content), add_generation_prompt=generation_prompt)


# A ChatML-like template costs about this much around one user message; only an estimate,
# which is why cases built with tiktoken are marked approximate.
_OPEN, _CLOSE, _GENERATION = 3, 2, 5


class TiktokenEncoder:
    approximate = True

    def __init__(self, encoding: Any):
        self.encoding = encoding
        self.name = f"tiktoken:{encoding.name}"

    async def encode(self, content: str, *, generation_prompt: bool = True) -> list[int]:
        ids = self.encoding.encode(content, disallowed_special=())
        tail = _CLOSE + (_GENERATION if generation_prompt else 0)
        return [-1] * _OPEN + ids + [-2] * tail


class _NotCached(Exception):
    pass


def load_tiktoken(name: str) -> TiktokenEncoder:
    """A tiktoken encoder from the local cache only; never a download."""
    try:
        import tiktoken
        import tiktoken.load
    except ImportError as exc:
        raise TokenizerUnavailable(f"no server offers /tokenize and tiktoken is not installed ({exc})") from None

    real_read = tiktoken.load.read_file

    def read_local_only(blobpath: str) -> bytes:
        if "://" in blobpath:  # tiktoken asks for a download only after a cache miss
            raise _NotCached(blobpath)
        return real_read(blobpath)

    tiktoken.load.read_file = read_local_only
    try:
        encoding = tiktoken.get_encoding(name)
    except _NotCached as exc:
        raise TokenizerUnavailable(
            f"no server offers /tokenize, and tiktoken's {name!r} encoding is not cached in "
            f"{tiktoken_cache_dir() or '(caching disabled)'}: tiktoken downloads it on first use "
            f"({exc.args[0]}) and kvprobe downloads nothing at run time. Run "
            f"`python -c \"import tiktoken; tiktoken.get_encoding('{name}')\"` once where there is "
            "network and copy the cache directory here (set TIKTOKEN_CACHE_DIR), or measure servers "
            "that serve /tokenize") from None
    except ValueError as exc:
        raise TokenizerUnavailable(f"needle.tiktoken_encoding: {exc}") from None
    finally:
        tiktoken.load.read_file = real_read
    return TiktokenEncoder(encoding)
