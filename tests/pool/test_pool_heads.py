"""Episode heads (swarm/pool/heads.py): SQLite reads them on the driver; the answer is SQLAlchemy's, value for value."""

from __future__ import annotations

import threading

from pool_helpers import episode, step

from swarm.pool import Pool
from swarm.pool.heads import _DRIVER_HEADS, _HEADS
from swarm.records import EpisodeStatus


def _through_sqlalchemy(pool: Pool, ids: list[str]) -> list[dict]:
    with pool._tx() as c:
        return sorted((dict(r) for r in c.execute(_HEADS, {"ids": ids}).mappings()), key=lambda r: r["episode_id"])


def test_heads_are_the_same_read_either_way_and_see_every_commit(pool: Pool) -> None:
    fresh = episode(pool)  # no step yet
    busy = episode(pool, group_id="g1", metadata={"k": [1, 2.5, "\u00e9"], "nested": {"a": None}})
    pool.add_steps([step(busy, index=0, seed=1), step(busy, index=1, seed=2)])
    done = episode(pool)
    pool.add_steps([step(done, index=0, seed=3)])
    pool.end_episode(done.episode_id, EpisodeStatus.finished, reward=0.5)
    ids = [fresh.episode_id, busy.episode_id, done.episode_id, "no-such-episode"]

    heads = pool.episode_heads(ids)
    assert {k: (h.episode.status, h.last_index) for k, h in heads.items()} == {
        fresh.episode_id: (EpisodeStatus.open, None), busy.episode_id: (EpisodeStatus.open, 1),
        done.episode_id: (EpisodeStatus.finished, 0)}
    assert heads[busy.episode_id].episode == pool.get_episode(busy.episode_id)
    rows = pool._driver_rows(_DRIVER_HEADS, sorted(ids))
    if rows is not None:  # SQLite: the driver's rows are SQLAlchemy's, every column and type
        rows.sort(key=lambda r: r["episode_id"])
        core = _through_sqlalchemy(pool, sorted(ids))
        assert rows == core
        assert [[type(v) for v in r.values()] for r in rows] == [[type(v) for v in r.values()] for r in core]

    pool.add_steps([step(busy, index=2, seed=4)])  # a commit from another thread is seen by the next read
    t = threading.Thread(target=lambda: pool.add_steps([step(fresh, index=0, seed=5)]))
    t.start()
    t.join()
    again = pool.episode_heads(ids)
    assert (again[busy.episode_id].last_index, again[fresh.episode_id].last_index) == (2, 0)


def test_closing_the_pool_closes_the_driver_connections(pool_url: str) -> None:
    pool = Pool(pool_url)
    ep = episode(pool)
    seen = [pool.episode_heads([ep.episode_id])]
    t = threading.Thread(target=lambda: seen.append(pool.episode_heads([ep.episode_id])))
    t.start()
    t.join()
    conns = list(pool._driver_conns)
    assert len(conns) == (2 if pool.sql.driver_reads else 0)  # one per reading thread
    pool.close()
    assert pool._driver_conns == []
    for conn in conns:  # closed: a closed sqlite3 connection refuses work
        try:
            conn.execute("SELECT 1")
        except Exception as exc:  # noqa: BLE001 - sqlite3.ProgrammingError
            assert "closed" in str(exc).lower()
        else:
            raise AssertionError("a driver connection stayed open after close()")
    assert all(s[ep.episode_id].last_index is None for s in seen)
