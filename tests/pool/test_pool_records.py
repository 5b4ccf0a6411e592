"""Record validation: inconsistent steps, episodes and events are rejected with the field named."""

from __future__ import annotations

import pytest

from swarm.errors import ValidationError
from swarm.pool.checks import coerce
from swarm.records import Episode, Event, Step


def test_logprob_length_mismatch_names_the_field():
    with pytest.raises(ValidationError) as e:
        coerce(Step, {"episode_id": "ep-1", "response_ids": [1, 2, 3], "response_logprobs": [-0.1]}, "step")
    assert "response_logprobs" in str(e.value) and "response_ids" in str(e.value)


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"prompt_ids": [1, -2]}, "prompt_ids"),
        ({"response_ids": [3], "response_logprobs": [0.5]}, "response_logprobs"),
        ({"reward": float("nan")}, "reward"),
        ({"policy_version": -1}, "policy_version"),
        ({"source": "robot"}, "source"),
        ({"unknown_key": 1}, "unknown_key"),
        ({"episode_id": ""}, "episode_id"),
    ],
)
def test_bad_step_fields_are_named(bad, field):
    with pytest.raises(ValidationError, match=field):
        coerce(Step, {"episode_id": "ep-1", **bad}, "step")


def test_episode_and_event_validation():
    with pytest.raises(ValidationError, match="task"):
        coerce(Episode, {"task": ""}, "episode")
    with pytest.raises(ValidationError, match="timeout_s"):
        coerce(Episode, {"task": "t", "timeout_s": 0}, "episode")
    with pytest.raises(ValidationError, match="episode_id or a step_id"):
        coerce(Event, {"kind": "event"}, "event")
    with pytest.raises(ValidationError, match="value"):
        coerce(Event, {"kind": "reward", "episode_id": "ep-1"}, "event")


def test_valid_step_passes_through_unchanged():
    s = Step(episode_id="ep-1", response_ids=[1, 2], response_logprobs=[-0.5, -0.25])
    assert coerce(Step, s, "step") is s
    assert s.length == 2


def test_scrub_nul_replaces_nul_in_keys_and_values_and_keeps_clean_json_as_is() -> None:
    from swarm.pool.checks import scrub_nul

    clean = {"a": ["b", {"c": 1.5, "d": None}], "e": "no nul"}
    assert scrub_nul(clean) is clean  # the one-pass check found no NUL: nothing copied
    literal = {"e": "\\u0000 is six characters here"}  # looks like an escaped NUL to that check: walked, unchanged
    assert scrub_nul(literal) == literal
    dirty = {"k\x00": ["x\x00y", {"n": "\x00"}], "lit": "\\u0000"}
    assert scrub_nul(dirty) == {"k\ufffd": ["x\ufffdy", {"n": "\ufffd"}], "lit": "\\u0000"}
    assert scrub_nul({"when": object}) == {"when": object}  # not JSON: walked, unchanged
    assert scrub_nul({"t": ("a\x00", 1)}) == {"t": ["a\ufffd", 1]}  # a tuple is walked too (stored as a list)
