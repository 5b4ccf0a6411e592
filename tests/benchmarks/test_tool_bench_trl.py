"""benchmarks/tool_bench_trl.py without training: the reward of a TRL completion, the tool's schema, the template TRL gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.math.calculator import CALCULATOR_TOOL


def _call(args: object, name: str = "calculator") -> dict:
    return {"type": "function", "function": {"name": name, "arguments": args}}


def test_a_completion_is_scored_by_its_last_assistant_text_and_its_calls(load_bench):
    bench = load_bench("tool_bench_trl")
    good = [{"role": "assistant", "content": "", "tool_calls": [_call({"expression": "47 * 38 + 15"})]},
            {"role": "tool", "name": "calculator", "content": "1801"},
            {"role": "assistant", "content": "Answer: 1801"}]
    assert bench.score_completion(good, 1801) == pytest.approx(
        {"reward": 1.1, "correct": 1.0, "answered": 1.0, "tool_ok": 1.0, "tool_errors": 0.0, "tool_calls": 1.0,
         "turns": 2.0})
    assert bench.score_completion([{"role": "assistant", "content": "Answer: 1801"}], 1801)["reward"] == 1.0
    # TRL runs calculator(**arguments): an extra argument or another tool is an error, not a well-formed call
    for args, name in (({"expression": "17", "number": "17"}, "calculator"), ({"expression": "2+3"}, "calc"),
                       ({"expression": "2 +"}, "calculator")):
        parts = bench.score_completion([{"role": "assistant", "content": "5", "tool_calls": [_call(args, name)]}], 5)
        assert (parts["tool_ok"], parts["tool_errors"], parts["reward"]) == (0.0, 1.0, 1.0)
    # the last turn's unrun call still counts; the final text is that turn's content
    last = bench.score_completion(good[:2] + [{"role": "assistant", "content": "so",
                                               "tool_calls": [_call({"expression": "1801"})]}], 1801)
    assert (last["tool_calls"], last["tool_ok"], last["reward"]) == (2.0, 2.0, 0.1)
    assert bench.calculator("47 * 38 + 15") == "1801" and bench.calculator("2 +").startswith("error:")


def test_the_tools_schema_differs_from_ours_only_by_pattern_and_return(load_bench):
    from transformers.utils import get_json_schema

    ours = CALCULATOR_TOOL["function"]
    theirs = get_json_schema(load_bench("tool_bench_trl").calculator)["function"]
    assert theirs.pop("return") == {"type": "string"}
    expression = {k: v for k, v in ours["parameters"]["properties"]["expression"].items() if k != "pattern"}
    assert theirs == {**ours, "parameters": {**ours["parameters"], "properties": {"expression": expression}}}


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    pytest.importorskip("trl", reason="the bench extra (pip install -e '.[bench]') brings trl")
    pytest.importorskip("gguf", reason="model=smollm2 needs the gguf package (make setup installs it)")
    from transformers import AutoTokenizer

    from swarm.policy.gguf import ensure_gguf_model

    return AutoTokenizer.from_pretrained(Path(ensure_gguf_model("smollm2")))


@pytest.mark.slow
def test_trl_takes_our_template_and_parses_its_calls_with_and_without_the_prefill(load_bench, smollm2_tokenizer):
    from trl.chat_template_utils import (
        is_chat_template_prefix_preserving,
        parse_response,
        qwen2_5_chat_template,
        qwen3_template,
        supports_tool_calling,
    )

    from experiments.math.agent import SYSTEM_PROMPT
    from swarm.policy.templates import FAMILIES

    bench, tok = load_bench("tool_bench_trl"), smollm2_tokenizer
    tok.response_template = qwen3_template
    chat = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "What is 47 * 38 + 15?"}]
    for template in (FAMILIES["smollm2"].text(), bench.prefill_template(FAMILIES["smollm2"].text())):
        tok.chat_template = template  # TRL keeps a prefix-preserving template as it is
        assert supports_tool_calling(tok) and is_chat_template_prefix_preserving(tok)
        assert tok.apply_chat_template(chat, tools=[bench.calculator], tokenize=False, add_generation_prompt=True) == \
            tok.apply_chat_template(chat, tools=[bench.calculator], tokenize=False, add_generation_prompt=True,
                                    chat_template=qwen2_5_chat_template)
    plain = tok.apply_chat_template(chat, tools=[bench.calculator], add_generation_prompt=True, return_dict=False)
    opened = tok.apply_chat_template(chat, tools=[bench.calculator], add_generation_prompt=True, return_dict=False,
                                     first_call_prefill=bench.FIRST_CALL_PREFILL)
    call = {"name": "calculator", "arguments": {"expression": "47 * 38 + 15"}}
    for prefix, reply in ((plain, bench.FIRST_CALL_PREFILL + '47 * 38 + 15"}}\n</tool_call><|im_end|>'),
                          (opened, '47 * 38 + 15"}}\n</tool_call><|im_end|>')):
        parsed = parse_response(tok, tok(reply)["input_ids"], prefix=prefix, tools=[bench.calculator])
        assert [c["function"] for c in parsed["tool_calls"]] == [call]
    # a tool turn is rendered as before: the prefill opens only a turn that answers the user
    turn = chat + [{"role": "assistant", "content": "", "tool_calls": [_call(call["arguments"])]},
                   {"role": "tool", "name": "calculator", "content": "1801"}]
    assert tok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True,
                                   first_call_prefill=bench.FIRST_CALL_PREFILL).endswith(
        "<tool_response>\n1801\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
