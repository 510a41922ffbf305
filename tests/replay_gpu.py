"""Replay the real vLLM 0.26 GPU captures (tests/fixtures/vllm-gpu-h200: one NVIDIA H200) through
httpx.MockTransport, as tests/replay.py does for the CPU ones.

/health, /version, /v1/models, /metrics, /server_info and /tokenizer_info are the captured files byte for
byte. The GPU capture holds no completion: the first-prefill smoke is answered in the shape of the CPU
capture's `completions_gen16` (the same OpenAI-compatible schema), carrying what the GPU run recorded for
that server's own smoke (tests/fixtures/runs/h200-gpu/inventory: prompt tokens, text, system_fingerprint).
/tokenize answers in the CPU capture's shape too."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from replay import MultiReplay, Replay, capture

GPU_FIXTURES = Path(__file__).parent / "fixtures" / "vllm-gpu-h200"
GPU_RUN = Path(__file__).parent / "fixtures" / "runs" / "h200-gpu"

DENSE = ("auto", "fp8", "int8_per_token_head")  # needle-llama, --max-model-len 8192
HYBRID = ("hybrid-auto", "hybrid-fp8", "hybrid-ssm16")  # needle-hybrid, --max-model-len 512
PORTS = {name: 8201 + i for i, name in enumerate((*DENSE, *HYBRID))}


def gpu_file(server: str, name: str) -> bytes:
    return (GPU_FIXTURES / server / name).read_bytes()


def gpu_server_info(server: str) -> dict:
    return json.loads(gpu_file(server, "server_info_config_format_json.json"))


class GpuReplay(Replay):
    """One captured H200 server."""

    def __init__(self, server: str):
        super().__init__("auto-8101")  # the CPU capture answers only what the GPU capture lacks
        self.gpu = server
        recorded = GPU_RUN / "inventory" / f"{server}.json"
        self.smoke = json.loads(recorded.read_text())["smoke"] if recorded.exists() else None
        self.routes.update({
            ("GET", "/health"): self._gpu("health.json"),
            ("GET", "/version"): self._gpu("version.json"),
            ("GET", "/v1/models"): self._gpu("v1_models.json"),
            ("GET", "/metrics"): self._gpu("metrics.txt"),
            ("GET", "/server_info"): self._gpu("server_info_config_format_json.json"),
            ("GET", "/tokenizer_info"): self._gpu("tokenizer_info.json"),
            ("POST", "/v1/completions"): self._completion,
        })

    def _gpu(self, name: str):
        def handler(request: httpx.Request) -> httpx.Response:
            body = gpu_file(self.gpu, name)
            ctype = "application/json" if name.endswith(".json") else "text/plain; version=0.0.4"
            return httpx.Response(200, content=body, headers={"content-type": ctype})
        return handler

    def _completion(self, request: httpx.Request) -> httpx.Response:
        data = json.loads(capture("auto-8101", "completions_gen16"))
        model = json.loads(gpu_file(self.gpu, "v1_models.json"))["data"][0]["id"]
        sent = json.loads(request.content)
        prompt = sent.get("prompt")
        prompt_tokens = len(prompt) if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) \
            else (self.smoke or {}).get("prompt_tokens", 16)
        text = (self.smoke or {}).get("output") or data["choices"][0]["text"]
        data.update(model=model, system_fingerprint=(self.smoke or {}).get("system_fingerprint"))
        data["choices"][0].update(text=text, logprobs=None, finish_reason="length")
        data["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": sent.get("max_tokens") or 8,
                         "total_tokens": prompt_tokens + (sent.get("max_tokens") or 8)}
        return httpx.Response(200, json=data)


def gpu_servers(names: tuple[str, ...] = DENSE) -> MultiReplay:
    return MultiReplay({f"127.0.0.1:{PORTS[n]}": GpuReplay(n) for n in names})


def gpu_servers_toml(names: tuple[str, ...] = DENSE) -> str:
    """The captured servers as a servers.toml, the first as the reference."""
    return "".join(f'[[server]]\nname = "{n}"\nurl = "http://127.0.0.1:{PORTS[n]}"\n'
                   f'role = "{"reference" if i == 0 else "candidate"}"\n\n' for i, n in enumerate(names))
