"""``python -m swarm.client.control``: drive the training run behind a gateway from a shell.

    python -m swarm.client.control --server URL [--token T] status
    python -m swarm.client.control --server URL start train.updates=20 lr=0.001 batching.strategy=episodes
    python -m swarm.client.control --server URL pause | resume | stop
    python -m swarm.client.control --server URL retune lr=0.0005 min_groups=2

Values are YAML scalars (``0.001``, ``null``, ``episodes``). ``--token`` is the admin token (default
``$SWARM_ADMIN_TOKEN``). Prints the gateway's JSON answer; a refusal prints its message and exits 1.
It is a thin shell over :class:`~swarm.client.sdk.SwarmClient`; it holds no state.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from swarm.client.sdk import ClientError, SwarmClient

__all__ = ["main", "parse_pairs"]


def parse_pairs(pairs: list[str]) -> dict[str, Any]:
    """``["lr=0.001", "batching.strategy=episodes"]`` -> ``{"lr": 0.001, "batching.strategy": "episodes"}``."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"{pair!r}: expected key=value")
        out[key] = yaml.safe_load(value) if value else ""
    return out


def main(argv: list[str] | None = None) -> int:
    """Run one control command; 0 on success, 1 when the gateway refused it."""
    ap = argparse.ArgumentParser(prog="python -m swarm.client.control", description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True, help="the training process's gateway, e.g. http://127.0.0.1:8420")
    ap.add_argument("--token", default=None, help="admin token (default: $SWARM_ADMIN_TOKEN)")
    ap.add_argument("command", choices=["status", "start", "pause", "resume", "retune", "stop"])
    ap.add_argument("pairs", nargs="*", help="key=value (start: config overrides; retune: knobs)")
    a = ap.parse_args(argv)
    with SwarmClient(a.server, admin_token=a.token, retries=2) as client:
        try:
            if a.command == "start":
                out = client.start_run(parse_pairs(a.pairs))
            elif a.command == "retune":
                out = client.retune(parse_pairs(a.pairs))
            else:
                out = {"status": client.control_status, "pause": client.pause, "resume": client.resume,
                       "stop": client.stop_run}[a.command]()
        except ClientError as exc:
            print(f"refused: {exc}", file=sys.stderr)
            return 1
    print(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
