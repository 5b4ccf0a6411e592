"""Argument checks shared by the pool's modules: each failure is a ValidationError naming the field."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any, TypeVar

import pydantic

from swarm.errors import ValidationError

__all__ = ["coerce", "coerce_enum", "check_reward", "check_page", "chunks", "scrub_nul"]

R = TypeVar("R", bound=pydantic.BaseModel)
IN_CHUNK = 500  # bound parameters per IN (...) list


def coerce(model: type[R], obj: Any, what: str) -> R:
    """``obj`` as a validated ``model``; a pydantic error becomes a ValidationError naming fields."""
    if isinstance(obj, model):
        return obj
    try:
        return model.model_validate(obj)
    except pydantic.ValidationError as e:
        parts = [f"{'.'.join(str(x) for x in err['loc']) or what}: {err['msg']}" for err in e.errors()]
        raise ValidationError(f"invalid {what}: " + "; ".join(parts)) from e


def chunks(items: list, n: int = IN_CHUNK) -> Iterable[list]:
    """Consecutive slices of ``items`` of at most ``n`` (one IN (...) list each)."""
    for i in range(0, len(items), n):
        yield items[i : i + n]


def coerce_enum(enum: type, value: Any, field: str) -> Any:
    try:
        return enum(value)
    except ValueError as e:
        raise ValidationError(f"{field}: must be one of {[m.value for m in enum]}, got {value!r}") from e


def check_reward(value: float | None, field: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(f"{field}: must be a finite number, got {value!r}")


def check_page(limit: int, offset: int) -> None:
    if limit < 0 or offset < 0:
        raise ValidationError(f"limit and offset must be >= 0, got limit={limit}, offset={offset}")


def scrub_nul(value: Any) -> Any:
    """``value`` with NUL replaced by U+FFFD in every string, keys included (PostgreSQL's JSONB refuses NUL).

    For text a model wrote (a byte-level tokenizer can sample the byte 0) and prompts quoting it; the
    step's token ids keep the exact bytes.
    """
    if isinstance(value, dict | list):
        try:  # one C-level pass finds whether any string holds NUL (JSON writes it as \u0000); almost never
            clean = "\\u0000" not in json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):  # not plain JSON: walk it
            clean = False
        if clean:
            return value
    return _scrub(value)


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_scrub(k): _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):  # a tuple is stored as a JSON list anyway
        return [_scrub(v) for v in value]
    return value
