"""The constraint record survives the pool (SQLite, PostgreSQL's JSONB) exactly: the replayed masks are the sampled ones."""

from __future__ import annotations

import asyncio

import pytest
import torch

from swarm.merge import TrainSeq
from swarm.policy.base import GenerateRequest, SamplingParams
from swarm.policy.constraint import request_constraint
from swarm.pool import Pool
from swarm.records import Episode, Step
from swarm.train.constraint import ConstraintReplay

# property order matters to the grammar, and JSONB sorts keys (shorter first): "zeta" must stay first
SCHEMA = {"type": "object", "properties": {"zeta": {"enum": ["x", "y"]}, "a": {"enum": ["p", "q"]}},
          "required": ["zeta", "a"], "additionalProperties": False}


@pytest.fixture(scope="module")
def backend(tiny_model_path):
    from swarm.policy.hf import HFBackend

    b = HFBackend(str(tiny_model_path), torch_threads=1)
    yield b
    b.close()


def test_record_round_trips_through_the_pool_and_replays(backend, pool_url):
    c = request_constraint({"type": "json_schema", "json_schema": {"name": "s", "strict": True, "schema": SCHEMA}})
    req = GenerateRequest("default", messages=[{"role": "user", "content": "go"}], constraint=c,
                          sampling=SamplingParams(max_tokens=48, n=2, seed=7))
    gens = asyncio.run(backend.generate(req))
    assert all(g.text.startswith('{"zeta":') for g in gens)
    pool = Pool(pool_url)
    try:
        ep = Episode(task="t")
        pool.add_episode(ep)
        steps = [Step(episode_id=ep.episode_id, index=i, prompt_ids=g.prompt_ids, response_ids=g.response_ids,
                      response_logprobs=g.logprobs, metadata={"constraint": g.constraint})
                 for i, g in enumerate(gens)]
        pool.add_steps(steps)
        back = [pool.get_step(s.step_id) for s in steps]
    finally:
        pool.close()
    replay = ConstraintReplay(backend.tokenizer)
    for s, b in zip(steps, back, strict=True):
        want = replay.masks(TrainSeq.from_step(s, 0.0))
        got = replay.masks(TrainSeq.from_step(b, 0.0))
        assert torch.equal(want, got) and bool(want.gather(1, torch.tensor(s.response_ids)[:, None]).all())
