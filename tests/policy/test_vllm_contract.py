"""The vllm client against vLLM v0.33.0's own protocol source (vllm-project/vllm@4ba787ec9): every field sent and read."""

# The pinned field sets are tests/policy/vllm_protocol.py, copied from the v0.33.0 wheel's
# vllm/entrypoints/openai/completion/protocol.py, vllm/entrypoints/serve/engine/protocol.py,
# vllm/entrypoints/serve/lora/protocol.py and vllm/sampling_params.py. vLLM's request models have
# extra="allow" and drop unknown fields with a debug log, so a misspelt or removed field would pass
# against a real server unnoticed: here it fails. Moving to another vLLM release means re-copying
# those dicts from its source and updating RELEASE / COMMIT there and SENT / READ here.

from __future__ import annotations

import ast
import asyncio
import json
import re
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import torch
from test_vllm import BASE, MSGS, FakeVLLM
from vllm_protocol import (
    ALIASES,
    COMMIT,
    MODELS,
    RELEASE,
    REMOVED_GUIDED_FIELDS,
    STREAM_CHOICE_FIELDS,
    STREAM_CHUNK_FIELDS,
)

from swarm.policy import _http
from swarm.policy import vllm as vllm_module
from swarm.policy.base import GenerateRequest, SamplingParams
from swarm.policy.constraint import request_constraint
from swarm.policy.vllm import VLLMBackend

VOTE = {"type": "object", "properties": {"target": {"type": "string", "enum": ["ann", "bo"]}},
        "required": ["target"], "additionalProperties": False}
RF = {"type": "json_schema", "json_schema": {"name": "vote", "strict": True, "schema": VOTE}}

REQUEST_MODEL = {
    "/v1/completions": "CompletionRequest",
    "/v1/load_lora_adapter": "LoadLoRAAdapterRequest",
    "/v1/unload_lora_adapter": "UnloadLoRAAdapterRequest",
}
RESPONSE_MODEL = {"/v1/completions": "CompletionResponse", "stream": "CompletionStreamResponse",
                  "/v1/models": "ModelList"}

# What our client sends and reads, per route: a change to the client must change this contract.
SENT = {
    "/v1/completions": {
        "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "logprobs", "stop", "seed", "stream",
        "return_tokens_as_token_ids", "return_token_ids", "skip_special_tokens", "spaces_between_special_tokens",
        "structured_outputs",
    },
    "/v1/load_lora_adapter": {"lora_name", "lora_path", "load_inplace"},
    "/v1/unload_lora_adapter": {"lora_name"},
}
_CHOICE_READS = {"index", "text", "finish_reason", "token_ids", "prompt_token_ids", "logprobs",
                 "logprobs.token_logprobs", "logprobs.tokens", "logprobs.top_logprobs"}
READ = {
    "/v1/completions": {"model", "choices"} | {f"choices[].{f}" for f in _CHOICE_READS},
    "stream": {"model", "choices"} | {f"choices[].{f}" for f in _CHOICE_READS},
    "/v1/models": {"data", "data[].id", "data[].max_model_len"},
}


