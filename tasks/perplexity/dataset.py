"""The kvprobe_ppl dataset: passages.jsonl next to this file, read locally (no network, no cache)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PASSAGES = Path(__file__).with_name("passages.jsonl")


def load(**_: Any) -> dict[str, Any]:
    import datasets

    # The same loader serves an operator's own passages: kvprobe copies it next to their file.
    rows = [json.loads(line) for line in PASSAGES.read_text().splitlines() if line.strip()]
    return {"test": datasets.Dataset.from_list(rows)}
