"""The judge's pure parts: spec checks, what the judge sees, the score schema, reply parsing, cache keys, chunks, errors."""

from __future__ import annotations

import pytest

from swarm.errors import BackendError, SwarmError
from swarm.judge import (
    JudgeFailed,
    JudgeReplyError,
    JudgeSpec,
    Trajectory,
    combine,
    judge_messages,
    parse_scores,
    score_schema,
)
from swarm.judge.prompt import cache_key, chunks, shared_prefix

SYS = {"role": "system", "content": "Solve it."}
Q = {"role": "user", "content": "What is 2+3?"}


def _traj(i: int, *turns: dict) -> Trajectory:
    return Trajectory(f"ep-{i}", (SYS, Q, *turns))


def test_the_shared_opening_is_shown_once_and_the_view_decides_the_rest() -> None:
    call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calculator",
                                                                             "arguments": '{"expression": "2+3"}'}}]}
    t1 = _traj(1, call, {"role": "tool", "content": "5"}, {"role": "assistant", "content": "Answer: 5"})
    t2 = _traj(2, {"role": "assistant", "content": "Answer: 6"})
    assert shared_prefix([t1, t2]) == 2
    full = judge_messages(JudgeSpec(), [t1, t2])
    user = full[1]["content"]
    assert user.count("What is 2+3?") == 1 and "### Trajectory t1" in user and "### Trajectory t2" in user
    assert '-> calculator({"expression": "2+3"})' in user and "[tool] 5" in user
    final = judge_messages(JudgeSpec(view="final"), [t1, t2])[1]["content"]
    assert "calculator" not in final and "Answer: 5" in final and "Answer: 6" in final
    assert "0 (worst) to 10 (best)" in full[0]["content"] and JudgeSpec().rubric in full[0]["content"]


def test_long_trajectories_are_cut_head_and_tail() -> None:
    long = _traj(1, {"role": "assistant", "content": "start " + "x" * 5000 + " Answer: 5"})
    user = judge_messages(JudgeSpec(max_chars=200), [long, _traj(2, {"role": "assistant", "content": "6"})])[1]["content"]
    assert "[...]" in user and "Answer: 5" in user and len(user) < 600


def test_schema_and_parsing() -> None:
    spec = JudgeSpec(scale_min=1, scale_max=5)
    schema = score_schema(spec, 3)
    assert schema["required"] == ["t1", "t2", "t3"] and schema["additionalProperties"] is False
    assert schema["properties"]["t2"]["enum"] == [1, 2, 3, 4, 5]
    assert parse_scores('{"t1": 1, "t2": 5, "t3": 3.0}', 3, spec) == [1, 5, 3]
    for junk, why in [("", "not JSON"), ("[1,2,3]", "expected an object"), ('{"t1":1,"t2":2}', "expected keys"),
                      ('{"t1":1,"t2":2,"t3":9}', "outside"), ('{"t1":1,"t2":2.5,"t3":1}', "not an integer"),
                      ('{"t1":1,"t2":"2","t3":1}', "not an integer"), ('{"t1":false,"t2":2,"t3":1}', "not an integer")]:
        with pytest.raises(JudgeReplyError, match=why):
            parse_scores(junk, 3, spec)


def test_cache_key_follows_content_and_what_the_judge_is_asked() -> None:
    a = [_traj(1, {"role": "assistant", "content": "5"}), _traj(2, {"role": "assistant", "content": "6"})]
    b = [_traj(3, {"role": "assistant", "content": "5"}), _traj(4, {"role": "assistant", "content": "6"})]
    spec = JudgeSpec()
    key = cache_key(spec, judge_messages(spec, a))
    assert key == cache_key(spec, judge_messages(spec, b))  # episode ids are not content
    assert key != cache_key(spec, judge_messages(spec, a[::-1]))
    assert key != cache_key(JudgeSpec(rubric="Prefer short answers."), judge_messages(spec, a))
    assert key == cache_key(JudgeSpec(retries=5, weight_task=1.0), judge_messages(spec, a))  # not what is asked


def test_chunks_and_combine() -> None:
    assert [len(c) for c in chunks(list(range(9)), 8)] == [5, 4]
    assert [len(c) for c in chunks(list(range(17)), 8)] == [6, 6, 5] and chunks([1, 2], 8) == [[1, 2]]
    spec = JudgeSpec(scale_min=0, scale_max=4, weight_judge=1.0, weight_task=0.5)
    assert combine(spec, 3, 1.0) == 0.75 + 0.5 and combine(spec, 0, None) == 0.0


@pytest.mark.parametrize("cfg, key", [({"view": "all"}, "task.reward.view"), ({"scale": [5, 5]}, "task.reward.scale"),
                                      ({"chunk_size": 1}, "task.reward.chunk_size"),
                                      ({"weights": {"judge": 0, "task": 0}}, "task.reward.weights"),
                                      ({"weights": {"judges": 1}}, "task.reward.weights"),
                                      ({"rubrik": "x"}, "task.reward.rubrik")])
def test_bad_specs_name_their_key(cfg: dict, key: str) -> None:
    with pytest.raises(ValueError, match=f"^{key}"):
        JudgeSpec.from_config({"kind": "judge", **cfg})
    assert JudgeSpec.from_config({"kind": "judge", "scale": [1, 7], "weights": {"task": 1}}).scale_max == 7


def test_judge_errors_sit_in_the_swarm_tree_and_keep_their_builtin_bases():
    assert issubclass(JudgeReplyError, BackendError) and issubclass(JudgeReplyError, ValueError)
    exc = JudgeFailed("judge 'j' failed 2 attempts", "ep-1", "math-3")
    assert isinstance(exc, BackendError) and isinstance(exc, SwarmError) and isinstance(exc, RuntimeError)
    assert exc.judge_episode == "ep-1" and exc.message == "judge 'j' failed 2 attempts"
    assert str(exc) == "judge 'j' failed 2 attempts (judge_episode=ep-1, group_id=math-3)"