# ----------------------------------------------------------------------------- the pinned types
def _split(s: str, sep: str) -> list[str]:
    """Split ``s`` on ``sep`` outside brackets and parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        depth += (ch in "[(") - (ch in "])")
        if ch == sep and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [*parts, cur.strip()]


_BASIC = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "dict": lambda v: isinstance(v, dict),
    "Any": lambda v: True,
}


def accepts(ann: str, value: Any) -> bool:
    """Whether a JSON ``value`` fits a pinned annotation (pydantic's lax mode: an int is a float)."""
    ann = ALIASES.get(ann.strip(), ann.strip())
    parts = _split(ann, "|")
    if len(parts) > 1:
        return value is None if value is None else any(accepts(p, value) for p in parts if p != "None")
    if ann == "None":
        return value is None
    head, _, rest = ann.partition("[")
    args = _split(rest[:-1], ",") if rest else []
    if head == "Annotated":
        return accepts(args[0], value)
    if head == "list":
        return isinstance(value, list) and all(accepts(args[0], v) for v in value)
    if head == "dict":
        return isinstance(value, dict) and all(accepts(args[1], v) for v in value.values())
    if head == "Literal":
        return value in ast.literal_eval(f"({rest[:-1]},)")
    if head in _BASIC:
        return _BASIC[head](value)
    if head in MODELS:
        fields = MODELS[head]
        return isinstance(value, dict) and set(value) <= set(fields) and all(
            accepts(fields[k], v) for k, v in value.items())
    raise KeyError(f"{ann!r} is not modelled in vllm_protocol.py (a value was given for it)")


def conforms(obj: dict[str, Any], model: str, keys: set[str] | frozenset[str] | None = None) -> None:
    """``obj`` has exactly ``keys`` (default: all of ``model``'s fields), each of its pinned type."""
    fields = MODELS[model]
    assert set(obj) == set(fields if keys is None else keys), f"{model} at vLLM {RELEASE}: {sorted(obj)}"
    for k, v in obj.items():
        assert accepts(fields[k], v), f"{model}.{k} = {v!r} is not {fields[k]}"


def resolve(model: str, path: str) -> str:
    """The pinned annotation at ``path`` (``choices[].logprobs.tokens``) inside ``model``."""
    ann = model
    for part in path.split("."):
        named = [n for n in re.findall(r"[A-Za-z_]\w*", ann) if n in MODELS]
        name = part.removesuffix("[]")
        assert len(named) == 1 and name in MODELS[named[0]], f"{model}: no field {path!r} at vLLM {RELEASE}"
        ann = MODELS[named[0]][name]
    return ann


# ----------------------------------------------------------------------------- exercising the client
def _adapter_state() -> dict[str, torch.Tensor]:
    prefix = "base_model.model.model.layers.0.self_attn"
    return {f"{prefix}.q_proj.lora_A.weight": torch.zeros(4, 128), f"{prefix}.q_proj.lora_B.weight": torch.zeros(128, 4)}


def exercise(backend: VLLMBackend, fake: FakeVLLM) -> None:
    """Every route and request variant the client has: generate, constrained, stream, LoRA load / unload."""
    sampling = SamplingParams(max_tokens=4, temperature=0.7, top_p=0.9, n=2, seed=3, stop=["\n\n"], top_logprobs=2)
    asyncio.run(backend.generate(GenerateRequest("default", messages=MSGS, sampling=sampling)))
    asyncio.run(backend.generate(GenerateRequest("default", prompt_ids=[5, 6, 7], constraint=request_constraint(RF),
                                                 sampling=SamplingParams(max_tokens=3, top_logprobs=1))))

    async def drain() -> None:
        async for _ in backend.stream(GenerateRequest("default", messages=MSGS, sampling=sampling)):
            pass

    asyncio.run(drain())
    backend.load_weights("default", _adapter_state(), version=1)
    backend.load_weights("default", _adapter_state(), version=2)  # unloads default-v1
    fake.without = {"token_ids"}  # answers without token_ids: the client reads logprobs.tokens instead
    asyncio.run(backend.generate(GenerateRequest("default", prompt_ids=[5, 6], sampling=SamplingParams(max_tokens=2))))
    asyncio.run(drain())
    fake.without = set()


def test_pinned_release():
    assert (RELEASE, COMMIT) == ("v0.33.0", "4ba787ec9")


def test_every_field_sent_is_a_field_of_vllms_request_model(vllm_backend, fake_vllm):
    exercise(vllm_backend, fake_vllm)
    sent: dict[str, set[str]] = {}
    for path, body in fake_vllm.requests:
        if path == "/v1/models":
            assert body == {}  # a GET
            continue
        model = REQUEST_MODEL[path]
        conforms(body, model, keys=set(body))  # each field is the model's, of its type
        assert not set(body) & REMOVED_GUIDED_FIELDS  # ignored at this release: output would be unconstrained
        sent.setdefault(path, set()).update(body)
    assert sent == SENT
    completions = [b for p, b in fake_vllm.requests if p == "/v1/completions"]
    for b in completions:
        # SamplingParams._verify_args / CompletionRequest.check_logprobs at v0.33.0
        assert b["top_k"] >= 0 and b["logprobs"] >= 0 and all(isinstance(i, int) and i >= 0 for i in b["prompt"])
    [so] = [b["structured_outputs"] for b in completions if "structured_outputs" in b]
    assert set(so) == {"grammar"}  # StructuredOutputsParams.__post_init__ wants exactly one kind
    loads = [b["lora_name"] for p, b in fake_vllm.requests if p == "/v1/load_lora_adapter"]
    assert len(loads) == len(set(loads))  # each version once (load_inplace only replaces what an older run left)


class _Seen(dict):
    """A JSON object that logs which keys the client reads (``[]`` / ``get``), as dotted paths."""

    def __init__(self, data: dict[str, Any], path: str, log: set[str]) -> None:
        super().__init__(data)
        self._path, self._log = path, log

    def _at(self, key: str) -> str:
        return f"{self._path}.{key}" if self._path else key

    def __getitem__(self, key: str) -> Any:
        self._log.add(self._at(key))
        return _seen(super().__getitem__(key), self._at(key), self._log)

    def get(self, key: str, default: Any = None) -> Any:
        self._log.add(self._at(key))
        return _seen(super().__getitem__(key), self._at(key), self._log) if key in self else default


def _seen(value: Any, path: str, log: set[str]) -> Any:
    if isinstance(value, dict):
        return _Seen(value, path, log)
    if isinstance(value, list):
        return [_seen(v, path + "[]", log) for v in value]
    return value


def test_every_field_read_exists_in_vllms_response_model(vllm_backend, fake_vllm, monkeypatch):
    reads: dict[str, set[str]] = {k: set() for k in READ}
    plain_json = httpx.Response.json

    def json_seen(self: httpx.Response, **kw: Any) -> Any:
        data = plain_json(self, **kw)
        return _seen(data, "", reads[self.request.url.path]) if self.is_success else data

    plain_post = vllm_module.post_json

    async def post_seen(client: Any, path: str, body: dict[str, Any], **context: Any) -> Any:
        return _seen(await plain_post(client, path, body, **context), "", reads.setdefault("/v1" + path, set()))

    monkeypatch.setattr(httpx.Response, "json", json_seen)  # the sync calls (/v1/models)
    monkeypatch.setattr(vllm_module, "post_json", post_seen)  # the generation calls' answers, by route
    monkeypatch.setattr(_http, "_decoded", lambda content, **context: json.loads(content))
    monkeypatch.setattr(_http, "json", SimpleNamespace(loads=lambda s: _seen(json.loads(s), "", reads["stream"])))
    exercise(vllm_backend, fake_vllm)
    assert reads == READ
    for route, paths in reads.items():
        for p in paths:
            resolve(RESPONSE_MODEL[route], p)


# ----------------------------------------------------------------------------- the fake's shapes
def _post(fake: FakeVLLM, path: str, body: dict[str, Any]) -> httpx.Response:
    return fake(httpx.Request("POST", f"http://gpu.test:8000{path}", json=body))


def _check_logprobs(lp: dict[str, Any], ids: list[int], n: int, offset: int = 0) -> None:
    conforms(lp, "CompletionLogProbs")
    assert lp["tokens"] == [f"token_id:{i}" for i in ids]
    assert lp["text_offset"] == [offset + sum(len(t) for t in lp["tokens"][:k]) for k in range(len(ids))]
    for tok, v, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert next(iter(top.items())) == (tok, v)  # the sampled token first
        assert n <= len(top) <= n + 1 and all(k.startswith("token_id:") for k in top)


def test_the_fake_answers_in_vllm_shapes(fake_vllm):
    body = {"model": BASE, "prompt": [5, 6, 7], "max_tokens": 4, "n": 2, "logprobs": 2,
            "return_tokens_as_token_ids": True, "return_token_ids": True}
    data = _post(fake_vllm, "/v1/completions", body).json()
    conforms(data, "CompletionResponse")
    conforms(data["usage"], "UsageInfo")
    for c in data["choices"]:
        conforms(c, "CompletionResponseChoice")
        assert c["prompt_token_ids"] == [5, 6, 7]
        _check_logprobs(c["logprobs"], c["token_ids"], 2)

    resp = _post(fake_vllm, "/v1/completions", {**body, "stream": True})
    assert resp.text.endswith("data: [DONE]\n\n")
    events = [json.loads(line[5:]) for line in resp.text.splitlines() if line.startswith("data: {")]
    offsets: dict[int, int] = {}
    for e in events:
        conforms(e, "CompletionStreamResponse", STREAM_CHUNK_FIELDS)
        [c] = e["choices"]
        conforms(c, "CompletionResponseStreamChoice", STREAM_CHOICE_FIELDS)
        first = c["index"] not in offsets
        assert (c["prompt_token_ids"] == [5, 6, 7]) if first else c["prompt_token_ids"] is None
        _check_logprobs(c["logprobs"], c["token_ids"], 2, offsets.get(c["index"], 0))
        offsets[c["index"]] = c["logprobs"]["text_offset"][-1] + len(c["logprobs"]["tokens"][-1])

    plain = _post(fake_vllm, "/v1/completions", {"model": BASE, "prompt": [5, 6], "max_tokens": 2}).json()
    [c] = plain["choices"]
    assert c["logprobs"] is None and c["token_ids"] is None and c["prompt_token_ids"] is None
    decoded = _post(fake_vllm, "/v1/completions",
                    {"model": BASE, "prompt": [5, 6], "max_tokens": 2, "logprobs": 0}).json()
    assert not any(t.startswith("token_id:") for t in decoded["choices"][0]["logprobs"]["tokens"])

    assert _post(fake_vllm, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/x"}).status_code == 200
    listed = fake_vllm(httpx.Request("GET", "http://gpu.test:8000/v1/models")).json()
    conforms(listed, "ModelList")
    for card in listed["data"]:
        conforms(card, "ModelCard")
        [perm] = card["permission"]
        conforms(perm, "ModelPermission")
    for path, b in [("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/x"}),
                    ("/v1/unload_lora_adapter", {"lora_name": "nope"}),
                    ("/v1/completions", {"model": "nope", "prompt": [1], "max_tokens": 1})]:
        err = _post(fake_vllm, path, b)
        conforms(err.json(), "ErrorResponse")
        conforms(err.json()["error"], "ErrorInfo")
        assert err.json()["error"]["code"] == err.status_code


# ----------------------------------------------------------------------------- a real server
@pytest.mark.vllm
@pytest.mark.slow
def test_real_vllm_server_answers_the_fields_we_read(real_vllm):
    url, model, tokenizer = real_vllm
    b = VLLMBackend(url, model, tokenizer_path=tokenizer)
    _, body = b._prepare(GenerateRequest("default", messages=MSGS, sampling=SamplingParams(max_tokens=4, n=2,
                                                                                           top_logprobs=2)), False)
    data = httpx.post(b.base_url + "/completions", json={"model": model, **body}, timeout=120).json()
    for c in data["choices"]:  # the fields we read, in the pinned shapes (a newer server may add fields)
        assert c["prompt_token_ids"] == body["prompt"] and len(c["token_ids"]) == len(c["logprobs"]["tokens"])
        assert accepts(MODELS["CompletionResponseChoice"]["logprobs"], c["logprobs"])
        assert c["logprobs"]["tokens"] == [f"token_id:{i}" for i in c["token_ids"]]
