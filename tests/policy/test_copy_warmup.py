"""The label-copy warm-up: deterministic data, the answer is the asked label's number, no task words."""

import re

from swarm.policy.copy_warmup import LABELS, copy_chats


def test_chats_are_deterministic_and_answer_the_asked_label() -> None:
    a = copy_chats(300, seed=5)
    assert a == copy_chats(300, seed=5) and a != copy_chats(300, seed=6)
    for _system, user, reply in a:
        *lines, ask = user.split("\n")
        label = ask.removesuffix("?")
        (line,) = [x for x in lines if x.split(" ")[-1].split(":")[0] == label]
        assert reply == f'{{"target":{line.split(":")[1]}}}'  # the asked line holds one number
        assert 2 <= len(lines) <= 5


def test_labels_are_single_tokens_at_a_line_start(tiny_model_path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    for label in LABELS:
        assert tok.tokenize(f"x\n{label}:3")[2:] == [label, ":", "3"], label


def test_no_label_is_a_werewolves_word() -> None:
    """The warm-up must not teach which line of a werewolves prompt matters: none of its words are there."""
    from experiments.werewolves import Game, HeuristicPlayer, deal_roles
    from experiments.werewolves.llm_player import ALL_KINDS, COMPACT_SYSTEM
    from experiments.werewolves.observe import compact_observation

    seen: set[str] = set(re.findall(r"[a-z]+", COMPACT_SYSTEM.lower()))
    for seed in range(30):
        roles = deal_roles(seed)

        class Watcher(HeuristicPlayer):
            def act(self, d):  # noqa: ANN001, ANN201
                seen.update(re.findall(r"[a-z]+", compact_observation(d).lower()))
                return super().act(d)

        Game(roles, seed).play([Watcher(p, seed) for p in range(len(roles))])
    assert {"accuses", "alive", "vote"} <= seen and len(ALL_KINDS) == 7
    assert not seen & set(LABELS)


def test_reading_model_copies_the_asked_number() -> None:
    """Held-out chats: the shipped reading model's greedy answer is the asked label's number far more often
    than a random number of the prompt would be (the same bytes on every machine: 0.64 vs 0.27)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swarm.policy.copy_warmup import copy_accuracy
    from swarm.policy.hf import HFSettings

    path = HFSettings(backend="hf", warmup="reading").weights()
    acc, chance = copy_accuracy(AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path))
    print(f"reading warm-up: the asked number {acc:.2f} of held-out chats, a random number of the prompt {chance:.2f}")
    assert acc > 2 * chance
