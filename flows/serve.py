"""``python -m flows.serve`` (console script ``swarm-serve``): serve the gateway and the policy.

Composes ``conf/serve.yaml`` (groups ``model``, ``pool``, ``gateway``), builds the pool and the
backend with :mod:`flows.components`, the :class:`~swarm.gateway.GatewaySettings` from the
``gateway`` keys plus the secrets in the environment, and runs uvicorn until interrupted. With
``gateway.port=0`` a free port is taken; the URL is printed either way. No training here.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import uvicorn
from omegaconf import DictConfig, OmegaConf

from flows.components import gateway_settings, make_backend, make_pool
from swarm.app import create_app
from swarm.gateway.connections import uvicorn_config

__all__ = ["main", "serve", "spawn", "GatewayProcess"]

REPO = Path(__file__).resolve().parents[1]


@hydra.main(config_path="../conf", config_name="serve", version_base="1.3")
def serve(cfg: DictConfig) -> None:
    c: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    gw = c["gateway"]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    settings = gateway_settings(gw)
    try:
        settings.check_bind(str(gw["host"]))
    except ValueError as exc:
        raise SystemExit(f"swarm-serve: {exc}") from None
    pool = make_pool(c["pool"])
    backend = make_backend(c["model"], list(c.get("policies") or ["default"]), None)
    app = create_app(pool, backend, settings)
    if float(gw.get("follow_versions_s") or 0) > 0:  # a gateway beside the trainer's: follow its publishes
        from swarm.policy.fleet import VersionFollower

        VersionFollower(pool, backend, interval_s=float(gw["follow_versions_s"])).start()
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so, and without
    # it every response waits ~40 ms for a delayed ACK (Nagle)
    family = socket.AF_INET6 if ":" in gw["host"] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((gw["host"], int(gw["port"])))
    host, port = sock.getsockname()[:2]
    print(f"swarm gateway on http://{host}:{port} (policies {backend.policies()}, pool {pool.url})", flush=True)
    print(f"access: {settings.access_summary()}", flush=True)
    # timeouts, connection cap and rate-limited refusal logs (docs/reliability.md "Connections")
    server = uvicorn.Server(uvicorn_config(app, settings, log_level=gw.get("log_level", "warning")))
    server.run(sockets=[sock])


def main() -> None:
    serve()


@dataclass
class GatewayProcess:
    """A ``python -m flows.serve`` subprocess (for tests, benchmarks and scripts)."""

    proc: subprocess.Popen
    url: str
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def spawn(*overrides: str, env: dict[str, str | None] | None = None, timeout_s: float = 90.0) -> GatewayProcess:
    """Start ``python -m flows.serve`` on a free loopback port and wait until ``/health`` answers.

    ``overrides`` follow the defaults ``gateway.host=127.0.0.1 gateway.port=0``, so they win. The
    output goes to a temporary log file (a pipe nobody reads would block the server once full).
    ``env`` adds variables to this process's environment; a ``None`` value removes one.
    """
    import httpx

    log = Path(tempfile.mkstemp(prefix="swarm-serve-", suffix=".log")[1])
    cmd = [sys.executable, "-m", "flows.serve", "gateway.host=127.0.0.1", "gateway.port=0", *overrides]
    full_env = {**os.environ, "PYTHONPATH": str(REPO)}
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    url = None
    while time.monotonic() < deadline and proc.poll() is None:
        if url is None:
            m = re.search(r"http://127\.0\.0\.1:\d+", log.read_text())
            url = m.group(0) if m else None
        if url is not None:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    return GatewayProcess(proc, url, log)
            except httpx.HTTPError:
                pass
        time.sleep(0.05)
    GatewayProcess(proc, url or "", log).stop()
    raise RuntimeError(f"flows.serve did not start within {timeout_s:.0f}s:\n{log.read_text()[-4000:]}")


if __name__ == "__main__":
    main()
