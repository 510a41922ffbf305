"""The operator's own perplexity data: a JSONL file of passages, or an lm-eval task folder.

`[perplexity] passages = "file.jsonl"` (one `{"text": ...}` per line) becomes an lm-eval task of its
own, written once to a folder named by the file's bytes, with the shipped task's guarantees: read
locally, max_length from the server, long passages in rolling windows. `[perplexity] include_path`
points lm-eval at the operator's task folder, with `task` naming the task in it. A file that is missing,
empty or malformed is one line at config time, before any server is asked anything.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from kvprobe.corpus import TASKS_DIR

if TYPE_CHECKING:
    from kvprobe.config import PerplexitySettings

OWN_TASK = "kvprobe_ppl_own"
_TEMPLATE = TASKS_DIR / "perplexity" / "kvprobe_ppl.yaml"


def task_source(settings: PerplexitySettings) -> tuple[str, Path]:
    """(lm-eval task name, folder it is in) for these settings."""
    if settings.passages:
        return OWN_TASK, own_task_dir(Path(settings.passages))
    if settings.include_path:
        return settings.task, Path(settings.include_path)
    return settings.task, TASKS_DIR


def own_task_dir(passages: Path, home: Path | None = None) -> Path:
    """A task folder for one passages file, keyed by its bytes (the same file is the same task)."""
    data = passages.read_bytes()
    target = (home or Path.home() / ".cache" / "kvprobe" / "tasks") / hashlib.sha256(data).hexdigest()[:16]
    if (target / f"{OWN_TASK}.yaml").exists():
        return target
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "passages.jsonl").write_bytes(data)
    shutil.copy(TASKS_DIR / "perplexity" / "dataset.py", tmp / "dataset.py")
    yaml = _TEMPLATE.read_text().replace("task: kvprobe_ppl", f"task: {OWN_TASK}")
    (tmp / f"{OWN_TASK}.yaml").write_text(f"# Written by kvprobe from {passages}.\n" + yaml)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target
