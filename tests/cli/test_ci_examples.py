"""The CI examples pass their linters: GitHub's workflow schema and GitLab's CI schema, as vendored
by check-jsonschema (offline), and they never pipe kvprobe into `tee`, which would swallow its exit."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

EXAMPLES = Path(__file__).parents[2] / "examples" / "ci"
SCHEMAS = {"github-actions.yml": "vendor.github-workflows", "gitlab-ci.yml": "vendor.gitlab-ci"}


@pytest.mark.parametrize(("name", "schema"), SCHEMAS.items())
def test_the_example_passes_its_schema(name: str, schema: str) -> None:
    done = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema, str(EXAMPLES / name)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def canary_lines(name: str) -> list[str]:
    doc = yaml.safe_load((EXAMPLES / name).read_text())
    if name == "github-actions.yml":
        scripts = [s.get("run", "") for s in doc["jobs"]["canary"]["steps"]]
    else:
        scripts = doc["kvprobe-canary"]["script"]
    return [line for script in scripts for line in script.splitlines() if "kvprobe canary" in line]


@pytest.mark.parametrize("name", SCHEMAS)
def test_the_canary_is_run_for_its_exit_code(name: str) -> None:
    lines = canary_lines(name)
    assert lines, "the example runs the canary"
    assert not any("|" in line for line in lines)  # no pipe: `kvprobe ... | tee` hands the job tee's exit
    text = (EXAMPLES / name).read_text()
    assert "--junit" in text and "kvprobe-run/" in text  # the JUnit file and the run directory are kept


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yml")), ids=lambda p: p.name)
def test_an_example_installs_a_named_source_never_the_bare_name(path) -> None:
    """`pip install kvprobe` installs whatever the default index serves under that name."""
    text = path.read_text()
    assert 'pip install "$KVPROBE_PACKAGE"' in text and 'KVPROBE_PACKAGE: "kvprobe @ git+' in text
    assert not re.search(r"pip install\s+kvprobe\b", text)
