"""Ingestion besides OpenAI calls: white-box steps, events (incl. late rewards) and feedback.

- ``POST /v1/steps``: a white-box agent submits its own exact ids with the episode's key. Any
  policy name and any length are accepted (the body limit is ``max_whitebox_body_bytes``), but
  token ids must be in the vocabulary of a policy this gateway serves, and a ``parent_step_id``
  must name a step of the same episode (else 400); the steps are stored in one transaction with
  consecutive indices. A retry naming step ids that are already stored in this episode is a
  no-op for those steps.
- ``POST /v1/events`` / ``POST /v1/feedback``: attach to an episode, a step or a response id
  (the ``id`` of a chat completion), also after the episode ended. They need the episode's key
  (that episode's targets only) or a configured client / admin token (any target): nothing else,
  even on an open gateway. Rewards go by authority (:mod:`swarm.pool.rewards`): the caller is the
  ``agent`` (episode key), a ``judge`` (client token) or the ``admin``; a higher authority supersedes a
  lower one, an equal one never overwrites a final reward, and every reward is recorded with its
  source. The answer says whether it was applied and why (``reward_applied``, ``reward_reason``).
- A feedback ``correction`` is also stored as exact token ids for the trainer
  (``payload["correction_tokens"]``: the corrected step, its policy, the ids), tokenized here with
  the step's policy: the text as plain text (control-token spellings stay text) followed by the
  end-of-turn id the step itself ended with (else the tokenizer's eos), as the backend ends an
  assistant turn. A correction of an episode corrects its last step. Without a local tokenizer for
  that policy (upstream, echo) the correction is stored as text only (``correction_ids: null``, the
  reason in ``correction_reason``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from swarm.errors import NotFoundError, SwarmError
from swarm.gateway.schemas import EventIn, FeedbackIn, StepsSubmit, WhiteboxStep
from swarm.gateway.state import GatewayState, State
from swarm.policy.base import vocab_size
from swarm.policy.textguard import GUARD_CLOSE, GUARD_OPEN, strip_marks
from swarm.pool import CORRECTION_KEY, RewardOutcome
from swarm.records import Event, Source, Step
from swarm.web.auth import Caller
from swarm.web.errors import ApiError
from swarm.web.state import any_caller, episode_caller

__all__ = ["router", "min_reward_source", "report_reward", "correction_tokens"]

router = APIRouter(tags=["ingest"])


@router.post("/v1/steps")
async def submit_steps(body: StepsSubmit, caller: Caller = Depends(episode_caller),
                       state: GatewayState = Depends(State)) -> dict[str, Any]:
    """White-box steps for the key's episode -> ``{"step_ids": [...]}``."""
    ep = await state.open_episode(caller)
    for i, s in enumerate(body.steps):
        if s.episode_id is not None and s.episode_id != ep.episode_id:
            raise ApiError(403, f"steps[{i}].episode_id is not the episode of this api key", code="wrong_episode",
                           param=f"steps.{i}.episode_id")
        if "constraint" in s.metadata:  # the trainer replays it: only the gateway's own sampling records one
            raise ApiError(400, f"steps[{i}].metadata.constraint is recorded by the gateway for constrained calls; "
                           "white-box steps cannot declare one", param=f"steps.{i}.metadata.constraint",
                           code="invalid_value")
        _check_vocab(state, i, s)
    async with state.episode_lock(ep.episode_id):
        known: dict[str, Step] = {}
        for s in body.steps:
            if s.step_id is not None:
                try:
                    known[s.step_id] = await state.db(state.lookup.get_step, s.step_id, with_tokens=False)
                except NotFoundError:
                    pass
        for sid, old in known.items():
            if old.episode_id != ep.episode_id:
                raise ApiError(409, f"step id {sid} is already used by another episode", code="step_id_taken")
        await _check_parents(state, ep.episode_id, body)
        last = await state.db(state.lookup.last_step, ep.episode_id, with_tokens=False)
        index = 0 if last is None else last.index + 1
        steps, ids = [], []
        for i, s in enumerate(body.steps):
            if s.step_id in known:
                ids.append(s.step_id)
                continue
            fields = s.model_dump(exclude={"episode_id", "step_id", "reward"}, exclude_none=True)
            extra = {"step_id": s.step_id} if s.step_id else {}
            try:
                step = Step(episode_id=ep.episode_id, index=index, task=ep.task, group_id=ep.group_id,
                            source=Source.whitebox, reward=s.reward, **extra, **fields)
            except ValueError as exc:  # pydantic's cross-field checks (lengths, parent)
                raise ApiError(400, f"steps[{i}]: {exc}", param=f"steps.{i}", code="invalid_value") from exc
            index += 1
            steps.append(step)
            ids.append(step.step_id)
        if steps:
            await state.write(state.recorder.add_steps, steps, append=True)
    return {"step_ids": ids}


