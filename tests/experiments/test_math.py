"""The math task: problems, safe calculator, answer parsing, reward and the LangChain tool loop (mocked HTTP)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from experiments.math import (
    CALCULATOR_TOOL,
    evaluate,
    make_instance,
    math_reward,
    parse_final_number,
    run_calculator,
    run_episode,
)
from experiments.math.calculator import CalculatorError
from swarm.client.task import AgentLLM


def test_instances_are_deterministic_small_and_consistent() -> None:
    assert make_instance(11) == make_instance(11)
    kinds = set()
    for seed in range(300):
        inst = make_instance(seed)
        kinds.add(inst["kind"])
        assert isinstance(inst["answer"], int) and 0 <= inst["answer"] <= 200
        assert inst["question"].endswith("?")
    assert kinds == {"add", "sub", "mul", "div", "two_step"}


def test_calculator_evaluates_arithmetic_only() -> None:
    assert evaluate("12 + 7 * 3") == 33
    assert evaluate("(10 - 4) / 2") == 3
    assert evaluate("7 / 2") == 3.5
    assert evaluate("6 × 7 =") == 42
    assert evaluate("2^10") == 1024
    for bad in ("__import__('os')", "x + 1", "9**9**9", "1/0", "", "open('f')", "[1, 2]", "1" * 300):
        with pytest.raises(CalculatorError):
            evaluate(bad)


def test_run_calculator_turns_bad_calls_into_error_results() -> None:
    assert run_calculator({"expression": "3+4"}) == ("7", True)
    assert run_calculator('{"expression": "3*4"}') == ("12", True)
    assert run_calculator({"expression": 5}) == ("5", True)
    for bad in ("{not json", {"expr": "1+1"}, {"expression": None}, [1], {"expression": "a+b"}):
        text, ok = run_calculator(bad)
        assert not ok and text.startswith("error:")
    assert CALCULATOR_TOOL["function"]["name"] == "calculator"


@pytest.mark.parametrize("text,value", [
    ("Answer: 19", 19), ("The answer is 1,234.", 1234), ("12 + 7 = 19", 19), ("\\boxed{42} so 3", 42),
    ("answer: 19.0", 19), ("I think -3", -3), ("Answer: 5 apples, not 6", 5), ("no idea", None), (None, None),
])
def test_parse_final_number(text: str | None, value: float | None) -> None:
    assert parse_final_number(text) == value


def test_reward_correct_wrong_and_tool_bonus() -> None:
    assert math_reward("Answer: 19", 19)["reward"] == 1.0
    assert math_reward("Answer: 19", 19, tool_ok=1, tool_calls=1)["reward"] == pytest.approx(1.1)
    assert math_reward("Answer: 18", 19, tool_ok=2, tool_calls=2)["reward"] == pytest.approx(0.1)
    r = math_reward("Answer: 18", 19, tool_errors=3, tool_calls=3)
    assert r["reward"] == 0.0 and r["correct"] == 0.0 and r["tool_errors"] == 3.0
    assert math_reward("", 19) == {"reward": 0.0, "correct": 0.0, "answered": 0.0, "tool_ok": 0.0,
                                   "tool_errors": 0.0, "tool_calls": 0.0}


def _fake_openai(replies: list[dict[str, Any]], seen: list[dict[str, Any]]) -> httpx.Client:
    """An httpx client whose /chat/completions answers the scripted assistant messages in order."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        msg = replies[min(len(seen) - 1, len(replies) - 1)]
        finish = "tool_calls" if msg.get("tool_calls") else "stop"
        return httpx.Response(200, json={
            "id": f"chatcmpl-{len(seen)}", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant", **msg}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    return httpx.Client(transport=httpx.MockTransport(handler))


def _call(args: str, name: str = "calculator", cid: str = "call_1") -> dict[str, Any]:
    return {"content": None, "tool_calls": [{"id": cid, "type": "function",
                                             "function": {"name": name, "arguments": args}}]}


def _llm(client: httpx.Client) -> AgentLLM:
    return AgentLLM("http://gateway.test/v1", "ep-key", "default", 1.0, 64, extra={"http_client": client})


def test_episode_tool_loop_sends_result_back_and_scores() -> None:
    inst = make_instance(3)
    a = inst["answer"]
    seen: list[dict[str, Any]] = []
    client = _fake_openai([_call(json.dumps({"expression": f"{a} + 0"})), {"content": f"Answer: {a}"}], seen)
    parts = run_episode(inst, _llm(client))
    assert parts["reward"] == pytest.approx(1.1) and parts["tool_ok"] == 1.0 and parts["turns"] == 2.0
    assert seen[0]["tools"][0]["function"]["name"] == "calculator" and seen[0]["max_completion_tokens"] == 64
    second = seen[1]["messages"]
    assert second[:2] == seen[0]["messages"]  # the history grows, it is not re-sent differently
    assert second[2]["role"] == "assistant" and second[2]["tool_calls"][0]["id"] == "call_1"
    assert second[3] == {"role": "tool", "content": str(a), "tool_call_id": "call_1"}


def test_episode_survives_malformed_and_unknown_tool_calls() -> None:
    inst = make_instance(5)
    seen: list[dict[str, Any]] = []
    client = _fake_openai([_call("{not json", cid="c1"), _call('{"expression": "1+1"}', name="search", cid="c2"),
                           _call('{"expression": "2**999"}', cid="c3"), _call('{"x": 1}', cid="c4")], seen)
    parts = run_episode(inst, _llm(client))  # never answers: max_turns calls, then scored as unanswered
    assert len(seen) == inst["max_turns"] == parts["turns"]
    assert parts["reward"] == 0.0 and parts["tool_errors"] == 4.0 and parts["tool_ok"] == 0.0
    tool_msgs = [m for m in seen[-1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["c1", "c2", "c3"]
    assert all(m["content"].startswith("error:") for m in tool_msgs)


def test_calc_problems_need_the_tool_and_keep_the_held_out_quarter_apart() -> None:
    from experiments.math import EVAL_SEED_BASE, Options
    from experiments.math.problems import held_out, make_calc_problem

    train = [make_calc_problem(s) for s in range(200)]
    evals = [make_calc_problem(EVAL_SEED_BASE + s, "eval") for s in range(50)]
    assert make_calc_problem(7) == train[7]  # deterministic in the seed
    assert not any(held_out(p["question"]) for p in train) and all(held_out(p["question"]) for p in evals)
    assert not {p["question"] for p in train} & {p["question"] for p in evals}
    for p in train[:20]:
        a, b, c = (int(x) for x in p["question"][len("What is "):-1].replace("*", "+").split("+"))
        assert p["answer"] == a * b + c and a >= 12 and b >= 12
    try:
        Options(problems="calc").use()
        assert make_instance(EVAL_SEED_BASE + 3)["question"] == evals[3]["question"]
        assert make_instance(3)["kind"] == "calc" and make_instance(3)["first_tool_call"] is False
    finally:
        Options().use()
    with pytest.raises(Exception, match="problems"):
        Options(problems="hard")


def test_first_tool_call_names_the_calculator_on_the_first_call_only() -> None:
    from experiments.math import Options

    seen: list[dict[str, Any]] = []
    client = _fake_openai([_call(json.dumps({"expression": "12 * 13 + 4"})), {"content": "Answer: 160"}], seen)
    try:
        Options(problems="calc", first_tool_call=True).use()
        inst = make_instance(1)
    finally:
        Options().use()
    parts = run_episode({**inst, "answer": 160}, _llm(client))
    assert parts["correct"] == 1.0 and len(seen) == 2
    assert seen[0]["tool_choice"] == {"type": "function", "function": {"name": "calculator"}}
    assert "tool_choice" not in seen[1]
    schema = seen[0]["tools"][0]["function"]["parameters"]["properties"]["expression"]
    assert schema["pattern"].startswith("^[0-9]")  # a constrained call writes digits and operators only
