"""One OpenAI-style call, from request body to stored steps: checks, prompt ids, generation, storage.

``prepare_chat`` / ``prepare_completion`` do every check that can refuse a call *before* anything
is generated or stored (model, limits, episode state, context length), and build the prompt ids
(prefix-consistent for chat, see :mod:`swarm.gateway.prefix`). ``store`` writes one step per
sampled choice in one pool transaction shared with concurrent calls (group commit), under the
episode's lock so step indices are consecutive. A call is acknowledged to the client only after
``store`` returned, i.e. after its batch committed.

It does not format responses (:mod:`swarm.gateway.openai_format`) or stream (:mod:`swarm.gateway.streaming`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from swarm.errors import SwarmError
from swarm.gateway.openai_format import new_completion_id, normalize_tool_calls, now_s
from swarm.gateway.prefix import PromptPlan, normalize_messages, plan_prompt
from swarm.gateway.schemas import ChatCompletionRequest, CompletionRequest
from swarm.gateway.state import GatewayState
from swarm.gateway.structured import chat_constraint, compile_constraint, completion_constraint, top_logprobs
from swarm.policy.base import CLIENT_BODY, GenerateRequest, Generation, SamplingParams, vocab_size
from swarm.policy.toolcalls import TOOL_CALL_OPEN, split_tool_calls
from swarm.pool import StepFilter
from swarm.records import Episode, Source, Step, new_id
from swarm.web.auth import Caller
from swarm.web.errors import ApiError

__all__ = ["stored_call", "replayed", "CallPlan", "prepare_chat", "prepare_completion", "generate", "store", "finalize",
           "complete"]


def finalize(gens: list[Generation], tool_calls: bool = True) -> list[Generation]:
    """Generations whose ``text`` is the message content: parsed tool-call blocks removed.

    Backends may return the full sampled text (markup included) next to the parsed calls; the
    client sees, and the step stores, the content without the blocks (the ids keep everything).
    ``tool_calls=False`` (``tool_choice: "none"`` on a backend that does not forward it): no calls are
    reported (the ids keep what was sampled).
    """
    out = []
    for g in gens:
        if not tool_calls:
            g = dataclasses.replace(g, tool_calls=[]) if g.tool_calls else g
        elif g.tool_calls and TOOL_CALL_OPEN in (g.text or ""):
            g = dataclasses.replace(g, text=split_tool_calls(g.text)[0])
        out.append(g)
    return out


@dataclass
class CallPlan:
    kind: str  # "chat" | "completion"
    episode: Episode
    policy: str
    request: GenerateRequest
    prompt: PromptPlan
    want_logprobs: bool
    cid: str
    created: int
    include_usage: bool = False
    tool_calls: bool = True  # False with tool_choice "none" emulated here: replies are content only
    idempotency_key: str | None = None  # the client's Idempotency-Key header: a repeat returns these steps
    metadata: dict[str, Any] = field(default_factory=dict)  # added to each step's (e.g. the client's protocol)
    t0: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=dict)


def _check_policy(state: GatewayState, model: str) -> str:
    served = state.backend.policies()
    if model not in served:
        raise ApiError(404, f"the model {model!r} does not exist on this gateway; served policies: {served}",
                       code="model_not_found", param="model")
    return model


def _max_tokens(state: GatewayState, requested: int | None, param: str, context: int) -> int | None:
    cap = state.settings.max_tokens_cap
    if requested is not None and requested > min(cap, context):
        raise ApiError(400, f"{param} is {requested}, more than this gateway allows ({min(cap, context)}: the "
                       f"model's context is {context} tokens, the cap {cap})", code="invalid_value", param=param)
    return requested


def _sampling(state: GatewayState, body: ChatCompletionRequest | CompletionRequest, max_tokens: int | None,
              prompt_len: int, context: int) -> SamplingParams:
    room = context - prompt_len
    if room < 1 or (max_tokens is not None and max_tokens > room):
        want = max_tokens if max_tokens is not None else 1
        raise ApiError(400, f"this model's maximum context length is {context} tokens; the prompt has {prompt_len} "
                       f"tokens and {want} more were requested", code="context_length_exceeded", param="messages")
    if max_tokens is None:
        max_tokens = min(room, state.settings.max_tokens_cap, state.settings.default_max_tokens or room)
    if body.n > state.settings.max_n:
        raise ApiError(400, f"n is {body.n}; this gateway allows at most {state.settings.max_n}", param="n",
                       code="invalid_value")
    stop = body.stop if isinstance(body.stop, list) else ([body.stop] if body.stop else [])
    if len(stop) > 16:
        raise ApiError(400, "stop: at most 16 stop strings", param="stop", code="invalid_value")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=max(body.top_k or 0, 0),  # 0 and -1 (vLLM's "off") both turn it off
        stop=tuple(s for s in stop if s),
        seed=None if body.seed is None else body.seed & (2**63 - 1),  # backends seed with non-negative ints
        n=body.n,
    )


def _client_fields(body: ChatCompletionRequest, forwards: bool) -> dict[str, Any]:
    """The OpenAI fields a forwarding backend passes on as sent (``GenerateRequest.client_fields``).

    ``forwards``: the backend sends the call on to a server (``upstream``): it also gets the client's
    whole body as sent (:data:`CLIENT_BODY`: the keys the client set, nothing filled in), so that
    server sees no sampling default the client did not choose, its own length key, ``stream_options``,
    content parts and ``extra_body`` keys.
    """
    sent = {k: getattr(body, k) for k in ("tool_choice", "parallel_tool_calls", "response_format")}
    fields = {k: v for k, v in sent.items() if v is not None} | ({"logprobs": True} if body.logprobs else {})
    if forwards:
        fields[CLIENT_BODY] = body.model_dump(exclude_unset=True, mode="json")
    return fields


def _forwards(state: GatewayState, policy: str) -> bool:
    """The policy's backend passes ``tool_choice`` & co. to a server that enforces them (``upstream``)."""
    forwards = getattr(state.backend, "forwards_openai_fields", None)
    return bool(forwards(policy)) if callable(forwards) else False


