"""An LLM werewolves seat: one chat call per decision it is given, constrained JSON for actions.

Two observation modes (``Options.observation``, :mod:`experiments.werewolves.task`):

- ``compact`` (the CPU default): every call is a fresh two-message chat, a fixed system prompt
  and the :func:`~experiments.werewolves.observe.compact_observation` of the decision, so a
  small model with a short context sees the same few lines in the same order every time.
- ``transcript``: one growing conversation per seat; each decision appends the events this
  player saw since its last decision and the question, then the reply verbatim, so every call
  extends the previous one (the gateway's prefix-consistent tokenization applies).

Non-speech decisions are asked with ``response_format`` = a strict JSON schema listing only the
legal actions and targets (:func:`~experiments.werewolves.observe.decision_schema`); a backend
that enforces it cannot produce a malformed decision. With ``constrained=False`` (backends that
cannot enforce schemas) the prompt shows a JSON example instead and parsing is lenient
(:func:`~experiments.werewolves.parse.parse_action`). Speech is free text capped by ``max_tokens``.

Decision kinds outside ``llm_kinds`` are played by the role's rule-based player (no call, no
format error). When the endpoint refuses a call with a 400 (e.g. the conversation outgrew the
model's context) the seat plays the rest of the game by the rules, without penalty
(``llm_errors``). Other errors propagate. This module does not open or end episodes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Collection
from typing import Any

from experiments.werewolves.game import MAX_SAY, WEREWOLF, Action, Decision
from experiments.werewolves.heuristic import HeuristicPlayer
from experiments.werewolves.observe import SPEECH_KINDS, TARGETED, compact_observation, decision_schema
from experiments.werewolves.parse import parse_action

__all__ = ["LLMPlayer", "ALL_KINDS", "COMPACT_SYSTEM", "system_prompt", "render_decision", "openai_chat"]

ALL_KINDS = ("wolf_kill", "witch", "seer", "hunter", "last_words", "speak", "vote")
COMPACT_SYSTEM = ("Werewolves, players 0-8: 3 werewolves, 3 villagers, a seer, a witch, a hunter. The village "
                  "wins when every wolf is dead; the wolves win at parity. Decide in JSON; speak in plain text.")
_GOALS = {
    "werewolf": "Each night the wolves pick a victim. Win by outnumbering the others; hide your role.",
    "villager": "Find the werewolves and vote them out.",
    "seer": "Each night check one player to learn their role. Help the village.",
    "witch": "You have one save potion (not for yourself) and one poison for the whole game. Help the village.",
    "hunter": "If the wolves or the vote kill you, you may shoot one player. Help the village.",
}
_ASK = {
    "wolf_kill": "Night: choose a victim (only wolves see your choice).",
    "witch": "Night: use a potion or pass.",
    "seer": "Night: choose a player to check.",
    "hunter": "You are dying: shoot a player or pass.",
    "last_words": "You are dead: say your last words (plain text).",
    "speak": "Day discussion: say something to everyone (plain text).",
    "vote": "Day vote: vote to eliminate a living player.",
}

Chat = Callable[[list[dict[str, Any]], dict[str, Any] | None], "tuple[str, str | None]"]


def system_prompt(player: int, role: str, wolves: list[int]) -> str:
    """The transcript mode's system prompt: rules in brief, the seat, its role (and fellow wolves)."""
    team = f" Your fellow wolves: {', '.join(map(str, wolves))}." if role == WEREWOLF else ""
    return (f"Werewolf game, players 0-8: 3 werewolves, 3 villagers, seer, witch, hunter. "
            f"You are player {player}, the {role}. {_GOALS[role]}{team} "
            "Answer decisions with one JSON object; speak in plain text.")


def _example(d: Decision) -> str:
    body: dict[str, Any] = {}
    if not all(a in TARGETED for a in d.actions):
        body["action"] = d.actions[0]
    if d.targets and any(a in TARGETED for a in d.actions):
        body["target"] = d.targets[0]
    return json.dumps(body)


