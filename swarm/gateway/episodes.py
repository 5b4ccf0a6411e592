"""Open episodes in gateway memory: each episode's last call, trusted only after a version check.

The prefix logic (:mod:`swarm.gateway.prefix`) needs the previous call of an episode: its
messages, tools, prompt and response ids and the step ids of its n choices. Reading them back
from the pool on every call costs two or three transactions and a token-block join; instead the
gateway remembers what it stored last for each episode (:meth:`OpenEpisodes.remember`).

Memory is only a cache. Every call first reads the episode's *head* from the pool (its record
and the index of its last step, :meth:`swarm.pool.Pool.episode_heads`; concurrent calls share
one read). The memory is used when it was taken at that same last index; otherwise another
gateway (or a white-box submission) wrote to the episode since, and the last call is read from
the pool again (:func:`load_last_call`). So several gateways on one pool stay exactly as
consistent as before, and one gateway pays no re-read. At most ``capacity`` episodes are kept
(least recently used go first); ended episodes are dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from swarm.errors import SwarmError
from swarm.gateway.batcher import Batcher
from swarm.gateway.prefix import PreviousCall
from swarm.pool import EpisodeHead, Lookup, Recorder
from swarm.records import Step

__all__ = ["LastCall", "OpenEpisodes", "load_last_call"]


@dataclass(frozen=True)
class LastCall:
    """The episode's last stored step (index, id) and, for a chat call, its choices as prefix candidates."""

    index: int
    step_id: str
    candidates: list[PreviousCall] = field(default_factory=list)


def _previous(s: Step, rendered: str | None = None, rendered_key: str | None = None) -> PreviousCall:
    return PreviousCall(s.step_id, s.prompt_messages or [], s.metadata.get("tools"), s.prompt_ids, s.response_ids,
                        s.response_text, s.tool_calls, rendered, rendered_key)


def last_call_of(steps: list[Step], rendered: str | None = None, rendered_key: str | None = None) -> LastCall:
    """What to remember after storing one call's steps (its n choices, indices assigned); ``rendered``: its
    prompt's text as rendered for it (one prompt for all choices), under ``rendered_key``."""
    last = max(steps, key=lambda s: s.index)
    chat = [s for s in steps if s.metadata.get("kind") == "chat" and s.prompt_messages is not None]
    chat.sort(key=lambda s: s.metadata.get("choice", 0))
    return LastCall(last.index, last.step_id, [_previous(s, rendered, rendered_key) for s in chat])


def load_last_call(pool: Lookup, episode_id: str) -> LastCall | None:
    """The episode's last call as stored in the pool (the last step and its sibling choices)."""
    last = pool.last_step(episode_id, with_tokens=True)
    if last is None:
        return None
    if last.metadata.get("kind") != "chat" or last.prompt_messages is None:
        return LastCall(last.index, last.step_id)
    steps = [last]
    for sid in last.metadata.get("siblings", []):
        if sid != last.step_id:
            try:
                steps.append(pool.get_step(sid, with_tokens=True))
            except SwarmError:
                continue
    steps.sort(key=lambda s: s.metadata.get("choice", 0))
    return LastCall(last.index, last.step_id, [_previous(s) for s in steps])


class OpenEpisodes:
    """Heads read in batches, last calls kept in memory per episode (see the module docstring)."""

    def __init__(self, recorder: Recorder, lookup: Lookup, db: Callable[..., Awaitable[Any]],
                 capacity: int = 2048, inline_heads: bool = False) -> None:
        """``inline_heads``: read heads on the event loop, not on a worker thread (a local SQLite file: the read
        is a few hundred microseconds that never wait for a writer in WAL mode, less than the thread hop costs)."""
        self.recorder, self.lookup = recorder, lookup
        self._db = db
        self.inline_heads = inline_heads
        self.capacity = capacity
        self._last: OrderedDict[str, LastCall] = OrderedDict()
        self._heads: Batcher[str, EpisodeHead | None] = Batcher(self._read_heads)
        self.hits = 0  # calls served from memory / calls that had to read the pool (benchmarks, tests)
        self.misses = 0

    async def _read_heads(self, ids: list[str]) -> list[EpisodeHead | None]:
        if self.inline_heads:
            heads = self.recorder.episode_heads(ids)
        else:
            heads = await self._db(self.recorder.episode_heads, ids)
        return [heads.get(i) for i in ids]

    async def head(self, episode_id: str) -> EpisodeHead | None:
        """The episode's record and last step index as the pool has them now (None: no such episode)."""
        return await self._heads.submit(episode_id)

    async def last_call(self, head: EpisodeHead) -> LastCall | None:
        """The episode's last call at ``head``: from memory when it is current, else from the pool."""
        ep_id = head.episode.episode_id
        if head.last_index is None:
            return None
        known = self._last.get(ep_id)
        if known is not None and known.index == head.last_index:
            self._last.move_to_end(ep_id)
            self.hits += 1
            return known
        self.misses += 1
        loaded = await self._db(load_last_call, self.lookup, ep_id)
        if loaded is not None:
            self._keep(ep_id, loaded)
        return loaded

    def known(self, episode_id: str) -> LastCall | None:
        """The newest last call this gateway knows of (no pool access)."""
        return self._last.get(episode_id)

    def remember(self, episode_id: str, steps: list[Step], rendered: str | None = None,
                 rendered_key: str | None = None) -> None:
        """Record a call's steps, just committed with their pool indices, as the episode's last call (with the
        text its prompt was rendered to, when known: :attr:`swarm.gateway.prefix.PreviousCall.rendered`)."""
        if steps:
            self._keep(episode_id, last_call_of(steps, rendered, rendered_key))

    def forget(self, episode_id: str) -> None:
        self._last.pop(episode_id, None)

    def _keep(self, episode_id: str, call: LastCall) -> None:
        old = self._last.get(episode_id)
        if old is not None and old.index > call.index:  # a concurrent call of this episode committed later
            return
        self._last[episode_id] = call
        self._last.move_to_end(episode_id)
        while len(self._last) > self.capacity:
            self._last.popitem(last=False)