def _messages(body: ChatCompletionRequest) -> list[dict[str, Any]]:
    for i, m in enumerate(body.messages):
        if isinstance(m.content, list):
            for j, part in enumerate(m.content):
                if part.type != "text" or part.text is None:
                    raise ApiError(400, f"content part of type {part.type!r} is not supported: this gateway serves "
                                   "text-only models (use parts of type 'text')",
                                   param=f"messages.{i}.content.{j}", code="unsupported_content")
    # one serializer call for the whole list: the same dicts as each message's model_dump(exclude_none=True),
    # in ~60% of the time (a call into pydantic-core per message was most of the cost)
    return normalize_messages(body.model_dump(include={"messages"}, exclude_none=True)["messages"])


def _chars(messages: list[dict[str, Any]]) -> int:
    """How much text a prompt render covers (decides whether it runs on the event loop)."""
    return sum(len(m.get("content") or "") + len(str(m.get("tool_calls") or "")) for m in messages)


async def prepare_chat(state: GatewayState, caller: Caller, body: ChatCompletionRequest) -> CallPlan:
    policy = _check_policy(state, body.model)
    context = state.backend.max_context(policy)
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = _max_tokens(state, body.max_completion_tokens or body.max_tokens, param, context)
    messages = _messages(body)
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    constraint = chat_constraint(state, policy, body.response_format, body.tool_choice, tools)
    await compile_constraint(state, policy, constraint)
    top = top_logprobs(state, body.top_logprobs, bool(body.logprobs))
    t0 = time.perf_counter()
    head = await state.open_head(caller)
    episode = head.episode
    last = await state.episodes.last_call(head)
    candidates = last.candidates if last is not None else []
    try:
        plan = await state.cpu(plan_prompt, state.backend, policy, messages, tools, candidates, chars=_chars(messages))
    except SwarmError:
        raise
    except Exception as exc:  # a chat template refusing these messages is the request's fault
        raise ApiError(400, f"the chat template cannot render these messages: {type(exc).__name__}: {exc}",
                       param="messages", code="template_error") from exc
    sampling = dataclasses.replace(_sampling(state, body, max_tokens, len(plan.prompt_ids), context), top_logprobs=top)
    forwards = _forwards(state, policy)
    request = GenerateRequest(policy=policy, messages=messages, tools=tools, prompt_ids=plan.prompt_ids,
                              sampling=sampling, constraint=constraint, client_fields=_client_fields(body, forwards))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    # tool_choice "none": a forwarding backend's server honours it; otherwise the gateway drops the calls
    emulate_none = body.tool_choice == "none" and not forwards
    return CallPlan("chat", episode, policy, request, plan, bool(body.logprobs), new_completion_id("chatcmpl"),
                    now_s(), include_usage, tool_calls=not emulate_none, t0=t0,
                    timings={"prepare_s": time.perf_counter() - t0})


