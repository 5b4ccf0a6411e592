"""What an LLM seat is shown: a compact observation per decision and the JSON schema of its answer.

The compact observation is a few fixed lines built only from what the player may see (its own
role, private facts of that role, and the public record), in the same order every time, so a
small model with a short context can read it:

    you 5 villager
    day 2 alive:1,2,3,5,6,8
    seer claims: 6 accuses:4
    voted against a seer claimant:3,8
    vote for a living player

The player numbers a decision would copy (alive players, the accused, the voters against a
claimant, fellow wolves, proposals, checks, the witch's victim) are written right after ``:``
or ``,``, never after a space: the answer ``{"target":4}`` (the gateway's compact JSON
separators) holds the bare digit token, and in the tiny tokenizer `` 4`` (space-digit) is
another token, so a number written after a space would have to be translated before it could be
copied. Numbers a vote should not copy follow a space: the claimant of a seer claim, the day,
and the observer's own number (written ``you:5``, a copying model put 26-42% of its vote on itself,
against 11% as ``you 5``: ``benchmarks/werewolves_reading.py --steps 0``).

The public facts are stated, not judged: ``seer claims`` lists every public "I am the seer.
Player N is a werewolf" claim as ``C accuses:N`` (true or not), ``voted against a seer
claimant`` lists the living players whose recorded votes targeted a claimant. Private lines:
wolves see ``wolves:`` and this night's proposals, the seer ``checked:`` with the roles it
learned, the witch tonight's victim and her potions left. Speech decisions also see today's
speeches. Hidden roles, wolf talk, checks and potions of others never appear (tested).

:func:`decision_schema` is the ``response_format`` of a non-speech decision: a strict JSON
schema whose enums list only the legal actions and targets of that moment. Speech has no
schema: it is free text capped by ``max_tokens``. This module does no I/O.
"""

from __future__ import annotations

import re
from typing import Any

from experiments.werewolves.game import SEER, WEREWOLF, WITCH, Decision
from experiments.werewolves.heuristic import seer_claims

__all__ = ["SPEECH_KINDS", "TARGETED", "compact_observation", "decision_schema", "claims_line", "against_line"]

SPEECH_KINDS = ("speak", "last_words")
TARGETED = ("kill", "check", "shoot", "vote", "poison")
_VOTE = re.compile(r"(\d+)->(\d+)")
_ASK = {
    "wolf_kill": "choose tonight's victim",
    "witch": "use a potion or pass",
    "seer": "check a player",
    "hunter": "you are dying: shoot a player or pass",
    "last_words": "say your last words",
    "speak": "say something to everyone",
    "vote": "vote for a living player",
}


def claims_line(d: Decision) -> str:
    """``<claimant> accuses:<accused>`` for every public seer claim with an accusation ("-" when none)."""
    pairs = [f"{c} accuses:{t}" for c, accused in seer_claims(d.events).items() for t in accused]
    return ", ".join(pairs) or "-"


def against_line(d: Decision) -> str:
    """Living players (not the observer) who voted for a seer claimant, first vote first ("-" when none)."""
    claimants = set(seer_claims(d.events))
    out: list[int] = []
    for e in d.events:
        if e.kind == "vote" and e.to is None:
            for voter, target in _VOTE.findall(e.text):
                v, t = int(voter), int(target)
                if t in claimants and v != t and v in d.alive and v != d.player and v not in out:
                    out.append(v)
    return _numbers(out)


def _numbers(players: list[int] | tuple[int, ...]) -> str:
    """``1,2,3`` (no spaces: see the module docstring), "-" for none."""
    return ",".join(map(str, players)) or "-"


def _private(d: Decision) -> list[str]:
    if d.role == WEREWOLF:
        lines = ["wolves:" + _numbers([p for p, r in sorted(d.known.items()) if r == WEREWOLF])]
        if d.kind == "wolf_kill":
            lines.append("proposals:" + _numbers(d.info.get("proposals", [])))
        return lines
    if d.role == SEER:
        checked = [f"{p} {r}" for p, r in sorted(d.known.items()) if p != d.player]
        return ["checked:" + (",".join(checked) or "-")]
    if d.role == WITCH and d.kind == "witch":
        victim = d.info.get("victim")
        return [f"victim:{'-' if victim is None else victim} save:{'yes' if d.info.get('save') else 'no'} "
                f"poison:{'yes' if d.info.get('poison') else 'no'}"]
    return []


def compact_observation(d: Decision) -> str:
    """The user message of one decision in the compact format (see the module docstring)."""
    lines = [f"you {d.player} {d.role}", f"day {d.round} alive:{_numbers(d.alive)}", *_private(d),
             f"seer claims: {claims_line(d)}", f"voted against a seer claimant:{against_line(d)}"]
    if d.kind in SPEECH_KINDS:
        today = [e.text for e in d.events if e.kind == "speech" and e.to is None and e.round == d.round]
        lines += today[-8:]
    lines.append(_ASK[d.kind])
    return "\n".join(lines)


def decision_schema(d: Decision) -> dict[str, Any] | None:
    """The strict ``response_format`` for a non-speech decision (None for speech)."""
    if d.kind in SPEECH_KINDS:
        return None
    props: dict[str, Any] = {}
    if not all(a in TARGETED for a in d.actions):  # a choice of action (witch, hunter)
        props["action"] = {"type": "string", "enum": list(d.actions)}
    if d.targets and any(a in TARGETED for a in d.actions):
        props["target"] = {"type": "integer", "enum": list(d.targets)}
    return {"type": "json_schema", "json_schema": {
        "name": d.kind, "strict": True,
        "schema": {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}}}
