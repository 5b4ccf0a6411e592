"""Crash drills: ``python -m flows.train`` as a real subprocess, SIGKILLed at each update boundary
(``SWARM_CRASH_AT``, :mod:`swarm.train.faults`) and restarted on the same run directory, then the
training journal audited: was any step trained twice?

:func:`train_process` starts one attempt (its own process group, output to a log file, marked with
``SWARM_TEST_RUN=<marker>`` so leftover processes can be found); :func:`boundary_plan` lists the
kills (after the update, after publish, after the checkpoint before the ack, after the settle), each
restarted at once or after the lease TTL; :func:`crash_drill` runs a plan to the end and returns every
attempt's exit code and the journal audit.
Used by ``tests/flows/test_crash.py`` and ``benchmarks/reliability_bench.py``; it starts no Prefect
server (wrap it in :func:`flows.shutdown.own_prefect_server`) and does not judge: the caller does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["LEASE_TTL_S", "train_process", "boundary_plan", "Attempt", "DrillResult", "crash_drill"]

REPO = Path(__file__).resolve().parents[1]
LEASE_TTL_S = 2.0  # the drill's train.lease_ttl_s; a restart "after the TTL" waits 1.5x this
_PROGRESS = ("after_checkpoint", "after_settle")  # kills after a committed checkpoint: the run moves on


def train_process(tmp: Path, marker: str, *overrides: str, env: dict[str, str] | None = None,
                  log: str = "train.log", cwd: Path = REPO) -> subprocess.Popen:
    """``python -m flows.train`` in its own process group (as a terminal runs it), output to ``tmp/log``.

    The run directory is ``tmp/run``, MLflow a SQLite store in ``tmp``; ``SWARM_CRASH_AT`` and
    ``PREFECT_API_URL`` are not inherited (pass them in ``env``); ``cwd``: where it runs from.
    """
    out, uri = tmp / "run", f"sqlite:///{tmp / 'mlruns.db'}"
    full = {k: v for k, v in os.environ.items() if k not in ("SWARM_CRASH_AT", "PREFECT_API_URL")}
    full.update({"PREFECT_HOME": str(tmp / "prefect"), "PYTHONPATH": str(REPO), "SWARM_TEST_RUN": marker,
                 **(env or {})})
    with (tmp / log).open("w") as f:
        return subprocess.Popen([sys.executable, "-m", "flows.train", f"train.out_dir={out}",
                                 f"mlflow.tracking_uri={uri}", "batching.min_groups=1", *overrides],
                                cwd=cwd, env=full, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def boundary_plan(every_delay: bool = False) -> list[tuple[str | None, float]]:
    """``(SWARM_CRASH_AT, seconds to wait before the restart)`` per attempt, ending with a clean run.

    Default: each boundary once, restarts alternating at once / after the TTL (4 kills). With
    ``every_delay``: each boundary with both delays (8 kills).
    """
    wait = 1.5 * LEASE_TTL_S  # the leases of the killed run have expired by then
    points = ["after_update:2", "after_checkpoint:1", "after_publish:1", "after_settle:1"]
    if every_delay:
        kills = [(p, d) for p in points for d in (0.0, wait)]
    else:
        kills = [(p, wait if i % 2 else 0.0) for i, p in enumerate(points)]
    return [*kills, (None, 0.0)]


@dataclass
class Attempt:
    point: str | None  # SWARM_CRASH_AT, None for the final clean run
    rc: int | None
    log: str  # the attempt's output


@dataclass
class DrillResult:
    attempts: list[Attempt] = field(default_factory=list)
    audit: dict[str, Any] = field(default_factory=dict)  # swarm.train.journal.audit of the run
    updates: int = 0  # train.updates of the drill

    @property
    def kills(self) -> int:
        """Attempts that died by SIGKILL at their crash point."""
        return sum(a.point is not None and a.rc == -signal.SIGKILL for a in self.attempts)


def crash_drill(tmp: Path, marker: str, plan: list[tuple[str | None, float]] | None = None,
                overrides: tuple[str, ...] = (), env: dict[str, str] | None = None,
                timeout_s: float = 400.0) -> DrillResult:
    """Run ``plan`` (default :func:`boundary_plan`) on one run directory ``tmp/run``; audit its journal.

    ``overrides`` go to every attempt (e.g. ``pool.url=...``); an attempt still running after
    ``timeout_s`` is killed with its process group and recorded with ``rc=None``.

    ``train.updates`` is 2 + 2 per kill that lands after a committed checkpoint (the others roll
    back to it), so every attempt reaches its crash point; checkpoints every 2 updates.
    """
    from swarm.train.journal import audit

    plan = plan if plan is not None else boundary_plan()
    updates = 2 + 2 * sum(p is not None and p.split(":")[0] in _PROGRESS for p, _ in plan)
    common = (f"train.updates={updates}", "train.checkpoint_every=2", f"train.lease_ttl_s={LEASE_TTL_S:g}")
    result = DrillResult(updates=updates)
    for i, (point, delay) in enumerate(plan):
        proc = train_process(tmp, marker, *common, *overrides,
                             env={**(env or {}), **({"SWARM_CRASH_AT": point} if point else {})}, log=f"attempt{i}.log")
        try:
            rc = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
        result.attempts.append(Attempt(point, rc, (tmp / f"attempt{i}.log").read_text()))
        time.sleep(delay)
    result.audit = audit(tmp / "run" / "checkpoints" / "default" / "journal.jsonl")
    return result
