"""Werewolves reply parsing (valid, variants, malformed, illegal -> fallback) and the reward functions."""

from __future__ import annotations

import pytest

from experiments.werewolves import (
    FORMAT_PENALTY,
    MAX_PENALTY,
    Action,
    Decision,
    Game,
    GameResult,
    deal_roles,
    extract_json,
    parse_action,
    player_reward,
    side_reward,
)


def vote_decision(**kw: object) -> Decision:
    base = dict(player=0, role="villager", kind="vote", actions=("vote", "pass"), targets=(1, 2, 3), round=1,
                alive=(0, 1, 2, 3), known={0: "villager"}, events=[], new_events=[])
    base.update(kw)
    return Decision(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("text,expected", [
    ('{"action": "vote", "target": 3, "say": "hi"}', Action("vote", 3, "hi")),
    ('Sure!\n```json\n{"action": "vote", "target": 2}\n```', Action("vote", 2)),
    ("{'action': 'lynch', 'target': 'player 2',}", Action("vote", 2)),
    ('{"Action": "VOTE", "Player": "P1", "reason": "quiet"}', Action("vote", 1, "quiet")),
    ('{"vote": 2}', Action("vote", 2)),
    ('{"target": 1}', Action("vote", 1)),
    ('{"action": "abstain"}', Action("pass")),
    ('{"action": "vote", "target": 9}', Action("vote", 9)),  # parsed; the engine judges legality
    ('{"action": "vote", "target": "}"}', Action("vote", None)),
])
def test_parse_valid_and_variants(text: str, expected: Action) -> None:
    assert parse_action(text, vote_decision()) == expected


@pytest.mark.parametrize("text", [None, "", "I vote 3", '{"action": "dance"}', '{"action": "vote", "target": 3',
                                  "[1, 2]", '{"say": "hello"}', "{{{{"])
def test_parse_malformed_is_none(text: str | None) -> None:
    assert parse_action(text, vote_decision()) is None


def test_parse_speak_without_action_key_and_extract_first_object() -> None:
    speak = vote_decision(kind="speak", actions=("speak",), targets=())
    assert parse_action('{"say": "I trust 4"}', speak) == Action("speak", None, "I trust 4")
    assert extract_json('x {"a": {"b": 1}} {"c": 2}') == {"a": {"b": 1}}
    assert extract_json('{"a": "}{", "b": True}') == {"a": "}{", "b": True}


def test_illegal_parsed_action_gets_the_fallback_and_a_penalty() -> None:
    game = Game(deal_roles(0), 0)

    class Replies:
        def __init__(self, text: str) -> None:
            self.text = text

        def act(self, d: Decision) -> Action | None:
            return parse_action(self.text, d)

    game._agents = [Replies('{"action": "vote", "target": 0}')] + [Replies('{"action": "pass"}')] * 8
    a = game.decide(0, "vote", game.living())  # voting for oneself is legal
    assert a == Action("vote", 0) and game.format_errors[0] == 0
    a = game.decide(1, "vote", game.living())  # passing is not: a random living player
    assert a.kind == "vote" and a.target in game.living() and game.format_errors[1] == 1
    victim = game.decide(0, "wolf_kill", (3, 4))  # "vote" is not a night action: a random victim
    assert victim.kind == "kill" and victim.target in (3, 4) and game.format_errors[0] == 1


def test_player_reward_team_result_plus_capped_penalty() -> None:
    assert player_reward(True, 0) == {"reward": 1.0, "win": 1.0, "format_penalty": 0.0, "format_errors": 0.0,
                                      "vote_bonus": 0.0}
    assert player_reward(False, 2)["reward"] == pytest.approx(-2 * FORMAT_PENALTY)
    assert player_reward(True, 100)["reward"] == pytest.approx(1.0 - MAX_PENALTY)
    assert player_reward(True, 100)["reward"] > player_reward(False, 0)["reward"]


def test_vote_shaping_pays_the_fraction_of_votes_that_eliminated_an_opponent_never_for_dying() -> None:
    assert player_reward(False, 0, votes=4, vote_kills=1, vote_shaping=0.5)["vote_bonus"] == pytest.approx(0.125)
    assert player_reward(False, 0, votes=0, vote_kills=0, vote_shaping=0.5)["reward"] == 0.0  # died before voting
    assert player_reward(True, 0, votes=3, vote_kills=0, vote_shaping=0.5)["reward"] == 1.0
    best_loser = player_reward(False, 0, votes=2, vote_kills=2, vote_shaping=0.5)["reward"]
    assert best_loser <= player_reward(True, 0, votes=2, vote_kills=0, vote_shaping=0.5)["reward"]
    with pytest.raises(ValueError, match="vote_shaping"):
        player_reward(True, 0, vote_shaping=0.8)


def test_vote_record_counts_ballots_on_the_other_side() -> None:
    from experiments.werewolves.game import SETUP, Event
    from experiments.werewolves.reward import vote_record

    roles = list(SETUP)  # 0-2 wolves
    events = [Event(1, "day", "vote", "Votes: 0->3, 3->0, 4->1, 5->5. Tie between 0, 3, broken at random. "
                                      "Player 3 is eliminated.", target=3)]
    result = GameResult("wolves", 1, False, [0] * 9, [0] * 9, [True] * 9, events)
    assert vote_record(result, roles) == {0: (1, 1, 1), 3: (1, 1, 0), 4: (1, 1, 0), 5: (1, 0, 0)}  # 3 went out


def test_vote_shaping_can_pay_votes_that_named_an_opponent() -> None:
    """``vote_shaping_pays="named"``: every vote for the other side counts, whether the day put that player out or not."""
    from experiments.werewolves.game import SETUP, Event
    from experiments.werewolves.reward import vote_step_rewards

    roles = list(SETUP)  # 0-2 wolves
    events = [Event(1, "day", "vote", "Votes: 3->0, 4->1, 5->0, 6->6. Player 0 is eliminated.", target=0),
              Event(2, "day", "vote", "Votes: 3->2, 4->2, 6->7. Player 2 is eliminated.", target=2)]
    result = GameResult("wolves", 2, False, [0] * 9, [0] * 9, [True] * 9, events)
    village = [3, 4, 5, 6]
    named = side_reward(result, roles, "village", village, vote_shaping=0.5, pays="named")
    eliminated = side_reward(result, roles, "village", village, vote_shaping=0.5)
    assert named["vote_bonus"] == pytest.approx(0.5 * (1 + 1 + 1 + 0) / 4)  # 4's vote for 1 counts
    assert eliminated["vote_bonus"] == pytest.approx(0.5 * (1 + 0.5 + 1 + 0) / 4)
    assert vote_step_rewards(result, roles, 4, {1: "s1", 2: "s2"}, 0.5, pays="named") == {"s1": 0.5, "s2": 0.5}
    assert vote_step_rewards(result, roles, 4, {1: "s1", 2: "s2"}, 0.5) == {"s1": 0.0, "s2": 0.5}
    with pytest.raises(ValueError, match="vote_shaping_pays"):
        side_reward(result, roles, "village", village, vote_shaping=0.5, pays="agreed")


def test_side_reward_averages_the_trainable_players() -> None:
    roles = list(deal_roles(0))
    wolves = [i for i, r in enumerate(roles) if r == "werewolf"]
    errors = [0] * 9
    errors[wolves[0]] = 3
    result = GameResult("wolves", 3, False, errors, [5] * 9, [True] * 9, [])
    parts = side_reward(result, roles, "wolves", wolves)
    assert parts == pytest.approx({"reward": 1 - 0.1, "win": 1.0, "format_penalty": -0.1, "vote_bonus": 0.0,
                                   "rounds": 3.0})
    village = [i for i in range(9) if i not in wolves]
    assert side_reward(result, roles, "village", village)["reward"] == 0.0
    assert side_reward(result, roles, "village", [])["win"] == 0.0
    with pytest.raises(ValueError):
        side_reward(result, roles, "village", wolves)
