"""Rule-based werewolves players for every role: the default opponents and the test players.

They read the public record with simple patterns: seer claims ("I am the seer") and
accusations ("player N is a werewolf"); roles are not revealed at death. Villagers keep a
suspicion score per player (see :meth:`HeuristicPlayer.suspicion`):

- seer: checks an unchecked living player; once a living wolf is found, claims seer and
  accuses it, and votes for it;
- villager / witch / hunter: vote for (and the hunter shoots) the most suspicious player;
  the witch saves the first victim and poisons a player a seer claim accused;
- werewolf: kills a seer claimant first, else follows the first wolf proposal, else a random
  villager; by day all wolves accuse and vote for the same villager (a seer claimant, else
  the most accused, else the lowest numbered), which the village can notice.

Randomness comes from ``random.Random(f"heuristic-{seed}-{player}")``: the same game seed
gives the same game. This module does not parse JSON or talk to any model.
"""

from __future__ import annotations

import random
import re
from collections import Counter

from experiments.werewolves.game import SEER, WEREWOLF, Action, Decision, Event

__all__ = ["HeuristicPlayer", "accusations", "seer_claims"]

_ACCUSE = re.compile(r"player\s*(\d+)\s+is\s+a\s+(?:were)?wol", re.I)
_CLAIM = re.compile(r"\bi\s*am\s+the\s+seer\b", re.I)
_VOTE = re.compile(r"(\d+)->(\d+)")


def _public_speeches(events: list[Event]) -> list[Event]:
    return [e for e in events if e.kind == "speech" and e.to is None and e.actor is not None]


def seer_claims(events: list[Event]) -> dict[int, list[int]]:
    """Who claimed seer in public -> the players they accused (in order)."""
    out: dict[int, list[int]] = {}
    for e in _public_speeches(events):
        if _CLAIM.search(e.text):
            assert e.actor is not None
            out.setdefault(e.actor, []).extend(int(t) for t in _ACCUSE.findall(e.text))
    return out


def accusations(events: list[Event]) -> Counter[int]:
    """How often each player was publicly called a werewolf."""
    return Counter(int(t) for e in _public_speeches(events) for t in _ACCUSE.findall(e.text))


class HeuristicPlayer:
    """A rule-based agent for one player (see the module docstring for its rules)."""

    def __init__(self, player: int, seed: int) -> None:
        self.player = player
        self.rng = random.Random(f"heuristic-{seed}-{player}")

    def _pick(self, targets: tuple[int, ...] | list[int]) -> int | None:
        return self.rng.choice(list(targets)) if targets else None

    def suspicion(self, d: Decision) -> dict[int, float]:
        """A village-side score per living other player: higher is more wolf-like.

        +3 per accusation in a seer claim (by a claimant not known to be a wolf), +1 per vote
        against a seer claimant (wolves protect each other by silencing the seer). Players the
        seer knows as good score -inf, known wolves +10.
        """
        score = {p: 0.0 for p in d.alive if p != self.player}
        claims = seer_claims(d.events)
        for claimant, accused in claims.items():
            if d.known.get(claimant) != WEREWOLF and claimant != self.player:
                for t in accused:
                    if t in score:
                        score[t] += 3
        for e in d.events:
            if e.kind == "vote":
                for voter, target in _VOTE.findall(e.text):
                    if int(voter) in score and int(target) in claims and int(target) != int(voter):
                        score[int(voter)] += 1
        for p, role in d.known.items():  # only the seer knows living players' roles
            if p in score:
                score[p] = score[p] + 10 if role == WEREWOLF else float("-inf")
        return score

    def _suspect(self, d: Decision, candidates: tuple[int, ...]) -> int | None:
        """The most suspicious candidate (random among equals); None when nobody scores above 0."""
        score = self.suspicion(d)
        scored = [(score.get(c, 0.0), c) for c in candidates]
        top = max((s for s, _ in scored), default=0.0)
        if top <= 0:
            return None
        return self._pick([c for s, c in scored if s == top])

    def act(self, d: Decision) -> Action:
        return getattr(self, f"_{d.kind}")(d)

    def _wolf_choice(self, d: Decision) -> int | None:
        others = [p for p in d.alive if d.known.get(p) != WEREWOLF]
        claimants = [c for c in seer_claims(d.events) if c in others]
        if claimants:
            return claimants[0]
        counts = accusations(d.events)
        return min(others, key=lambda p: (-counts[p], p)) if others else None

    def _wolf_kill(self, d: Decision) -> Action:
        claimants = [c for c in seer_claims(d.events) if c in d.targets]
        proposals = [t for t in d.info.get("proposals", []) if t in d.targets]
        target = claimants[0] if claimants else proposals[0] if proposals else self._pick(d.targets)
        return Action("kill", target)

    def _witch(self, d: Decision) -> Action:
        if "save" in d.actions and d.info.get("victim") is not None:
            return Action("save")
        claimed = [t for c, acc in seer_claims(d.events).items() if d.known.get(c) != WEREWOLF
                   for t in acc if t in d.targets]
        if "poison" in d.actions and claimed:
            return Action("poison", claimed[-1])
        return Action("pass")

    def _seer(self, d: Decision) -> Action:
        unchecked = [t for t in d.targets if t not in d.known]
        return Action("check", self._pick(unchecked or list(d.targets)))

    def _known_wolf(self, d: Decision) -> int | None:
        wolves = [p for p, r in d.known.items() if r == WEREWOLF and p in d.alive and p != self.player]
        return wolves[0] if wolves else None

    def _speak(self, d: Decision) -> Action:
        if d.role == SEER:
            wolf = self._known_wolf(d)
            if wolf is not None:
                return Action("speak", say=f"I am the seer. Player {wolf} is a werewolf.")
            return Action("speak", say="I have no information yet.")
        if d.role == WEREWOLF:
            return Action("speak", say=f"I think player {self._wolf_choice(d)} is a werewolf.")
        suspect = self._suspect(d, tuple(p for p in d.alive if p != self.player))
        if suspect is not None:
            return Action("speak", say=f"I suspect player {suspect} is a werewolf.")
        return Action("speak", say="I have no information.")

    def _last_words(self, d: Decision) -> Action:
        if d.role == SEER:
            wolves = [p for p, r in d.known.items() if r == WEREWOLF and p in d.alive]
            if wolves:
                return Action("speak", say=f"I am the seer. Player {wolves[-1]} is a werewolf.")
        return Action("speak", say="Good luck, village.")

    def _vote(self, d: Decision) -> Action:
        if d.role == WEREWOLF:
            target = self._wolf_choice(d)
            return Action("vote", target if target in d.targets else self._pick(d.targets))
        if d.role == SEER and self._known_wolf(d) is not None:
            return Action("vote", self._known_wolf(d))
        target = self._suspect(d, d.targets)
        if target is None:
            cleared = {p for p, r in d.known.items() if r != WEREWOLF} | {self.player}
            target = self._pick([t for t in d.targets if t not in cleared] or list(d.targets))
        return Action("vote", target)

    def _hunter(self, d: Decision) -> Action:
        target = self._suspect(d, d.targets)
        return Action("shoot", target) if target is not None else Action("pass")
