"""GatewayState: the shared :class:`~swarm.web.state.ServiceState` plus the gateway's episode write path.

One instance per app, stored on ``app.state.gateway``; gateway routes get it with :func:`State`.
Per-episode locks serialize step *storage* (index assignment) within this process, not generation:
two calls of one episode still generate concurrently.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections import OrderedDict

from fastapi import Request

from swarm.gateway.batcher import Batcher
from swarm.gateway.episodes import OpenEpisodes
from swarm.policy.base import PolicyBackend
from swarm.pool import Ended, EpisodeEnding, EpisodeHead, Served, WriteBusy
from swarm.records import Episode, EpisodeStatus, Step
from swarm.web.auth import Caller
from swarm.web.errors import ApiError
from swarm.web.settings import GatewaySettings
from swarm.web.state import ServiceState

__all__ = ["GatewayState", "State"]


class GatewayState(ServiceState):
    """The service state with open-episode heads, group-commit writers and per-episode locks."""

    def __init__(self, pool: Served, backend: PolicyBackend, settings: GatewaySettings) -> None:
        super().__init__(pool, backend, settings)
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        # SQLite (one local file, WAL): heads are read right on the event loop (see OpenEpisodes)
        self.episodes = OpenEpisodes(self.recorder, self.lookup, self.db, inline_heads=bool(pool.single_writer))
        # group commit: concurrent calls' steps, episode opens and episode ends each go to the pool
        # in one transaction per batch; on SQLite each batch is taken under the write gate
        gate = self._write_gate
        self.step_writer: Batcher[list[Step], None] = Batcher(self._write_steps, gate=gate)
        self.episode_opener: Batcher[Episode, Episode] = Batcher(
            functools.partial(self.db, self.recorder.add_episodes), gate=gate)
        self.episode_ender: Batcher[EpisodeEnding, Ended] = Batcher(
            functools.partial(self.db, self.recorder.end_episodes), gate=gate)
        # (episode, kind, Idempotency-Key) -> steps this process stored for that call: a repeat racing the first
        # call is answered from here without a pool read under the episode lock (bounded, oldest dropped)
        self.recent_calls: OrderedDict[tuple[str, str, str], list[Step]] = OrderedDict()

    def remember_call(self, ident: tuple[str, str, str], steps: list[Step]) -> None:
        self.recent_calls[ident] = steps
        while len(self.recent_calls) > 4096:
            self.recent_calls.popitem(last=False)

    async def _write_steps(self, calls: list[list[Step]]) -> list[None]:
        # the pool numbers them in its write transaction: another gateway may write these episodes too
        steps = [s for c in calls for s in c]
        if self.recorder.nowait_writes:  # SQLite: written right here, unless another writer holds the lock
            try:  # a thread hop costs more than a call's write (docs/pool.md "Writes without waiting")
                self.recorder.add_steps(steps, append=True, wait=False)
                return [None] * len(calls)
            except WriteBusy:
                pass
        await self.db(self.recorder.add_steps, steps, append=True)
        return [None] * len(calls)

    def episode_lock(self, episode_id: str) -> asyncio.Lock:
        lock = self._locks.get(episode_id)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[episode_id] = lock
        return lock

    async def open_episode(self, caller: Caller) -> Episode:
        """The caller's episode, which must exist in this pool and still be open."""
        return (await self.open_head(caller)).episode

    async def open_head(self, caller: Caller) -> EpisodeHead:
        """The caller's open episode and its last step index (one batched read; see :mod:`.episodes`)."""
        assert caller.episode_id is not None
        head = await self.episodes.head(caller.episode_id)
        if head is None:
            raise ApiError(401, "invalid api key: its episode does not exist in this pool", code="invalid_api_key")
        ep = head.episode
        if ep.status != EpisodeStatus.open:
            self.episodes.forget(ep.episode_id)
            raise ApiError(403, f"episode {ep.episode_id} is {ep.status.value}; its key can no longer add steps",
                           code="episode_ended")
        return head


async def State(request: Request) -> GatewayState:  # noqa: N802 - reads as a type in signatures
    return request.app.state.gateway
