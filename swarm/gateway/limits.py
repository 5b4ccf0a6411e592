"""What the pool can store, as pydantic field types: every input the API accepts is storable.

PostgreSQL refuses NUL characters in text and JSONB, NaN in JSONB, integers >= 2^31 in
``integer`` columns and strings longer than a ``varchar(n)``; SQLite takes all of them. The
response serialiser refuses JSON nested deeper than 255 levels, so such a record, once stored,
breaks every read that returns it. The types here refuse all of that at the door (a 400 naming
the field) on both backends, with the column sizes taken from :mod:`swarm.pool.schema`.

- :data:`Id` / :data:`Task` / :data:`Name`: strings sized like their columns, without NUL.
- :data:`Text`: a string without NUL (stored inside a JSON column, no length limit here).
- :data:`ModelText` / :data:`ModelJSONList`: text a model wrote, or a prompt quoting it, may hold
  NUL: a byte-level tokenizer can sample the byte 0 and the client sends the reply back next turn.
  The pool stores NUL there as U+FFFD (:func:`swarm.pool.checks.scrub_nul`); the token ids, which are
  what trains, stay exact.
- :data:`Int32`: an integer that fits an ``integer`` column.
- :data:`FreeJSON` / :data:`JSONList`: free-form JSON, bounded in depth and size, without NUL
  or non-finite numbers anywhere (keys included).
- :func:`check_json`: the same walk for raw bodies (OpenAI-compatible bodies keep unknown keys;
  ``nul_ok`` for model text).

It does not know which routes use which type (:mod:`swarm.gateway.schemas` does).
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StringConstraints

from swarm.pool.schema import ID_LEN, INT32_MAX, NAME_LEN

__all__ = ["MAX_JSON_DEPTH", "MAX_JSON_BYTES", "Id", "Task", "Name", "Text", "Int32", "FreeJSON", "JSONList",
           "ModelText", "ModelJSONList", "check_json", "check_text"]

MAX_JSON_DEPTH = 32  # levels of nesting in one free-form field (the serialiser's limit is 255)
MAX_JSON_BYTES = 1024 * 1024  # approximate encoded size of one free-form field


def check_text(value: str) -> str:
    """``value`` unless it holds a NUL character (PostgreSQL cannot store those)."""
    if "\x00" in value:
        raise ValueError("must not contain NUL (\\u0000) characters")
    return value


def check_json(value: Any, max_depth: int = MAX_JSON_DEPTH, max_bytes: int | None = MAX_JSON_BYTES,
               nul_ok: bool = False) -> Any:
    """``value`` unless it is too deep or too large, or holds a non-finite number or (unless ``nul_ok``) NUL anywhere."""
    size = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            if not nul_ok:
                check_text(v)
            size += len(v) + 2
        elif isinstance(v, dict | list):
            if depth >= max_depth:
                raise ValueError(f"JSON is nested more than {max_depth} levels deep")
            size += 2
            if isinstance(v, dict):
                for k, item in v.items():
                    if isinstance(k, str):
                        if not nul_ok:
                            check_text(k)
                        size += len(k) + 3
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in v)
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise ValueError("numbers must be finite (no NaN or Infinity)")
            size += 8
        else:
            size += 8
        if max_bytes is not None and size > max_bytes:
            raise ValueError(f"JSON is larger than {max_bytes} bytes")
    return value


_NoNul = AfterValidator(check_text)
Id = Annotated[str, StringConstraints(min_length=1, max_length=ID_LEN), _NoNul]
Task = Annotated[str, StringConstraints(min_length=1, max_length=NAME_LEN), _NoNul]
Name = Annotated[str, StringConstraints(max_length=NAME_LEN), _NoNul]
Text = Annotated[str, _NoNul]
Int32 = Annotated[int, Field(ge=0, le=INT32_MAX)]
FreeJSON = Annotated[dict[str, Any], AfterValidator(check_json)]
JSONList = Annotated[list[dict[str, Any]], AfterValidator(check_json)]
ModelText = str
ModelJSONList = Annotated[list[dict[str, Any]], AfterValidator(lambda v: check_json(v, nul_ok=True))]
