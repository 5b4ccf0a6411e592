"""A writer killed with SIGKILL mid-batch leaves a readable pool with every committed batch intact, and no partial batch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa
from pool_helpers import episode, seeded_step

from swarm.pool import Pool

HERE = Path(__file__).parent


def test_sigkill_mid_batch_keeps_committed_steps(pool: Pool, pool_url: str):
    ep = episode(pool)
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "pool_workers.py"), "write", pool_url, ep.episode_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(HERE.parents[1])},
    )
    committed = -1
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        while committed < 4:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            committed = int(line)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    reopened = Pool(pool_url)
    try:
        if reopened.dialect == "sqlite":
            with reopened.engine.connect() as c:
                assert c.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
        n = reopened.count_steps()
        assert n % 64 == 0, f"{n} steps: a batch was half written"
        assert n >= (committed + 1) * 64
        for batch in range(n // 64):
            for i in (0, 17, 63):
                want = seeded_step(ep.episode_id, batch, i)
                got = reopened.get_step(want.step_id)
                assert (got.prompt_ids, got.response_ids, got.response_logprobs) == (
                    want.prompt_ids,
                    want.response_ids,
                    want.response_logprobs,
                )
        # and it still takes writes
        reopened.add_step(seeded_step(ep.episode_id, 10_000, 0))
        with reopened.engine.connect() as c:
            assert c.execute(sa.text("SELECT count(*) FROM steps")).scalar() == n + 1
    finally:
        reopened.close()
