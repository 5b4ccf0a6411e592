"""Episode lifecycle: ``POST /v1/episodes`` (-> base_url + api key), heartbeat, end, abort.

Creating an episode needs the client token when one is configured. Heartbeat / end / abort take
the episode's own key (or the client / admin token). Opens and ends (aborts too) are group-committed
(:class:`swarm.gateway.batcher.Batcher`): each is answered once the transaction holding it has
committed. Episodes idle past their ``timeout_s`` are abandoned by the sweep in
:mod:`swarm.app`, not here.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from swarm.gateway.routes_ingest import min_reward_source
from swarm.gateway.schemas import EpisodeCreate, EpisodeEnd
from swarm.gateway.state import GatewayState, State
from swarm.pool import EpisodeEnding
from swarm.records import Episode, EpisodeStatus
from swarm.web.auth import Caller
from swarm.web.errors import ApiError
from swarm.web.state import any_caller, client_caller

__all__ = ["router", "episode_json"]

router = APIRouter(tags=["episodes"])


def episode_json(ep: Episode) -> dict[str, Any]:
    return ep.model_dump(mode="json")


def _check(caller: Caller, episode_id: str) -> None:
    if not caller.may_touch(episode_id):
        raise ApiError(403, "this api key belongs to another episode", code="wrong_episode")


@router.post("/v1/episodes")
async def create_episode(body: EpisodeCreate, request: Request, caller: Caller = Depends(client_caller),
                         state: GatewayState = Depends(State)) -> dict[str, Any]:
    """Open an episode; its ``api_key`` and ``base_url`` go to any OpenAI-compatible client."""
    s = state.settings
    timeout = s.default_episode_timeout_s if body.timeout_s is None else body.timeout_s
    if timeout > s.max_episode_timeout_s:
        raise ApiError(400, f"timeout_s is {timeout}; at most {s.max_episode_timeout_s}", param="timeout_s",
                       code="invalid_value")
    ep = Episode(task=body.task, group_id=body.group_id, client_id=body.client_id, type=body.type,
                 timeout_s=timeout, metadata=body.metadata)
    ep = await state.episode_opener.submit(ep)
    return {"episode_id": ep.episode_id, "base_url": state.base_url(request),
            "api_key": state.signer.issue(ep.episode_id), "task": ep.task, "group_id": ep.group_id,
            "type": ep.type.value, "timeout_s": ep.timeout_s, "created_at": ep.created_at}


@router.post("/v1/episodes/{episode_id}/heartbeat")
async def heartbeat(episode_id: str, caller: Caller = Depends(any_caller),
                    state: GatewayState = Depends(State)) -> dict[str, Any]:
    """Keep an open episode from being abandoned."""
    _check(caller, episode_id)
    await state.write(state.recorder.heartbeat, episode_id)
    return {"episode_id": episode_id, "status": "open"}


@router.post("/v1/episodes/{episode_id}/end")
async def end_episode(episode_id: str, body: EpisodeEnd | None = None, caller: Caller = Depends(any_caller),
                      state: GatewayState = Depends(State)) -> dict[str, Any]:
    """Finish (or fail) an episode, with its reward and per-step rewards (final), by the caller's authority.

    The pool decides under the episode's lock (:func:`swarm.pool.rewards.ending_rewards`): below the task's floor
    or a higher authority's episode reward, the ending's rewards stay history (``reward_applied`` false); a step
    reward a higher authority set stands (``step_rewards_refused``)."""
    _check(caller, episode_id)
    body = body or EpisodeEnd()
    rewarded = body.reward is not None or bool(body.step_rewards)
    floor = await min_reward_source(state, episode_id) if rewarded else "agent"
    ended = await state.episode_ender.submit(EpisodeEnding(episode_id, EpisodeStatus(body.status), body.reward,
                                                           body.step_rewards, body.metadata,
                                                           source=caller.reward_source, min_source=floor))
    state.episodes.forget(episode_id)
    out = episode_json(ended.episode)
    if ended.rewards is not None:
        if ended.refused_steps:
            out["step_rewards_refused"] = dict(ended.refused_steps)
        out.update(reward_applied=ended.rewards.applied, reward_source=ended.rewards.source,
                   reward_reason=ended.rewards.reason)
    return out


@router.post("/v1/episodes/{episode_id}/abort")
async def abort_episode(episode_id: str, caller: Caller = Depends(any_caller),
                        state: GatewayState = Depends(State)) -> dict[str, Any]:
    """End an episode as failed (its steps are kept, never trained)."""
    _check(caller, episode_id)
    ended = await state.episode_ender.submit(EpisodeEnding(episode_id, EpisodeStatus.failed))
    state.episodes.forget(episode_id)
    return episode_json(ended.episode)
