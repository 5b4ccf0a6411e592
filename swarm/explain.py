"""Pydantic validation errors as one line per problem: the dotted key, the bad value, the fix.

Used by every typed config (the run's sections in ``flows/config``, a task's ``Options``, a plugin's
section): a mistyped key gets the close one (``train.updatse: unknown key (did you mean
train.updates?)``), a union's unknown tag lists the kinds, a missing key says how to set it. It reads
the schema's field types only; it does not validate anything itself.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from pydantic import BaseModel, ValidationError

__all__ = ["explain", "section_keys", "unknown_key_hint"]

Tree = dict[str, Any]


def _members(tp: Any) -> list[Any]:
    """The types a field may hold: Annotated, Optional and unions unwrapped."""
    if get_origin(tp) is Annotated:
        kinds = [m for m in tp.__metadata__ if callable(getattr(m, "members", None))]  # a registry's kinds
        return [k for m in kinds for k in m.members()] or _members(get_args(tp)[0])
    if get_origin(tp) in (Union, types.UnionType):
        return [m for a in get_args(tp) for m in _members(a)]
    return [tp]


def _fields(tp: Any) -> Tree:
    if isinstance(tp, type) and issubclass(tp, BaseModel):  # pydantic keeps Annotated metadata apart: put it back
        return {n: Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation
                for n, f in tp.model_fields.items()}
    return get_type_hints(tp) if dataclasses.is_dataclass(tp) else {}


def _tag(tp: Any) -> Any:
    """A union member's discriminator value (its one-value Literal field), None if it has none."""
    for ann in _fields(tp).values():
        if get_origin(ann) is Literal and len(get_args(ann)) == 1:
            return get_args(ann)[0]
    return None


def _walk(schema: type, loc: tuple[Any, ...]) -> tuple[list[Any], list[str], list[Any]]:
    """(an error location's key path without union tags, the names its section allows, the types it may hold)."""
    path: list[Any] = []
    known: list[str] = []
    cur = [schema]
    for part in loc:
        if len(cur) > 1 and (tagged := [t for t in cur if _tag(t) == part]):
            cur = tagged
            continue
        path.append(part)
        fields = {n: a for t in cur for n, a in _fields(t).items()}
        if fields:
            known, cur = list(fields), _members(fields.get(part, Any))
        else:  # dict[str, X] / list[X]: the part is a key or an index
            known, cur = [], [m for t in cur for m in _members(get_args(t)[-1] if get_args(t) else Any)]
    return path, known, cur


def section_keys(key: str, schema: type) -> list[str]:
    """The names allowed beside dotted ``key`` in its section (a union's: every member's); [] in an open dict."""
    return _walk(schema, tuple(key.split(".")))[1]


def explain(exc: ValidationError, schema: type, data: Tree, prefix: str = "") -> str:
    """``exc`` (from ``schema.model_validate(data)``) as one line per problem, ``; ``-joined: each names its dotted
    key (under ``prefix``, e.g. ``task.options``), the bad value, and for a mistyped key the close one."""
    return "; ".join(_problem(err, schema, data, prefix) for err in exc.errors())


def _problem(err: Any, schema: type, data: Tree, prefix: str) -> str:
    path, known, types_ = _walk(schema, err["loc"])
    key = ".".join(str(p) for p in ([prefix] if prefix else []) + path)
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        section = key.rpartition(".")[0]
        return f"{key}: unknown key{unknown_key_hint(str(path[-1]), known, cutoff=0.6, section=section)}"
    if err["type"] in ("union_tag_not_found", "union_tag_invalid"):
        field = err["ctx"]["discriminator"].strip("'")
        tags = sorted(t for t in map(_tag, types_) if t)
        got = _value(data, (*path, field))
        return (f"{key}.{field}{'' if got == '?' else '=' + str(got)}: "
                f"{'missing' if got == '?' else 'unknown'}; use one of {', '.join(tags)}")
    if err["type"] == "missing":
        return f"{key}: missing (set {key}=...)"
    if path and msg.startswith((key + ".", key + ":", f"{path[-1]}.")):  # the message names its key already
        return msg if msg.startswith(key) else f"{key.rpartition('.')[0]}.{msg}"
    if key:
        return f"{key}={_value(data, tuple(path))}: {msg}"
    return f"{prefix}: {msg}" if prefix else msg


def _value(data: Tree, loc: tuple[Any, ...]) -> Any:
    cur: Any = data
    for p in loc:
        try:
            cur = cur[p]
        except (KeyError, IndexError, TypeError):
            return "?"
    return cur


def unknown_key_hint(key: str, known: list[str], *, cutoff: float = 0.75, section: str = "") -> str:
    """`` (did you mean train.updates?)`` for a mistyped ``key`` among ``known``, '' if none is close.

    ``key`` and ``known`` are dotted keys; or, with ``section``, the names inside that section (the
    suggestion is then spelled ``section.name``).
    """
    close = difflib.get_close_matches(key, known, n=1, cutoff=cutoff)
    return f" (did you mean {section + '.' if section else ''}{close[0]}?)" if close else ""