def _check_prompt_vocab(state: GatewayState, policy: str, ids: list[int]) -> None:
    """Token-id prompts pass the white-box steps' check: every id within the policy's vocabulary."""
    vocab = vocab_size(state.backend, policy)
    if vocab is not None and ids and max(ids) >= vocab:
        bad = next(t for t in ids if t >= vocab)
        raise ApiError(400, f"prompt: token id {bad} is outside the vocabulary of policy {policy!r} "
                       f"(ids must be in [0, {vocab}))", param="prompt", code="invalid_token_id")


async def prepare_completion(state: GatewayState, caller: Caller, body: CompletionRequest) -> CallPlan:
    policy = _check_policy(state, body.model)
    context = state.backend.max_context(policy)
    max_tokens = _max_tokens(state, body.max_tokens, "max_tokens", context)
    if body.echo:
        raise ApiError(400, "echo=true is not supported", param="echo", code="unsupported_parameter")
    if body.suffix:
        raise ApiError(400, "suffix is not supported", param="suffix", code="unsupported_parameter")
    constraint = completion_constraint(state, body.model_extra)
    await compile_constraint(state, policy, constraint)
    top = top_logprobs(state, body.logprobs, body.logprobs is not None, param="logprobs")
    t0 = time.perf_counter()
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise ApiError(400, "only one prompt per request is supported (use n for several samples)",
                           param="prompt", code="unsupported_parameter")
        prompt = prompt[0]
    episode = await state.open_episode(caller)
    if isinstance(prompt, str):
        ids = await state.cpu(state.backend.encode, policy, prompt, chars=len(prompt))
    else:
        ids = list(prompt)
        _check_prompt_vocab(state, policy, ids)
    if not ids:
        raise ApiError(400, "prompt is empty", param="prompt", code="invalid_value")
    plan = PromptPlan(ids, None, None, "completion prompt")
    sampling = dataclasses.replace(_sampling(state, body, max_tokens, len(ids), context), top_logprobs=top)
    request = GenerateRequest(policy=policy, prompt_ids=ids, sampling=sampling, constraint=constraint)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return CallPlan("completion", episode, policy, request, plan, body.logprobs is not None,
                    new_completion_id("cmpl"), now_s(), include_usage, t0=t0,
                    timings={"prepare_s": time.perf_counter() - t0})


async def generate(state: GatewayState, plan: CallPlan) -> list[Generation]:
    t = time.perf_counter()
    try:
        gens = await state.backend.generate(plan.request)
    except SwarmError:
        raise
    except Exception as exc:  # a backend's own failure of any kind is a 502 to the client, never a 500
        raise ApiError(502, f"the inference backend failed: {type(exc).__name__}: {exc}", type="backend_error",
                       code="backend_error") from exc
    plan.timings["generate_s"] = time.perf_counter() - t
    if not gens:
        raise ApiError(502, "the inference backend returned no completion", type="backend_error", code="backend_error")
    return finalize(gens, plan.tool_calls)


