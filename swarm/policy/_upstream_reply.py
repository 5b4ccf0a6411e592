"""Reading an OpenAI-compatible server's chat answers for the ``upstream`` backend.

Pure functions from the server's JSON to what a :class:`~swarm.policy.base.Generation` holds: its
``logprobs.content`` entries in OpenAI's shape (only what it sent: no alternatives are made up),
token ids where its token strings carry them (vLLM's ``token_id:<n>``), logprobs only as the
logprobs of known ids, and tool calls in OpenAI's shape. It does not talk HTTP (``_http.py``) or
build requests (``upstream.py``).
"""

from __future__ import annotations

from typing import Any

from swarm.policy._http import token_id

__all__ = ["served_logprobs", "chat_token_data", "aligned", "norm_tool_calls"]


def _alternative(a: Any) -> dict[str, Any]:
    tok = str(a.get("token", ""))
    raw = a.get("bytes")
    return {"token": tok, "logprob": float(a["logprob"]), "bytes": list(raw) if isinstance(raw, list) else None}


def served_logprobs(logprobs: Any) -> list[dict[str, Any]] | None:
    """The server's ``logprobs.content`` in OpenAI's shape, as it sent it; None when absent or unreadable.

    ``top_logprobs`` of an entry are the server's (empty when it sent none): nothing is made up.
    """
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return None
    try:
        return [{**_alternative(t), "top_logprobs": [_alternative(a) for a in t.get("top_logprobs") or []]}
                for t in content]
    except (AttributeError, KeyError, TypeError, ValueError):  # a logprob missing or not a number
        return None


def chat_token_data(logprobs: Any) -> tuple[list[int], list[float] | None, list[dict[str, Any]] | None]:
    """Token ids (when the token strings are ``token_id:<n>``), logprobs and the served entries."""
    entries = served_logprobs(logprobs)
    if not entries:
        return [], None, entries
    ids = [token_id(e["token"]) for e in entries]
    known = [i for i in ids if i is not None]
    return (known if len(known) == len(ids) else []), [e["logprob"] for e in entries], entries


def aligned(ids: list[int], lps: list[float] | None) -> list[float] | None:
    """Logprobs only as the logprobs *of known ids*: a step never holds logprobs without their tokens."""
    return lps if lps is not None and ids and len(lps) == len(ids) else None


def norm_tool_calls(calls: Any) -> list[dict[str, Any]]:
    """A message's ``tool_calls`` in OpenAI's shape (arguments kept as the server's text)."""
    out = []
    for c in calls or []:
        fn = c.get("function") or {}
        args = fn.get("arguments")
        out.append(
            {"id": c.get("id") or f"call_{len(out)}", "type": "function",
             "function": {"name": fn.get("name", ""), "arguments": args if isinstance(args, str) else "{}"}}
        )
    return out
