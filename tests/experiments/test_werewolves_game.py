"""The werewolves engine with rule-based and scripted players: rules, fallbacks, determinism."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from experiments.werewolves import SETUP, Action, Decision, Game, HeuristicPlayer, deal_roles, make_instance, winner_of
from experiments.werewolves.game import HUNTER, SEER, VILLAGER, WEREWOLF, WITCH


def heuristic_game(seed: int, **kw: int) -> tuple[Game, object]:
    roles = deal_roles(seed)
    game = Game(roles, seed, **kw)
    return game, game.play([HeuristicPlayer(i, seed) for i in range(9)])


class Scripted:
    """Plays ``rule(decision)`` when it returns an action, else the heuristic's move."""

    def __init__(self, player: int, seed: int, rule: Callable[[Decision], Action | None | str]) -> None:
        self.rule, self.backup = rule, HeuristicPlayer(player, seed)

    def act(self, d: Decision) -> Action | None:
        a = self.rule(d)
        if a == "none":
            return None
        return a if isinstance(a, Action) else self.backup.act(d)


def scripted_game(seed: int, rule: Callable[[Decision], Action | None | str], **kw: int) -> tuple[Game, object]:
    game = Game(deal_roles(seed), seed, **kw)
    return game, game.play([Scripted(i, seed, rule) for i in range(9)])


def test_instances_deal_the_nine_roles_deterministically() -> None:
    assert make_instance(4) == make_instance(4) == {"seed": 4, "roles": deal_roles(4)}
    assert sorted(make_instance(4)["roles"]) == sorted(SETUP)
    assert len({tuple(make_instance(s)["roles"]) for s in range(20)}) > 10
    with pytest.raises(ValueError):
        Game(["villager"] * 9, 0)


def test_heuristic_games_end_legally_and_are_deterministic() -> None:
    winners = set()
    for seed in range(40):
        game, result = heuristic_game(seed)
        assert result.winner in ("wolves", "village") and 1 <= result.rounds <= 7
        assert sum(result.format_errors) == 0  # heuristic players only make legal moves
        assert winner_of(game.roles, result.alive) == result.winner or result.timeout
        winners.add(result.winner)
    assert winners == {"wolves", "village"}
    assert [e.text for e in heuristic_game(7)[1].events] == [e.text for e in heuristic_game(7)[1].events]


def test_winner_of_parity_and_village() -> None:
    roles = list(SETUP)  # 0-2 wolves, 3-5 villagers, 6 seer, 7 witch, 8 hunter
    assert winner_of(roles, [True] * 9) is None
    assert winner_of(roles, [True, True, True, True, True, True, False, False, False]) == "wolves"
    assert winner_of(roles, [True, False, False, True, True, False, False, False, False]) is None
    assert winner_of(roles, [True, False, False, True, False, False, False, False, False]) == "wolves"
    assert winner_of(roles, [False, False, False, True, False, False, False, False, False]) == "village"


def test_witch_potions_are_used_at_most_once_each() -> None:
    asked: list[int] = []

    def greedy_witch(d: Decision) -> Action | None:
        if d.kind == "witch":
            asked.append(d.round)
            return Action("save") if d.round % 2 else Action("poison", d.targets[0])
        return Action("pass") if d.kind == "vote" else None

    for seed in range(5):
        asked.clear()
        game, result = scripted_game(seed, greedy_witch)
        potions = [e.text for e in result.events if e.kind == "potion"]
        assert sum("saved" in p for p in potions) == 1 and sum("poisoned" in p for p in potions) <= 1
        # every repeated potion was refused: the fallback (pass) played and a format error counted
        assert result.format_errors[game.roles.index(WITCH)] == len(asked) - len(potions)


def test_seer_check_reveals_the_truth_privately() -> None:
    game, result = heuristic_game(3)
    seer = game.roles.index(SEER)
    checks = [e for e in result.events if e.kind == "check"]
    assert checks
    for e in checks:
        assert e.to == (seer,) and e.target is not None
        assert ("is a werewolf" in e.text) == (game.roles[e.target] == WEREWOLF)


