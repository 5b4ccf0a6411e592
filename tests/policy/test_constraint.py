"""Constrained decoding on the hf backend: request parsing, valid replies, masked logprobs, replay, streaming."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
import torch

from swarm.errors import ValidationError
from swarm.policy.base import GenerateRequest, Generation, SamplingParams, TokenDelta
from swarm.policy.constraint import Constraint, Grammars, request_constraint

NAMES = ["alice", "bob", "carol", "dave"]
VOTE = {"type": "object", "properties": {"target": {"type": "string", "enum": NAMES}},
        "required": ["target"], "additionalProperties": False}
RF = {"type": "json_schema", "json_schema": {"name": "vote", "strict": True, "schema": VOTE}}
TOOLS = [{"type": "function", "function": {"name": "vote", "parameters": VOTE}},
         {"type": "function", "function": {"name": "skip", "parameters": {"type": "object", "properties": {}}}}]
MSGS = [{"role": "user", "content": "Who do you vote for?"}]


def run(coro):
    return asyncio.run(coro)


def generate(backend, constraint, n=8, temperature=1.0, seed=3, max_tokens=64, tools=None, top=0) -> list[Generation]:
    req = GenerateRequest("default", messages=MSGS, tools=tools, constraint=constraint,
                          sampling=SamplingParams(max_tokens=max_tokens, n=n, temperature=temperature, seed=seed,
                                                  top_logprobs=top))
    return run(backend.generate(req))


def masked_rescore(backend, gen: Generation, temperature: float) -> torch.Tensor:
    """Logprobs of the response under the replayed grammar masks, from one forward pass."""
    grammars = Grammars(backend.tokenizer, gen.constraint["vocab_size"], gen.constraint["stop_token_ids"])
    masks = grammars.masks(Constraint.from_record(gen.constraint), gen.response_ids)
    ids = torch.tensor([gen.prompt_ids + gen.response_ids])
    with torch.no_grad():
        logits = backend.model(ids).logits[0, len(gen.prompt_ids) - 1: -1].float()
    logp = torch.log_softmax(logits.masked_fill(~masks, float("-inf")) / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(gen.response_ids).unsqueeze(-1)).squeeze(-1)


# ----------------------------------------------------------------------------- request fields -> constraint
def test_request_fields_map_to_constraints_and_bad_ones_name_the_parameter():
    assert request_constraint({"type": "text"}) is None and request_constraint(None, "auto", TOOLS) is None
    assert request_constraint({"type": "json_object"}).kind == "json_object"
    c = request_constraint(RF)
    assert (c.kind, c.schema, c.strict, c.name) == ("json_schema", VOTE, True, "vote")
    assert Constraint.from_record(c.to_record()) == c
    named = request_constraint(None, {"type": "function", "function": {"name": "skip"}}, TOOLS)
    assert named.kind == "tool_call" and [t[0] for t in named.tools] == ["skip"]
    assert [t[0] for t in request_constraint(None, "required", TOOLS).tools] == ["vote", "skip"]

    class Parser:  # the per-family parser contract: prefix + {"name", <arguments_key>} + suffix
        call_prefix, call_suffix, arguments_key = "[CALL]", "[/CALL]", "parameters"

    p = request_constraint(None, "required", TOOLS, Parser())
    assert (p.call_prefix, p.call_suffix, p.arguments_key) == ("[CALL]", "[/CALL]", "parameters")
    bad = [
        (({"type": "xml"},), "response_format.type"),
        (({"type": "json_schema"},), "response_format.json_schema"),
        (({"type": "json_schema", "json_schema": {"schema": []}},), "response_format.json_schema.schema"),
        ((None, "required", None), "tool_choice"),
        ((None, {"type": "function", "function": {"name": "nope"}}, TOOLS), "tool_choice"),
        ((RF, "required", TOOLS), "tool_choice"),
    ]
    for args, param in bad:
        with pytest.raises(ValidationError) as e:
            request_constraint(*args)
        assert e.value.context["param"] == param, args


def test_a_schema_the_library_refuses_is_a_validation_error(hf_backend):
    c = request_constraint({"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"a": {"$ref": "#/missing"}}, "required": ["a"]}}})
    with pytest.raises(ValidationError) as e:
        hf_backend.grammars().compile(c)
    assert e.value.context["param"] == "response_format"


# ----------------------------------------------------------------------------- generation
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_json_schema_replies_validate_and_logprobs_are_the_masked_distribution(hf_backend, temperature):
    c = request_constraint(RF)
    gens = generate(hf_backend, c, n=8, temperature=temperature)
    for g in gens:
        assert g.finish_reason == "stop", g.text
        jsonschema.validate(json.loads(g.text), VOTE)
        assert g.constraint["kind"] == "json_schema" and json.loads(g.constraint["schema"]) == VOTE
        got = masked_rescore(hf_backend, g, temperature if temperature > 0 else 1.0)
        assert torch.allclose(torch.tensor(g.logprobs), got, atol=1e-5), (g.logprobs, got)
    # the unmasked distribution differs: the record is not the plain softmax
    g = gens[0]
    ids = torch.tensor([g.prompt_ids + g.response_ids])
    with torch.no_grad():
        raw = torch.log_softmax(hf_backend.model(ids).logits[0, len(g.prompt_ids) - 1: -1].float(), -1)
    raw = raw.gather(-1, torch.tensor(g.response_ids).unsqueeze(-1)).squeeze(-1)
    assert (raw - torch.tensor(g.logprobs)).abs().max() > 1e-3


def test_json_object_is_an_object(hf_backend):
    for g in generate(hf_backend, request_constraint({"type": "json_object"}), n=6, max_tokens=96):
        if g.finish_reason == "stop":
            assert isinstance(json.loads(g.text), dict)
        else:  # cut by max_tokens: still a prefix the grammar allowed
            assert g.text.startswith("{")


def test_named_tool_choice_is_always_that_call_and_required_is_one_of_the_tools(hf_backend):
    named = request_constraint(None, {"type": "function", "function": {"name": "vote"}}, TOOLS)
    for g in generate(hf_backend, named, n=8, tools=TOOLS, max_tokens=96):
        assert g.finish_reason == "stop" and len(g.tool_calls) == 1, g.text
        call = g.tool_calls[0]["function"]
        assert call["name"] == "vote"
        jsonschema.validate(json.loads(call["arguments"]), VOTE)
    names = set()
    for g in generate(hf_backend, request_constraint(None, "required", TOOLS), n=8, tools=TOOLS, max_tokens=96):
        assert len(g.tool_calls) == 1, g.text
        names.add(g.tool_calls[0]["function"]["name"])
    assert names <= {"vote", "skip"}


def test_control_tokens_never_appear_inside_a_reply(hf_backend):
    c = request_constraint({"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"say": {"type": "string", "maxLength": 12}}, "required": ["say"]}}})
    control = {0, 1, 2}  # <|endoftext|>, <|im_start|>, <|im_end|>
    mask = hf_backend.grammars().masks(c, hf_backend.encode("default", '{"say":"'))
    m = hf_backend.grammars().matcher(c)
    for t in hf_backend.encode("default", '{"say":"'):
        m.accept(t)
    inside = m.allowed()
    assert mask.shape[0] == len(hf_backend.encode("default", '{"say":"'))
    assert not inside[list(control)].any() and inside.sum() > 100  # free text, but no control token
    for g in generate(hf_backend, c, n=6):
        assert not control & set(g.response_ids[:-1]), g.response_ids


def test_streaming_deltas_match_the_final_generation(hf_backend):
    c = request_constraint(RF)
    req = GenerateRequest("default", messages=MSGS, constraint=c,
                          sampling=SamplingParams(max_tokens=48, n=3, seed=11, top_logprobs=2))

    async def collect():
        return [x async for x in hf_backend.stream(req)]

    items = run(collect())
    finals = [x for x in items if isinstance(x, Generation)]
    for g in finals:
        deltas = [d for d in items if isinstance(d, TokenDelta) and d.index == finals.index(g)]
        assert [t for d in deltas for t in d.token_ids] == g.response_ids
        assert [lp for d in deltas for lp in d.logprobs] == g.logprobs
        assert "".join(d.text for d in deltas) == g.text
        jsonschema.validate(json.loads(g.text), VOTE)
        assert [t for d in deltas for t in d.top_logprobs] == g.top_logprobs


def test_top_logprobs_come_from_the_sampled_distribution(hf_backend):
    gens = generate(hf_backend, request_constraint(RF), n=2, top=5)
    for g in gens:
        assert len(g.top_logprobs) == len(g.response_ids)
        for tok, lp, alts in zip(g.response_ids, g.logprobs, g.top_logprobs, strict=True):
            assert 1 <= len(alts) <= 5 and sum(torch.tensor([v for _, v in alts]).exp()) <= 1 + 1e-5
            assert [v for _, v in alts] == sorted((v for _, v in alts), reverse=True)
            if tok in dict(alts):
                assert dict(alts)[tok] == pytest.approx(lp)
            else:
                assert lp <= alts[-1][1]


def test_replay_refuses_a_token_outside_the_grammar(hf_backend):
    c = request_constraint(RF)
    with pytest.raises(ValidationError, match="not allowed"):
        hf_backend.grammars().masks(c, hf_backend.encode("default", "hello"))


def test_a_constrained_call_joining_a_running_batch_still_masks(hf_backend):
    """Continuous batching: the grammar rows that join mid-batch get their bitmask rows and exact masked logprobs."""
    b = hf_backend
    req = GenerateRequest("default", messages=MSGS, constraint=request_constraint(RF),
                          sampling=SamplingParams(max_tokens=64, n=2, seed=4))

    async def scenario():
        started, order = asyncio.Event(), []

        async def long_call():
            n = 0
            async for item in b.stream(GenerateRequest("default", messages=MSGS,
                                                       sampling=SamplingParams(max_tokens=200, seed=2))):
                n += isinstance(item, TokenDelta)
                if n == 5:
                    started.set()
            started.set()  # a reply shorter than 5 tokens must not leave the votes waiting
            order.append("long")

        async def vote():
            await started.wait()
            gens = await b.generate(req)
            order.append("vote")
            return gens

        return order, (await asyncio.gather(long_call(), vote()))[1]

    # seed 2 makes a 198-token reply here, far past the votes (the tiny model's bytes differ across machines,
    # so a shorter one elsewhere ends first and the votes get a batch of their own: still masked)
    order, joined = run(scenario())
    assert b.stats["batches"] == (1 if order == ["vote", "long"] else 2)
    for g in joined:
        assert g.finish_reason == "stop", g.text
        jsonschema.validate(json.loads(g.text), VOTE)
        assert torch.allclose(torch.tensor(g.logprobs), masked_rescore(b, g, 1.0), atol=1e-5)
