"""What LLM seats are shown: compact observations and transcript prompts leak no hidden information; schemas."""

from __future__ import annotations

import re

from experiments.werewolves import Decision, Game, HeuristicPlayer, deal_roles
from experiments.werewolves.game import SEER, WEREWOLF, WITCH, Action
from experiments.werewolves.llm_player import COMPACT_SYSTEM, render_decision, system_prompt
from experiments.werewolves.observe import compact_observation, decision_schema


class Recorder(HeuristicPlayer):
    """A heuristic player that keeps every decision it was given."""

    def __init__(self, player: int, seed: int, log: list[Decision]) -> None:
        super().__init__(player, seed)
        self.log = log

    def act(self, d: Decision) -> Action:
        self.log.append(d)
        return super().act(d)


def games(seeds: range) -> list[tuple[Game, list[Decision]]]:
    out = []
    for seed in seeds:
        log: list[Decision] = []
        game = Game(deal_roles(seed), seed)
        game.play([Recorder(i, seed, log) for i in range(9)])
        out.append((game, log))
    return out


def hidden_facts(game: Game, d: Decision) -> list[str]:
    """Patterns that would reveal what ``d.player`` may not know: others' roles, private events of others."""
    facts = []
    for q, role in enumerate(game.roles):
        if q != d.player and q not in d.known:
            facts += [rf"(?<!\d){q} {role}\b", rf"Player {q} is the {role}\b"]
    seen = {e.text for e in d.events}  # the same words may have been addressed to this player too
    for e in game.events:
        if e.to is not None and d.player not in e.to and e.text not in seen:
            facts.append(re.escape(e.text))
    return facts


def test_no_prompt_shows_a_player_what_its_role_may_not_see() -> None:
    checked = 0
    for game, log in games(range(12)):
        for d in log:
            role_line = system_prompt(d.player, d.role, [w for w in game.wolves()])
            prompts = [compact_observation(d), render_decision(d), COMPACT_SYSTEM]
            if d.role == WEREWOLF:
                prompts.append(role_line)  # only wolves are told who the wolves are
            for text in prompts:
                for fact in hidden_facts(game, d):
                    assert not re.search(fact, text), (d.player, d.role, d.kind, fact, text)
            obs = compact_observation(d)
            if d.role != WEREWOLF:
                assert "wolves:" not in obs and "proposals:" not in obs
            if d.role != SEER:
                assert "checked:" not in obs
            if d.role != WITCH:
                assert "victim:" not in obs
            if d.role == WEREWOLF:  # a wolf sees exactly its pack
                assert f"wolves:{','.join(map(str, game.wolves()))}" in obs
            checked += 1
    assert checked > 500


def test_seer_sees_its_checks_and_everyone_sees_public_claims() -> None:
    for game, log in games(range(12)):
        seer = game.roles.index(SEER)
        for d in log:
            obs = compact_observation(d)
            if d.player == seer:
                for q, role in game.seer_checks.items():
                    if q in d.known and q != seer:
                        assert f"{q} {role}" in obs
            claims = [e for e in d.events if e.kind == "speech" and "I am the seer" in e.text and e.to is None]
            for e in claims:
                accused = re.search(r"Player (\d+) is a werewolf", e.text)
                assert accused and f"{e.actor} accuses:{accused.group(1)}" in obs


def test_schemas_list_only_the_legal_choices() -> None:
    kinds = set()
    for _, log in games(range(6)):
        for d in log:
            schema = decision_schema(d)
            kinds.add(d.kind)
            if d.kind in ("speak", "last_words"):
                assert schema is None
                continue
            assert schema is not None and schema["type"] == "json_schema" and schema["json_schema"]["strict"]
            props = schema["json_schema"]["schema"]["properties"]
            if "target" in props:
                assert props["target"]["enum"] == list(d.targets)
            if "action" in props:
                assert props["action"]["enum"] == list(d.actions)
            if d.kind == "vote":
                assert set(props) == {"target"} and props["target"]["enum"] == list(d.alive)
    assert {"vote", "wolf_kill", "seer", "witch", "speak"} <= kinds


def test_the_own_number_is_not_written_as_a_number_to_copy() -> None:
    """Players a decision may copy follow ``:`` or ``,`` (the answer's digit token); the observer's own
    number and the day follow a space, so a copying model is not led to vote for itself
    (``benchmarks/werewolves_reading.py --steps 0`` prints the share it puts on its own number)."""
    for _, log in games(range(6)):
        for d in log:
            first, second = compact_observation(d).splitlines()[:2]
            assert first == f"you {d.player} {d.role}"
            assert second == f"day {d.round} alive:{','.join(map(str, d.alive))}"
