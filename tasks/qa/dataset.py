"""The kvprobe_qa dataset: qa.jsonl next to this file, read locally (no network, no cache)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DOCUMENTS = Path(__file__).with_name("qa.jsonl")


def load(**_: Any) -> dict[str, Any]:
    import datasets

    rows = [json.loads(line) for line in DOCUMENTS.read_text().splitlines() if line.strip()]
    return {"test": datasets.Dataset.from_list(rows)}
