"""`kvprobe demo --hybrid`: the third trap (more KV bytes can free nothing) and its lever, end to end on needle-hybrid.

Each comparison of kvprobe.testbed.hybrid is its own servers.toml (its own knob and reference) and
its own run directory: fp8 KV frees nothing (AVX-512 only), a 16-bit Mamba SSM state is the lever but
breaks with vLLM's defaults, and pinned with prefix caching off it frees 1.67x with retrieval intact.
"""

from __future__ import annotations

from pathlib import Path

from kvprobe.knob import DEFAULT as DEFAULT_KNOB
from kvprobe.testbed.hybrid import Comparison
from kvprobe.testbed.launcher import NEEDLE_HYBRID, PROJECT_ROOT, LocalServer, home, start_many, stop

TEMPLATE = PROJECT_ROOT / "demo" / "hybrid.toml"


def start_comparison(c: Comparison) -> list[LocalServer]:
    """The comparison's servers (reused when already running), all or none."""
    return start_many([c.reference, *c.candidates.values()])


def stop_unneeded(done: Comparison, following: Comparison | None) -> None:
    """Stop what the next comparison does not use: a tiny hybrid server takes ~3.4 GB, so the demo
    keeps two or three up at a time, not all five or six."""
    keep = {s.port for s in (following.reference, *following.candidates.values())} if following else set()
    for spec in (done.reference, *done.candidates.values()):
        if spec.port not in keep:
            stop(spec.port)


def reference_name(c: Comparison) -> str:
    if c.knob == DEFAULT_KNOB:
        return c.reference.kv_cache_dtype
    return f"ssm_{c.reference.mamba_ssm_cache_dtype or 'float32'}"  # NemotronH's own SSM state dtype


def config_text(c: Comparison, knob: str | None = None) -> str:
    """demo/hybrid.toml with this comparison's knob (or `knob`) and its [[server]] tables."""
    head = TEMPLATE.read_text()
    # The template's model_config is relative to demo/; the written file lives elsewhere.
    head = head.replace('model_config = "models/needle-hybrid/config.json"',
                        f'model_config = "{NEEDLE_HYBRID / "config.json"}"')
    tables = [f'[[server]]\nname = "{reference_name(c)}"\nurl = "{c.reference.url}"\nrole = "reference"\n']
    tables += [f'[[server]]\nname = "{name}"\nurl = "{spec.url}"\nrole = "candidate"  # {spec.knobs}\n'
               for name, spec in c.candidates.items()]
    return f'knob = "{knob or c.knob}"  # {c.shows}\n' + head.rstrip() + "\n\n" + "\n".join(tables)


def write_config(c: Comparison, path: Path | None = None) -> Path:
    path = path or home() / "demo" / f"hybrid-{c.key}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config_text(c))
    return path
