"""The vllm client against a fake server in vLLM's recorded response shapes; a real-server check when one is set."""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest
import torch

from swarm.errors import BackendError, ConflictError, ContextLengthError
from swarm.policy.base import GenerateRequest, Generation, PolicyBackend, SamplingParams, TokenDelta
from swarm.policy.vllm import VLLMBackend

BASE = "tiny-base"
MSGS = [{"role": "user", "content": "Say hello."}]


class FakeVLLM:
    """Answers like `vllm serve --enable-lora` (shapes of vLLM's protocol: CompletionResponse, ModelList)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.adapters: dict[str, str] = {}
        self.requests: list[tuple[str, dict]] = []
        self.wrong_model = False

    def reply_ids(self, body):
        seed = (sum(body["prompt"]) + (body.get("seed") or 0)) % 500
        return [10 + (seed + 7 * k) % 800 for k in range(body["max_tokens"] - 1)] + [2]  # ends with <|im_end|>

    def choice(self, body, ids, index=0, finish="stop"):
        return {
            "index": index,
            "text": self.tok.decode([i for i in ids if i != 2]),
            "logprobs": {
                "text_offset": list(range(len(ids))),
                "token_logprobs": [-0.01 * (k + 1) for k in range(len(ids))],
                "tokens": [f"token_id:{i}" for i in ids],
                "top_logprobs": [{f"token_id:{i}": -0.01 * (k + 1)} for k, i in enumerate(ids)],
            },
            "finish_reason": finish,
            "stop_reason": None,
            "prompt_logprobs": None,
            "prompt_token_ids": body["prompt"],
            "token_ids": ids,
        }

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        self.requests.append((path, body))
        if path == "/v1/models":
            data = [
                {
                    "id": BASE,
                    "object": "model",
                    "created": 1,
                    "owned_by": "vllm",
                    "root": BASE,
                    "parent": None,
                    "max_model_len": 256,
                    "permission": [],
                }
            ]
            data += [
                {
                    "id": n,
                    "object": "model",
                    "created": 1,
                    "owned_by": "vllm",
                    "root": p,
                    "parent": BASE,
                    "max_model_len": None,
                    "permission": [],
                }
                for n, p in self.adapters.items()
            ]
            return httpx.Response(200, json={"object": "list", "data": data})
        if path == "/v1/load_lora_adapter":
            if body["lora_name"] in self.adapters:
                return httpx.Response(
                    400, json={"error": {"message": "already loaded", "type": "BadRequestError", "code": 400}}
                )
            self.adapters[body["lora_name"]] = body["lora_path"]
            return httpx.Response(200, text=f"Success: LoRA adapter '{body['lora_name']}' added successfully.")
        if path == "/v1/unload_lora_adapter":
            self.adapters.pop(body["lora_name"])
            return httpx.Response(200, text=f"Success: LoRA adapter '{body['lora_name']}' removed successfully.")
        assert path == "/v1/completions"
        if body["model"] != BASE and body["model"] not in self.adapters:
            return httpx.Response(
                404,
                json={
                    "error": {
                        "message": f"The model `{body['model']}` does not exist.",
                        "type": "NotFoundError",
                        "code": 404,
                    }
                },
            )
        model = "someone-else" if self.wrong_model else body["model"]
        outs = [self.reply_ids({**body, "seed": (body.get("seed") or 0) + i}) for i in range(body.get("n", 1))]
        if not body.get("stream"):
            return httpx.Response(
                200,
                json={
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "created": 1,
                    "model": model,
                    "choices": [self.choice(body, ids, i) for i, ids in enumerate(outs)],
                    "usage": {
                        "prompt_tokens": len(body["prompt"]),
                        "total_tokens": 0,
                        "completion_tokens": 0,
                        "prompt_tokens_details": None,
                    },
                    "kv_transfer_params": None,
                },
            )
        events = []
        for i, ids in enumerate(outs):
            for k, t in enumerate(ids):
                c = self.choice(body, [t], i, finish="stop" if k == len(ids) - 1 else None)
                c["logprobs"]["token_logprobs"] = [-0.01 * (k + 1)]
                c.pop("prompt_token_ids")
                events.append(
                    {
                        "id": "cmpl-1",
                        "object": "text_completion",
                        "created": 1,
                        "model": model,
                        "choices": [c],
                        "usage": None,
                    }
                )
        payload = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, content=payload.encode(), headers={"content-type": "text/event-stream"})


@pytest.fixture
def fake(tiny_model_path):
    from transformers import AutoTokenizer

    return FakeVLLM(AutoTokenizer.from_pretrained(tiny_model_path))


@pytest.fixture
def backend(fake, tiny_model_path, tmp_path):
    return VLLMBackend(
        "http://gpu.test:8000",
        BASE,
        policies=["default"],
        tokenizer_path=str(tiny_model_path),
        transport=httpx.MockTransport(fake),
        adapter_dir=str(tmp_path / "adapters"),
    )


def test_generate_sends_exact_prompt_ids_and_parses_tokens(backend, fake):
    assert isinstance(backend, PolicyBackend)
    req = GenerateRequest("default", messages=MSGS, sampling=SamplingParams(max_tokens=6, temperature=0.8, seed=4, n=2))
    gens = asyncio.run(backend.generate(req))
    path, body = fake.requests[-1]
    expected_prompt = backend.encode("default", backend.render_chat("default", MSGS, None, True))
    assert path == "/v1/completions" and body["prompt"] == expected_prompt and body["model"] == BASE
    assert body["return_tokens_as_token_ids"] and body["return_token_ids"] and body["logprobs"] == 1
    assert len(gens) == 2
    g = gens[0]
    assert g.prompt_ids == expected_prompt and g.response_ids[-1] == 2 and len(g.response_ids) == 6
    assert g.logprobs == pytest.approx([-0.01 * (k + 1) for k in range(6)])
    assert g.text == fake.tok.decode(g.response_ids[:-1]) and g.policy_version == 0
    assert backend.max_context("default") == 256


def test_ids_from_token_strings_when_token_ids_absent(backend, fake):
    orig = fake.choice
    fake.choice = lambda *a, **k: {key: v for key, v in orig(*a, **k).items() if key != "token_ids"}
    [g] = asyncio.run(
        backend.generate(GenerateRequest("default", prompt_ids=[5, 6, 7], sampling=SamplingParams(max_tokens=3)))
    )
    assert g.prompt_ids == [5, 6, 7] and len(g.response_ids) == 3 and g.response_ids[-1] == 2


def test_streaming_adds_up(backend):
    async def collect():
        return [
            i
            async for i in backend.stream(
                GenerateRequest("default", messages=MSGS, sampling=SamplingParams(max_tokens=5))
            )
        ]

    items = asyncio.run(collect())
    deltas = [i for i in items if isinstance(i, TokenDelta)]
    [final] = [i for i in items if isinstance(i, Generation)]
    assert [t for d in deltas for t in d.token_ids] == final.response_ids and len(deltas) == 5
    assert "".join(d.text for d in deltas) == final.text
    assert final.logprobs == pytest.approx([-0.01 * (k + 1) for k in range(5)])


def _adapter_state():
    g = torch.Generator().manual_seed(0)
    prefix = "base_model.model.model.layers.0.self_attn"
    return {
        f"{prefix}.{m}.lora_{ab}.weight": torch.randn(shape, generator=g)
        for m in ("q_proj", "v_proj")
        for ab, shape in (("A", (4, 128)), ("B", (128, 4)))
    }


def test_load_weights_uses_a_new_adapter_name_per_version(backend, fake, tmp_path):
    backend.load_weights("default", _adapter_state(), version=1)
    assert backend.version("default") == 1 and backend.served_model("default") == "default-v1"
    saved = tmp_path / "adapters" / "default-v1"
    cfg = json.loads((saved / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["target_modules"] == ["q_proj", "v_proj"] and cfg["base_model_name_or_path"] == BASE
    assert (saved / "adapter_model.safetensors").exists()
    [g] = asyncio.run(backend.generate(GenerateRequest("default", messages=MSGS)))
    assert fake.requests[-1][1]["model"] == "default-v1" and g.policy_version == 1

    backend.load_weights("default", _adapter_state(), version=2)
    assert set(fake.adapters) == {"default-v2"}  # v1 unloaded: nothing could still request it
    with pytest.raises(ConflictError):
        backend.load_weights("default", _adapter_state(), version=2)


def test_adapter_in_use_is_unloaded_after_its_last_request(backend, fake):
    backend.load_weights("default", _adapter_state(), version=1)
    name, version = backend._acquire("default")  # a request on v1 still in flight
    backend.load_weights("default", _adapter_state(), version=2)
    assert set(fake.adapters) == {"default-v1", "default-v2"}
    asyncio.run(backend._release(name))
    assert set(fake.adapters) == {"default-v2"} and version == 1


def test_errors(backend, fake):
    with pytest.raises(ContextLengthError):
        asyncio.run(
            backend.generate(GenerateRequest("default", prompt_ids=[5] * 250, sampling=SamplingParams(max_tokens=10)))
        )
    fake.wrong_model = True
    with pytest.raises(ConflictError):
        asyncio.run(backend.generate(GenerateRequest("default", messages=MSGS)))
    fake.wrong_model = False
    backend._served["default"] = "gone-v9"  # an adapter the server no longer has
    with pytest.raises(BackendError, match="404"):
        asyncio.run(backend.generate(GenerateRequest("default", messages=MSGS)))


@pytest.mark.vllm
@pytest.mark.gpu
def test_real_vllm_server():
    url = os.environ.get("SWARM_VLLM_URL")
    if not url:
        pytest.skip("SWARM_VLLM_URL is not set (no vllm serve process for this test)")
    model = os.environ.get("SWARM_VLLM_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")
    b = VLLMBackend(url, model, tokenizer_path=os.environ.get("SWARM_VLLM_TOKENIZER", model))
    gens = asyncio.run(
        b.generate(GenerateRequest("default", messages=MSGS, sampling=SamplingParams(max_tokens=16, seed=1, n=2)))
    )
    for g in gens:
        assert len(g.response_ids) == len(g.logprobs) > 0 and all(lp <= 0 for lp in g.logprobs)
        assert b.decode("default", g.response_ids).startswith(g.text)