def _hunter_seed() -> int:
    return next(s for s in range(100) if deal_roles(s).index(HUNTER) != 0)


def test_hunter_shoots_when_killed_by_wolves() -> None:
    seed = _hunter_seed()
    roles = deal_roles(seed)
    hunter, wolf = roles.index(HUNTER), roles.index(WEREWOLF)

    def rule(d: Decision) -> Action | None | str:
        if d.kind == "wolf_kill":
            return Action("kill", hunter)
        if d.kind == "witch":
            return Action("pass")
        if d.kind == "hunter":
            return Action("shoot", wolf)
        return None

    game, result = scripted_game(seed, rule)
    shots = [e for e in result.events if e.kind == "shot"]
    assert shots and shots[0].round == 1 and shots[0].actor == hunter and shots[0].target == wolf
    assert not result.alive[wolf]


def test_poisoned_hunter_cannot_shoot() -> None:
    seed = _hunter_seed()
    hunter = deal_roles(seed).index(HUNTER)

    def rule(d: Decision) -> Action | None | str:
        if d.kind == "wolf_kill":
            return Action("kill", next(t for t in d.targets if t != hunter))
        if d.kind == "witch":
            return Action("poison", hunter) if "poison" in d.actions and hunter in d.targets else Action("pass")
        if d.kind == "hunter":
            raise AssertionError("a poisoned hunter is not asked to shoot")
        return None

    game, result = scripted_game(seed, rule)
    assert any(e.kind == "potion" and e.target == hunter for e in result.events)
    assert not result.alive[hunter] and not any(e.kind == "shot" and e.actor == hunter for e in result.events)


def test_round_limit_gives_wolves_the_win() -> None:
    def stall(d: Decision) -> Action | None | str:  # the witch saves, nobody is voted out
        if d.kind == "witch":
            return Action("save") if "save" in d.actions else Action("pass")
        return Action("pass") if d.kind in ("vote", "hunter") else None

    game, result = scripted_game(1, stall, max_rounds=1)
    assert result.timeout and result.winner == "wolves" and result.rounds == 1
    assert all(result.alive)


def test_invalid_answers_get_the_fallback_and_count_as_format_errors() -> None:
    seed = 2
    roles = deal_roles(seed)
    wolves = [i for i, r in enumerate(roles) if r == WEREWOLF]

    def broken_wolves(d: Decision) -> Action | None | str:
        if d.role == WEREWOLF:
            return "none" if d.kind != "vote" else Action("vote", d.player)  # self-vote is illegal
        return None

    game, result = scripted_game(seed, broken_wolves)
    for w in wolves:
        assert result.format_errors[w] == result.decisions[w] > 0
    for i, r in enumerate(roles):
        if r != WEREWOLF:
            assert result.format_errors[i] == 0
    kills = [e for e in result.events if e.kind == "wolf_talk"]
    assert kills and all(roles[e.target] != WEREWOLF for e in kills)  # fallback: a random legal victim
    votes = [e.text for e in result.events if e.kind == "vote"]
    assert all(f"{w}->pass" in v for v in votes for w in wolves if f"{w}->" in v)  # fallback: pass


def test_decisions_only_show_what_the_player_may_see() -> None:
    seen: dict[int, list[Decision]] = {}

    def spy(d: Decision) -> None:
        seen.setdefault(d.player, []).append(d)
        return None

    game, result = scripted_game(5, spy)
    for p, decisions in seen.items():
        role = game.roles[p]
        for d in decisions:
            assert all(e.to is None or p in e.to for e in d.events)
            assert d.known[p] == role
            living_known = {q for q in d.known if q in d.alive and q != p}
            if role == VILLAGER:
                assert not living_known  # a villager knows no living player's role
            assert set(d.targets) <= set(d.alive) | {p} and p not in d.targets
