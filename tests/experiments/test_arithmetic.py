"""The arithmetic task: disjoint train / held-out splits by content, options checked, exact scoring."""

from __future__ import annotations

import pytest

import experiments.arithmetic as arith
from swarm.client.task import check_options, configure_task, load_task


def test_held_out_problems_are_never_drawn_for_training() -> None:
    train = {arith.make_instance(s)["question"] for s in range(2000)}
    held = {arith.make_instance(arith.EVAL_SEED_BASE + s)["question"] for s in range(2000)}
    assert train and held and not train & held
    assert held == {q for q, _ in arith.problems(held_out=True)}  # every held-out problem is reachable
    assert all(a >= 0 for _, a in arith.problems())


def test_options_are_checked_and_applied() -> None:
    task = load_task("arithmetic")
    with pytest.raises(ValueError, match=r"task.options.ops=/"):
        check_options(task, {"ops": "/"})
    configure_task(task, {"max_operand": 19, "ops": "*"})
    assert arith.Options.current() == arith.Options(max_operand=19, ops="*")
    assert " * " in arith.make_instance(3)["question"]


@pytest.mark.parametrize("reply,correct", [("7 - 3 = 4", 1.0), ("The answer is 4.", 1.0), ("4", 1.0),
                                           ("I think it is 5", 0.0), ("Let me think", 0.0), (None, 0.0)])
def test_the_final_number_is_scored(reply: str | None, correct: float) -> None:
    assert arith.score(reply, 4)["reward"] == correct
