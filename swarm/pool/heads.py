"""Episode heads: many episodes' records and last step index in one read (the gateway's version check).

A gateway keeps each open episode's last call in memory (:mod:`swarm.gateway.episodes`). Before
it trusts that memory it asks the pool for the episode's *head*: the episode record (is it still
open?) and the index of its last step. Appended indices only grow, so an unchanged last index
means no other gateway (or white-box submission) wrote to the episode since. One query answers
for any number of episodes, so concurrent calls share it.

Errors: none of its own; unknown episode ids are simply absent from the result.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from swarm.pool.checks import IN_CHUNK, chunks
from swarm.pool.engine import Database
from swarm.pool.rows import to_episode
from swarm.pool.schema import episodes as E
from swarm.pool.schema import steps as S
from swarm.records import Episode

__all__ = ["EpisodeHead", "HeadsMixin", "LAST_INDEX"]

# an episode's last step index, per episode row: a correlated max() is one seek at the end of the (episode_id, idx)
# index, where ``max(idx) ... GROUP BY episode_id`` reads every index entry of the episode (SQLite and PostgreSQL
# alike: O(the episode's steps) a call; 9.5 ms at 100,000 steps on SQLite)
LAST_INDEX = (
    sa.select(sa.func.max(S.c.idx)).where(S.c.episode_id == E.c.episode_id).scalar_subquery().label("last_index")
)
# built once: SQLAlchemy then reuses its compiled form and cache key (building it per call cost
# more CPU than running it)
_HEADS = sa.select(E, LAST_INDEX).where(E.c.episode_id.in_(sa.bindparam("ids", expanding=True)))


@dataclass(frozen=True)
class EpisodeHead:
    """An episode as stored now, and the index of its last step (None before its first step)."""

    episode: Episode
    last_index: int | None


class HeadsMixin(Database):
    """``episode_heads`` for :class:`swarm.pool.store.Pool`."""

    def episode_heads(self, episode_ids: list[str]) -> dict[str, EpisodeHead]:
        """Heads of the named episodes that exist (one read transaction; on SQLite, a read on the driver)."""
        ids = sorted(set(episode_ids))
        if self.sql.driver_sql and len(ids) <= IN_CHUNK:  # the gateway's reads: ~4x less CPU (docs/pool.md)
            with self._driver_conn() as c:
                rows = c.execute(_HEADS, {"ids": ids})
            return {r.episode_id: EpisodeHead(to_episode(r._asdict()), r.last_index) for r in rows}
        out: dict[str, EpisodeHead] = {}
        with self._tx() as c:
            for chunk in chunks(ids):
                rows = c.execute(_HEADS, {"ids": chunk}).mappings()
                out.update((r["episode_id"], EpisodeHead(to_episode(r), r["last_index"])) for r in rows)
        return out
