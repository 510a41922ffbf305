"""[perplexity] passages / include_path: the operator's own data, checked before any server is asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvprobe.config import check_passages, load_config
from kvprobe.errors import ConfigError
from kvprobe.quality import lmeval
from kvprobe.quality.own_data import OWN_TASK, own_task_dir

SERVERS = ('[[server]]\nname = "a"\nurl = "http://127.0.0.1:1"\nrole = "reference"\n'
           '[[server]]\nname = "b"\nurl = "http://127.0.0.1:2"\n')


def servers_toml(tmp_path: Path, perplexity: str) -> Path:
    path = tmp_path / "servers.toml"
    path.write_text(f"[perplexity]\n{perplexity}\n\n{SERVERS}")
    return path


@pytest.mark.parametrize(("content", "why"), [
    (None, "cannot read: No such file or directory"),
    ("", "no passages (one {\"text\": ...} per line)"),
    ('{"text": "fine"}\nnot json\n', "line 2: not JSON: give one {\"text\": ...} per line"),
    ('{"body": "x"}\n', "line 1: needs a non-empty \"text\" string"),
])
def test_a_bad_passages_file_is_one_line_at_config_time(tmp_path: Path, content: str | None, why: str) -> None:
    if content is not None:
        (tmp_path / "mine.jsonl").write_text(content)
    path = servers_toml(tmp_path, 'passages = "mine.jsonl"')  # relative to servers.toml
    with pytest.raises(ConfigError) as err:
        load_config(path)  # the server at 127.0.0.1:1 is never asked anything
    where = f"{path}: perplexity.passages {tmp_path / 'mine.jsonl'}"
    assert err.value.problems == [f"{where}: {why}" if content is None or not content else f"{where} {why}"]


def test_a_missing_task_folder_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(servers_toml(tmp_path, 'include_path = "tasks"'))
    assert err.value.problems[0].endswith(f"perplexity.include_path {tmp_path / 'tasks'}: not a folder")


def test_own_passages_become_an_lm_eval_task_read_locally(tmp_path: Path) -> None:
    rows = [{"text": f"Passage {i}: the operator's own words, " * 20} for i in range(3)]
    mine = tmp_path / "mine.jsonl"
    mine.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert check_passages(mine) == 3
    folder = own_task_dir(mine, tmp_path / "cache")
    assert own_task_dir(mine, tmp_path / "cache") == folder  # the same bytes, the same task
    passages = lmeval.task_passages(OWN_TASK, None, folder)
    assert [p.text for p in passages] == [r["text"] for r in rows]
