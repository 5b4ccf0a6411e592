"""Helpers for scale-out tests: start ``python -m flows.serve`` gateway processes on loopback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


@dataclass
class GatewayProcess:
    """A ``python -m flows.serve`` subprocess on a free loopback port."""

    proc: subprocess.Popen
    url: str

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_gateway(pool_url: str, secret: str, *overrides: str, timeout_s: float = 90) -> GatewayProcess:
    """Start a gateway process over ``pool_url`` with ``SWARM_GATEWAY_SECRET=secret``; wait until it answers."""
    env = {**os.environ, "SWARM_GATEWAY_SECRET": secret, "PYTHONPATH": str(REPO)}
    env.pop("SWARM_POOL_URL", None)
    cmd = [sys.executable, "-m", "flows.serve", "model=echo", "gateway.port=0", "gateway.host=127.0.0.1",
           f"pool.url={pool_url}", *overrides]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    url = None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        m = re.search(r"http://127\.0\.0\.1:\d+", line)
        if m:
            url = m.group(0)
            break
        if time.monotonic() > deadline:
            break
    if url is None:
        proc.kill()
        raise RuntimeError("gateway process did not start:\n" + "".join(lines))
    gw = GatewayProcess(proc, url)
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return gw
        except httpx.HTTPError:
            time.sleep(0.1)
    gw.stop()
    raise RuntimeError(f"gateway on {url} does not answer /health")
