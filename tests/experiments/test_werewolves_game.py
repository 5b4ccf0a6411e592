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
        return None

    for seed in range(5):
        asked.clear()
        game, result = scripted_game(seed, greedy_witch)
        potions = [e.text for e in result.events if e.kind == "potion"]
        assert sum("saved" in p for p in potions) == 1 and sum("poisoned" in p for p in potions) <= 1
        # every repeated potion was refused: the fallback (pass) played and a format error counted
        assert result.format_errors[game.roles.index(WITCH)] == len(asked) - len(potions)


def test_seer_check_reveals_the_role_privately() -> None:
    game, result = heuristic_game(3)
    seer = game.roles.index(SEER)
    checks = [e for e in result.events if e.kind == "check"]
    assert checks
    for e in checks:
        assert e.to == (seer,) and e.target is not None
        assert e.text == f"Player {e.target} is the {game.roles[e.target]}."


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
    def stall(d: Decision) -> Action | None | str:  # the witch saves, one player is voted out
        if d.kind == "witch":
            return Action("save") if "save" in d.actions else Action("pass")
        if d.kind == "vote":
            return Action("vote", d.player)
        return Action("pass") if d.kind == "hunter" else None

    game, result = scripted_game(1, stall, max_rounds=1)
    assert result.timeout and result.winner == "wolves" and result.rounds == 1
    assert sum(result.alive) == 8


def test_invalid_answers_get_the_fallback_and_count_as_format_errors() -> None:
    seed = 2
    roles = deal_roles(seed)
    wolves = [i for i, r in enumerate(roles) if r == WEREWOLF]

    def broken_wolves(d: Decision) -> Action | None | str:
        if d.role == WEREWOLF:
            return "none" if d.kind != "vote" else Action("vote", 99)  # not a living player
        return None

    game, result = scripted_game(seed, broken_wolves)
    for w in wolves:
        assert result.format_errors[w] == result.decisions[w] > 0
    for i, r in enumerate(roles):
        if r != WEREWOLF:
            assert result.format_errors[i] == 0
    kills = [e for e in result.events if e.kind == "wolf_talk"]
    assert kills and all(roles[e.target] != WEREWOLF for e in kills)  # fallback: a random legal victim
    fallbacks = [e for e in result.events if e.kind == "fallback"]
    assert len(fallbacks) == sum(result.format_errors)  # every fallback is narrated ...
    assert all(e.to == (e.actor,) and "fallback" in e.text for e in fallbacks)  # ... to that player only


def test_fallback_randomness_is_its_own_stream() -> None:
    """Two games of one seed with different fallback streams diverge; rule chance stays seeded."""
    import random

    def broken(d: Decision) -> Action | None | str:
        return "none" if d.role == WEREWOLF and d.kind == "wolf_kill" else None

    victims = set()
    for k in range(6):
        game = Game(deal_roles(2), 2, fallback_rng=random.Random(k))
        result = game.play([Scripted(i, 2, broken) for i in range(9)])
        victims.add(next(e.target for e in result.events if e.kind == "wolf_talk"))
    assert len(victims) > 1


def _night_order(seed: int) -> list[str]:
    kinds: list[str] = []

    def spy(d: Decision) -> None:
        if d.round == 1 and d.kind in ("wolf_kill", "witch", "seer"):
            kinds.append(d.kind)
        return None

    scripted_game(seed, spy)
    return kinds


def test_night_order_is_wolves_then_witch_then_seer() -> None:
    for seed in range(5):
        kinds = _night_order(seed)
        assert kinds == ["wolf_kill"] * 3 + ["witch", "seer"]


def test_wolves_agree_on_the_most_proposed_victim() -> None:
    seed = 0
    roles = deal_roles(seed)
    prey = [i for i, r in enumerate(roles) if r not in (WEREWOLF, WITCH)]
    wolves = [i for i, r in enumerate(roles) if r == WEREWOLF]
    picks = {wolves[0]: prey[0], wolves[1]: prey[1], wolves[2]: prey[1]}

    def rule(d: Decision) -> Action | None | str:
        if d.kind == "wolf_kill" and d.round == 1:
            return Action("kill", picks[d.player])
        if d.kind == "witch":
            return Action("pass")
        return None

    game, result = scripted_game(seed, rule)
    dawn = next(e for e in result.events if e.kind == "dawn")
    assert dawn.text == f"Night 1: player {prey[1]} died."


