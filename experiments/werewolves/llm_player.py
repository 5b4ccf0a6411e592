"""An LLM werewolves player: one growing chat conversation, one JSON action per decision.

The system prompt states the rules in brief, the player's number and role (and fellow wolves),
and the reply format. Each decision appends one user message (the events this player saw
since its last decision, then what to decide: legal actions, legal targets and a JSON example)
and the assistant's reply verbatim, so every call extends the previous one and the gateway's
prefix-consistent tokenization applies. Replies are parsed by
:func:`experiments.werewolves.parse.parse_action`; the engine handles illegal answers.

When the endpoint refuses a call with a 400 (for example the conversation outgrew the
model's context) the player stops calling it and plays the rest of the game with the
heuristic rules, without a format penalty (``llm_errors`` counts these). Other errors
propagate. This module does not open or end episodes (see :mod:`experiments.werewolves.task`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from experiments.werewolves.game import WEREWOLF, Action, Decision
from experiments.werewolves.heuristic import HeuristicPlayer
from experiments.werewolves.parse import parse_action

__all__ = ["LLMPlayer", "system_prompt", "render_decision", "openai_chat"]

_GOALS = {
    "werewolf": "Each night the wolves pick a victim. Win by outnumbering the others; hide your role.",
    "villager": "Find the werewolves and vote them out.",
    "seer": "Each night check one player to learn if they are a werewolf. Help the village.",
    "witch": "You have one save potion and one poison potion for the whole game. Help the village.",
    "hunter": "If you are killed you may shoot one player. Help the village.",
}
_ASK = {
    "wolf_kill": "Night: choose a victim (wolves see your message).",
    "witch": "Night: use a potion or pass.",
    "seer": "Night: choose a player to check.",
    "hunter": "You are dying: shoot a player or pass.",
    "last_words": "You are dead: say your last words.",
    "speak": "Day discussion: say something to everyone.",
    "vote": "Day vote: vote to eliminate a player, or pass.",
}


def system_prompt(player: int, role: str, wolves: list[int]) -> str:
    team = f" Your fellow wolves: {', '.join(map(str, wolves))}." if role == WEREWOLF else ""
    return (f"Werewolf game, players 0-8: 3 werewolves, 3 villagers, seer, witch, hunter. "
            f"You are player {player}, the {role}. {_GOALS[role]}{team} "
            'Reply with one JSON object only, like {"action": "vote", "target": 3, "say": "short text"}.')


_SAYS = {"wolf_kill", "speak", "last_words"}  # decisions whose "say" someone reads


def _example(d: Decision) -> str:
    a = d.actions[0]
    target = f', "target": {d.targets[0]}' if a in ("kill", "check", "shoot", "vote", "poison") and d.targets else ""
    say = ', "say": "..."' if d.kind in _SAYS else ""
    return f'{{"action": "{a}"{target}{say}}}'


def render_decision(d: Decision) -> str:
    """The user message for one decision: new events, then the question (kept short: small contexts)."""
    lines = [e.text for e in d.new_events]
    if d.kind == "witch":
        lines.append(f"Tonight's victim: player {d.info.get('victim')}.")
    lines.append(f"Round {d.round}, alive: {','.join(map(str, d.alive))}. {_ASK[d.kind]} "
                 f"Actions: {', '.join(d.actions)}." + (f" Targets: {','.join(map(str, d.targets))}." if d.targets else "")
                 + f" Reply e.g. {_example(d)}")
    return "\n".join(lines)


def openai_chat(client: Any, model: str, temperature: float, max_tokens: int) -> Callable[[list[dict[str, Any]]], str]:
    """A ``messages -> reply text`` function over an ``openai.OpenAI`` client."""

    def chat(messages: list[dict[str, Any]]) -> str:
        resp = client.chat.completions.create(model=model, messages=messages, temperature=temperature,
                                              max_tokens=max_tokens)
        return resp.choices[0].message.content or ""

    return chat


class LLMPlayer:
    """Plays one seat through ``chat`` (``messages -> reply text``), keeping the whole conversation."""

    def __init__(self, player: int, role: str, wolves: list[int], seed: int,
                 chat: Callable[[list[dict[str, Any]]], str]) -> None:
        self.player = player
        self.chat = chat
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(player, role, wolves)}]
        self.backup = HeuristicPlayer(player, seed)
        self.calls = 0
        self.llm_errors = 0
        self.exhausted = False

    def act(self, decision: Decision) -> Action | None:
        if self.exhausted:
            return self.backup.act(decision)
        import openai

        user = {"role": "user", "content": render_decision(decision)}
        try:
            reply = self.chat([*self.messages, user])
        except openai.BadRequestError:
            self.exhausted, self.llm_errors = True, self.llm_errors + 1
            return self.backup.act(decision)
        self.calls += 1
        self.messages += [user, {"role": "assistant", "content": reply}]
        return parse_action(reply, decision)