def _steps(plan: CallPlan, gens: list[Generation], base_index: int, parent: str | None,
           state_backend: Any = None) -> list[Step]:
    ep, req = plan.episode, plan.request
    ids = [new_id("step") for _ in gens]
    group = ep.group_id or (plan.cid if len(gens) > 1 else None)
    steps = []
    for i, g in enumerate(gens):
        consistent = plan.prompt.prefix_consistent
        meta: dict[str, Any] = {"kind": plan.kind, "call_id": plan.cid, "choice": i, "n": len(gens),
                                "prefix_reason": plan.prompt.reason}
        if g.prompt_ids != plan.prompt.prompt_ids:  # the backend re-tokenized: record what it consumed
            consistent = False if consistent is not None else None
            meta["prefix_reason"] = "the backend consumed other prompt ids than the gateway built"
        exact = getattr(state_backend, "exact_tokens", None)
        if exact is not None and not exact(plan.policy):  # e.g. an upstream API: its tokens are unknown here
            consistent = False
            meta["prefix_reason"] = "the backend's model tokenizes for itself: no exact token ids"
        meta.update(plan.metadata)
        if len(gens) > 1:
            meta["siblings"] = ids
        if plan.idempotency_key is not None:
            meta["idempotency_key"] = plan.idempotency_key
        if req.tools:
            meta["tools"] = req.tools
        if plan.prompt.template_mismatch:
            meta["template_mismatch"] = True
        if g.usage:  # the serving backend's own token counts for the whole call (e.g. an upstream API's bill)
            meta["usage"] = g.usage
        if g.constraint is not None:  # the grammar it was sampled under: the trainer replays its masks
            meta["constraint"] = g.constraint
        elif req.constraint is not None:  # a server enforced it with its own masks: recorded, not replayable
            meta["constraint"] = {**req.constraint.to_record(), "library": "enforced by the serving backend"}
        steps.append(Step(
            step_id=ids[i],
            episode_id=ep.episode_id,
            index=base_index + i,
            parent_step_id=parent,
            task=ep.task,
            group_id=group,
            policy=plan.policy,
            policy_version=g.policy_version,
            source=Source.blackbox,
            prompt_messages=req.messages,
            prompt_ids=list(g.prompt_ids),
            response_text=g.text,
            tool_calls=normalize_tool_calls(g.tool_calls),
            response_ids=list(g.response_ids),
            response_logprobs=None if g.logprobs is None else [float(x) for x in g.logprobs],
            finish_reason="tool_calls" if g.tool_calls else g.finish_reason,
            response_id=plan.cid if i == 0 else f"{plan.cid}-{i}",
            prefix_consistent=consistent,
            timings={**plan.timings, "total_s": time.perf_counter() - plan.t0},
            metadata=meta,
        ))
    return steps


async def stored_call(state: GatewayState, episode_id: str, key: str, kind: str) -> list[Step]:
    """The steps an earlier ``kind`` call of ``episode_id`` with Idempotency-Key ``key`` stored (in choice order)."""
    steps = await state.db(state.lookup.query_steps, StepFilter(episode_id=episode_id, metadata={"idempotency_key": key}),
                           with_tokens=True, order="episode")
    return [s for s in steps if s.metadata.get("idempotency_key") == key and s.metadata.get("kind") == kind]


def replayed(steps: list[Step]) -> list[Generation]:
    """The generations behind stored steps, to answer a repeated call exactly as the first time."""
    return [Generation(prompt_ids=list(s.prompt_ids), response_ids=list(s.response_ids), logprobs=s.response_logprobs,
                       text=s.response_text or "", tool_calls=list(s.tool_calls), finish_reason=s.finish_reason or "stop",
                       policy_version=s.policy_version, usage=s.metadata.get("usage")) for s in steps]


async def store(state: GatewayState, plan: CallPlan, gens: list[Generation]) -> list[Step]:
    """Write one step per choice; returns them (tool calls normalized) once their batch is committed.

    The steps go to the pool with other concurrent calls' steps in one transaction (group
    commit, :mod:`swarm.gateway.batcher`); the pool numbers them there, since another gateway
    may write this episode too. The episode lock keeps this gateway's calls of one episode in order.
    """
    ep_id = plan.episode.episode_id
    async with state.episode_lock(ep_id):
        ident = None if plan.idempotency_key is None else (ep_id, plan.kind, plan.idempotency_key)
        if ident is not None and ident in state.recent_calls:  # a concurrent repeat stored it first
            return state.recent_calls[ident]
        last = state.episodes.known(ep_id)
        parent = plan.prompt.parent_step_id or (last.step_id if last else None)
        steps = _steps(plan, gens, 0 if last is None else last.index + 1, parent, state.backend)
        await state.step_writer.submit(steps)
        state.episodes.remember(ep_id, steps, plan.prompt.rendered, plan.prompt.rendered_key)
        if ident is not None:
            state.remember_call(ident, steps)
    return steps


async def complete(state: GatewayState, plan: CallPlan) -> tuple[list[Generation], list[Step]]:
    """Generate and store a non-streamed call; when a concurrent repeat stored first, its generations and steps."""
    gens = await generate(state, plan)
    steps = await store(state, plan, gens)
    return (gens, steps) if steps[0].metadata.get("call_id") == plan.cid else (replayed(steps), steps)
