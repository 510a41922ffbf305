"""kvprobe's lm-eval model: lm-eval's local-completions with every rolling window of every passage in
flight at once, and each answer checked before lm-eval sums it.

It imports lm-eval, so only kvprobe.quality.lmeval imports it, on first use, after settings has put the
Hugging Face libraries offline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from lm_eval import utils as lm_utils
from lm_eval.models.openai_completions import LocalCompletionsAPI

from kvprobe.server.untrusted import check_logprobs

WindowCallback = Callable[[int, int], None]  # (windows done, windows in all)


class KvprobeCompletions(LocalCompletionsAPI):
    """lm-eval's local-completions with all windows of all passages scheduled together."""

    def __init__(self, *, on_window: WindowCallback | None = None, server: str = "server", **kwargs: Any):
        super().__init__(**kwargs)
        self.on_window = on_window
        self.server = server
        self.windows_sent = 0

    def parse_logprobs(self, outputs: Any, tokens: Any = None, ctxlens: list[int] | None = None,
                       **kwargs: Any) -> list[tuple[float, bool]]:
        """lm-eval's own reading, once what it sums is checked: a NaN logprob would give a NaN
        perplexity, a string one a TypeError deep in lm-eval."""
        check_logprobs(self.server, outputs, ctxlens or [])
        return super().parse_logprobs(outputs, tokens, ctxlens, **kwargs)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        windows: list[tuple[None, list[int], list[int]]] = []
        owners: list[int] = []
        for i, request in enumerate(requests):
            (string,) = request.args
            rolling = lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length - 1, context_len=1)
            for context, continuation in map(lm_utils.make_disjoint_window, rolling):
                windows.append((None, context, continuation))
                owners.append(i)
        inputs, ctxlens, _ = self.batch_loglikelihood_requests([windows])
        self.windows_sent = len(inputs)
        scores = asyncio.run(self._score_all(inputs, ctxlens))
        per_doc: list[list[float]] = [[] for _ in requests]
        for owner, (loglikelihood, _greedy) in zip(owners, scores, strict=True):
            per_doc[owner].append(loglikelihood)
        totals = [sum(parts) for parts in per_doc]  # window order, as lm-eval sums them
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    async def _score_all(self, inputs: list[list[int]], ctxlens: list[int]) -> list[tuple[float, bool]]:
        from aiohttp import ClientSession, ClientTimeout, TCPConnector
        from tenacity import retry, stop_after_attempt, wait_exponential

        call = retry(stop=stop_after_attempt(self.max_retries), reraise=True,
                     wait=wait_exponential(multiplier=0.5, min=1, max=10))(self.amodel_call)
        sem = asyncio.Semaphore(self._concurrent)
        done = 0

        async def one(session: ClientSession, inp: list[int], ctxlen: int) -> tuple[float, bool]:
            nonlocal done
            (score,) = await call(session=session, sem=sem, messages=[inp], generate=False, ctxlens=[ctxlen])
            done += 1
            if self.on_window:
                self.on_window(done, len(inputs))
            return score

        # Longest first, as lm-eval orders them: the long prefills start while short ones fill gaps.
        order = sorted(range(len(inputs)), key=lambda k: -len(inputs[k]))
        async with ClientSession(connector=TCPConnector(limit=self._concurrent, ssl=self.verify_certificate),
                                 timeout=ClientTimeout(total=self.timeout)) as session:
            results = await asyncio.gather(*(one(session, inputs[k], ctxlens[k]) for k in order))
        scores: list[tuple[float, bool]] = [(0.0, False)] * len(inputs)
        for k, score in zip(order, results, strict=True):
            scores[k] = score
        return scores

