"""The gateway's hot statements on the driver (swarm/pool/engine.py DriverConnection): the same rows as SQLAlchemy's.

SQLite runs the episode-heads read and the step write straight on a DBAPI connection; the same calls through
SQLAlchemy (``driver_sql`` off) must read and write exactly the same values, every column and type.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from pool_helpers import episode, step

from swarm.errors import ConflictError, NotFoundError
from swarm.pool import Pool
from swarm.pool.schema import metadata
from swarm.records import Episode, EpisodeStatus


def _pools(tmp_path: Path) -> tuple[Pool, Pool]:
    driver, core = Pool(f"sqlite:///{tmp_path / 'driver.db'}"), Pool(f"sqlite:///{tmp_path / 'core.db'}")
    assert driver.sql.driver_sql
    core.sql.driver_sql = False  # this pool's statements go through SQLAlchemy
    return driver, core


def _tables(pool: Pool) -> dict[str, list[tuple]]:
    """Every row of every table, typed as the driver returns them (``updated_at`` and ``ended_at`` are the clock's)."""
    out = {}
    with pool.engine.connect() as c:
        for t in metadata.sorted_tables:
            cols = [col for col in t.columns if col.name not in ("updated_at", "ended_at")]
            rows = c.exec_driver_sql(f"SELECT {', '.join(col.name for col in cols)} FROM {t.name}").fetchall()
            out[t.name] = sorted(tuple((type(v).__name__, v) for v in r) for r in rows)
    return out


def test_the_driver_writes_and_reads_what_sqlalchemy_does(tmp_path: Path) -> None:
    driver, core = _pools(tmp_path)
    try:
        for pool in (driver, core):
            eps = [Episode(episode_id=f"ep-{k}", task="t", group_id="g" if k else None, created_at=1000.0 + k,
                           metadata={"k": [1, 2.5, "\u00e9"], "n": None}) for k in range(3)]
            pool.add_episodes(eps)
            for turn in range(3):  # appended turns of a chat: messages and token blocks shared along each episode
                msgs = [{"role": "system", "content": "be brief \u00e9"}] + [
                    {"role": "user", "content": f"turn {j}", "name": None, "extra": [1, True, 1.0]} for j in range(turn + 1)]
                batch = [step(ep, index=0, n_prompt=70 + 10 * turn, seed=turn * 10 + k, step_id=f"s-{k}-{turn}",
                              prompt_messages=msgs, response_text="ok \x00 nul", tool_calls=[{"id": "c", "type": "function",
                              "function": {"name": "f", "arguments": "{}"}}] if k == 1 else [],
                              metadata={"kind": "chat", "x": 1.5}, timings={"total_s": 0.25},
                              created_at=2000.0 + turn)
                         for k, ep in enumerate(eps)]
                pool.add_steps(batch, append=True)
                pool.add_steps(batch, append=True)  # an idempotent retry
            pool.end_episode("ep-2", EpisodeStatus.finished, reward=1.0)
        assert _tables(driver) == _tables(core)
        ids = ["ep-0", "ep-1", "ep-2", "ep-none"]
        heads = [{k: (h.episode.model_copy(update={"updated_at": 0.0, "ended_at": None}), h.last_index)
                  for k, h in pool.episode_heads(ids).items()} for pool in (driver, core)]
        assert heads[0] == heads[1] and len(heads[0]) == 3
        assert driver.episode_heads(ids)["ep-1"].last_index == 2
        for pool in (driver, core):
            assert [s.step_id for s in pool.query_steps(limit=20, order="episode")][:3] == ["s-0-0", "s-0-1", "s-0-2"]
    finally:
        driver.close()
        core.close()


@pytest.mark.parametrize("driver_sql", [True, False], ids=["driver", "sqlalchemy"])
def test_a_refused_batch_leaves_nothing_and_raises_the_same_errors(tmp_path: Path, driver_sql: bool) -> None:
    pool = Pool(f"sqlite:///{tmp_path / 'p.db'}")
    pool.sql.driver_sql = driver_sql
    try:
        ep = episode(pool)
        pool.add_steps([step(ep, index=0, seed=1, step_id="a")])
        with pytest.raises(NotFoundError):
            pool.add_steps([step(ep, index=1, seed=2, step_id="b"), step("missing", index=0, seed=3)], append=True)
        with pytest.raises(ConflictError):
            pool.add_steps([step(ep, index=1, seed=4, step_id="c"), step(ep, index=0, seed=5, step_id="a")])
        if driver_sql:  # a driver's error is raised as SQLAlchemy's, and its transaction rolled back
            with pytest.raises(sa.exc.OperationalError, match="no such column"), pool._driver_write() as c:
                c.execute(sa.select(sa.literal_column("nope")), {})
        assert [s.step_id for s in pool.query_steps(limit=10)] == ["a"]
        other = episode(pool)
        before = {e.episode_id: pool.get_episode(e.episode_id).updated_at for e in (ep, other)}
        pool.add_steps([step(ep, index=1, seed=7, step_id="e")])  # the connection is usable after each refusal
        assert pool.get_episode(ep.episode_id).updated_at > before[ep.episode_id]  # the write touched its episode
        assert pool.get_episode(other.episode_id).updated_at == before[other.episode_id]  # and no other
        assert pool.episode_heads([ep.episode_id])[ep.episode_id].last_index == 1
    finally:
        pool.close()


def test_heads_see_commits_from_other_threads(pool: Pool) -> None:
    ep = episode(pool)
    assert pool.episode_heads([ep.episode_id])[ep.episode_id].last_index is None
    t = threading.Thread(target=lambda: pool.add_steps([step(ep, index=0, seed=1)], append=True))
    t.start()
    t.join()
    assert pool.episode_heads([ep.episode_id])[ep.episode_id].last_index == 0


def test_a_statement_binds_on_the_driver_as_through_sqlalchemy(tmp_path: Path) -> None:
    from swarm.pool.schema import episodes as E

    pool = Pool(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        pool.add_episodes([Episode(episode_id=f"e-{k}", task="t" if k % 3 else "u", created_at=float(k),
                                   metadata={"k": k}) for k in range(7)])
        # an expanding list, a scalar parameter named like an expanded one, and a value the statement holds
        q = (sa.select(E.c.episode_id, E.c.meta).where(E.c.created_at > sa.bindparam("ids_1"))
             .where(E.c.task == "t").where(E.c.episode_id.in_(sa.bindparam("ids", expanding=True)))
             .order_by(E.c.episode_id))
        for ids in (("e-1",), ["e-1", "e-2", "e-4"], [f"e-{k}" for k in range(7)]):  # a tuple; padded to 1, 4, 8
            with pool._driver_conn() as c:
                got = [tuple(r) for r in c.execute(q, {"ids": ids, "ids_1": 0.5})]
            with pool._tx() as c:
                want = [tuple(r) for r in c.execute(q, {"ids": list(ids), "ids_1": 0.5})]
            assert got == want and got, ids
        assert got == [("e-1", {"k": 1}), ("e-2", {"k": 2}), ("e-4", {"k": 4}), ("e-5", {"k": 5})]
    finally:
        pool.close()
