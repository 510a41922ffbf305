"""The needle plan: how long prompts may be, which cases, and their exact text, built once with one
tokenizer and sent unchanged to every server. Saved in the run directory so a resumed run asks
exactly the same questions."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from kvprobe.config import NeedleSettings
from kvprobe.corpus import filler_text
from kvprobe.disk import json_digest
from kvprobe.errors import ConfigError
from kvprobe.needle.cases import CaseSpec, load_templates, resolve_grid
from kvprobe.needle.placement import Filler, place, tokens_per_word
from kvprobe.needle.tokens import Encoder
from kvprobe.server import fit

# With an estimated tokenizer the default longest prompt keeps this share of the room, so an
# underestimate still fits.
APPROXIMATE_MARGIN = 0.9


def cap_misfit(settings: NeedleSettings, max_model_lens: dict[str, int | None]) -> fit.CapMisfit | None:
    """The answer cap (max_tokens) leaves no room for a prompt on the tightest server."""
    return fit.cap_misfit("needle", "max_tokens", settings.max_tokens, max_model_lens)


def prompt_room(settings: NeedleSettings, max_model_lens: dict[str, int | None]) -> int | None:
    """The longest prompt (chat template included) every server accepts with max_tokens left for
    the answer; refuses up front, with the numbers, an answer cap or any configured length that does
    not fit. (Whether a misfit is the operator's to fix or leaves the probe not measured is the fit
    phase's call: kvprobe.probes.needle.cannot_run.)"""
    tight = fit.tightest(max_model_lens)
    if tight is None:
        if settings.lengths:
            return None
        raise ConfigError(["needle: no server reports max_model_len (/v1/models): give needle.lengths "
                           "in servers.toml"])
    if misfit := cap_misfit(settings, max_model_lens):
        raise ConfigError([misfit.error()])
    tightest, limit = tight
    room = limit - settings.max_tokens
    too_long = [n for n in settings.lengths or [] if n > room]
    if too_long:
        n, also = too_long[-1], ", ".join(map(str, too_long[:-1]))
        raise ConfigError([
            f"needle.lengths: {n} tokens + max_tokens {settings.max_tokens} = {n + settings.max_tokens} is over "
            f"max_model_len {limit} of server {tightest!r}{f' (so is {also})' if also else ''}: the longest prompt "
            f"that fits is {room} tokens"])
    return room


def grid(settings: NeedleSettings, room: int | None, approximate: bool) -> tuple[list[int], list[float]]:
    largest = room if room is not None else 0
    if approximate and not settings.lengths:
        largest = int(largest * APPROXIMATE_MARGIN)
    return resolve_grid(settings, largest)


def fingerprint(settings: NeedleSettings, lengths: list[int], depths: list[float], tokenizer: str,
                model: str | None) -> str:
    """Identifies a plan: same settings, grid, tokenizer, model and filler give the same cases."""
    return json_digest({
        "settings": settings.model_dump(mode="json", exclude={"concurrency", "stream"}),
        "lengths": lengths, "depths": depths, "tokenizer": tokenizer, "model": model,
        "filler": hashlib.sha256(filler_text().encode()).hexdigest(),
    }, 16)


async def build_cases(
    specs: list[CaseSpec],
    encoder: Encoder,
    filler: Filler,
    *,
    concurrency: int = 4,
    on_done: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Place every case with `encoder`; returns JSON-ready case dicts (spec + text + token counts)."""
    templates = load_templates()
    tpw = await tokens_per_word(encoder, filler)
    gate = asyncio.Semaphore(concurrency)

    async def one(spec: CaseSpec) -> dict[str, Any]:
        async with gate:
            placed = await place(
                encoder=encoder, filler=filler, needle=spec.needle(templates), question=spec.question(templates),
                target_length=spec.target_length, target_depth=spec.target_depth, start=spec.filler_start,
                tpw=tpw)
        if on_done:
            on_done()
        return {**spec.to_dict(), **asdict(placed)}

    return list(await asyncio.gather(*(one(s) for s in specs)))

