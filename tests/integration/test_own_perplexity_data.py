"""The operator's own perplexity data on the real trio (kvprobe.servers.testbed): a JSONL corpus, and an
lm-eval task folder of their own. The text is the help of stdlib modules the shipped passages do not
use (pydoc, as Python renders it here): close to what needle-llama knows, and not what it was trained
on. (The project's README was tried first: both servers score it near chance, 7.4 bits per byte, so
it cannot tell the wrecking candidate apart: -5.2% [-12.8, +3.3].)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from scenarios import trio

from kvprobe.config import load_config
from kvprobe.corpus import TASKS_DIR
from kvprobe.evaluation import run_eval
from kvprobe.store import RunDir

pytestmark = pytest.mark.integration

MODULES = ("json", "argparse", "csv", "pathlib", "fractions", "heapq")


def paragraphs(n: int) -> list[str]:
    import importlib
    import pydoc

    return [pydoc.plain(pydoc.render_doc(importlib.import_module(m)))[:6000] for m in MODULES[:n]]


def config_file(tmp_path: Path, servers: list[dict], perplexity: str) -> Path:
    path = tmp_path / "servers.toml"
    tables = "".join(f'[[server]]\nname = "{s["name"]}"\nurl = "{s["url"]}"\nrole = "{s["role"]}"\n\n'
                     for s in servers)
    path.write_text(f"[perplexity]\n{perplexity}\nreference_repeats = 2\n\n{tables}")
    return path


async def perplexity_of(path: Path, tmp_path: Path) -> dict:
    run = RunDir.create(tmp_path / "run")
    await run_eval(load_config(path), run, ["perplexity"], Console(stderr=True))
    return run.read_json("perplexity.json")


def pair(vllm_servers) -> list[dict]:
    rows = trio(vllm_servers)
    return [rows[0], next(r for r in rows if r["url"] == vllm_servers["lossy_2x"].url)]


async def test_a_jsonl_corpus_is_scored_against_the_reference(vllm_servers, tmp_path: Path) -> None:
    texts = paragraphs(6)
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    servers = pair(vllm_servers)
    summary = await perplexity_of(config_file(tmp_path, servers, 'passages = "mine.jsonl"'), tmp_path)
    assert summary["task"] == "kvprobe_ppl_own" and summary["passages_file"] == str(tmp_path / "mine.jsonl")
    ref, lossy = (summary["servers"][s["name"]] for s in servers)
    assert abs(ref["delta"]) < 0.001  # the reference's second run against its first: noise only
    assert lossy["delta"] > 0.01 and lossy["outcome"] == "fail"  # the wrecking 2x fails on this text too
    assert len(summary["passages"]) == len(texts)  # every line of the file was scored


async def test_an_lm_eval_task_folder_of_ones_own(vllm_servers, tmp_path: Path) -> None:
    folder = tmp_path / "my_tasks"
    folder.mkdir()
    shutil.copy(TASKS_DIR / "perplexity" / "dataset.py", folder / "dataset.py")
    (folder / "passages.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in paragraphs(4)))
    yaml = (TASKS_DIR / "perplexity" / "kvprobe_ppl.yaml").read_text().replace("task: kvprobe_ppl", "task: my_ppl")
    (folder / "my_ppl.yaml").write_text(yaml)
    servers = pair(vllm_servers)
    summary = await perplexity_of(config_file(tmp_path, servers, 'task = "my_ppl"\ninclude_path = "my_tasks"'),
                                  tmp_path)
    assert summary["task"] == "my_ppl"
    # The reference's second run against its first: run-to-run noise, a small fraction of the 1% bar.
    assert abs(summary["servers"][servers[0]["name"]]["delta"]) < 0.001
    assert summary["servers"][servers[1]["name"]]["delta"] > 0.01
