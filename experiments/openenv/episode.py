"""One openenv episode against a gateway: observations become chat turns, replies become actions.

:func:`play` opens a session with openenv's own client (``GenericEnvClient(...).sync()``, its WebSocket
``/ws``), resets the environment with the instance seed, and each turn sends the observation's text
(:func:`prompt_text`) as the user message through the episode's LLM (one chat call, so one recorded
step), sends the reply as the action (``{action_field: reply}``), and stops when the environment says
``done`` or after ``max_turns``. With ``history`` the chat keeps the earlier turns, so each call's prompt
extends the last (the gateway's prefix-consistent tokens; one timeline in the merge). The action
field comes from the server's ``/schema`` (:func:`action_field`). Episodes of one process share at most
``sessions`` open sessions per server (a semaphore), since openenv servers refuse sessions past their
capacity. Nothing here starts a server.
"""

from __future__ import annotations

import functools
import json
import threading
from typing import Any

import httpx

from experiments.openenv.options import Options, library
from experiments.openenv.reward import episode_reward
from swarm.client.task import AgentLLM

__all__ = ["play", "prompt_text", "action_field", "server_schema"]

_SKIP = frozenset({"done", "reward", "metadata"})
_LOCK = threading.Lock()
_GATES: dict[tuple[str, int], threading.BoundedSemaphore] = {}


def prompt_text(observation: dict[str, Any], field: str = "") -> str:
    """The user message for an observation: ``field``'s text; else ``prompt``, else its only text field, else
    every field (not done/reward/metadata) as ``key: value`` lines."""
    if field:
        if field not in observation:
            raise KeyError(f"openenv: the observation has no field {field!r} (task.options.prompt_field); "
                           f"its fields: {sorted(observation)}")
        value = observation[field]
        return value if isinstance(value, str) else json.dumps(value)
    fields = {k: v for k, v in observation.items() if k not in _SKIP}
    texts = [k for k, v in fields.items() if isinstance(v, str)]
    if isinstance(fields.get("prompt"), str):
        return fields["prompt"]
    if len(texts) == 1:
        return fields[texts[0]]
    return "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v)}" for k, v in fields.items())


@functools.lru_cache(maxsize=32)
def server_schema(url: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The server's ``GET /schema`` (action, observation and state JSON schemas); ValueError when it does not answer."""
    try:
        resp = httpx.get(f"{url.rstrip('/')}/schema", timeout=timeout_s, trust_env=False)
        resp.raise_for_status()
        return resp.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ValueError(f"openenv: no openenv server answers GET {url.rstrip('/')}/schema: {exc}") from None


def action_field(schema: dict[str, Any], wanted: str = "") -> str:
    """The action field a reply fills: ``wanted`` if the action has it, else the action's only text field."""
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
    if wanted:
        if wanted not in props:
            raise ValueError(f"openenv: the action has no field {wanted!r} (task.options.action_field); "
                             f"its fields: {sorted(props)}")
        field = wanted
    else:
        texts = [k for k, v in props.items() if v.get("type") == "string"]
        if len(texts) != 1:
            raise ValueError(f"openenv: set task.options.action_field to the action field the reply fills; the "
                             f"action's text fields are {texts}, all its fields {sorted(props)}")
        field = texts[0]
    others = sorted(set(schema.get("required") or ()) - {field})
    if others:
        raise ValueError(f"openenv: the action also requires {others}; the adapter sends one field ({field!r})")
    return field


def _gate(url: str, sessions: int) -> threading.BoundedSemaphore:
    with _LOCK:
        return _GATES.setdefault((url, sessions), threading.BoundedSemaphore(sessions))


def play(url: str, llm: AgentLLM, opts: Options, seed: int, sessions: int = 1) -> dict[str, float]:
    """One episode on the server at ``url``: reward parts (:func:`episode_reward`) and ``turns``, ``done``."""
    field = action_field(server_schema(url)["action"], opts.action_field)
    base = [{"role": "system", "content": opts.system_prompt}] if opts.system_prompt else []
    messages: list[dict[str, Any]] = list(base)
    rewards: list[Any] = []
    with _gate(url, sessions), library().GenericEnvClient(base_url=url).sync() as env:
        result = env.reset(seed=int(seed))
        while not result.done and len(rewards) < opts.max_turns:
            turn = {"role": "user", "content": prompt_text(result.observation, opts.prompt_field)}
            messages = (messages if opts.history else list(base)) + [turn]
            reply = llm.chat(messages).content or ""
            messages.append({"role": "assistant", "content": reply})
            result = env.step({field: reply})
            rewards.append(result.reward)
    return {**episode_reward(rewards, opts.reward), "turns": float(len(rewards)), "done": float(bool(result.done))}
