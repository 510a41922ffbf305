"""Token ids a server makes of kvprobe's shipped filler: the prompts that fill a pool or pad a smoke."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvprobe.corpus import filler_text

if TYPE_CHECKING:
    from kvprobe.server.client import Client


async def filler_ids(client: Client, tokens: int, *, prefix: str = "",
                     add_special_tokens: bool | None = None) -> list[int]:
    """Exactly `tokens` token ids of `prefix` + filler from the server's /tokenize, the filler
    repeated if it is short (empty if the server returns no ids)."""
    ids = await client.tokenize(prompt=(prefix + filler_text())[: tokens * 8], add_special_tokens=add_special_tokens)
    if not ids:
        return []
    return (ids * (tokens // len(ids) + 1))[:tokens]
