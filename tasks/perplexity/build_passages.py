"""Rebuild passages.jsonl: docstrings of CPython 3.11.7 standard-library modules (PSF licence).

Run with CPython 3.11.7 for the exact shipped file: `python tasks/perplexity/build_passages.py`.
needle-llama was trained on pydoc topics and licence texts, not on these docstrings, so they are
unseen text in the model's own domain (technical English with some code).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import platform
from pathlib import Path

# One passage per module, so documents are independent units for the paired bootstrap.
MODULES = [
    "subprocess", "typing", "imaplib", "difflib", "logging", "statistics", "email.message",
    "http.cookiejar", "unittest.case", "unittest.mock", "inspect", "shutil", "configparser",
    "optparse", "threading", "smtplib",
    # 17: the fewest at which an equal candidate passes the 1% bar with the share issue 33 asked of it
    "http.server",
]
# ~3,000 needle-llama tokens: past a 2,048-token prefill chunk, far under 8,192.
MIN_CHARS, MAX_CHARS = 9_000, 12_000


def docstrings(module: str) -> tuple[str, list[str]]:
    spec = importlib.util.find_spec(module)
    assert spec and spec.origin
    tree = ast.parse(Path(spec.origin).read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 80:
                found.append((getattr(node, "lineno", 0), doc))
    found.sort()
    rel = Path(spec.origin).as_posix().split("/lib/python3.11/")[-1]
    return rel, [doc for _, doc in found]


def passage(docs: list[str]) -> str:
    text = ""
    for doc in docs:
        if len(text) >= MIN_CHARS:
            break
        if text and len(text) + 2 + len(doc) > MAX_CHARS:
            continue
        text = f"{text}\n\n{doc}" if text else doc
    return text


def main() -> None:
    rows = []
    for module in MODULES:
        rel, docs = docstrings(module)
        text = passage(docs)
        if len(text) < MIN_CHARS:
            raise SystemExit(f"{module}: only {len(text)} characters of docstrings")
        rows.append({"id": module, "source": f"CPython {platform.python_version()} Lib/{rel} (docstrings)",
                     "text": text})
    out = Path(__file__).with_name("passages.jsonl")
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"wrote {len(rows)} passages to {out}")


if __name__ == "__main__":
    main()