def _check_vocab(state: GatewayState, i: int, s: WhiteboxStep) -> None:
    """Token ids must be in the policy's vocabulary (when the gateway serves that policy)."""
    vocab = vocab_size(state.backend, s.policy)
    if vocab is None:
        return
    for name in ("prompt_ids", "response_ids"):
        bad = next((t for t in getattr(s, name) if t >= vocab), None)
        if bad is not None:
            raise ApiError(400, f"steps[{i}].{name}: token id {bad} is outside the vocabulary of policy "
                           f"{s.policy!r} (ids must be in [0, {vocab}))", param=f"steps.{i}.{name}",
                           code="invalid_token_id")


async def _check_parents(state: GatewayState, episode_id: str, body: StepsSubmit) -> None:
    """A parent step must be a step of this episode (stored, or earlier in this request)."""
    earlier: set[str] = set()
    for i, s in enumerate(body.steps):
        parent = s.parent_step_id
        if parent is not None and parent not in earlier:
            try:
                owner = (await state.db(state.lookup.get_step, parent, with_tokens=False)).episode_id
            except NotFoundError:
                owner = None
            if owner != episode_id:
                why = "does not exist" if owner is None else "belongs to another episode"
                raise ApiError(400, f"steps[{i}].parent_step_id: step {parent} {why}; a parent must be a step "
                               "of the same episode", param=f"steps.{i}.parent_step_id", code="invalid_parent")
        if s.step_id is not None:
            earlier.add(s.step_id)


async def _resolve(state: GatewayState, caller: Caller, episode_id: str | None, step_id: str | None,
                   response_id: str | None) -> tuple[str | None, str | None]:
    """(episode_id, step_id) of a target, checked against the caller."""
    if response_id is not None:
        step = await state.db(state.lookup.get_step_by_response_id, response_id, with_tokens=False)
        if step_id is not None and step_id != step.step_id:
            raise ApiError(400, "step_id and response_id name different steps", param="response_id")
        step_id = step.step_id
    if step_id is not None:
        step = await state.db(state.lookup.get_step, step_id, with_tokens=False)
        if episode_id is not None and episode_id != step.episode_id:
            raise ApiError(400, "the step belongs to another episode than episode_id", param="episode_id")
        episode_id = step.episode_id
    if episode_id is None:
        raise ApiError(400, "name a target: episode_id, step_id or response_id", param="episode_id",
                       code="missing_target")
    if not caller.may_touch(episode_id):
        raise ApiError(403, "this api key belongs to another episode", code="wrong_episode")
    return episode_id, step_id


async def min_reward_source(state: GatewayState, episode_id: str) -> str:
    """The lowest reward source the episode's task takes (``GatewaySettings.reward_authority``)."""
    table = state.settings.reward_authority
    if not table:
        return "agent"
    return table.get((await state.db(state.lookup.get_episode, episode_id)).task, "agent")


async def report_reward(state: GatewayState, caller: Caller, episode_id: str, step_id: str | None, reward: float,
                        final: bool = True) -> RewardOutcome:
    target = {"step_id": step_id} if step_id is not None else {"episode_id": episode_id}
    return await state.write(state.annotator.report_reward, **target, reward=reward, final=final,
                             source=caller.reward_source, min_source=await min_reward_source(state, episode_id))


@router.post("/v1/events")
async def post_event(body: EventIn, caller: Caller = Depends(any_caller),
                     state: GatewayState = Depends(State)) -> dict[str, Any]:
    """A live event; ``kind: "reward"`` with ``value`` sets the target's final reward (also late)."""
    if body.kind == "reward" and body.value is None:
        raise ApiError(400, "a reward event needs a value", param="value", code="missing_value")
    ep_id, step_id = await _resolve(state, caller, body.episode_id, body.step_id, body.response_id)
    source = Source.blackbox if caller.episode_id else Source.service
    ev = Event(kind=body.kind, episode_id=ep_id if step_id is None else None, step_id=step_id, name=body.name,
               value=body.value, source=source, payload=body.payload)
    event_id = await state.write(state.annotator.add_event, ev, apply_reward=False)
    out: dict[str, Any] = {"event_id": event_id, "episode_id": ep_id, "step_id": step_id}
    if body.kind == "reward" and body.value is not None:
        out.update((await report_reward(state, caller, ep_id, step_id, body.value)).json())
    return out


