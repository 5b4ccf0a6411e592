"""GroupJudge: scores complete GRPO groups with an LLM judge and gives the scores as rewards.

A pool service, like the trainer: it reads the pool directly and reports rewards with the
``judge`` authority (:mod:`swarm.pool.rewards`), and it calls the judge policy through the
gateway, so every judge call is an ordinary recorded step. For each group of its task
(group ids ``<task>-<seed>``) whose ``group_size`` episodes have all ended and whose finished
episodes have no reward yet (the gateway keeps the agent's own report in the history when the
task takes rewards from the judge: ``gateway.reward_authority``):

1. render the finished episodes (:mod:`swarm.judge.prompt`), in chunks of ``chunk_size``;
2. look the chunk's content key up: in memory, then among the pool's finished judge episodes
   (``metadata.judge_key``); a hit makes no call;
3. else open a judge episode (task ``judge``, type ``eval``, labelled ``judge`` with
   ``exclude``: never trained; ``metadata.judge`` links it to the group and its episodes), ask
   the judge at temperature 0 under the JSON schema, retry up to ``retries`` times on junk or
   an HTTP error, and end it with ``metadata.judge_result`` (the scores, or the errors);
4. report ``weight_judge * normalised score + weight_task * task reward`` per episode and an
   event ``judge`` explaining it (score, scale, judge episode and step, cache hit).

A chunk that fails every attempt fails its group: each finished episode gets the label and
event ``judge_failed`` with the reason, and no reward (so it is never trained on a made-up 0).
Groups with an open episode, or fewer than ``group_size`` episodes, wait. It does not train,
start servers or decide the gateway's reward authority.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from swarm.client.sdk import EpisodeHandle, SwarmClient
from swarm.errors import BackendError
from swarm.judge.prompt import (
    JudgeReplyError,
    Trajectory,
    cache_key,
    chunks,
    judge_messages,
    parse_scores,
    response_format,
)
from swarm.judge.spec import JudgeSpec
from swarm.pool import Annotator, Lookup, StepFilter
from swarm.records import Episode, EpisodeStatus, Event, RewardStatus, Source

__all__ = ["GroupJudge", "GroupOutcome", "JudgeFailed", "JudgedPool", "JUDGE_TASK", "combine"]

log = logging.getLogger(__name__)
JUDGE_TASK = "judge"
_SCAN = 10_000


@dataclass
class GroupOutcome:
    """What became of one group: ``judged`` (a call), ``cached`` (no call) or ``failed`` (no reward)."""

    group_id: str
    status: str
    rewards: dict[str, float] = field(default_factory=dict)
    judge_episodes: list[str] = field(default_factory=list)
    reason: str = ""


@dataclass
class _Chunk:
    scores: list[int]
    judge_episode: str
    judge_step: str | None
    cached: bool


class JudgeFailed(BackendError, RuntimeError):
    """Every attempt of a judge call failed; ``judge_episode`` holds the recorded attempts. Also a RuntimeError."""

    def __init__(self, reason: str, judge_episode: str, group_id: str | None = None) -> None:
        super().__init__(reason, judge_episode=judge_episode, group_id=group_id)
        self.judge_episode = judge_episode


def combine(spec: JudgeSpec, score: int, task_reward: float | None) -> float:
    """The episode's reward: the weighted normalised judge score plus the weighted task reward (None: 0)."""
    norm = (score - spec.scale_min) / (spec.scale_max - spec.scale_min)
    return spec.weight_judge * norm + spec.weight_task * float(task_reward or 0.0)



class JudgedPool(Lookup, Annotator, Protocol):
    """What the judge uses of the pool: episodes and steps read back, rewards, events and labels written."""


