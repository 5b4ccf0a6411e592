"""vllm and upstream backends pass constraints on in the form those servers accept (fake servers, real client code)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch
import xgrammar as xgr
from test_upstream import chat_response, make

from swarm.errors import ValidationError
from swarm.policy.base import GenerateRequest, SamplingParams
from swarm.policy.constraint import Constraint, Grammars, _unpack, request_constraint

VOTE = {"type": "object", "properties": {"target": {"type": "string", "enum": ["ann", "bo"]}},
        "required": ["target"], "additionalProperties": False}
RF = {"type": "json_schema", "json_schema": {"name": "vote", "strict": True, "schema": VOTE}}
TOOLS = [{"type": "function", "function": {"name": "vote", "parameters": VOTE}}]
TOOLS2 = TOOLS + [{"type": "function", "function": {"name": "wait"}}]
MSGS = [{"role": "user", "content": "vote"}]


@pytest.mark.parametrize("constraint", [request_constraint(RF), request_constraint(None, "required", TOOLS)])
def test_vllm_gets_the_exact_grammar_and_the_step_its_replay_record(vllm_backend, fake_vllm, constraint):
    req = GenerateRequest("default", messages=MSGS, tools=TOOLS, constraint=constraint,
                          sampling=SamplingParams(max_tokens=4, top_logprobs=1))
    gens = asyncio.run(vllm_backend.generate(req))
    _, body = fake_vllm.requests[-1]
    ebnf = body["structured_outputs"]["grammar"]
    assert body["logprobs"] == 1 and gens[0].top_logprobs and gens[0].constraint["kind"] == constraint.kind
    # the EBNF text vLLM compiles is our grammar: the same masks along a valid reply
    g = Grammars(vllm_backend.tokenizer, len(vllm_backend.tokenizer), [vllm_backend.tokenizer.eos_token_id])
    reply = '{"target":"bo"}' if constraint.kind == "json_schema" else \
        '<tool_call>\n{"name": "vote", "arguments": {"target": "ann"}}\n</tool_call>'
    ids = vllm_backend.encode("default", reply) + [vllm_backend.tokenizer.eos_token_id]
    ours = g.masks(constraint, ids)
    compiler = g._compiler(("<tool_call>", "</tool_call>") if constraint.kind == "tool_call" else ())
    theirs = xgr.GrammarMatcher(compiler.compile_grammar(ebnf))  # parsed back from the text sent
    buf = xgr.allocate_token_bitmask(1, len(vllm_backend.tokenizer))
    for k, t in enumerate(ids):
        theirs.fill_next_token_bitmask(buf)
        assert torch.equal(_unpack(buf[0], len(vllm_backend.tokenizer)), ours[k]), k
        assert theirs.accept_token(t)


def test_vllm_streams_top_logprobs(vllm_backend):
    req = GenerateRequest("default", messages=MSGS, sampling=SamplingParams(max_tokens=3, top_logprobs=2))

    async def collect():
        return [x async for x in vllm_backend.stream(req)]

    items = asyncio.run(collect())
    final = items[-1]
    # vLLM sends the sampled token plus the top 2 (3 entries where the sampled one ranks below them)
    assert [len(t) for t in final.top_logprobs] == [2, 2, 2]
    for k, (tops, tok, lp) in enumerate(zip(final.top_logprobs, final.response_ids, final.logprobs, strict=True)):
        assert [v for _, v in tops] == sorted((v for _, v in tops), reverse=True)
        assert ((tok, lp) in tops) == (k % 2 == 0)  # the fake's sampled token is the top one at even k only


def test_upstream_passes_openai_fields():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        import json

        seen.append(json.loads(request.content))
        return httpx.Response(200, json=chat_response("m"))

    b = make(handler)
    for c, fields in [
        (request_constraint(RF), {"response_format": {"type": "json_schema", "json_schema": {
            "schema": VOTE, "strict": True, "name": "vote"}}}),
        (request_constraint({"type": "json_object"}), {"response_format": {"type": "json_object"}}),
        (request_constraint(None, {"type": "function", "function": {"name": "vote"}}, TOOLS),
         {"tool_choice": {"type": "function", "function": {"name": "vote"}}}),
        (request_constraint(None, "required", TOOLS2), {"tool_choice": "required"}),
    ]:
        asyncio.run(b.generate(GenerateRequest("default", messages=MSGS, tools=TOOLS2, constraint=c)))
        assert {k: seen[-1][k] for k in fields} == fields
    with pytest.raises(ValidationError):
        asyncio.run(b.generate(GenerateRequest("default", prompt_ids=[1, 2],
                                               constraint=request_constraint(None, "required", TOOLS))))
    assert Constraint.from_record(request_constraint(RF).to_record()).openai_fields() == \
        request_constraint(RF).openai_fields()
