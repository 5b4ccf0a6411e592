"""``python -m flows.serve`` (console script ``swarm-serve``): serve the gateway and the policy.

Composes ``conf/serve.yaml`` (groups ``model``, ``pool``, ``gateway``), validates it into
:class:`flows.config.ServeConfig` (the sections a training run uses; a bad key is one ``config error:``
line, exit 2) and starts pool, backend and gateway through :mod:`flows.components`, exactly as
``flows.train``'s flow does, until interrupted. With ``gateway.port=0`` a free port is taken; the
URL is printed either way. No training here.
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from flows.components import make_backend, make_pool, start_gateway
from flows.config import ConfigError, ServeConfig, validate
from flows.shutdown import end_process

__all__ = ["main", "serve", "spawn", "GatewayProcess"]

REPO = Path(__file__).resolve().parents[1]


@hydra.main(config_path="../conf", config_name="serve", version_base="1.3")
def serve(cfg: DictConfig) -> None:
    """Serve until interrupted (Ctrl-C or SIGTERM)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        c: ServeConfig = validate(OmegaConf.to_container(cfg, resolve=True), schema=ServeConfig)  # type: ignore[arg-type]
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    pool = make_pool(c.pool)
    backend = make_backend(c.model, c.policies, None)  # model.base_url: null (vllm) starts a local engine here
    atexit.register(getattr(backend, "close", lambda: None))  # ... which ends with this process, as the gateway does
    try:
        stack = start_gateway(pool, backend, c.gateway)
    except ValueError as exc:  # check_bind: off loopback without both tokens
        raise SystemExit(f"swarm-serve: {exc}") from None
    print(f"swarm gateway on {stack.url} (policies {backend.policies()}, pool {pool.url})", flush=True)
    print(f"access: {stack.extra['app'].state.gateway.settings.access_summary()}", flush=True)
    # SIGTERM stops the server as Ctrl-C does, even where Ctrl-C is ignored (a job started in a script's background or
    # under nohup): copying SIGINT's handler copied "ignore" there, and nothing but SIGKILL stopped the server
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while stack.server.thread.is_alive():
            stack.server.thread.join(0.5)
    except KeyboardInterrupt:
        pass
    # a stop and exit that take over 5 s (a pool call blocked in a worker thread) leave every thread's stack in the
    # output; stopping a server whose thread already ended returns at once
    faulthandler.dump_traceback_later(5, exit=False)
    stack.stop()


def main() -> None:
    serve()


@dataclass
class GatewayProcess:
    """A ``python -m flows.serve`` subprocess (for tests, benchmarks and scripts)."""

    proc: subprocess.Popen
    url: str
    log: Path

    def stop(self) -> None:
        end_process(self.proc, 15)


def spawn(*overrides: str, env: dict[str, str | None] | None = None, timeout_s: float = 90.0,
          repo: Path = REPO) -> GatewayProcess:
    """Start ``python -m flows.serve`` on a free loopback port and wait until ``/health`` answers.

    ``overrides`` follow the defaults ``gateway.host=127.0.0.1 gateway.port=0``, so they win. The
    output goes to a temporary log file (a pipe nobody reads would block the server once full).
    ``env`` adds variables to this process's environment; a ``None`` value removes one. ``repo``: the source
    tree whose ``flows.serve`` runs (a benchmark compares another checkout's).
    """
    import httpx

    log = Path(tempfile.mkstemp(prefix="swarm-serve-", suffix=".log")[1])
    cmd = [sys.executable, "-m", "flows.serve", "gateway.host=127.0.0.1", "gateway.port=0", *overrides]
    full_env = {**os.environ, "PYTHONPATH": str(repo)}
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=repo, env=full_env, stdout=out, stderr=subprocess.STDOUT)
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
