"""The tiny random NemotronH hybrid of tests/fixtures/vllm-cpu/hybrid-nemotronh, built once.

Weights are random (seed 1234) from the fixture's config.json, made with transformers inside the vLLM
venv (kvprobe itself never imports torch or vLLM); the tokenizer is needle-llama's (same 4,096-token
vocabulary, bos 0, eos 2, pad 0). The folder is cached under the launcher's home, keyed by the bytes
that decide it, so repeated test sessions and every worktree serve the same path.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
from pathlib import Path

from kvprobe.servers.launcher import NEEDLE_LLAMA, LaunchError, ensure_venv, home

CONFIG = Path(__file__).parents[1] / "fixtures" / "vllm-cpu" / "hybrid-nemotronh" / "config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

# from_pretrained (not from_dict) decodes transformers' {"__float__": "Infinity"} in time_step_limit.
_BUILD = """
import sys, torch
from transformers import NemotronHConfig, NemotronHForCausalLM
src, out = sys.argv[1], sys.argv[2]
torch.manual_seed(1234)
model = NemotronHForCausalLM(NemotronHConfig.from_pretrained(src)).to(torch.bfloat16)
model.save_pretrained(out)
"""


def tiny_hybrid_model() -> str:
    """Path of the built model folder (built on first use, ~10 s)."""
    digest = hashlib.sha256(_BUILD.encode() + CONFIG.read_bytes())
    for name in TOKENIZER_FILES:
        digest.update((NEEDLE_LLAMA / name).read_bytes())
    target = home() / "models" / f"tiny-hybrid-{digest.hexdigest()[:12]}"
    if (target / "model.safetensors").exists():
        return str(target)
    python = ensure_venv()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(home() / "tiny-hybrid.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "model.safetensors").exists():
            return str(target)
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        src = tmp / "src"
        src.mkdir(parents=True)
        shutil.copy(CONFIG, src / "config.json")
        done = subprocess.run([str(python), "-c", _BUILD, str(src), str(tmp)], capture_output=True, text=True)
        if done.returncode != 0:
            raise LaunchError("building the tiny hybrid failed: " + " | ".join(done.stderr.strip().splitlines()[-3:]))
        shutil.rmtree(src)
        for name in TOKENIZER_FILES:
            shutil.copy(NEEDLE_LLAMA / name, tmp / name)
        tmp.rename(target)
    return str(target)