class GroupJudge:
    """Judges ``task``'s complete groups on ``pool`` through the gateway at ``server`` (see the module docstring)."""

    def __init__(self, pool: JudgedPool, server: str, spec: JudgeSpec, task: str, group_size: int,
                 token: str | None = None, lookback_s: float = 3600.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.pool, self.spec, self.task, self.group_size = pool, spec, task, int(group_size)
        self.client = SwarmClient(server, token=token, timeout=spec.timeout_s, transport=transport)
        self._http = httpx.Client(timeout=spec.timeout_s, transport=transport)
        self._since = time.time() - lookback_s
        self._done: set[str] = set()
        self._cache: dict[str, tuple[list[int], str, str | None]] = {}
        self.stats: dict[str, int] = {"judged": 0, "cached": 0, "failed": 0, "calls": 0, "bad_replies": 0}
        self._lock = threading.Lock()  # stats, _done and _cache are shared by poll()'s threads

    def close(self) -> None:
        self.client.close()
        self._http.close()

    # -- which groups ---------------------------------------------------------------------------
    def ready_groups(self) -> list[str]:
        """Groups of this task with finished, unrewarded episodes and none open, ``group_size`` in all."""
        eps = self.pool.query_episodes(StepFilter(episode_status=EpisodeStatus.finished,
                                                  reward_status=RewardStatus.pending, since=self._since), limit=_SCAN)
        prefix = f"{self.task}-"
        newest: dict[str, float] = {}
        for e in eps:
            if e.group_id and e.group_id.startswith(prefix) and e.group_id not in self._done:
                newest[e.group_id] = max(newest.get(e.group_id, 0.0), e.ended_at or e.created_at)
        # newest first: when the judge falls behind, fresh groups are worth more to on-policy training
        # than groups that will be too stale to train by the time they are scored
        candidates = sorted(newest, key=lambda g: (-newest[g], g))
        return [g for g in candidates if self._complete(self._members(g))]

    def _members(self, group_id: str) -> list[Episode]:
        return self.pool.query_episodes(StepFilter(group_id=group_id, include_excluded=True), limit=_SCAN)

    def _complete(self, members: list[Episode]) -> bool:
        return len(members) >= self.group_size and all(e.status != EpisodeStatus.open for e in members)

    def poll(self) -> list[GroupOutcome]:
        """Judge every ready group once, ``spec.concurrency`` at a time (the backend batches them);
        returns their outcomes in :meth:`ready_groups` order."""
        groups = self.ready_groups()
        if self.spec.concurrency == 1 or len(groups) < 2:
            return [self.judge_group(g) for g in groups]
        with ThreadPoolExecutor(min(self.spec.concurrency, len(groups)), thread_name_prefix="swarm-judge") as ex:
            return list(ex.map(self.judge_group, groups))

    def run(self, stop: threading.Event, poll_s: float = 0.5) -> dict[str, int]:
        """:meth:`poll` until ``stop`` is set; a failing pool or gateway read is logged and retried."""
        while not stop.is_set():
            try:
                self.poll()
            except Exception as exc:  # a service loop outlives a gateway restart or a locked pool: next poll
                if stop.is_set():
                    break
                log.warning("judge: %s: %s (the group is tried again)", type(exc).__name__, exc)
            stop.wait(poll_s)
        return dict(self.stats)

    # -- one group ------------------------------------------------------------------------------
    def judge_group(self, group_id: str) -> GroupOutcome:
        """Score the group's finished episodes (cached content makes no call) and report their rewards."""
        members = [e for e in self._members(group_id) if e.status == EpisodeStatus.finished and e.reward is None]
        members.sort(key=lambda e: (e.created_at, e.episode_id))
        out = GroupOutcome(group_id, "cached")
        if not members:
            self._done.add(group_id)
            out.status = "judged"
            return out
        pairs = [(e, self._trajectory(e)) for e in members]
        results: list[tuple[Episode, int, _Chunk]] = []
        for i, part in enumerate(chunks(pairs, self.spec.chunk_size)):
            try:
                got = self._judge_chunk(group_id, i, [e for e, _ in part], [t for _, t in part])
            except JudgeFailed as exc:
                self._mark_failed(group_id, members, exc.message, exc.judge_episode)
                self._count("failed", done=group_id)
                return GroupOutcome(group_id, "failed", judge_episodes=[exc.judge_episode], reason=exc.message)
            out.judge_episodes.append(got.judge_episode)
            out.status = "judged" if not got.cached else out.status
            results.extend((e, s, got) for (e, _), s in zip(part, got.scores, strict=True))
        for ep, score, got in results:
            out.rewards[ep.episode_id] = self._reward(ep, score, got)
        self._count(out.status, done=group_id)  # only now: a group interrupted by an error is tried again
        return out

    def _count(self, stat: str, done: str | None = None) -> None:
        with self._lock:
            self.stats[stat] += 1
            if done is not None:
                self._done.add(done)

    def _trajectory(self, ep: Episode) -> Trajectory:
        steps = self.pool.query_steps(StepFilter(episode_id=ep.episode_id, include_excluded=True), limit=_SCAN,
                                      with_tokens=False)
        if not steps:
            return Trajectory(ep.episode_id, ({"role": "assistant", "content": "(no model call)"},))
        last = max(steps, key=lambda s: s.index)
        reply = {"role": "assistant", "content": last.response_text or ""}
        if last.tool_calls:
            reply["tool_calls"] = last.tool_calls
        return Trajectory(ep.episode_id, (*[dict(m) for m in last.prompt_messages or []], reply))

    def _judge_chunk(self, group_id: str, index: int, eps: list[Episode], trajs: list[Trajectory]) -> _Chunk:
        messages = judge_messages(self.spec, trajs)
        key = cache_key(self.spec, messages)
        hit = self._cache.get(key) or self._stored(key, len(trajs))
        if hit is not None:
            self._cache[key] = hit
            return _Chunk(hit[0], hit[1], hit[2], cached=True)
        link = {"group_id": group_id, "task": self.task, "chunk": index, "episodes": [e.episode_id for e in eps],
                "policy": self.spec.policy, "spec": self.spec.identity()}
        ep = self.client.begin(JUDGE_TASK, group_id=f"judge-{group_id}", type="eval",
                               metadata={"judge": link, "judge_key": key}, timeout_s=self.spec.timeout_s * 4)
        self.pool.label("episode", ep.episode_id, "judge", exclude=True,
                        note=f"judge call for group {group_id}: recorded, never trained")
        errors: list[str] = []
        for _ in range(self.spec.retries + 1):
            self._count("calls")
            try:
                text = self._ask(ep.base_url, ep.api_key, messages, len(trajs))
                scores = parse_scores(text, len(trajs), self.spec)
            except (JudgeReplyError, httpx.HTTPError, ValueError, KeyError) as exc:
                self._count("bad_replies")
                errors.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            step = self.pool.last_step(ep.episode_id, with_tokens=False)
            sid = step.step_id if step is not None else None
            self._end(ep, "finished", {"status": "ok", "scores": scores, "attempts": len(errors) + 1,
                                       "errors": errors, "step_id": sid})
            self._cache[key] = (scores, ep.episode_id, sid)
            return _Chunk(scores, ep.episode_id, sid, cached=False)
        reason = f"judge {self.spec.policy!r} failed {len(errors)} attempts; last: {errors[-1]}"
        self._end(ep, "failed", {"status": "failed", "attempts": len(errors), "errors": errors})
        raise JudgeFailed(reason, ep.episode_id, group_id)

    def _ask(self, base_url: str, api_key: str, messages: list[dict[str, str]], n: int) -> str:
        """One judge call through the gateway: temperature 0, the score schema as ``response_format``."""
        body = {"model": self.spec.policy, "messages": messages, "temperature": 0.0,
                "max_tokens": self.spec.max_tokens, "response_format": response_format(self.spec, n)}
        r = self._http.post(f"{base_url.rstrip('/')}/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {api_key}"})
        if r.status_code >= 400:
            raise httpx.HTTPStatusError(f"{r.status_code}: {r.text[:200]}", request=r.request, response=r)
        return r.json()["choices"][0]["message"]["content"] or ""

    def _end(self, ep: EpisodeHandle, status: str, result: dict[str, object]) -> None:
        self.client.request("POST", f"/v1/episodes/{ep.episode_id}/end", key=ep.api_key,
                            json={"status": status, "metadata": {"judge_result": result}}, episode_id=ep.episode_id)

    def _stored(self, key: str, n: int) -> tuple[list[int], str, str | None] | None:
        """A finished judge episode of the same content in the pool (an earlier run, another judge)."""
        found = self.pool.query_episodes(StepFilter(task=JUDGE_TASK, episode_status=EpisodeStatus.finished,
                                                    metadata={"judge_key": key}, include_excluded=True), limit=1)
        if not found:
            return None
        res = found[0].metadata.get("judge_result") or {}
        scores = res.get("scores")
        if res.get("status") != "ok" or not isinstance(scores, list) or len(scores) != n:
            return None
        return [int(s) for s in scores], found[0].episode_id, res.get("step_id")

    # -- results --------------------------------------------------------------------------------
    def _task_reward(self, episode_id: str) -> float | None:
        """The task's own reward for the episode: the agent's latest episode-level report in the history."""
        rows = [r for r in self.pool.reward_history(episode_id) if r["source"] == "agent" and r["step_id"] is None]
        return float(rows[-1]["value"]) if rows else None

    def _reward(self, ep: Episode, score: int, got: _Chunk) -> float:
        task_reward = self._task_reward(ep.episode_id) if self.spec.weight_task else None
        reward = combine(self.spec, score, task_reward)
        outcome = self.pool.report_reward(episode_id=ep.episode_id, reward=reward, source="judge")
        self.pool.add_event(Event(episode_id=ep.episode_id, name="judge", value=reward, source=Source.service,
                                  payload={"score": score, "scale": [self.spec.scale_min, self.spec.scale_max],
                                           "judge_policy": self.spec.policy, "judge_episode_id": got.judge_episode,
                                           "judge_step_id": got.judge_step, "cached": got.cached,
                                           "task_reward": task_reward,
                                           "weights": {"judge": self.spec.weight_judge, "task": self.spec.weight_task},
                                           "applied": outcome.applied, "reason": outcome.reason}))
        return reward

    def _mark_failed(self, group_id: str, members: list[Episode], reason: str, judge_episode: str) -> None:
        log.warning("judge: group %s failed: %s", group_id, reason)
        for ep in members:
            self.pool.label("episode", ep.episode_id, "judge_failed", note=reason[:500])
            self.pool.add_event(Event(episode_id=ep.episode_id, name="judge_failed", source=Source.service,
                                      payload={"reason": reason, "judge_episode_id": judge_episode,
                                               "group_id": group_id}))