def test_witch_cannot_save_herself_and_uses_one_potion_per_night() -> None:
    seed = 1
    roles = deal_roles(seed)
    witch = roles.index(WITCH)
    offered: list[tuple[str, ...]] = []

    def rule(d: Decision) -> Action | None | str:
        if d.kind == "wolf_kill":
            return Action("kill", witch)
        if d.kind == "witch":
            offered.append(d.actions)
            return Action("save")  # not offered: a format error, the fallback (pass) plays
        return None

    game, result = scripted_game(seed, rule)
    assert offered == [("pass", "poison")]
    assert not result.alive[witch] and result.format_errors[witch] == 1
    for r in range(1, result.rounds + 1):
        assert sum(1 for e in result.events if e.kind == "potion" and e.round == r) <= 1


def test_hunter_shoots_when_voted_out() -> None:
    seed = _hunter_seed()
    roles = deal_roles(seed)
    hunter, wolf = roles.index(HUNTER), roles.index(WEREWOLF)

    def rule(d: Decision) -> Action | None | str:
        if d.kind == "wolf_kill":
            return Action("kill", next(t for t in d.targets if t != hunter))
        if d.kind == "witch":
            return Action("pass")
        if d.kind == "vote":
            return Action("vote", hunter)
        if d.kind == "hunter":
            return Action("shoot", wolf)
        return None

    game, result = scripted_game(seed, rule)
    shot = next(e for e in result.events if e.kind == "shot")
    assert shot.round == 1 and shot.actor == hunter and shot.target == wolf and not result.alive[wolf]


def test_bitten_and_poisoned_hunter_cannot_shoot() -> None:
    seed = _hunter_seed()
    hunter = deal_roles(seed).index(HUNTER)

    def rule(d: Decision) -> Action | None | str:
        if d.kind == "wolf_kill":
            return Action("kill", hunter)
        if d.kind == "witch":
            return Action("poison", hunter) if "poison" in d.actions and hunter in d.targets else Action("pass")
        if d.kind == "hunter":
            raise AssertionError("a poisoned hunter is not asked to shoot, even when also bitten")
        return None

    game, result = scripted_game(seed, rule)
    assert not result.alive[hunter] and not any(e.kind == "shot" for e in result.events)


def test_roles_stay_hidden_until_the_end() -> None:
    for seed in range(10):
        game, result = heuristic_game(seed)
        public = [e for e in result.events if e.to is None and e.kind != "end"]
        for e in public:
            if e.kind in ("death", "dawn", "vote", "shot"):
                assert not any(r in e.text for r in ("werewolf", "villager", "seer", "witch", "hunter")), e.text
        end = result.events[-1]
        assert end.kind == "end" and all(f"{i} {r}" in end.text for i, r in enumerate(game.roles))


def test_last_words_only_for_the_first_nights_victims_and_the_voted_out() -> None:
    kinds = set()
    for seed in range(15):
        game, result = heuristic_game(seed)
        first_night = {e.target for e in result.events if e.kind == "death" and e.phase == "dawn" and e.round == 1}
        voted = {(e.round, e.target) for e in result.events if e.kind == "vote"}
        for e in result.events:
            if e.kind == "speech" and "(last words)" in e.text:
                assert (e.round == 1 and e.phase == "day" and e.actor in first_night) or (e.round, e.actor) in voted
                kinds.add("night" if (e.round, e.actor) not in voted else "vote")
    assert kinds == {"night", "vote"}


def test_each_living_player_speaks_once_per_day_in_seat_order() -> None:
    game, result = heuristic_game(4)
    for r in range(1, result.rounds + 1):
        day = [e.actor for e in result.events if e.kind == "speech" and e.round == r and "(last words)" not in e.text]
        assert day == sorted(day) and len(day) == len(set(day))


def test_votes_are_simultaneous_self_votes_legal_and_ties_broken_at_random() -> None:
    seen_votes: list[int] = []
    eliminated = set()
    for seed in range(12):
        roles = deal_roles(seed)

        def rule(d: Decision, roles: list[str] = roles) -> Action | None | str:
            if d.kind == "vote":
                seen_votes.append(sum(1 for e in d.events if e.kind == "vote" and e.round == d.round))
                return Action("vote", d.player)  # everyone votes for themself: an all-way tie
            return None

        game, result = scripted_game(seed, rule)
        assert sum(result.format_errors) == 0  # self-votes are legal
        first = next(e for e in result.events if e.kind == "vote")
        assert "Tie between" in first.text and first.target is not None
        eliminated.add(first.target)
    assert set(seen_votes) == {0}  # no ballot of the day is visible while voting
    assert len(eliminated) > 3  # the tie is broken at random


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
            if d.kind == "vote":
                assert d.targets == d.alive  # self-votes are legal
            else:
                assert set(d.targets) <= set(d.alive) and p not in d.targets
