"""Does a probe's request fit the servers' context? The arithmetic the needle and tasks probes share.

An answer cap (needle.max_tokens, tasks.max_gen_toks) is taken from the tightest server's
max_model_len before any prompt: what is left must hold a prompt. When it cannot, whose setting it is
decides what happens (kvprobe.evaluate.orchestrate's fit phase): a cap the operator wrote in servers.toml is
theirs to fix (`error`: ConfigError, exit 2); kvprobe's own default leaves the probe not measured,
with the `reason`, and the run goes on.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

# The shortest prompt worth sending: a chat template, a question and a little context.
MIN_PROMPT_TOKENS = 64


def tightest(max_model_lens: dict[str, int | None]) -> tuple[str, int] | None:
    """(server, max_model_len) of the server with the smallest context; None when none reports one."""
    known = {name: n for name, n in max_model_lens.items() if n}
    if not known:
        return None
    name = min(known, key=lambda n: known[n])
    return name, known[name]


def written(settings: BaseModel, *fields: str) -> bool:
    """Whether servers.toml sets any of `fields` (not kvprobe's default): pydantic's fields_set. A
    model_copy(update=...) adds its keys to that set, so settings kvprobe resizes are built keeping the
    operator's (kvprobe.evaluate.canary.canary_config); the budget resizes only counts, never what must fit."""
    return any(f in settings.model_fields_set for f in fields)


def suggested_cap(max_model_len: int) -> int | None:
    """A cap that leaves three quarters of the context to the prompt, in steps of 16; None when the
    context is too short for any cap beside a MIN_PROMPT_TOKENS prompt."""
    cap = min(max_model_len // 4 // 16 * 16, max_model_len - MIN_PROMPT_TOKENS)
    return cap if cap >= 16 else None


@dataclass(frozen=True)
class CapMisfit:
    """An answer cap that leaves less than MIN_PROMPT_TOKENS of the tightest server's context."""

    table: str  # "needle"
    key: str  # "max_tokens"
    cap: int
    server: str
    max_model_len: int

    @property
    def room(self) -> int:
        return max(self.max_model_len - self.cap, 0)

    def error(self) -> str:
        """For a cap the operator wrote: one line naming the setting and the fix."""
        return (f"{self.table}.{self.key} = {self.cap} leaves {self.room} tokens for the prompt within max_model_len "
                f"{self.max_model_len} of server {self.server!r}: lower {self.table}.{self.key}")

    def reason(self) -> str:
        """For kvprobe's default cap: why the probe is not measured, and the setting that would measure it."""
        fix = suggested_cap(self.max_model_len)
        example = f" (e.g. {fix})" if fix else ""
        return (f"its default answer cap ({self.key} {self.cap}) leaves {self.room} tokens for a prompt within "
                f"max_model_len {self.max_model_len} of server {self.server!r}; set [{self.table}] {self.key}"
                f"{example} to measure it")


def cap_misfit(table: str, key: str, cap: int, max_model_lens: dict[str, int | None]) -> CapMisfit | None:
    """The misfit of answer cap `cap` on the tightest server; None when it leaves room for a prompt or
    no server reports its max_model_len."""
    tight = tightest(max_model_lens)
    if tight is None or tight[1] - cap >= MIN_PROMPT_TOKENS:
        return None
    return CapMisfit(table, key, cap, *tight)
