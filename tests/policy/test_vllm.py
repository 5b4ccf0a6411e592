"""The vllm client against a fake server in vLLM's recorded response shapes; a real-server check when one is set."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest
import torch
from vllm_protocol import dump

from swarm.errors import BackendError, ConflictError, ContextLengthError
from swarm.policy.base import GenerateRequest, Generation, PolicyBackend, SamplingParams, TokenDelta
from swarm.policy.vllm import VLLMBackend

BASE = "tiny-base"
MSGS = [{"role": "user", "content": "Say hello."}]


class FakeVLLM:
    """Answers like `vllm serve --enable-lora` at the pinned release (tests/policy/vllm_protocol.py).

    Every body is built with :func:`vllm_protocol.dump`, so its fields are exactly vLLM's, and the
    request fields act as in vLLM's completion/serving.py: ``logprobs`` gives per position the
    sampled token first, then the top ``logprobs`` (at most ``logprobs + 1`` entries);
    ``return_tokens_as_token_ids`` makes tokens and top-logprob keys ``token_id:<n>`` strings (else
    decoded text); ``return_token_ids`` adds ``token_ids``, and ``prompt_token_ids`` on every
    choice of a response but only on the first streamed chunk of each choice. Unknown request
    fields are ignored, as vLLM's ``extra="allow"`` models do.
    """

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.adapters: dict[str, str] = {}
        self.requests: list[tuple[str, dict]] = []
        self.wrong_model = False
        self.without: set[str] = set()  # choice fields left out, to play an older server

    def reply_ids(self, body):
        seed = (sum(body["prompt"]) + (body.get("seed") or 0)) % 500
        return [10 + (seed + 7 * k) % 800 for k in range(body["max_tokens"] - 1)] + [2]  # ends with <|im_end|>

    @staticmethod
    def logprob(k: int) -> float:
        """The sampled token's logprob at output position ``k``: the top token at even k, below the top n at odd k."""
        return -0.01 * (k + 1) if k % 2 == 0 else -3.0 - 0.01 * k

    def step(self, k: int, t: int, n: int) -> dict[int, float]:
        """vLLM's logprobs at one position: the sampled token first, then the top ``n`` (a proper distribution)."""
        lp, vocab = self.logprob(k), len(self.tok)
        if k % 2 == 0:  # sampled is rank 1: n - 1 others
            rest = 1.0 - math.exp(lp)
            alts = {(t + r) % vocab: math.log(rest * 0.5**r) for r in range(1, n)}
        else:
            alts = {(t + r) % vocab: math.log(0.45 * 0.5 ** (r - 1)) for r in range(1, n + 1)}
        return {t: lp, **alts}

    def token(self, body, i: int) -> str:
        return f"token_id:{i}" if body.get("return_tokens_as_token_ids") else self.tok.decode([i])

    def logprobs(self, body, ids, start: int, offset: int):
        """CompletionLogProbs for ``ids`` at output positions ``start..``; ``offset``: text_offset of the first."""
        n = body.get("logprobs")
        if n is None:
            return None
        out = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        for j, t in enumerate(ids):
            step = self.step(start + j, t, n)
            tok = self.token(body, t)
            out["text_offset"].append(offset)
            offset += len(tok)
            out["tokens"].append(tok)
            out["token_logprobs"].append(step[t])
            out["top_logprobs"].append({self.token(body, i): v for i, v in list(step.items())[: n + 1]})
        return dump("CompletionLogProbs", **out)

    def text(self, ids) -> str:
        return self.tok.decode([i for i in ids if i != 2])  # the EOS that stopped it is not in the text

    def choice(self, body, ids, index=0):
        ret = bool(body.get("return_token_ids"))
        c = dump(
            "CompletionResponseChoice", index=index, text=self.text(ids), logprobs=self.logprobs(body, ids, 0, 0),
            finish_reason="stop", token_ids=ids if ret else None, prompt_token_ids=body["prompt"] if ret else None,
        )
        return {k: v for k, v in c.items() if k not in self.without}

    def error(self, status: int, message: str, kind: str, param: str | None = None) -> httpx.Response:
        info = dump("ErrorInfo", message=message, type=kind, param=param, code=status)
        return httpx.Response(status, json=dump("ErrorResponse", error=info))

    def models(self):
        perm = dump(
            "ModelPermission", id="modelperm-1", object="model_permission", created=1, allow_create_engine=False,
            allow_sampling=True, allow_logprobs=True, allow_search_indices=False, allow_view=True,
            allow_fine_tuning=False, organization="*", is_blocking=False,
        )
        card = {"object": "model", "created": 1, "owned_by": "vllm", "permission": [perm]}
        data = [dump("ModelCard", id=BASE, root=BASE, max_model_len=256, **card)]
        data += [dump("ModelCard", id=n, root=p, parent=BASE, **card) for n, p in self.adapters.items()]
        return dump("ModelList", object="list", data=data)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        self.requests.append((path, body))
        if path == "/v1/models":
            return httpx.Response(200, json=self.models())
        if path == "/v1/load_lora_adapter":
            name = body["lora_name"]
            if name in self.adapters and not body.get("load_inplace"):
                return self.error(400, f"The lora adapter '{name}' has already been loaded. If you want to load "
                                  "the adapter in place, set 'load_inplace' to True.", "InvalidUserInput")
            self.adapters[name] = body["lora_path"]
            return httpx.Response(200, content=f"Success: LoRA adapter '{name}' added successfully.".encode())
        if path == "/v1/unload_lora_adapter":
            name = body["lora_name"]
            if name not in self.adapters:
                return self.error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
            self.adapters.pop(name)
            return httpx.Response(200, content=f"Success: LoRA adapter '{name}' removed successfully.".encode())
        assert path == "/v1/completions"
        if body["model"] != BASE and body["model"] not in self.adapters:
            return self.error(404, f"The model `{body['model']}` does not exist. Valid aliases: {BASE}.",
                              "NotFoundError", "model")
        model = "someone-else" if self.wrong_model else body["model"]
        outs = [self.reply_ids({**body, "seed": (body.get("seed") or 0) + i}) for i in range(body.get("n", 1))]
        if not body.get("stream"):
            n_out = sum(len(ids) for ids in outs)
            usage = dump("UsageInfo", prompt_tokens=len(body["prompt"]), completion_tokens=n_out,
                         total_tokens=len(body["prompt"]) + n_out)
            choices = [self.choice(body, ids, i) for i, ids in enumerate(outs)]
            return httpx.Response(200, json=dump("CompletionResponse", id="cmpl-1", object="text_completion",
                                                 created=1, model=model, choices=choices, usage=usage))
        return httpx.Response(200, content=self.stream(body, model, outs), headers={"content-type": "text/event-stream"})

    def stream(self, body, model, outs) -> bytes:
        """One chunk per token, choices interleaved, as ``model_dump_json(exclude_unset=True)`` writes them."""
        ret = bool(body.get("return_token_ids"))
        offsets = [0] * len(outs)
        events = []
        for k in range(max(len(ids) for ids in outs)):
            for i, ids in enumerate(outs):
                if k >= len(ids):
                    continue
                lp = self.logprobs(body, [ids[k]], k, offsets[i])
                if lp is not None:
                    offsets[i] = lp["text_offset"][-1] + len(lp["tokens"][-1])
                choice = {
                    "index": i, "text": self.text([ids[k]]), "logprobs": lp,
                    "finish_reason": "stop" if k == len(ids) - 1 else None, "stop_reason": None,
                    "prompt_token_ids": body["prompt"] if ret and k == 0 else None,
                    "token_ids": [ids[k]] if ret else None, "weight_versions": None,
                }
                choice = {key: v for key, v in choice.items() if key not in self.without}
                events.append({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": model,
                               "choices": [choice], "kv_transfer_params": None})
        return ("".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n").encode()


def test_generate_sends_exact_prompt_ids_and_parses_tokens(vllm_backend, fake_vllm):
    assert isinstance(vllm_backend, PolicyBackend)
    req = GenerateRequest("default", messages=MSGS, sampling=SamplingParams(max_tokens=6, temperature=0.8, seed=4, n=2))
    gens = asyncio.run(vllm_backend.generate(req))
    path, body = fake_vllm.requests[-1]
    expected_prompt = vllm_backend.encode("default", vllm_backend.render_chat("default", MSGS, None, True))
    assert path == "/v1/completions" and body["prompt"] == expected_prompt and body["model"] == BASE
    assert body["return_tokens_as_token_ids"] and body["return_token_ids"] and body["logprobs"] == 1
    assert len(gens) == 2
    g = gens[0]
    assert g.prompt_ids == expected_prompt and g.response_ids[-1] == 2 and len(g.response_ids) == 6
    assert g.logprobs == pytest.approx([fake_vllm.logprob(k) for k in range(6)])
    assert g.text == fake_vllm.tok.decode(g.response_ids[:-1]) and g.policy_version == 0
    assert vllm_backend.max_context("default") == 256


def test_ids_from_token_strings_when_token_ids_absent(vllm_backend, fake_vllm):
    fake_vllm.without = {"token_ids"}
    [g] = asyncio.run(
        vllm_backend.generate(GenerateRequest("default", prompt_ids=[5, 6, 7], sampling=SamplingParams(max_tokens=3)))
    )
    assert g.prompt_ids == [5, 6, 7] and len(g.response_ids) == 3 and g.response_ids[-1] == 2


def test_streaming_adds_up(vllm_backend, fake_vllm):
    async def collect():
        return [
            i
            async for i in vllm_backend.stream(
                GenerateRequest("default", messages=MSGS, sampling=SamplingParams(max_tokens=5))
            )
        ]

    items = asyncio.run(collect())
    deltas = [i for i in items if isinstance(i, TokenDelta)]
    [final] = [i for i in items if isinstance(i, Generation)]
    # the events one network read brings come as one delta (coalesced): 1 to 5 of them, every token once, in order
    assert [t for d in deltas for t in d.token_ids] == final.response_ids and 1 <= len(deltas) <= 5
    assert "".join(d.text for d in deltas) == final.text
    assert final.logprobs == pytest.approx([fake_vllm.logprob(k) for k in range(5)])


def _adapter_state():
    g = torch.Generator().manual_seed(0)
    prefix = "base_model.model.model.layers.0.self_attn"
    return {
        f"{prefix}.{m}.lora_{ab}.weight": torch.randn(shape, generator=g)
        for m in ("q_proj", "v_proj")
        for ab, shape in (("A", (4, 128)), ("B", (128, 4)))
    }


def test_load_weights_uses_a_new_adapter_name_per_version(vllm_backend, fake_vllm, tmp_path):
    vllm_backend.load_weights("default", _adapter_state(), version=1)
    assert vllm_backend.version("default") == 1 and vllm_backend.served_model("default") == "default-v1"
    saved = tmp_path / "adapters" / "default-v1"
    cfg = json.loads((saved / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["target_modules"] == ["q_proj", "v_proj"] and cfg["base_model_name_or_path"] == BASE
    assert (saved / "adapter_model.safetensors").exists()
    [g] = asyncio.run(vllm_backend.generate(GenerateRequest("default", messages=MSGS)))
    assert fake_vllm.requests[-1][1]["model"] == "default-v1" and g.policy_version == 1

    vllm_backend.load_weights("default", _adapter_state(), version=2)
    assert set(fake_vllm.adapters) == {"default-v2"}  # v1 unloaded: nothing could still request it
    with pytest.raises(ConflictError):
        vllm_backend.load_weights("default", _adapter_state(), version=2)


def test_a_name_an_earlier_run_left_loaded_is_replaced_by_this_runs_weights(vllm_backend, fake_vllm, tmp_path):
    """A server that outlived a run (resumed from an older checkpoint) still holds default-v1: load_inplace."""
    fake_vllm.adapters["default-v1"] = "/elsewhere/default-v1"
    vllm_backend.load_weights("default", _adapter_state(), version=1)
    assert fake_vllm.adapters["default-v1"] == str((tmp_path / "adapters" / "default-v1").resolve())


def test_adapter_in_use_is_unloaded_after_its_last_request(vllm_backend, fake_vllm):
    vllm_backend.load_weights("default", _adapter_state(), version=1)
    name, version = vllm_backend._acquire("default")  # a request on v1 still in flight
    vllm_backend.load_weights("default", _adapter_state(), version=2)
    assert set(fake_vllm.adapters) == {"default-v1", "default-v2"}
    asyncio.run(vllm_backend._release(name))
    assert set(fake_vllm.adapters) == {"default-v2"} and version == 1


def test_errors(vllm_backend, fake_vllm):
    with pytest.raises(ContextLengthError):
        asyncio.run(
            vllm_backend.generate(
                GenerateRequest("default", prompt_ids=[5] * 250, sampling=SamplingParams(max_tokens=10)))
        )
    fake_vllm.wrong_model = True
    with pytest.raises(ConflictError):
        asyncio.run(vllm_backend.generate(GenerateRequest("default", messages=MSGS)))
    fake_vllm.wrong_model = False
    vllm_backend._served["default"] = "gone-v9"  # an adapter the server no longer has
    with pytest.raises(BackendError, match="404"):
        asyncio.run(vllm_backend.generate(GenerateRequest("default", messages=MSGS)))


def test_prompt_the_server_did_not_run_and_null_logprobs_are_errors(vllm_backend, fake_vllm):
    req = GenerateRequest("default", prompt_ids=[5, 6, 7], sampling=SamplingParams(max_tokens=2))
    orig = fake_vllm.choice
    fake_vllm.choice = lambda body, ids, index=0: {**orig(body, ids, index), "prompt_token_ids": [1, *body["prompt"]]}
    with pytest.raises(BackendError, match="prompt ids"):  # e.g. a BOS added by the server
        asyncio.run(vllm_backend.generate(req))
    fake_vllm.choice = lambda body, ids, index=0: (c := orig(body, ids, index)) and {
        **c, "logprobs": {**c["logprobs"], "token_logprobs": [None] * len(ids)}}
    with pytest.raises(BackendError, match="without a logprob"):
        asyncio.run(vllm_backend.generate(req))


@pytest.mark.vllm
@pytest.mark.slow
def test_real_vllm_server(real_vllm):
    url, model, tokenizer = real_vllm
    b = VLLMBackend(url, model, tokenizer_path=tokenizer)
    gens = asyncio.run(
        b.generate(GenerateRequest("default", messages=MSGS, sampling=SamplingParams(max_tokens=16, seed=1, n=2)))
    )
    for g in gens:
        assert len(g.response_ids) == len(g.logprobs) > 0 and all(lp <= 0 for lp in g.logprobs)
        assert b.decode("default", g.response_ids).startswith(g.text)
