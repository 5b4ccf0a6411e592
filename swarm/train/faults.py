"""Crash points for reliability tests: ``SWARM_CRASH_AT=<point>[:<n>]`` SIGKILLs this process the
n-th time (default first) it passes ``<point>``. Unset (always, outside tests) it does nothing. The points
are an update's boundaries (:mod:`swarm.update`): ``after_update``, ``after_publish``, ``after_checkpoint``
(committed, leases not settled yet) and ``after_settle``.
"""

from __future__ import annotations

import os
import signal

__all__ = ["crash_point"]

_seen: dict[str, int] = {}


def crash_point(name: str) -> None:
    """SIGKILL this process here if ``SWARM_CRASH_AT`` names this point (and this pass)."""
    spec = os.environ.get("SWARM_CRASH_AT")
    if not spec:
        return
    point, _, nth = spec.partition(":")
    if point != name:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
