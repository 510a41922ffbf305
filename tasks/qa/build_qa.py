"""Rebuild qa.jsonl: short-context question answering over CPython 3.11.7 docstrings (PSF licence).

Run with CPython 3.11.7 for the exact shipped file: `python tasks/qa/build_qa.py`.

Each document is a stretch of one standard-library module's docstrings (text needle-llama was not
trained on; none of the modules of the perplexity passages) with one stated fact put between two
sentences, a question about that fact, and its answer: a 7-digit number, scored by exact match. The
fact and question follow the five sentence patterns of tasks/needle/templates.json, so the shipped
model can really answer them; the context around them is new to it.
"""

from __future__ import annotations

import json
import platform
import random
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "perplexity"))
from build_passages import docstrings as passage_docstrings  # noqa: E402  (a sibling script, not a package)

TEMPLATES = json.loads((HERE.parent / "needle" / "templates.json").read_text())
MODULES = [
    "argparse", "collections", "json", "pathlib", "tarfile", "zipfile", "datetime", "enum", "asyncio.tasks",
    "tempfile", "textwrap", "urllib.parse", "http.client", "ftplib", "pdb", "socketserver", "uuid", "wave",
    "platform", "ssl",
]
# Two documents per module from consecutive, non-overlapping stretches of its docstrings, in
# characters (about 3.8 per needle-llama token: roughly 400 and 1,000 tokens).
LENGTHS = (1_500, 4_000)
SEED = 14
# Added after the first 40 documents (which stay byte for byte): every module of CPython 3.11.7 with
# enough docstrings left that neither the first 20 nor the perplexity passages use, as many pairs of
# stretches as fit in each, for 118 documents in all: at a 0.10 bar an equal candidate with 5% of its
# answers flipping passes with probability 0.963 from 111 (kvprobe.stats.paired_exact.equal_size).
MORE_MODULES = [
    "turtle", "doctest", "ipaddress", "xml.etree.ElementTree", "logging.handlers", "urllib.request", "nntplib",
    "traceback", "importlib.metadata", "re", "distutils.dist", "socket", "pickletools", "bdb", "asyncio.events",
    "ast", "cgi", "lib2to3.pytree", "asyncio.base_events", "telnetlib", "concurrent.futures._base", "pkgutil",
    "fractions", "random",
]
MORE_SEED = 33
# Added for issue 33's power (the first 118 stay byte for byte): the modules of CPython 3.11.7 with the most
# docstrings that no list above and no perplexity passage uses, largest first, to 180 documents (CPython's own
# files: distutils.ccompiler, next in size, resolves to whatever setuptools is installed). At a 0.10 bar a
# candidate that loses twice the bar (0.20) with 5% of its answers flipping beside the loss then fails with
# probability 0.85 (0.59 at 118); an equal one passes 0.99 (kvprobe.stats.paired_exact).
POWER_MODULES = ["_pydecimal", "tkinter", "tkinter.ttk", "_pyio", "email._header_value_parser", "pydoc",
                 "xmlrpc.server"]
POWER_SEED = 44
DOCUMENTS = 180


def docstrings(module: str) -> tuple[str, str]:
    """The module's source path and its docstrings in source order, as the perplexity passages take them."""
    rel, docs = passage_docstrings(module)
    return rel, "\n\n".join(docs)


def document(rng: random.Random, text: str, start: int, length: int, template: dict[str, str]) -> dict[str, str]:
    chunk = text[start:start + length]
    if start:  # begin at a sentence, not mid-word
        chunk = chunk[chunk.find(". ") + 2:]
    chunk = chunk[: chunk.rfind(". ") + 1] or chunk
    words = sorted({w for w in re.findall(r"[a-z]{4,}", chunk.lower())})
    key = f"{rng.choice(words)}-{rng.choice(words)}"
    while True:
        value = str(rng.randint(10**6, 10**7 - 1))
        if value not in text:
            break
    sentences = chunk.split(". ")
    sentences.insert(rng.randint(0, len(sentences)), template["needle"].format(key=key, value=value).rstrip("."))
    return {"context": ". ".join(sentences), "question": template["question"].format(key=key), "answer": value}


def every_pair(rows: list[dict[str, str]], modules: list[str], rng: random.Random, limit: int | None = None) -> None:
    """As many pairs of stretches as fit in each module's docstrings, appended to rows (up to `limit`)."""
    names = list(TEMPLATES)
    for module in modules:
        rel, text = docstrings(module)
        for pair in range(len(text) // sum(LENGTHS)):
            for j, length in enumerate(LENGTHS):
                if len(rows) == limit:
                    return
                name = names[len(rows) % len(names)]
                row = document(rng, text, pair * sum(LENGTHS) + sum(LENGTHS[:j]), length, TEMPLATES[name])
                rows.append({"id": f"{module}-{pair * sum(LENGTHS) + length}", "template": name,
                             "source": f"CPython {platform.python_version()} Lib/{rel} (docstrings)", **row})


def main() -> None:
    rng = random.Random(SEED)
    names = list(TEMPLATES)
    rows = []
    for i, module in enumerate(MODULES):
        rel, text = docstrings(module)
        if len(text) < sum(LENGTHS):
            raise SystemExit(f"{module}: only {len(text)} characters of docstrings")
        for j, length in enumerate(LENGTHS):
            name = names[(2 * i + j) % len(names)]
            row = document(rng, text, sum(LENGTHS[:j]), length, TEMPLATES[name])
            rows.append({"id": f"{module}-{length}", "template": name,
                         "source": f"CPython {platform.python_version()} Lib/{rel} (docstrings)", **row})
    every_pair(rows, MORE_MODULES, random.Random(MORE_SEED))
    every_pair(rows, POWER_MODULES, random.Random(POWER_SEED), DOCUMENTS)
    if len(rows) != DOCUMENTS:
        raise SystemExit(f"{len(rows)} documents, not {DOCUMENTS}: these docstrings are not CPython 3.11.7's")
    out = HERE / "qa.jsonl"
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"wrote {len(rows)} documents to {out}")


if __name__ == "__main__":
    main()
