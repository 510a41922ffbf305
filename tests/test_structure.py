"""The package's shape, held by tests: no import cycle at any level, a root that holds only the
foundation, data flowing one way between the stage packages, and one list of probes that every
per-probe table follows.

Imports are read from the source (an AST walk), so a function-level import or one under
TYPE_CHECKING counts like any other: a cycle that works only because an import is deferred is
still a cycle. An edge is what a module names: `from kvprobe.memmap import build` is an import of
kvprobe.memmap's __init__, `from kvprobe.memmap.dtypes import X` of the dtypes module. The parent
packages Python runs on the way are not counted, so a package's __init__ may re-export its own
modules (httpx's pattern) without that reading as a cycle.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import kvprobe
from kvprobe.config import Config, parse_config
from kvprobe.evaluate.plan import WHOLE_SIZE
from kvprobe.probes import ORDER, PROBES, default_probes, help_text
from kvprobe.run.budget import BudgetCost, Speed
from kvprobe.verdict.evidence import READERS
from kvprobe.verdict.sealed.checks import RULES3_PROBES

PACKAGE = Path(kvprobe.__file__).parent

# The root holds the foundation every stage may import and that imports no stage: errors and settings,
# plus servers.toml's model (config), the one knob a comparison may change (knob), atomic writes
# (disk) and the text shipped in tasks/ (corpus). Each imports nothing from kvprobe but errors/settings.
ROOT_MODULES = {"__init__", "errors", "settings", "config", "knob", "disk", "corpus"}
FOUNDATION = ROOT_MODULES - {"__init__"}

# Stage packages, lowest first: a module may import from its own package, the foundation, and any
# package listed before its own. kvprobe.probes/__init__ is a leaf (the registry), readable by the probes
# and every stage above them.
LAYERS = ["stats", "memmap", "server", "quality", "needle", "load", "run", "probes", "verdict", "report",
          "evaluate", "cli"]
LEAVES = {"kvprobe.probes"}  # the registry: imports nothing from kvprobe at run time but config/run types


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _owner(name: str) -> str | None:
    """The kvprobe module an imported dotted name lives in (a name imported from a module is not one)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """Every kvprobe module `module` imports, at any level, with the packages that importing runs."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        for target in targets:
            if not target.startswith("kvprobe"):
                continue
            owner = _owner(target)
            if owner:
                found.add(owner)
    found.discard(module)
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_deferred_cycle() -> None:
    # The check itself can fail: a function-level import that closes a loop is a cycle.
    source = {"kvprobe.a": "def f():\n    from kvprobe.b import g\n", "kvprobe.b": "from kvprobe.a import f\n"}
    graph = {}
    for name, text in source.items():
        graph[name] = {
            n.module for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom) and n.module}
    assert cycles(graph) == [["kvprobe.a", "kvprobe.b"]]


def test_the_walk_sees_function_level_and_type_checking_imports() -> None:
    assert "kvprobe.server.client" in GRAPH["kvprobe.server.tokens"]  # under TYPE_CHECKING
    assert "kvprobe.verdict.design" in GRAPH["kvprobe.evaluate.plan"]  # inside a function


def test_no_import_cycle_inside_kvprobe() -> None:
    assert cycles(GRAPH) == []


def test_the_root_holds_only_the_foundation() -> None:
    root = {p.stem for p in PACKAGE.glob("*.py")}
    assert root == ROOT_MODULES, f"modules at kvprobe/'s root beyond the foundation: {sorted(root - ROOT_MODULES)}"
    for name in FOUNDATION:
        above = {m for m in GRAPH[f"kvprobe.{name}"] if m not in {"kvprobe.errors", "kvprobe.settings"}}
        assert not above, f"kvprobe.{name} is foundation but imports {sorted(above)}"


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_data_flows_one_way_between_the_stages() -> None:
    upward = []
    for module, targets in GRAPH.items():
        own = _stage(module)
        if own is None or module in LEAVES:
            continue
        for target in targets:
            stage = _stage(target)
            if stage is None or stage == own or target in LEAVES:
                continue
            if LAYERS.index(stage) > LAYERS.index(own):
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_nothing_below_the_probes_reads_the_registry() -> None:
    # run/ is what every probe is handed (the context, the store, the budget's generic parts): a table of
    # probes kept there or lower is one a new probe is never added to. Each probe's module models its own
    # cost; kvprobe.evaluate.budget walks the registry.
    below = LAYERS[: LAYERS.index("probes")]
    found = [f"{module} -> {target}" for module, targets in GRAPH.items() if _stage(module) in below
             for target in targets if target.startswith("kvprobe.probes")]
    assert found == []


def test_the_verdict_imports_no_engine() -> None:
    # `kvprobe verify` re-derives a verdict from recorded numbers; a rule an engine applies too (whether the
    # client limited a load case) sits in stats/, below both.
    engines = {"quality", "needle", "load"}
    found = [f"{module} -> {target}" for module, targets in GRAPH.items() if _stage(module) == "verdict"
             for target in targets if _stage(target) in engines]
    assert found == []


def test_nothing_below_the_cli_imports_it_and_the_testbed_is_no_product_dependency() -> None:
    for module, targets in GRAPH.items():
        if not module.startswith(("kvprobe.cli", "kvprobe.testbed")):
            assert not {t for t in targets if t.startswith("kvprobe.cli")}, module
            assert not {t for t in targets if t.startswith("kvprobe.testbed")}, module


def test_probes_and_engines_never_import_the_report() -> None:
    # A probe shows its checks and draws its charts through ctx.reporter (kvprobe.run.context).
    for module, targets in GRAPH.items():
        if _stage(module) in {"probes", "quality", "needle", "load", "memmap", "server", "run", "verdict", "stats"}:
            assert not {t for t in targets if t.startswith("kvprobe.report")}, module


def test_one_list_of_probes() -> None:
    assert list(PROBES) == list(ORDER)
    assert set(READERS) == set(PROBES), "every probe needs its reader in kvprobe.verdict.evidence"
    for name, probe in PROBES.items():
        assert probe.module().__name__ == f"kvprobe.probes.{name}"
        assert callable(probe.run)
    assert default_probes() == ["capacity", "perplexity", "agreement", "needle", "load"]
    assert "fill" in help_text() and "tasks" in help_text()


def test_every_per_probe_table_follows_the_registry() -> None:
    """A sized probe models its own cost (budget_cost) and no other probe has one; what orders the budget's
    growth and re-plans is a sized probe; every table keyed by probe names only registered ones."""
    sized = {name for name, probe in PROBES.items() if probe.budget == "sized"}
    for name, probe in PROBES.items():
        assert (probe.budget_cost is not None) == (name in sized), f"{name}: budget {probe.budget!r}"
    assert {name for name, probe in PROBES.items() if probe.grow_rank is not None or probe.replans} <= sized
    ranks = [probe.grow_rank for probe in PROBES.values() if probe.grow_rank is not None]
    assert len(ranks) == len(set(ranks)), "grow ranks order the growth: no two alike"
    assert set(WHOLE_SIZE) <= sized, "kvprobe check sizes a probe in its budget_cost's units"
    assert set(RULES3_PROBES) <= set(PROBES)


TWO_SERVERS = parse_config({"server": [{"name": "a", "url": "http://127.0.0.1:1", "role": "reference"},
                                      {"name": "b", "url": "http://127.0.0.1:2"}]})


@pytest.mark.parametrize("name", list(PROBES))
def test_every_probe_module_fills_the_seam(name: str) -> None:
    module = PROBES[name].module()
    assert inspect.iscoroutinefunction(module.run), f"{name}.run must be async"
    assert list(inspect.signature(module.run).parameters) == ["ctx"], f"{name}.run takes the EvalContext only"
    for hook in ("preflight", "cannot_run", "budget_cost"):
        if (fn := getattr(module, hook, None)) is not None:
            assert not inspect.iscoroutinefunction(fn), f"{name}.{hook} runs before any request: no await"
    for hook in ("preflight", "cannot_run"):
        if (fn := getattr(module, hook, None)) is not None:
            assert len(inspect.signature(fn).parameters) == 1, f"{name}.{hook} takes one argument"
    if (cost := getattr(module, "budget_cost", None)) is not None:
        assert list(inspect.signature(cost).parameters) == ["config", "servers", "speed", "max_model_len"], name
        priced = cost(TWO_SERVERS, 2, Speed(1_000.0), 8192)
        assert isinstance(priced, BudgetCost) and priced.unit_s > 0 and priced.least >= 1, name
        sections, size = priced.resize(priced.least)
        assert set(sections) <= set(Config.model_fields) and size, f"{name}: resized into servers.toml's tables"


@pytest.mark.parametrize("name", ["Client", "RunDir", "PROBES", "write_verdict", "run_eval"])
def test_the_public_api_resolves_lazily(name: str) -> None:
    assert getattr(kvprobe, name) is not None
    assert name in kvprobe.__all__


def test_verify_and_the_rules_load_without_the_http_stack_or_lm_eval() -> None:
    # An auditor re-deriving a verdict needs neither a server nor lm-eval: verify must not pull them in.
    code = ("import sys, kvprobe.verdict.verify; "
            "print(sorted(m for m in ('httpx', 'lm_eval', 'matplotlib', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
