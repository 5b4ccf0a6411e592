"""The judge's prompt and reply: trajectories -> chat messages + JSON schema; reply text -> scores.

Pure functions over plain data. A group's trajectories usually share their opening messages
(system prompt, the task); that shared prefix is shown once as the task, and each trajectory
shows what follows it (``view: transcript``) or only its last reply (``view: final``), cut to
``max_chars``. The reply must be ``{"t1": s1, ..., "tn": sn}`` with integer scores on the spec's
scale (the schema is sent as ``response_format``, enforced by constrained decoding on the hf
backend and by the server upstream); anything else is a :class:`JudgeReplyError`.
It does not call a model or touch the pool.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, TypeVar

from swarm.errors import BackendError
from swarm.judge.spec import JudgeSpec

__all__ = ["Trajectory", "JudgeReplyError", "judge_messages", "score_schema", "response_format", "parse_scores",
           "cache_key", "chunks", "shared_prefix", "render_message"]

_T = TypeVar("_T")


class JudgeReplyError(BackendError, ValueError):
    """The judge's reply is not the asked JSON (the message says what is wrong); also a ValueError."""


@dataclass(frozen=True)
class Trajectory:
    """One episode as the judge sees it: its conversation (OpenAI-style messages, replies included)."""

    episode_id: str
    messages: tuple[dict[str, Any], ...]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def render_message(m: dict[str, Any]) -> str:
    """``[role] text`` plus its tool calls as ``name(arguments)``."""
    out = _text(m.get("content")).strip()
    for call in m.get("tool_calls") or []:
        fn = call.get("function") or call
        out += f"{chr(10) if out else ''}-> {fn.get('name', '?')}({_text(fn.get('arguments'))})"
    return f"[{m.get('role', '?')}] {out}"


def shared_prefix(trajectories: list[Trajectory]) -> int:
    """How many opening messages every trajectory has in common (never all of anyone's)."""
    if not trajectories:
        return 0
    n = min(len(t.messages) for t in trajectories) - 1
    k = 0
    while k < n and all(t.messages[k] == trajectories[0].messages[k] for t in trajectories):
        k += 1
    return max(k, 0)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return text[:head] + " [...] " + text[-(limit - head - 7):]


def judge_messages(spec: JudgeSpec, trajectories: list[Trajectory]) -> list[dict[str, str]]:
    """The judge call's messages: the rubric and scale (system), the task and the numbered trajectories (user)."""
    k = shared_prefix(trajectories)
    context = "\n".join(render_message(m) for m in trajectories[0].messages[:k]) if trajectories else ""
    parts = []
    for i, t in enumerate(trajectories, 1):
        tail = t.messages[k:] if spec.view == "transcript" else t.messages[-1:]
        body = "\n".join(render_message(m) for m in tail)
        parts.append(f"### Trajectory t{i}\n{_cut(body, spec.max_chars)}")
    n = len(trajectories)
    system = (f"You are a strict judge. Compare {n} trajectories of an agent on the same task and score each from "
              f"{spec.scale_min} (worst) to {spec.scale_max} (best) under this rubric:\n{spec.rubric.strip()}\n"
              "Scores are relative: the best trajectory gets the highest score; equal quality, equal score. "
              f"Reply with JSON only: {{\"t1\": <score>, ..., \"t{n}\": <score>}}.")
    user = f"## Task\n{_cut(context, 4 * spec.max_chars) or '(not shown)'}\n\n" + "\n\n".join(parts)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def score_schema(spec: JudgeSpec, n: int) -> dict[str, object]:
    """One integer score per trajectory, keys ``t1..tn`` in order, nothing else."""
    score = {"type": "integer", "enum": list(range(spec.scale_min, spec.scale_max + 1))}
    keys = [f"t{i}" for i in range(1, n + 1)]
    return {"type": "object", "properties": {k: score for k in keys}, "required": keys, "additionalProperties": False}


def response_format(spec: JudgeSpec, n: int) -> dict[str, object]:
    """The OpenAI ``response_format`` of a judge call over ``n`` trajectories."""
    return {"type": "json_schema", "json_schema": {"name": "judge_scores", "strict": True,
                                                   "schema": score_schema(spec, n)}}


def parse_scores(text: str | None, n: int, spec: JudgeSpec) -> list[int]:
    """The ``n`` scores of a judge reply, in trajectory order; JudgeReplyError when it is not exactly that."""
    try:
        data = json.loads(text or "")
    except ValueError as exc:
        raise JudgeReplyError(f"not JSON: {(text or '')[:80]!r}") from exc
    if not isinstance(data, dict):
        raise JudgeReplyError(f"expected an object with t1..t{n}, got {type(data).__name__}")
    want = {f"t{i}" for i in range(1, n + 1)}
    if set(data) != want:
        raise JudgeReplyError(f"expected keys t1..t{n}, got {sorted(data)[:12]}")
    out = []
    for i in range(1, n + 1):
        v = data[f"t{i}"]
        if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v):
            raise JudgeReplyError(f"t{i}: {v!r} is not an integer score")
        if not spec.scale_min <= v <= spec.scale_max:
            raise JudgeReplyError(f"t{i}: {v} is outside {spec.scale_min}..{spec.scale_max}")
        out.append(int(v))
    return out


def cache_key(spec: JudgeSpec, messages: list[dict[str, str]]) -> str:
    """Same spec and same rendered group -> same key (the content cache's key)."""
    blob = json.dumps([spec.identity(), messages], sort_keys=True, ensure_ascii=False)
    return "jc-" + hashlib.sha256(blob.encode()).hexdigest()[:32]


def chunks(items: list[_T], size: int) -> list[list[_T]]:
    """``items`` in near-equal consecutive chunks of at most ``size`` (no chunk of one when avoidable)."""
    if len(items) <= size:
        return [items]
    k = -(-len(items) // size)
    base, rest = divmod(len(items), k)
    out, i = [], 0
    for j in range(k):
        m = base + (j < rest)
        out.append(items[i:i + m])
        i += m
    return out
