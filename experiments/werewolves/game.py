"""The werewolves game engine: state, phases, rules and legal actions, deterministic in a seed.

Nine players (0-8): 3 werewolves, 3 villagers, a seer, a witch and a hunter. Each round is a
night then a day:

- night (order: wolves -> witch -> seer): each living wolf in turn proposes a victim (with a
  line only wolves see); the wolves agree on the most proposed target (ties: the earliest
  proposal). The witch hears the victim and may save them (one save per game, never
  herself) or poison someone (one poison per game), at most one potion per night. The seer
  checks one player and privately learns that player's role. Deaths are announced without
  roles: roles stay hidden until the game ends.
- day: the first night's victims say last words, every living player speaks
  ``day_discussion`` times in seat order, then everyone votes at once for a living player
  (their own seat included); the plurality is eliminated (a tie is broken at random) and
  says last words.
- the hunter, when killed by the wolves or by the vote (not when poisoned, even if bitten the
  same night), may shoot one player.

Wolves win at parity (living wolves >= living others) or when ``max_rounds`` rounds end; the
village wins when every wolf is dead. Players are driven through :class:`Decision` objects;
any agent with ``act(decision) -> Action | None`` can play. An unparsable (``None``) or
illegal action is replaced by the decision's defined fallback (pass / say nothing, or a random
legal target from ``fallback_rng`` where the role must act) and counted in ``format_errors``;
the fallback is logged (visible to that player only) as a ``fallback`` event.

Rule chance (vote ties) uses ``random.Random(f"game-{seed}")``; fallbacks use their own
``fallback_rng`` so that two games of one seed (one training group) do not share fallback
choices.

This module does no I/O and knows nothing about LLMs, prompts or rewards.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["WEREWOLF", "VILLAGER", "SEER", "WITCH", "HUNTER", "SETUP", "MAX_ROUNDS", "Action", "Event",
           "Decision", "Agent", "GameResult", "Game", "deal_roles", "side_of", "winner_of"]

WEREWOLF, VILLAGER, SEER, WITCH, HUNTER = "werewolf", "villager", "seer", "witch", "hunter"
SETUP = (WEREWOLF,) * 3 + (VILLAGER,) * 3 + (SEER, WITCH, HUNTER)
MAX_ROUNDS = 7
MAX_SAY = 120  # characters; speeches are read by every LLM seat, contexts are small

# decision kind -> (legal action names, the action that needs no target when used as fallback)
_KINDS = {
    "wolf_kill": ("kill",),
    "witch": ("save", "poison", "pass"),
    "seer": ("check",),
    "hunter": ("shoot", "pass"),
    "last_words": ("speak",),
    "speak": ("speak",),
    "vote": ("vote",),
}
_TARGETED = {"kill", "poison", "check", "shoot", "vote"}


@dataclass(frozen=True)
class Action:
    """One move: ``kind`` is a legal action name, ``target`` a player index where it needs one."""

    kind: str
    target: int | None = None
    say: str = ""


@dataclass(frozen=True)
class Event:
    """Something that happened; ``to`` lists who saw it (None: everyone)."""

    round: int
    phase: str
    kind: str
    text: str
    actor: int | None = None
    target: int | None = None
    to: tuple[int, ...] | None = None


@dataclass
class Decision:
    """What one player must decide now, with everything that player may see."""

    player: int
    role: str
    kind: str
    actions: tuple[str, ...]
    targets: tuple[int, ...]
    round: int
    alive: tuple[int, ...]
    known: dict[int, str]
    events: list[Event]
    new_events: list[Event]
    info: dict[str, Any] = field(default_factory=dict)


class Agent(Protocol):
    def act(self, decision: Decision) -> Action | None: ...


@dataclass
class GameResult:
    winner: str  # "wolves" | "village"
    rounds: int
    timeout: bool
    format_errors: list[int]
    decisions: list[int]
    alive: list[bool]
    events: list[Event]


def deal_roles(seed: int) -> list[str]:
    """The role of each player for a game seed (a seeded shuffle of :data:`SETUP`)."""
    roles = list(SETUP)
    random.Random(f"roles-{seed}").shuffle(roles)
    return roles


def side_of(role: str) -> str:
    return "wolves" if role == WEREWOLF else "village"


def winner_of(roles: Sequence[str], alive: Sequence[bool]) -> str | None:
    wolves = sum(1 for r, a in zip(roles, alive, strict=True) if a and r == WEREWOLF)
    others = sum(1 for r, a in zip(roles, alive, strict=True) if a and r != WEREWOLF)
    if wolves == 0:
        return "village"
    if wolves >= others:
        return "wolves"
    return None


class Game:
    """One game; :meth:`play` runs it to the end with one agent per player."""

    def __init__(self, roles: Sequence[str], seed: int, max_rounds: int = MAX_ROUNDS, day_discussion: int = 1,
                 fallback_rng: random.Random | None = None) -> None:
        if sorted(roles) != sorted(SETUP):
            raise ValueError(f"roles must be a permutation of {SETUP}, got {list(roles)}")
        self.roles = list(roles)
        self.seed = seed
        self.max_rounds = max_rounds
        self.day_discussion = day_discussion
        self.rng = random.Random(f"game-{seed}")
        self.fallback_rng = fallback_rng or random.Random(f"fallback-{seed}")
        n = len(self.roles)
        self.alive = [True] * n
        self.round = 1
        self.phase = "night"
        self.events: list[Event] = []
        self.witch_save_used = False
        self.witch_poison_used = False
        self.seer_checks: dict[int, str] = {}
        self.format_errors = [0] * n
        self.decisions = [0] * n
        self.winner: str | None = None
        self.timeout = False
        self._seen = [0] * n
        self._agents: Sequence[Agent] = ()
        self._after: Callable[[Decision, Action], None] | None = None

    # -- views ---------------------------------------------------------------------------
    def living(self, exclude: int | None = None) -> tuple[int, ...]:
        return tuple(i for i, a in enumerate(self.alive) if a and i != exclude)

    def wolves(self) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.roles) if r == WEREWOLF)

    def known_roles(self, player: int) -> dict[int, str]:
        known = {player: self.roles[player]}
        if self.roles[player] == WEREWOLF:
            known.update({w: WEREWOLF for w in self.wolves()})
        if self.roles[player] == SEER:
            known.update(self.seer_checks)
        return known

    def visible(self, player: int, since: int = 0) -> list[Event]:
        return [e for e in self.events[since:] if e.to is None or player in e.to]

    def _log(self, kind: str, text: str, actor: int | None = None, target: int | None = None,
             to: tuple[int, ...] | None = None) -> None:
        self.events.append(Event(self.round, self.phase, kind, text, actor, target, to))

    # -- decisions -----------------------------------------------------------------------
    def legal(self, decision: Decision, action: Action | None) -> bool:
        if action is None or action.kind not in decision.actions:
            return False
        if action.kind in _TARGETED:
            return action.target in decision.targets
        return True

    def fallback(self, decision: Decision) -> Action:
        """The defined replacement for an invalid action: pass if allowed, else a random legal target."""
        if "pass" in decision.actions:
            return Action("pass")
        if decision.actions == ("speak",):
            return Action("speak")
        return Action(decision.actions[0], self.fallback_rng.choice(decision.targets))

    def decide(self, player: int, kind: str, targets: Sequence[int] = (), actions: Sequence[str] | None = None,
               **info: Any) -> Action:
        """Ask ``player``'s agent; returns a legal action (the fallback when the answer is not)."""
        decision = Decision(player, self.roles[player], kind, tuple(actions or _KINDS[kind]), tuple(targets),
                            self.round, self.living(), self.known_roles(player), self.visible(player),
                            self.visible(player, self._seen[player]), info)
        self._seen[player] = len(self.events)
        self.decisions[player] += 1
        action = self._agents[player].act(decision)
        if not self.legal(decision, action):
            self.format_errors[player] += 1
            action = self.fallback(decision)
            self._log("fallback", f"Player {player}'s {kind} answer was invalid; the fallback played: "
                      f"{action.kind}{'' if action.target is None else ' ' + str(action.target)}.",
                      player, action.target, to=(player,))
        assert action is not None
        action = Action(action.kind, action.target if action.kind in _TARGETED else None, (action.say or "")[:MAX_SAY])
        if self._after is not None:
            self._after(decision, action)
        return action

    # -- deaths --------------------------------------------------------------------------
    def _kill(self, player: int, cause: str) -> None:
        self.alive[player] = False
        self._log("death", f"Player {player} is dead.", target=player)
        self.winner = self.winner or winner_of(self.roles, self.alive)
        if self.roles[player] == HUNTER and cause != "poison" and self.winner is None:
            shot = self.decide(player, "hunter", self.living(exclude=player))
            if shot.kind == "shoot":
                self._log("shot", f"Player {player}, dying, shoots player {shot.target}.", player, shot.target)
                assert shot.target is not None
                self._kill(shot.target, "shot")

    def _last_words(self, player: int) -> None:
        if self.winner is None:
            a = self.decide(player, "last_words")
            self._log("speech", f"Player {player} (last words): {a.say}", player)

    # -- phases --------------------------------------------------------------------------
    def _night(self) -> list[int]:
        self.phase = "night"
        wolves = tuple(w for w in self.wolves() if self.alive[w])
        prey = tuple(i for i in self.living() if self.roles[i] != WEREWOLF)
        proposals: list[int] = []
        for w in wolves:
            a = self.decide(w, "wolf_kill", prey, proposals=list(proposals))
            assert a.target is not None
            proposals.append(a.target)
            self._log("wolf_talk", f"Wolf {w} proposes to kill player {a.target}. {a.say}".strip(), w, a.target, wolves)
        counts = Counter(proposals)
        top = max(counts.values())
        victim: int | None = next(t for t in proposals if counts[t] == top)
        poisoned = None
        witch = self.roles.index(WITCH)
        if self.alive[witch]:
            actions = ["pass"] + (["save"] if not self.witch_save_used else []) + \
                      (["poison"] if not self.witch_poison_used else [])
            if victim == witch and "save" in actions:  # the witch may not save herself
                actions.remove("save")
            a = self.decide(witch, "witch", self.living(exclude=witch), actions=actions, victim=victim,
                            save=not self.witch_save_used, poison=not self.witch_poison_used)
            if a.kind == "save":
                self.witch_save_used, victim = True, None
                self._log("potion", "You saved tonight's victim.", witch, to=(witch,))
            elif a.kind == "poison":
                self.witch_poison_used, poisoned = True, a.target
                self._log("potion", f"You poisoned player {a.target}.", witch, a.target, to=(witch,))
        seer = self.roles.index(SEER)
        if self.alive[seer]:
            a = self.decide(seer, "seer", self.living(exclude=seer))
            assert a.target is not None
            self.seer_checks[a.target] = self.roles[a.target]
            self._log("check", f"Player {a.target} is the {self.roles[a.target]}.", seer, a.target, to=(seer,))
        deaths = sorted({d for d in (victim, poisoned) if d is not None})
        self.phase = "dawn"
        self._log("dawn", f"Night {self.round}: " + (", ".join(f"player {d}" for d in deaths) + " died."
                                                     if deaths else "nobody died."))
        for d in deaths:
            if self.alive[d]:
                self._kill(d, "poison" if d == poisoned else "wolves")
        return deaths

    def _day(self, night_deaths: list[int]) -> None:
        self.phase = "day"
        if self.round == 1:  # last words: the first night's victims only
            for d in night_deaths:
                self._last_words(d)
        for _ in range(self.day_discussion):
            for p in self.living():
                if self.winner is not None:
                    return
                a = self.decide(p, "speak")
                self._log("speech", f"Player {p}: {a.say}", p)
        if self.winner is not None:
            return
        # simultaneous: every ballot is asked before any is logged, so nobody sees another's vote
        votes = {p: self.decide(p, "vote", self.living()) for p in self.living()}
        tally = Counter(a.target for a in votes.values())
        text = ", ".join(f"{p}->{a.target}" for p, a in votes.items())
        top = max(tally.values())
        leaders = sorted(t for t, c in tally.items() if c == top)
        out = leaders[0] if len(leaders) == 1 else self.rng.choice(leaders)
        tie = f" Tie between {', '.join(map(str, leaders))}, broken at random." if len(leaders) > 1 else ""
        self._log("vote", f"Votes: {text}.{tie} Player {out} is eliminated.", target=out)
        self._kill(out, "vote")
        self._last_words(out)

    def play(self, agents: Sequence[Agent], after_decision: Callable[[Decision, Action], None] | None = None
             ) -> GameResult:
        """Run the game to its end; ``after_decision`` (optional) is called after every decision."""
        if len(agents) != len(self.roles):
            raise ValueError(f"need {len(self.roles)} agents, got {len(agents)}")
        self._agents, self._after = agents, after_decision
        while self.winner is None:
            deaths = self._night()
            if self.winner is None:
                self._day(deaths)
            if self.winner is None and self.round >= self.max_rounds:
                self.winner, self.timeout = "wolves", True
            if self.winner is None:
                self.round += 1
        self.phase = "end"
        self._log("end", f"Game over: the {self.winner} win. Roles: "
                  + ", ".join(f"{i} {r}" for i, r in enumerate(self.roles)) + ".")
        return GameResult(self.winner, self.round, self.timeout, list(self.format_errors), list(self.decisions),
                          list(self.alive), list(self.events))
