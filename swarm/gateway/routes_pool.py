"""Pool read API, leases and labels under ``/v1/pool``.

Every route returns steps in one shape (:func:`~swarm.web.pool_json.step_json`: all :class:`~swarm.records.Step`
fields; ``prompt_ids`` / ``response_ids`` / ``response_logprobs`` are ``null`` unless tokens
were asked for). Filters are :class:`~swarm.pool.filter.StepFilter`: the same keys in JSON
bodies and query strings (``metadata`` as a JSON object in the query string). Reads need the
admin token when one is configured (else the client token when that is); leases, acks, releases,
labels and saved curations need the admin token when one is configured (a gateway off loopback
always has one). Curations (``/v1/pool/curations``) are named, versioned filters; lease plans
(``/v1/pool/lease_plans``) are the filters the running trainers lease with next.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from swarm.gateway.routes_episodes import episode_json
from swarm.gateway.schemas import AckRequest, CurationIn, LabelIn, LeaseRequest
from swarm.gateway.state import GatewayState, State
from swarm.pool import StepFilter, parse_ref
from swarm.web.auth import Caller
from swarm.web.errors import ApiError
from swarm.web.pool_json import finite, parse_filter, readable_response, split_query, step_json
from swarm.web.state import admin_caller, reader_caller

__all__ = ["router"]

router = APIRouter(tags=["pool"])

_PAGING = {"limit", "offset", "with_tokens", "order"}
_MAX_LIMIT = 1000


def _filter_params() -> list[dict[str, Any]]:
    """OpenAPI description of the filter's query parameters (parsed by hand in parse_filter)."""
    out = []
    for name, f in StepFilter.model_fields.items():
        schema: dict[str, Any] = {"type": "string"}
        ann = str(f.annotation)
        if "int" in ann:
            schema = {"type": "integer", "minimum": 0}
        elif "bool" in ann:
            schema = {"type": "boolean"}
        elif "float" in ann:
            schema = {"type": "number"}
        out.append({"name": name, "in": "query", "required": False, "schema": schema})
    return out


def _paging_params(default_tokens: bool = False) -> list[dict[str, Any]]:
    return [
        {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0, "maximum": _MAX_LIMIT}},
        {"name": "offset", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0}},
        {"name": "with_tokens", "in": "query", "required": False, "schema": {"type": "boolean", "default": default_tokens}},
    ]


def _int(paging: dict[str, str], key: str, default: int, hi: int | None = None) -> int:
    try:
        v = int(paging.get(key, default))
    except ValueError:
        raise ApiError(400, f"{key} must be an integer", param=key, code="invalid_value") from None
    hi = hi if hi is not None else 2**62
    if v < 0 or v > hi:
        raise ApiError(400, f"{key} must be in [0, {hi}]", param=key, code="invalid_value")
    return v


def _bool(paging: dict[str, str], key: str, default: bool) -> bool:
    v = paging.get(key)
    if v is None:
        return default
    if v.lower() in ("1", "true", "yes", "on"):
        return True
    if v.lower() in ("0", "false", "no", "off"):
        return False
    raise ApiError(400, f"{key} must be true or false", param=key, code="invalid_value")


@router.get("/v1/pool/stats")
async def pool_stats(state: GatewayState = Depends(State), _: Caller = Depends(reader_caller)) -> dict[str, Any]:
    """Counts of steps and episodes by status, source, task and policy; token storage."""
    return await state.db(state.reader.stats)


@router.get("/v1/pool/steps", openapi_extra={"parameters": _filter_params() + _paging_params()})
async def list_steps(request: Request, state: GatewayState = Depends(State),
                     _: Caller = Depends(reader_caller)) -> dict[str, Any]:
    """Steps matching a filter (query-string keys = StepFilter fields), oldest first."""
    paging, raw = split_query(request, _PAGING)
    f = parse_filter(raw)
    limit, offset = _int(paging, "limit", 100, _MAX_LIMIT), _int(paging, "offset", 0)
    tokens = _bool(paging, "with_tokens", False)
    order = paging.get("order", "created")
    if order not in ("created", "-created", "episode"):
        raise ApiError(400, "order must be 'created', '-created' or 'episode'", param="order", code="invalid_value")
    steps = await state.db(state.lookup.query_steps, f, limit=limit, offset=offset, with_tokens=tokens, order=order)
    total = await state.db(state.lookup.count_steps, f)
    return readable_response({"object": "list", "data": [step_json(s, tokens) for s in steps], "total": total,
                              "limit": limit, "offset": offset}, rows="data")


@router.get("/v1/pool/steps/{step_id}", openapi_extra={"parameters": _paging_params(True)[2:]})
async def get_step(step_id: str, request: Request, state: GatewayState = Depends(State),
                   _: Caller = Depends(reader_caller)) -> Response:
    """One step, with token ids and logprobs unless ``with_tokens=false``."""
    paging, rest = split_query(request, _PAGING)
    tokens = _bool(paging, "with_tokens", True)
    step = await state.db(state.lookup.get_step, step_id, with_tokens=tokens)
    return readable_response(step_json(step, tokens))


