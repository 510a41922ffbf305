"""A passage against a server's limits: split into windows (never cut), chunk crossing recorded."""

from __future__ import annotations

import json

import pytest

from kvprobe.corpus import TASKS_DIR
from kvprobe.quality.passages import plan_passage, rolling_windows, split_ids


def test_a_passage_that_fits_is_one_window():
    assert rolling_windows(3000, 8192) == [3000]


def test_a_passage_too_long_for_max_model_len_is_split_and_every_token_is_kept():
    windows = rolling_windows(20_000, 8192)
    assert windows == [8190, 8190, 3620]
    assert sum(windows) == 20_000
    ids = list(range(20_000))
    parts = split_ids(ids, 8192)
    assert [len(p) for p in parts] == windows
    assert [t for p in parts for t in p] == ids  # nothing dropped, nothing repeated
    # Each request (context token + window) plus the one generated token fits the server.
    assert all(len(p) + 1 + 1 <= 8192 for p in parts)


def test_tiny_max_model_len_is_refused():
    with pytest.raises(ValueError, match="max_model_len"):
        rolling_windows(10, 2)


@pytest.mark.parametrize(("tokens", "crossed"), [(2046, False), (2047, False), (2048, True), (9000, True)])
def test_chunk_crossing_counts_the_context_token(tokens, crossed):
    # The request is the prefix token plus the passage's first window.
    plan = plan_passage(0, "p", "text", tokens, 8192, 2048)
    assert plan.prompt_tokens == min(tokens, 8190) + 1
    assert plan.crossed_chunk is crossed


def test_plan_records_windows_for_a_long_passage():
    plan = plan_passage(3, "long", "é" * 10, 10_000, 4096, 2048)
    assert plan.windows == [4094, 4094, 1812]
    assert plan.bytes == 20 and plan.crossed_chunk
    assert plan.to_dict()["id"] == "long"


def test_shipped_passages_are_long_enough_and_not_the_memorised_text():
    rows = [json.loads(line) for line in (TASKS_DIR / "perplexity" / "passages.jsonl").read_text().splitlines()]
    assert len(rows) == 17 and len({r["id"] for r in rows}) == 17
    memorised = (TASKS_DIR / "filler" / "pydoc_topics.txt").read_text()
    for row in rows:
        assert 9_000 <= len(row["text"]) <= 12_000
        assert row["source"].startswith("CPython 3.11.7 Lib/")
        # No 200-character stretch of a passage is in the memorised pydoc topics.
        text = row["text"]
        assert not any(text[i:i + 200] in memorised for i in range(0, len(text) - 200, 100))