@router.post("/v1/feedback")
async def post_feedback(body: FeedbackIn, caller: Caller = Depends(any_caller),
                        state: GatewayState = Depends(State)) -> dict[str, Any]:
    """Human / judge feedback: a rating, a correction and/or a reward (final unless ``final: false``)."""
    if body.rating is None and body.correction is None and body.reward is None:
        raise ApiError(400, "feedback needs a rating, a correction or a reward", param="rating", code="empty_feedback")
    if CORRECTION_KEY in body.payload:
        raise ApiError(400, f"payload.{CORRECTION_KEY} is written by the gateway (a correction's token ids); "
                       "send the correction as text in 'correction'", param=f"payload.{CORRECTION_KEY}",
                       code="invalid_value")
    ep_id, step_id = await _resolve(state, caller, body.episode_id, body.step_id, body.response_id)
    source = Source.blackbox if caller.episode_id else Source.service
    payload = dict(body.payload)
    if body.reward is not None:
        payload["reward"] = body.reward
    fixed: dict[str, Any] = {}
    if body.correction is not None:
        tokens, why = await correction_tokens(state, ep_id, step_id, body.correction)
        fixed = {"correction_ids": None if tokens is None else tokens["ids"],
                 "correction_step_id": None if tokens is None else tokens["step_id"]}
        if tokens is None:
            fixed["correction_reason"] = why
        else:
            payload[CORRECTION_KEY] = tokens
    ev = Event(kind="feedback", episode_id=ep_id if step_id is None else None, step_id=step_id, name=body.name,
               value=body.reward, rating=body.rating, correction=body.correction, source=source, payload=payload)
    event_id = await state.write(state.annotator.add_event, ev)
    out: dict[str, Any] = {"event_id": event_id, "episode_id": ep_id, "step_id": step_id, "reward_applied": None,
                           **fixed}
    if body.reward is not None:  # by authority; a refused one stays in the history with its reason
        out.update((await report_reward(state, caller, ep_id, step_id, body.reward, body.final)).json())
    return out


async def correction_tokens(state: GatewayState, episode_id: str, step_id: str | None,
                            text: str) -> tuple[dict[str, Any] | None, str]:
    """``({"step_id", "policy", "ids"}, "")`` of a correction of the step (else the episode's last step),
    tokenized with that step's policy; ``(None, why)`` when it cannot be tokenized here."""
    step = await (state.db(state.lookup.get_step, step_id) if step_id is not None
                  else state.db(state.lookup.last_step, episode_id))
    if step is None:
        return None, "the episode has no step to correct"
    backend = state.backend
    try:
        if step.policy not in backend.policies():
            return None, f"policy {step.policy!r} is not served by this gateway: no tokenizer for the correction"
        ids = backend.encode(step.policy, GUARD_OPEN + strip_marks(text) + GUARD_CLOSE)  # plain text, no control ids
        tok = getattr(backend, "tokenizer", None)
    except SwarmError as exc:  # no local tokenizer (an upstream policy)
        return None, f"the correction cannot be tokenized for policy {step.policy!r}: {exc}"
    eot = _end_of_turn(step.response_ids, step.finish_reason, tok)
    if eot is None:
        return None, f"no end-of-turn token is known for policy {step.policy!r} (the backend has no tokenizer)"
    return {"step_id": step.step_id, "policy": step.policy, "ids": [*ids, eot]}, ""


def _end_of_turn(response_ids: list[int], finish_reason: str | None, tok: Any) -> int | None:
    """The id ending an assistant turn: the one the step stopped on, else the tokenizer's eos (None: unknown)."""
    specials = set(getattr(tok, "all_special_ids", None) or [])
    if response_ids and finish_reason == "stop" and response_ids[-1] in specials:
        return int(response_ids[-1])
    eos = getattr(tok, "eos_token_id", None)
    return int(eos) if isinstance(eos, int) else None
