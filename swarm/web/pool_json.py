"""The pool read API's JSON: steps in one shape, filters parsed from JSON or query strings, readable responses.

Shared by the gateway's ``/v1/pool`` routes and the dashboard's API, so both answer alike. It does not
query the pool or check credentials.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pydantic
import pydantic_core
from fastapi import Request
from fastapi.responses import Response

from swarm.pool import INT32_MAX, StepFilter
from swarm.records import Step
from swarm.web.errors import ApiError, describe_validation
from swarm.web.limits import MAX_JSON_BYTES, check_json, repair_unicode

__all__ = ["step_json", "readable_response", "parse_filter", "finite", "split_query"]

_TOKEN_FIELDS = ("prompt_ids", "response_ids", "response_logprobs")


def step_json(step: Step, with_tokens: bool) -> dict[str, Any]:
    d = step.model_dump(mode="json")
    if not with_tokens:
        for k in _TOKEN_FIELDS:
            d[k] = None
    return d


def readable_response(payload: dict[str, Any], rows: str | None = None, id_key: str = "step_id") -> Response:
    """``payload`` as JSON, even if a stored row holds text UTF-8 cannot encode (defence in depth).

    Serialising costs nothing extra when all is well; otherwise each bad row (of ``payload[rows]``, or
    the payload itself) is served with its bad text escaped and named under ``unreadable``, and the
    rest as stored: one bad row never makes a read (or a lease) fail.
    """
    try:
        return _json(payload)
    except (UnicodeEncodeError, pydantic_core.PydanticSerializationError):
        pass
    notes: list[dict[str, Any]] = []
    if rows is None:
        payload, paths = repair_unicode(payload)
        notes.append({id_key: payload.get(id_key), "fields": paths})
    else:
        fixed = []
        for row in payload[rows]:
            row, paths = repair_unicode(row)
            if paths:
                notes.append({id_key: row.get(id_key), "fields": paths})
            fixed.append(row)
        payload = {**repair_unicode({k: v for k, v in payload.items() if k != rows})[0], rows: fixed}
    payload["unreadable"] = notes
    return _json(payload)


def _json(payload: dict[str, Any]) -> Response:
    # pydantic's encoder, as FastAPI's own responses use: a non-finite float (a -inf logprob) is null, not a 500
    return Response(pydantic_core.to_json(payload, inf_nan_mode="null"), media_type="application/json")


def _bounded(value: Any, path: str) -> None:
    """Numbers the database can bind: finite floats, integers within 64 bits (nested too)."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ApiError(400, f"{path} must be a finite number", param=path, code="invalid_value")
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise ApiError(400, f"{path} is out of the 64-bit integer range", param=path, code="invalid_value")
    if isinstance(value, dict):
        for k, v in value.items():
            _bounded(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _bounded(v, f"{path}.{i}")


def finite(f: StepFilter) -> StepFilter:
    """``f`` if the database can bind it: integers that fit a column, strings without NUL, bounded JSON."""
    for name in StepFilter.model_fields:
        value = getattr(f, name)
        _bounded(value, name)
        if isinstance(value, int) and not isinstance(value, bool) and value > INT32_MAX:
            raise ApiError(400, f"{name} must be at most {INT32_MAX}", param=name, code="invalid_value")
        try:  # group_ids: bounded by count (StepFilter), not by the 1 MiB of a free-form field
            check_json(value, max_bytes=None if name == "group_ids" else MAX_JSON_BYTES)
        except ValueError as exc:
            raise ApiError(400, f"{name}: {exc}", param=name, code="invalid_value") from None
    return f


def parse_filter(raw: dict[str, Any]) -> StepFilter:
    """A StepFilter from JSON or query-string values (a 400 names the bad key)."""
    data = dict(raw)
    if isinstance(data.get("metadata"), str):
        try:
            data["metadata"] = json.loads(data["metadata"])
        except ValueError:
            raise ApiError(400, "metadata must be a JSON object", param="metadata", code="invalid_value") from None
    try:
        return finite(StepFilter.model_validate(data))
    except pydantic.ValidationError as exc:
        raise describe_validation(list(exc.errors())) from None


def split_query(request: Request, keys: frozenset[str] | set[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the query parameters named in ``keys``, all others); a parameter given twice is a 400."""
    q = request.query_params
    dup = [k for k in q.keys() if len(q.getlist(k)) > 1]
    if dup:
        raise ApiError(400, f"query parameter {dup[0]!r} is given more than once", param=dup[0])
    return {k: v for k, v in q.items() if k in keys}, {k: v for k, v in q.items() if k not in keys}