def render_decision(d: Decision, constrained: bool = True) -> str:
    """The transcript mode's user message: new events, then the question (kept short)."""
    lines = [e.text for e in d.new_events]
    if d.kind == "witch":
        lines.append(f"Tonight's victim: player {d.info.get('victim')}.")
    ask = f"Round {d.round}, alive: {','.join(map(str, d.alive))}. {_ASK[d.kind]}"
    if d.kind not in SPEECH_KINDS:
        ask += f" Actions: {', '.join(d.actions)}." + (f" Targets: {','.join(map(str, d.targets))}." if d.targets else "")
        if not constrained:
            ask += f" Reply e.g. {_example(d)}"
    lines.append(ask)
    return "\n".join(lines)


def openai_chat(client: Any, model: str, temperature: float, max_tokens: int, seed: str | None = None) -> Chat:
    """A ``(messages, response_format) -> (reply text, step id)`` function over an ``openai.OpenAI`` client.

    The step id is the gateway's record of the call (``swarm.step_id`` in the response; None elsewhere).
    With ``seed`` the k-th call asks for sampling seed ``sha256(f"{seed}:{k}")`` (OpenAI's ``seed``), so the
    same weights sample the same replies whatever else the backend is serving at the time.
    """
    calls = itertools.count()

    def chat(messages: list[dict[str, Any]], response_format: dict[str, Any] | None) -> tuple[str, str | None]:
        extra: dict[str, Any] = {"response_format": response_format} if response_format is not None else {}
        if seed is not None:
            extra["seed"] = int.from_bytes(hashlib.sha256(f"{seed}:{next(calls)}".encode()).digest()[:7], "big")
        resp = client.chat.completions.create(model=model, messages=messages, temperature=temperature,
                                              max_tokens=max_tokens, **extra)
        swarm = (resp.model_extra or {}).get("swarm") or {}
        return resp.choices[0].message.content or "", swarm.get("step_id")

    return chat


class LLMPlayer:
    """Plays one seat through ``chat``; see the module docstring for the modes."""

    def __init__(self, player: int, role: str, wolves: list[int], seed: int, chat: Chat, *,
                 observation: str = "compact", constrained: bool = True,
                 llm_kinds: Collection[str] = ALL_KINDS,
                 on_reply: Callable[[Decision, str], None] | None = None) -> None:
        self.player, self.chat = player, chat
        self.observation, self.constrained, self.llm_kinds = observation, constrained, frozenset(llm_kinds)
        self.on_reply = on_reply
        system = COMPACT_SYSTEM if observation == "compact" else system_prompt(player, role, wolves)
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        self.backup = HeuristicPlayer(player, seed)
        self.calls = 0
        self.steps: list[tuple[str, int, str]] = []  # (decision kind, round, gateway step id) per call
        self.llm_errors = 0
        self.exhausted = False

    def act(self, decision: Decision) -> Action | None:
        """The seat's move; None when the reply is unusable (the engine then plays the fallback)."""
        if self.exhausted or decision.kind not in self.llm_kinds:
            return self.backup.act(decision)
        import openai

        if self.observation == "compact":
            user = {"role": "user", "content": compact_observation(decision)}
            history = self.messages[:1]
        else:
            user = {"role": "user", "content": render_decision(decision, self.constrained)}
            history = self.messages
        schema = decision_schema(decision) if self.constrained else None
        try:
            reply, step_id = self.chat([*history, user], schema)
        except openai.BadRequestError:
            self.exhausted, self.llm_errors = True, self.llm_errors + 1
            return self.backup.act(decision)
        self.calls += 1
        if step_id is not None:
            self.steps.append((decision.kind, decision.round, step_id))
        if self.observation != "compact":
            self.messages += [user, {"role": "assistant", "content": reply}]
        if self.on_reply is not None:
            self.on_reply(decision, reply)
        if decision.kind in SPEECH_KINDS:
            return Action("speak", say=" ".join(reply.split())[:MAX_SAY])
        return parse_action(reply, decision)
