"""The echo task: deterministic instances and the similarity reward."""

from experiments.echo import WORDS, echo_reward, make_instance


def test_instances_are_deterministic_and_valid() -> None:
    assert make_instance(3) == make_instance(3)
    words = {make_instance(s)["word"] for s in range(200)}
    assert words == set(WORDS)


def test_reward_exact_partial_and_malformed() -> None:
    assert echo_reward("apple", "apple") == {"reward": 1.0, "exact": 1.0, "similarity": 1.0}
    assert echo_reward(" Apple. ", "apple")["exact"] == 1.0
    part = echo_reward("appl", "apple")
    assert 0.5 < part["reward"] < 1.0 and part["exact"] == 0.0
    for bad in (None, "", "<|im_end|>", "x" * 1000):
        r = echo_reward(bad, "apple")
        assert 0.0 <= r["reward"] < 0.5
