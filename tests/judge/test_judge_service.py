"""GroupJudge through a real gateway: partial groups, retries, the failure state, the cache, recorded judge steps."""

from __future__ import annotations

import threading
import time

import pytest

from swarm.judge import GroupJudge, JudgeSpec
from swarm.pool import StepFilter
from swarm.records import EpisodeStatus


def _judge(stack, **spec) -> GroupJudge:
    return GroupJudge(stack.pool, stack.url, JudgeSpec(**{"retries": 2, "concurrency": 1, **spec}), stack.task,
                      group_size=3)


def test_a_group_is_judged_once_complete_and_its_scores_become_rewards(judge_stack) -> None:
    stack = judge_stack(['{"t1":10,"t2":0,"t3":5}'])
    judge = _judge(stack)
    eps = stack.play("t-1", ["a", "b"], reward=1.0)
    last = stack.play("t-1", ["c"], end=False)[0]  # still open: the group waits
    assert judge.ready_groups() == [] and judge.poll() == [] and not stack.api.requests
    last.end(reward=1.0)
    [out] = judge.poll()
    assert out.status == "judged" and len(stack.api.requests) == 1
    ids = [e.episode_id for e in eps] + [last.episode_id]
    assert [out.rewards[i] for i in ids] == [1.0, 0.0, 0.5]
    for i in ids:  # the judge's reward is applied; the agent's 1.0 stays in the history only
        ep = stack.pool.get_episode(i)
        assert ep.reward == out.rewards[i] and stack.pool.episode_reward_authority(i) == "judge"
        hist = stack.pool.reward_history(i)
        assert [(r["source"], r["applied"]) for r in hist] == [("agent", False), ("judge", True)]
    assert judge.poll() == []  # judged once
    req = stack.api.requests[0]
    assert req["temperature"] == 0 and req["response_format"]["json_schema"]["schema"]["required"] == ["t1", "t2", "t3"]
    assert "[user] say c" in req["messages"][1]["content"]  # no shared opening: each shows its own prompt


def test_judge_calls_are_recorded_linked_and_never_trainable(judge_stack) -> None:
    stack = judge_stack(['{"t1":3,"t2":7,"t3":7}'])
    eps = stack.play("t-2", ["x", "y", "z"], reward=0.0)
    [out] = _judge(stack).poll()
    [jid] = out.judge_episodes
    jep = stack.pool.get_episode(jid)
    assert jep.task == "judge" and jep.type.value == "eval" and jep.reward is None
    assert jep.metadata["judge"]["group_id"] == "t-2"
    assert jep.metadata["judge"]["episodes"] == [e.episode_id for e in eps]
    assert jep.metadata["judge_result"]["scores"] == [3, 7, 7]
    assert [lb.label for lb in stack.pool.labels(jid)] == ["judge"] and stack.pool.labels(jid)[0].exclude
    steps = stack.pool.query_steps(StepFilter(episode_id=jid, include_excluded=True), limit=10)
    assert len(steps) == 1 and steps[0].policy == "judge" and steps[0].response_text == '{"t1":3,"t2":7,"t3":7}'
    assert jep.metadata["judge_result"]["step_id"] == steps[0].step_id
    trainable = stack.pool.query_steps(StepFilter.trainable(), limit=100)
    assert trainable and not any(s.episode_id == jid for s in trainable)  # the judged group trains; the judge never
    ev = [e for e in stack.pool.events(eps[1].episode_id) if e.name == "judge"][0]
    assert ev.value == pytest.approx(0.7)
    assert ev.payload["judge_episode_id"] == jid and ev.payload["judge_step_id"] == steps[0].step_id
    assert ev.payload["score"] == 7 and ev.payload["cached"] is False
    # lineage answers "why 0.7": the judge's verdict, linked to the judge step that gave it
    lin = stack.pool.step_lineage(stack.pool.query_steps(StepFilter(episode_id=eps[1].episode_id), limit=1)[0].step_id)
    [verdict] = [f for f in lin["episode"]["feedback"] if f["name"] == "judge"]
    assert verdict["payload"]["judge_step_id"] == steps[0].step_id and verdict["value"] == pytest.approx(0.7)
    assert [(r["source"], r["applied"]) for r in lin["episode"]["reward_history"]][-1] == ("judge", True)


def test_junk_is_retried_then_accepted(judge_stack) -> None:
    stack = judge_stack(["I think t1 is best", '{"t1":1}', '{"t1":4,"t2":4,"t3":9}'])
    stack.play("t-3", ["a", "b", "c"])
    judge = _judge(stack)
    [out] = judge.poll()
    assert out.status == "judged" and len(stack.api.requests) == 3
    res = stack.pool.get_episode(out.judge_episodes[0]).metadata["judge_result"]
    assert res["attempts"] == 3 and "not JSON" in res["errors"][0] and "expected keys" in res["errors"][1]
    assert judge.stats["bad_replies"] == 2
    steps = stack.pool.query_steps(StepFilter(episode_id=out.judge_episodes[0], include_excluded=True), limit=10)
    assert len(steps) == 3 and res["step_id"] == max(steps, key=lambda s: s.index).step_id  # every attempt recorded


