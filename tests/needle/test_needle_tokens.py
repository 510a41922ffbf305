"""Token counting without /tokenize: tiktoken from its local cache only, and a clear stop without one."""

from __future__ import annotations

import socket

import pytest
import tiktoken
import tiktoken.load

from kvprobe.errors import TokenizerUnavailable
from kvprobe.needle.tokens import TiktokenEncoder, load_tiktoken
from kvprobe.settings import tiktoken_cache_dir


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Any attempt to open a connection is recorded and refused (as on a box without network)."""
    attempts: list[tuple] = []

    def refuse_connect(self, address, *a, **kw):
        attempts.append(address)
        raise OSError("network is unreachable (test)")

    def refuse_dns(host, port, *a, **kw):
        attempts.append((host, port))
        raise socket.gaierror("no DNS (test)")

    monkeypatch.setattr(socket.socket, "connect", refuse_connect)
    monkeypatch.setattr(socket, "getaddrinfo", refuse_dns)
    return attempts


def test_plain_tiktoken_would_try_the_network(tmp_path, monkeypatch, no_network) -> None:
    # The situation kvprobe guards against: tiktoken's own first use goes online.
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "cl100k_base", raising=False)
    with pytest.raises(Exception):  # noqa: B017 - requests' ConnectionError, whatever its exact class
        tiktoken.get_encoding("cl100k_base")
    assert no_network, "the fixture did not see tiktoken's download attempt"

def test_offline_without_cached_file_stops_with_a_clear_error(tmp_path, monkeypatch, no_network) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "cl100k_base", raising=False)
    real_read = tiktoken.load.read_file
    with pytest.raises(TokenizerUnavailable) as err:
        load_tiktoken("cl100k_base")
    text = str(err.value)
    assert "no server offers /tokenize" in text
    assert f"'cl100k_base' encoding is not cached in {tmp_path}" in text
    assert "kvprobe downloads nothing at run time" in text
    assert "TIKTOKEN_CACHE_DIR" in text
    assert no_network == []  # it never even tried the network
    assert tiktoken.load.read_file is real_read  # the library is left as it was
    assert list(tmp_path.iterdir()) == []


def test_caching_disabled_is_reported_too(monkeypatch, no_network) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "o200k_base", raising=False)
    with pytest.raises(TokenizerUnavailable, match=r"not cached in \(caching disabled\)"):
        load_tiktoken("o200k_base")
    assert no_network == []


def test_unknown_encoding_name_is_named(monkeypatch) -> None:
    with pytest.raises(TokenizerUnavailable, match=r"needle\.tiktoken_encoding: Unknown encoding"):
        load_tiktoken("no_such_encoding")


def test_cache_dir_follows_tiktoken_rules(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    monkeypatch.setenv("DATA_GYM_CACHE_DIR", str(tmp_path))
    assert tiktoken_cache_dir() == str(tmp_path)


async def test_tiktoken_estimate_counts_the_content_plus_a_template_estimate() -> None:
    # A byte-level encoding built here (no file needed): one token per byte.
    encoding = tiktoken.Encoding(name="bytes", pat_str=r"\S+|\s+", mergeable_ranks={bytes([i]): i for i in range(256)},
                                 special_tokens={})
    encoder = TiktokenEncoder(encoding)
    assert encoder.approximate and encoder.name == "tiktoken:bytes"
    with_gen = await encoder.encode("hello")
    without = await encoder.encode("hello", generation_prompt=False)
    assert len(with_gen) == 3 + 5 + 2 + 5 and len(without) == 3 + 5 + 2
    assert with_gen[:8] == without[:8]  # same prefix: depth measurement works on estimates too