@router.get("/v1/pool/episodes", openapi_extra={"parameters": _filter_params() + _paging_params()[:2]})
async def list_episodes(request: Request, state: GatewayState = Depends(State),
                        _: Caller = Depends(reader_caller)) -> dict[str, Any]:
    """Episodes matching a filter (its episode-level keys), oldest first."""
    paging, raw = split_query(request, _PAGING)
    f = parse_filter(raw)
    limit, offset = _int(paging, "limit", 100, _MAX_LIMIT), _int(paging, "offset", 0)
    eps = await state.db(state.lookup.query_episodes, f, limit=limit, offset=offset)
    return readable_response({"object": "list", "data": [episode_json(e) for e in eps], "limit": limit,
                              "offset": offset}, rows="data", id_key="episode_id")


@router.get("/v1/pool/episodes/{episode_id}")
async def get_episode(episode_id: str, state: GatewayState = Depends(State),
                      _: Caller = Depends(reader_caller)) -> Response:
    """One episode."""
    return readable_response(episode_json(await state.db(state.lookup.get_episode, episode_id)), id_key="episode_id")


@router.get("/v1/pool/episodes/{episode_id}/rewards")
async def episode_rewards(episode_id: str, state: GatewayState = Depends(State),
                          _: Caller = Depends(reader_caller)) -> Response:
    """Every reward reported for an episode and its steps, oldest first: source, value, applied, reason."""
    await state.db(state.lookup.get_episode, episode_id)  # 404 for an unknown episode
    rows = await state.db(state.annotator.reward_history, episode_id)
    return readable_response({"object": "list", "data": rows}, rows="data", id_key="reward_id")


@router.post("/v1/pool/leases")
async def create_lease(body: LeaseRequest, caller: Caller = Depends(admin_caller),
                       state: GatewayState = Depends(State)) -> dict[str, Any]:
    """Lease steps for training (with token ids and logprobs); ack after the update, or let it expire."""
    if body.max_steps is None and body.max_groups is None:
        raise ApiError(400, "give max_steps and/or max_groups", param="max_steps", code="invalid_value")
    f = finite(body.filter)
    lease = await state.write(state.leases.lease, f, max_steps=body.max_steps, max_groups=body.max_groups,
                           ttl_s=body.ttl_s)
    try:  # the lease stands only once its answer is built: else its steps would stay held until the TTL
        return readable_response({"lease_id": lease.lease_id, "expires_at": lease.expires_at,
                                  "group_ids": list(lease.group_ids or []),
                                  "steps": [step_json(s, True) for s in lease.steps]}, rows="steps")
    except Exception:  # any failure to answer: the steps go back to the pool, then the error propagates
        await state.write(state.leases.release, lease.lease_id)
        raise


@router.post("/v1/pool/leases/{lease_id}/ack")
async def ack_lease(lease_id: str, body: AckRequest, caller: Caller = Depends(admin_caller),
                    state: GatewayState = Depends(State)) -> dict[str, Any]:
    """Mark a lease's steps consumed by ``consumed_version``."""
    n = await state.write(state.leases.ack, lease_id, body.consumed_version)
    return {"lease_id": lease_id, "acked": n}


@router.post("/v1/pool/leases/{lease_id}/release")
async def release_lease(lease_id: str, caller: Caller = Depends(admin_caller),
                        state: GatewayState = Depends(State)) -> dict[str, Any]:
    """Give a lease's steps back unconsumed."""
    await state.write(state.leases.release, lease_id)
    return {"lease_id": lease_id, "released": True}


@router.post("/v1/pool/labels")
async def add_label(body: LabelIn, caller: Caller = Depends(admin_caller),
                    state: GatewayState = Depends(State)) -> dict[str, Any]:
    """A curation label on a step or an episode; ``exclude: true`` keeps it out of training."""
    lbl = await state.write(state.annotator.label, body.target, body.target_id, body.label, exclude=body.exclude,
                         note=body.note)
    return lbl.model_dump(mode="json")


@router.post("/v1/pool/curations")
async def save_curation(body: CurationIn, caller: Caller = Depends(admin_caller),
                        state: GatewayState = Depends(State)) -> dict[str, Any]:
    """Save a filter as curation ``name``: version 1, or the newest version + 1 when the filter changed
    (the same filter as the newest version saves nothing and returns that version)."""
    c = await state.write(state.reader.save_curation, body.name, finite(body.filter), note=body.note)
    return c.to_json()


@router.get("/v1/pool/curations")
async def list_curations(state: GatewayState = Depends(State), _: Caller = Depends(reader_caller)) -> dict[str, Any]:
    """The newest version of every saved curation, by name."""
    return {"object": "list", "data": [c.to_json() for c in await state.db(state.reader.curations)]}


@router.get("/v1/pool/curations/{name}", openapi_extra={"parameters": [
    {"name": "version", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1}}]})
async def get_curation(name: str, request: Request, state: GatewayState = Depends(State),
                       _: Caller = Depends(reader_caller)) -> dict[str, Any]:
    """One curation: its newest version, ``?version=k``, or ``name@k`` in the path."""
    base, version = parse_ref(name)
    if "version" in request.query_params:
        version = _int(dict(request.query_params), "version", 1, 2**31 - 1)
        if version < 1:
            raise ApiError(400, "version must be >= 1", param="version", code="invalid_value")
    c = await state.db(state.reader.curation, base, version)
    return c.to_json()


@router.get("/v1/pool/lease_plans")
async def lease_plans(state: GatewayState = Depends(State), _: Caller = Depends(reader_caller)) -> dict[str, Any]:
    """Per trained policy, the filter its trainer's next lease uses (written when it starts waiting)."""
    return {"object": "list", "data": await state.db(state.leases.lease_plans)}