@pytest.mark.parametrize("junk", ["not json at all", '{"t1":11,"t2":0,"t3":0}', '{"t1":true,"t2":0,"t3":0}'])
def test_a_judge_that_never_answers_right_marks_the_group_failed(judge_stack, junk: str) -> None:
    stack = judge_stack([junk])
    eps = stack.play("t-4", ["a", "b", "c"], reward=1.0)
    judge = _judge(stack, retries=1)
    [out] = judge.poll()
    assert out.status == "failed" and len(stack.api.requests) == 2 and "failed 2 attempts" in out.reason
    for ep in eps:  # marked, not silently rewarded: no reward, a label and an event saying why
        stored = stack.pool.get_episode(ep.episode_id)
        assert stored.reward is None and stored.status == EpisodeStatus.finished
        assert [lb.label for lb in stack.pool.labels(ep.episode_id)] == ["judge_failed"]
        [ev] = [e for e in stack.pool.events(ep.episode_id) if e.name == "judge_failed"]
        assert ev.payload["judge_episode_id"] == out.judge_episodes[0] and ev.payload["reason"] == out.reason
    jep = stack.pool.get_episode(out.judge_episodes[0])
    assert jep.status == EpisodeStatus.failed and jep.metadata["judge_result"]["status"] == "failed"
    assert not stack.pool.query_steps(StepFilter.trainable(), limit=10)  # nothing of the group trains
    assert judge.poll() == [] and judge.stats["failed"] == 1  # not retried in a loop


def test_same_group_content_is_judged_once(judge_stack) -> None:
    stack = judge_stack(['{"t1":2,"t2":8,"t3":5}'])
    judge = _judge(stack)
    stack.play("t-5", ["a", "b", "c"])
    stack.play("t-6", ["a", "b", "c"])  # the same trajectories: the same judge prompt
    outs = judge.poll()
    assert [o.status for o in outs] == ["judged", "cached"] and len(stack.api.requests) == 1
    assert sorted(outs[0].rewards.values()) == sorted(outs[1].rewards.values()) == [0.2, 0.5, 0.8]
    stack.play("t-7", ["a", "b", "c"])
    fresh = _judge(stack)  # a new judge (a restart) finds the earlier judge episode in the pool
    [out] = fresh.poll()
    assert out.status == "cached" and len(stack.api.requests) == 1 and out.judge_episodes == outs[0].judge_episodes
    ev = [e for e in stack.pool.events(next(iter(out.rewards))) if e.name == "judge"][0]
    assert ev.payload["cached"] is True
    stack.play("t-8", ["a", "b", "d"])  # different content: a new call
    assert [o.status for o in judge.poll()] == ["judged"] and len(stack.api.requests) == 2


def test_large_groups_are_judged_in_chunks_and_mixed_with_the_task_reward(judge_stack) -> None:
    stack = judge_stack(['{"t1":10,"t2":0,"t3":0}', '{"t1":0,"t2":10}'])
    judge = GroupJudge(stack.pool, stack.url, JudgeSpec(chunk_size=3, weight_judge=0.5, weight_task=0.5),
                       stack.task, group_size=5)
    eps = stack.play("t-9", ["a", "b", "c", "d", "e"], reward=1.0)
    [out] = judge.poll()
    assert out.status == "judged" and len(out.judge_episodes) == 2 and len(stack.api.requests) == 2
    got = [out.rewards[e.episode_id] for e in eps]  # chunks of 3 and 2; reward = 0.5 * score/10 + 0.5 * 1.0
    assert got == pytest.approx([1.0, 0.5, 0.5, 0.5, 1.0])


def test_the_judge_loop_rewards_groups_as_they_complete_and_stops(judge_stack) -> None:
    stack = judge_stack(['{"t1":1,"t2":2,"t3":3}'])
    judge = _judge(stack)
    stop = threading.Event()
    loop = threading.Thread(target=judge.run, args=(stop, 0.05))
    loop.start()
    try:
        eps = stack.play("t-10", ["a", "b", "c"])
        deadline = time.monotonic() + 20
        while stack.pool.get_episode(eps[-1].episode_id).reward is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        loop.join(10)
    assert not loop.is_alive() and judge.stats["judged"] == 1
    assert [stack.pool.get_episode(e.episode_id).reward for e in eps] == pytest.approx([0.1, 0.2, 0.3])


def test_groups_are_judged_concurrently_newest_first(judge_stack) -> None:
    stack = judge_stack(['{"t1":0,"t2":5,"t3":10}'])
    for i in range(4):
        stack.play(f"t-2{i}", [f"a{i}", f"b{i}", f"c{i}"])
    judge = _judge(stack, concurrency=4)
    assert judge.ready_groups() == ["t-23", "t-22", "t-21", "t-20"]  # fresh groups are worth more to training
    outs = judge.poll()
    assert [o.group_id for o in outs] == ["t-23", "t-22", "t-21", "t-20"] and len(stack.api.requests) == 4
    assert all(o.status == "judged" and sorted(o.rewards.values()) == [0.0, 0.5, 1.0] for o in outs)
    assert judge.stats["judged"] == 4 and judge.poll() == []
