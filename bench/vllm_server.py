"""A vLLM server of a checkpoint on 127.0.0.1, as a live RL job runs one (`vllm serve`, its
OpenAI-compatible server), started and stopped around the served-policy tests
(tests/vllm/test_served.py) and benchmark (bench/served.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
START_S = 300  # a CPU server's start, on a busy machine


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class VLLMServer:
    """`vllm serve` of a checkpoint on 127.0.0.1:`port`, float32, as a job runs it (`dev_mode`:
    with the routes an RL trainer drives, VLLM_SERVER_DEV_MODE=1)."""

    def __init__(self, checkpoint, port: int, *extra: str, dev_mode: bool = False) -> None:
        self.url = f"http://127.0.0.1:{port}/v1"
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                   str(checkpoint), "--dtype", "float32", "--host", "127.0.0.1", "--port",
                   str(port), "--served-model-name", "policy",
                   # vLLM's CPU build crashes a seeded request whose prefill is split over steps
                   # ("CPU Generator does not use offset"); GPU servers keep chunked prefill
                   "--no-enable-chunked-prefill", *extra]  # fmt: skip
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
        if dev_mode:  # vLLM's RL routes: /weight_info, /update_weight_version
            env["VLLM_SERVER_DEV_MODE"] = "1"
        self.process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the vLLM server of {checkpoint} exited while starting")
            try:
                if httpx.get(f"{self.url}/models", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"the vLLM server of {checkpoint} did not start within {START_S} s")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
