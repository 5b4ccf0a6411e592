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
- Every string, everywhere (model text included, keys included), must be valid Unicode: JSON's
  ``\\ud800`` escape decodes to a lone surrogate, which no UTF-8 database column or response can
  hold (SQLite stored it and every read of the row then failed). :func:`check_unicode` asks the
  codec (``str.encode``), and a refusal names the field's path.

It does not know which routes use which type (:mod:`swarm.gateway.schemas` does).
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StringConstraints

from swarm.pool import ID_LEN, INT32_MAX, NAME_LEN

__all__ = ["MAX_JSON_DEPTH", "MAX_JSON_BYTES", "Id", "Task", "Name", "Text", "Int32", "FreeJSON", "JSONList",
           "ModelText", "ModelJSONList", "check_json", "check_text", "check_unicode", "bad_unicode_path", "repair_unicode"]

MAX_JSON_DEPTH = 32  # levels of nesting in one free-form field (the serialiser's limit is 255)
MAX_JSON_BYTES = 1024 * 1024  # approximate encoded size of one free-form field


def check_unicode(value: str) -> str:
    """``value`` unless it is not valid Unicode (a lone surrogate such as ``\\ud800``): UTF-8 cannot encode it."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"is not valid Unicode (lone surrogate {value[exc.start]!r} at character "
                             f"{exc.start}); send UTF-8 text") from None
    return value


def check_text(value: str) -> str:
    """``value`` unless it holds a NUL character (PostgreSQL cannot store those) or is not valid Unicode."""
    if "\x00" in value:
        raise ValueError("must not contain NUL (\\u0000) characters")
    return check_unicode(value)


def bad_unicode_path(value: Any, path: str = "") -> str | None:
    """The dotted path of the first string (or key) in ``value`` that is not valid Unicode, or None."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, str):
            try:
                check_unicode(v)
            except ValueError:
                return p or "(body)"
        elif isinstance(v, dict):
            for k, item in v.items():
                kp = f"{p}.{k}" if p else str(k)
                if isinstance(k, str):
                    try:
                        check_unicode(k)
                    except ValueError:
                        return f"{p} (a key)" if p else "(a key)"
                stack.append((item, kp))
        elif isinstance(v, list):
            stack.extend((item, f"{p}.{i}" if p else str(i)) for i, item in enumerate(v))
    return None


def repair_unicode(value: Any) -> tuple[Any, list[str]]:
    """``value`` with every string (key) UTF-8 cannot encode backslash-escaped, and the repaired paths.

    The read side's defence in depth: a row stored before the write side refused invalid Unicode
    (or written past the gateway) is served with its bad text escaped and named, never a 500.
    """
    paths: list[str] = []

    def fix(v: Any, p: str) -> Any:
        if isinstance(v, str):
            if v.isascii():
                return v
            try:
                v.encode("utf-8")
                return v
            except UnicodeEncodeError:
                paths.append(p)
                return v.encode("utf-8", "backslashreplace").decode("utf-8")
        if isinstance(v, dict):
            return {fix(k, f"{p} (a key)") if isinstance(k, str) else k: fix(item, f"{p}.{k}" if p else str(k))
                    for k, item in v.items()}
        if isinstance(v, list):
            return [fix(item, f"{p}.{i}" if p else str(i)) for i, item in enumerate(v)]
        return v

    fixed = fix(value, "")
    return fixed, [p.encode("utf-8", "backslashreplace").decode("utf-8") for p in paths]


def check_json(value: Any, max_depth: int = MAX_JSON_DEPTH, max_bytes: int | None = MAX_JSON_BYTES,
               nul_ok: bool = False, max_values: int | None = None) -> Any:
    """``value`` unless it is too deep or too large, or holds a non-finite number or (unless ``nul_ok``) NUL anywhere.

    ``max_values`` bounds how many JSON values (container items) it may hold; a container is counted
    before it is walked, so a list of millions of numbers is refused at once, not after a walk.
    """
    size = 0
    values = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            if not nul_ok and "\x00" in v:
                check_text(v)
            if not v.isascii():
                _unicode_at(value, v)
            size += len(v) + 2
        elif isinstance(v, dict | list):
            if depth >= max_depth:
                raise ValueError(f"JSON is nested more than {max_depth} levels deep")
            size += 2
            if max_values is not None:
                values += len(v)
                if values > max_values:
                    raise ValueError(f"JSON holds more than {max_values} values")
            if isinstance(v, dict):
                for k, item in v.items():
                    if isinstance(k, str):
                        if not nul_ok and "\x00" in k:
                            check_text(k)
                        if not k.isascii():
                            _unicode_at(value, k)
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


def _unicode_at(whole: Any, s: str) -> None:
    try:
        check_unicode(s)
    except ValueError as exc:
        raise ValueError(f"{bad_unicode_path(whole)}: {exc}") from None


_NoNul = AfterValidator(check_text)
Id = Annotated[str, StringConstraints(min_length=1, max_length=ID_LEN), _NoNul]
Task = Annotated[str, StringConstraints(min_length=1, max_length=NAME_LEN), _NoNul]
Name = Annotated[str, StringConstraints(max_length=NAME_LEN), _NoNul]
Text = Annotated[str, _NoNul]
Int32 = Annotated[int, Field(ge=0, le=INT32_MAX)]
FreeJSON = Annotated[dict[str, Any], AfterValidator(check_json)]
JSONList = Annotated[list[dict[str, Any]], AfterValidator(check_json)]
ModelText = Annotated[str, AfterValidator(check_unicode)]
ModelJSONList = Annotated[list[dict[str, Any]], AfterValidator(lambda v: check_json(v, nul_ok=True))]
