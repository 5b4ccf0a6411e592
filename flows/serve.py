"""``python -m flows.serve`` (console script ``swarm-serve``): serve the gateway and the policy.

Composes ``conf/serve.yaml`` (groups ``model``, ``pool``, ``gateway``), builds the pool and the
backend with :mod:`flows.components`, the :class:`~swarm.gateway.GatewaySettings` from the
``gateway`` keys plus the secrets in the environment, and runs uvicorn until interrupted. With
``gateway.port=0`` a free port is taken; the URL is printed either way. No training here.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import hydra
import uvicorn
from omegaconf import DictConfig, OmegaConf

from flows.components import gateway_settings, make_backend, make_pool
from swarm.gateway import create_app

__all__ = ["main", "serve"]


@hydra.main(config_path="../conf", config_name="serve", version_base="1.3")
def serve(cfg: DictConfig) -> None:
    c: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    gw = c["gateway"]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    pool = make_pool(c["pool"])
    backend = make_backend(c["model"], list(c.get("policies") or ["default"]), None)
    app = create_app(pool, backend, gateway_settings(gw))
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
    server = uvicorn.Server(uvicorn.Config(app, log_level=gw.get("log_level", "warning"), access_log=False,
                                           timeout_graceful_shutdown=5))
    server.run(sockets=[sock])


def main() -> None:
    serve()


if __name__ == "__main__":
    main()
