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
from swarm.pool import AUTHORITY, EpisodeEnding
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
    """Finish (or fail) an episode, with its reward and per-step rewards (final)."""
    _check(caller, episode_id)
    body = body or EpisodeEnd()
    reward, step_rewards, note = body.reward, body.step_rewards, None
    refused: dict[str, float] = {}  # step rewards a higher authority already set: history only
    if reward is not None or step_rewards:
        note = await _end_reward_authority(state, caller, episode_id)
        if note is not None:  # a higher authority's reward stands: the ending's rewards are history only
            reward, step_rewards = None, None
        elif step_rewards:
            mine = AUTHORITY[caller.reward_source]
            higher = await state.db(state.annotator.step_reward_sources, episode_id, list(step_rewards))
            refused = {s: v for s, v in step_rewards.items() if AUTHORITY[higher.get(s, "agent")] > mine}
            step_rewards = {s: v for s, v in step_rewards.items() if s not in refused}
    ep = await state.episode_ender.submit(EpisodeEnding(episode_id, EpisodeStatus(body.status), reward,
                                                        step_rewards, body.metadata, source=caller.reward_source))
    state.episodes.forget(episode_id)
    out = episode_json(ep)
    # a higher authority's episode reward that landed after the check above stands (the pool checks again)
    raced = (None if note is not None or reward is None or ep.reward == reward else
             "a higher authority set the episode's reward while it was ending; kept in the history")
    if body.reward is not None or body.step_rewards:
        src = caller.reward_source
        if note is not None:  # nothing of the ending's rewards applied
            await state.write(state.annotator.record_rewards, episode_id, src, body.reward, body.step_rewards, False, note)
        else:
            if raced:
                await state.write(state.annotator.record_rewards, episode_id, src, body.reward, None, False, raced)
            if src != "agent":  # an unrecorded reward counts as the agent's anyway
                await state.write(state.annotator.record_rewards, episode_id, src, None if raced else body.reward,
                                  step_rewards, True, "applied when the episode ended")
        if refused:
            why = (f"a higher authority set these steps' rewards, which a {src} cannot supersede; "
                   "kept in the history")
            await state.write(state.annotator.record_rewards, episode_id, src, None, refused, False, why)
            out["step_rewards_refused"] = {s: why for s in refused}
        out.update(reward_applied=note is None and raced is None, reward_source=src,
                   reward_reason=note or raced or "applied")
    return out


async def _end_reward_authority(state: GatewayState, caller: Caller, episode_id: str) -> str | None:
    """Why the caller's end-of-episode rewards must not apply (None: they apply)."""
    mine = caller.reward_source
    floor = await min_reward_source(state, episode_id)
    if AUTHORITY[mine] < AUTHORITY[floor]:
        return f"this task takes rewards from {floor} or higher; the {mine}'s report is kept in the history"
    current = await state.db(state.annotator.episode_reward_authority, episode_id)
    if current is not None and AUTHORITY[current] > AUTHORITY[mine]:
        return f"the episode's reward was set by the {current}, which a {mine} cannot supersede; kept in the history"
    return None


@router.post("/v1/episodes/{episode_id}/abort")
async def abort_episode(episode_id: str, caller: Caller = Depends(any_caller),
                        state: GatewayState = Depends(State)) -> dict[str, Any]:
    """End an episode as failed (its steps are kept, never trained)."""
    _check(caller, episode_id)
    ep = await state.episode_ender.submit(EpisodeEnding(episode_id, EpisodeStatus.failed))
    state.episodes.forget(episode_id)
    return episode_json(ep)
