"""OpenAI response shapes: chat completions, completions, stream chunks, logprobs, usage.

Pure functions from backend :class:`~swarm.policy.base.Generation` objects to JSON-ready dicts.
``top_logprobs`` are filled from the backend's ``(token id, logprob)`` pairs when it reported
them (``SamplingParams.top_logprobs``), else empty. A backend whose server tokenizes for itself
(``upstream``) hands over that server's own ``logprobs.content`` entries, which go out as they came,
and its own ``usage``, which is the call's ``usage`` (body and streamed usage chunk).
This module does not store, validate requests or talk to the backend beyond ``decode``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from swarm.policy.base import Generation, PolicyBackend
from swarm.policy.toolcalls import new_call_id
from swarm.records import new_id

__all__ = ["new_completion_id", "normalize_tool_calls", "chat_logprobs", "chat_response", "chat_chunk",
           "completion_response", "completion_chunk", "completion_logprobs", "usage"]


def new_completion_id(kind: str = "chatcmpl") -> str:
    return new_id(kind)


def normalize_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls in OpenAI's shape: ``{id, type: "function", function: {name, arguments: str}}``."""
    out = []
    for c in calls or []:
        fn = c.get("function") or {"name": c.get("name", ""), "arguments": c.get("arguments", {})}
        args = fn.get("arguments", "")
        if not isinstance(args, str):
            args = json.dumps(args)
        out.append({"id": c.get("id") or new_call_id(), "type": "function",
                    "function": {"name": str(fn.get("name", "")), "arguments": args}})
    return out


def _token_strings(backend: PolicyBackend, policy: str, ids: list[int]) -> list[str]:
    return [backend.decode(policy, [t]) for t in ids]


def _tops(backend: PolicyBackend, policy: str, tops: list[list[tuple[int, float]]] | None, n: int) -> list[list]:
    if not tops:
        return [[] for _ in range(n)]
    return [[(backend.decode(policy, [t]), lp) for t, lp in row] for row in tops]


def chat_logprobs(backend: PolicyBackend, policy: str, ids: list[int], lps: list[float] | None,
                  tops: list[list[tuple[int, float]]] | None = None,
                  served: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """OpenAI's ``logprobs`` of a choice; ``served``: entries a server sent in that shape (used as they are)."""
    if served is not None:
        return {"content": served, "refusal": None}
    if lps is None:
        return None
    alts = _tops(backend, policy, tops, len(ids))
    return {"content": [{"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8")),
                         "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode("utf-8"))} for t, v in alt]}
                        for tok, lp, alt in zip(_token_strings(backend, policy, ids), lps, alts, strict=False)],
            "refusal": None}


def completion_logprobs(backend: PolicyBackend, policy: str, ids: list[int], lps: list[float] | None,
                        offset: int = 0, tops: list[list[tuple[int, float]]] | None = None) -> dict[str, Any] | None:
    if lps is None:
        return None
    toks = _token_strings(backend, policy, ids)
    offsets, pos = [], offset
    for t in toks:
        offsets.append(pos)
        pos += len(t)
    top = None if not tops else [dict(row) for row in _tops(backend, policy, tops, len(ids))]
    return {"tokens": toks, "token_logprobs": list(lps), "top_logprobs": top, "text_offset": offsets}


_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


def usage(gens: list[Generation]) -> dict[str, Any]:
    """OpenAI's ``usage`` of one call: the serving backend's own when it reported one (``Generation.usage``,
    details included, as sent), else counted here: its prompt once, every choice's completion tokens."""
    reported = gens[0].usage if gens else None
    if isinstance(reported, dict) and all(isinstance(reported.get(k), int) for k in _COUNTS):
        return dict(reported)
    prompt, completion = len(gens[0].prompt_ids), sum(len(g.response_ids) for g in gens)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _finish(gen: Generation, tool_calls: list[dict[str, Any]]) -> str:
    if tool_calls:
        return "tool_calls"
    return gen.finish_reason if gen.finish_reason in ("stop", "length", "content_filter") else "stop"


def chat_message(gen: Generation, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": gen.text if (gen.text or not tool_calls) else None,
                           "refusal": None}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return msg


def _body(cid: str, obj: str, created: int, model: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"id": cid, "object": obj, "created": created, "model": model, "system_fingerprint": None,
            "choices": choices, **extra}


def chat_response(cid: str, created: int, model: str, gens: list[Generation], calls: list[list[dict[str, Any]]],
                  logprobs: list[dict[str, Any] | None], swarm: dict[str, Any]) -> dict[str, Any]:
    choices = [{"index": i, "message": chat_message(g, calls[i]), "logprobs": logprobs[i],
                "finish_reason": _finish(g, calls[i])} for i, g in enumerate(gens)]
    return _body(cid, "chat.completion", created, model, choices, usage=usage(gens), swarm=swarm)


def chat_chunk(cid: str, created: int, model: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return _body(cid, "chat.completion.chunk", created, model, choices, **extra)


def completion_response(cid: str, created: int, model: str, gens: list[Generation],
                        logprobs: list[dict[str, Any] | None], swarm: dict[str, Any]) -> dict[str, Any]:
    choices = [{"index": i, "text": g.text, "logprobs": logprobs[i],
                "finish_reason": g.finish_reason if g.finish_reason in ("stop", "length") else "stop"}
               for i, g in enumerate(gens)]
    return _body(cid, "text_completion", created, model, choices, usage=usage(gens), swarm=swarm)


def completion_chunk(cid: str, created: int, model: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"id": cid, "object": "text_completion", "created": created, "model": model, "choices": choices, **extra}


def now_s() -> int:
    return int(time.time())
