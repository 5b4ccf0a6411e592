"""Writes tried without waiting (SQLite, ``add_steps(wait=False)``): what a gateway's event loop may run itself.

Such a write must never stall its caller: another writer's lock is :class:`WriteBusy` at once with nothing written
(the caller then waits on a thread), and a commit never checkpoints the log; the pool checkpoints it on a thread of
its own every ``NOWAIT_CHECKPOINT_EVERY`` such commits.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from pool_helpers import episode, step

from swarm.pool import Pool, WriteBusy
from swarm.pool import engine as pool_engine


def test_a_held_lock_is_busy_at_once_and_nothing_is_written(tmp_path: Path) -> None:
    pool = Pool(f"sqlite:///{tmp_path / 'p.db'}")
    other = sqlite3.connect(tmp_path / "p.db", isolation_level=None)
    try:
        assert pool.nowait_writes
        ep = episode(pool)
        pool.add_steps([step(ep, index=0, seed=1, step_id="a")], append=True, wait=False)
        other.execute("BEGIN IMMEDIATE")  # another process's writer
        t = time.monotonic()
        with pytest.raises(WriteBusy):
            pool.add_steps([step(ep, index=1, seed=2, step_id="b")], append=True, wait=False)
        assert time.monotonic() - t < 1.0  # the pool's busy timeout is 60 s: it did not wait for the lock
        other.execute("COMMIT")
        assert [s.step_id for s in pool.query_steps(limit=10)] == ["a"]
        pool.add_steps([step(ep, index=1, seed=2, step_id="b")], append=True, wait=False)  # the same write, again
        assert [(s.step_id, s.index) for s in pool.query_steps(limit=10, order="episode")] == [("a", 0), ("b", 1)]
    finally:
        other.close()
        pool.close()


def test_a_refused_nowait_write_raises_as_a_waiting_one(tmp_path: Path) -> None:
    from swarm.errors import NotFoundError

    pool = Pool(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        with pytest.raises(NotFoundError):
            pool.add_steps([step("missing", index=0, seed=3)], append=True, wait=False)
        ep = episode(pool)
        pool.add_steps([step(ep, index=0, seed=1, step_id="a")], append=True, wait=False)  # usable after it
        assert pool.episode_heads([ep.episode_id])[ep.episode_id].last_index == 0
    finally:
        pool.close()


def _wal_pages(tmp_path: Path, every: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """The log's size in pages after 300 one-step commits without waiting, checkpointed every ``every`` of them."""
    monkeypatch.setattr(pool_engine, "NOWAIT_CHECKPOINT_EVERY", every)
    db = tmp_path / f"every-{every}.db"
    pool = Pool(f"sqlite:///{db}")
    try:
        ep = episode(pool)
        for k in range(300):
            pool.add_steps([step(ep, index=k, seed=k, n_prompt=600)], append=True, wait=False)
            if pool._checkpointer is not None:
                pool._checkpointer.join()  # a test's stand-in for a thread that keeps up
        return Path(f"{db}-wal").stat().st_size // 4096
    finally:
        pool.close()


def test_commits_never_checkpoint_the_log_the_pool_does_on_its_own_thread(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    never = _wal_pages(tmp_path, 10**9, monkeypatch)
    assert never > 2000  # twice SQLite's own checkpoint mark (1,000 pages; ~1,030 with it): no commit checkpointed
    kept = _wal_pages(tmp_path, 20, monkeypatch)
    assert kept < never / 4  # checkpointed every 20 commits, the log restarts from its start


def test_an_engine_without_nowait_writes_refuses_them(tmp_path: Path) -> None:
    pool = Pool(f"sqlite:///{tmp_path / 'p.db'}")
    pool.sql.nowait_setup = ()  # as PostgreSQL's: the caller waits on a thread
    try:
        assert not pool.nowait_writes
        with pytest.raises(ValueError, match="nowait_writes is False"):
            pool.add_steps([step(episode(pool), index=0, seed=1)], wait=False)
    finally:
        pool.close()


def test_an_append_costs_the_same_at_any_length_of_its_episode(tmp_path: Path) -> None:
    """The next index is one index seek, not a walk over the episode's steps (SQLite's virtual-machine steps counted:
    deterministic, unlike a timer)."""
    pool = Pool(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        short, long = episode(pool), episode(pool)
        pool.add_steps([step(long, index=k, seed=k, n_prompt=2, n_response=1) for k in range(3000)])
        pool.add_steps([step(short, index=0, seed=1)], append=True, wait=False)  # the nowait connection is made
        conn = pool._nowait_fairy.dbapi_connection
        ops = [0]

        def counted() -> int:
            ops[0] += 1
            return 0

        conn.set_progress_handler(counted, 10)

        def cost(ep: object, seed: int) -> int:
            ops[0] = 0
            pool.add_steps([step(ep, index=0, seed=seed)], append=True, wait=False)
            return ops[0]

        assert cost(long, 2) <= 1.5 * cost(short, 3)
        conn.set_progress_handler(None, 0)
        assert pool.episode_heads([long.episode_id])[long.episode_id].last_index == 3000
    finally:
        pool.close()


@pytest.mark.parametrize("failing", [("COMMIT",), ("COMMIT", "ROLLBACK")], ids=["commit", "commit-and-rollback"])
def test_a_failed_commit_leaves_no_transaction_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    failing: tuple[str, ...]) -> None:
    """A COMMIT that fails is rolled back (and a connection whose ROLLBACK fails too is closed): the lock is free for
    every other writer and the next write goes through."""
    import sqlalchemy as sa

    pool = Pool(f"sqlite:///{tmp_path / 'p.db'}")
    other = sqlite3.connect(tmp_path / "p.db", isolation_level=None, timeout=0)
    run = pool_engine.DriverConnection.run

    def flaky(self: pool_engine.DriverConnection, sql: str) -> None:
        if sql in failing:
            raise sqlite3.OperationalError(f"{sql} failed (the test's)")
        run(self, sql)

    try:
        ep = episode(pool)
        monkeypatch.setattr(pool_engine.DriverConnection, "run", flaky)
        with pytest.raises(sa.exc.OperationalError, match="the test's"):
            pool.add_steps([step(ep, index=0, seed=1, step_id="a")], append=True, wait=False)
        monkeypatch.setattr(pool_engine.DriverConnection, "run", run)
        other.execute("BEGIN IMMEDIATE")  # no transaction was left holding the lock
        other.execute("ROLLBACK")
        pool.add_steps([step(ep, index=0, seed=1, step_id="a")], append=True, wait=False)
        assert [s.step_id for s in pool.query_steps(limit=10)] == ["a"]
    finally:
        other.close()
        pool.close()
