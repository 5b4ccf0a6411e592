"""The ``hf`` backend: a transformers model in-process, batched, with one LoRA adapter per policy.

Requests go into a thread-safe queue. One worker thread takes what arrives within
``batch_wait_ms`` (up to ``max_batch_size`` samples, same policy only) and decodes it as one
batch with its own sampling loop (``_decode.py``), so the recorded logprobs are exactly those of
the distribution sampled from (``sampling.py``); under a ``response_format`` / ``tool_choice``
constraint that distribution is the grammar-masked one (``constraint.py``), and each
:class:`Generation` carries the constraint record the trainer replays. Tokens reach the caller as they are sampled,
through an ``asyncio.Queue`` on the caller's loop, so the event loop is never blocked.

Policies share one base model. A policy with a LoRA config gets its own peft adapter (selected
with ``set_adapter`` while a batch holds one policy, per row with peft's ``adapter_names`` while
it mixes); one without uses the base weights. ``load_weights`` swaps a
policy's weights under the lock a batch holds while decoding: a generation in flight finishes on
the old weights and reports the version it started with; the next batch gets the new version.

Continuous batching: a request that arrives while a batch decodes joins it at the next step
(prefilled apart, its KV cache merged into the batch's: ``_batch_cache.py``), whatever its
policy (rows of several policies run each with its own adapter: ``_mixed.py``), and a finished
row leaves at once, so its caller gets the answer then and the batch stops computing it.

``merge_lora`` (default: on for CUDA): a batch of one adapter policy runs a sampling copy with that
policy's LoRA merged into the weights (``_merged.py``), one matmul per layer instead of peft's three;
the peft model stays the reference and runs batches that mix policies.

``static_cache_len`` (default off): decode on a static KV cache of ``max_batch_size`` slots x that
many columns (``_slots.py``, ``_decode_static.py``), every step the same shape; with
``compile_step`` (default: on for CUDA) the step is ``torch.compile``d with ``reduce-overhead``,
i.e. captured as a CUDA graph. A call with prompt + ``max_tokens`` over ``static_cache_len`` is refused.

Not here: prefix caching, a paged KV cache, speculative decoding, tensor parallelism. Use the
``vllm`` backend for throughput.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, model_validator

from swarm.errors import BackendError, ConfigError, ConflictError, ContextLengthError, ValidationError
from swarm.lora import LoraSpec
from swarm.policy._decode import Row, decode_batch
from swarm.policy._decode_static import decode_static
from swarm.policy._merged import MergedCopy
from swarm.policy._mixed import StepWeights
from swarm.policy._slots import SlotCache, static_supported
from swarm.policy.base import GenerateRequest, Generation, StateDict, TokenDelta, VersionTable
from swarm.policy.chat import LocalTokenizer
from swarm.policy.constraint import Constraint, Grammars
from swarm.policy.lora import attach_adapters, get_adapter_state, load_adapter_state, load_base_state
from swarm.policy.settings import BACKENDS, WeightsSection
from swarm.policy.templates import parser_for
from swarm.policy.tiny import TinySpec, load_template
from swarm.settings import derive

__all__ = ["HFBackend"]

log = logging.getLogger(__name__)
_DONE = object()


@dataclass(eq=False)  # identity: the backlog removes this job, not an equal twin
class _Job:
    request: GenerateRequest
    prompt_ids: list[int]
    rows: list[Row]
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    remaining: int = 0
    cancelled: bool = False
    deltas: bool = True  # send each token as it is sampled (stream); generate only needs the finals
    version: int = 0
    finals: dict[int, Generation] = field(default_factory=dict)


class HFBackend(LocalTokenizer, VersionTable):
    """transformers backend implementing :class:`~swarm.policy.base.PolicyBackend`.

    ``policies``: a list of names (each gets a ``lora`` adapter when ``lora`` is given, else the base
    weights) or a dict ``name -> LoraSpec | None`` (None: base weights); lora_B starts at zero, so a
    fresh adapter equals the base model. ``chat_template``: template text or the name of one shipped
    in ``swarm/policy/templates`` to replace the tokenizer's own. ``torch_threads`` sets torch's
    (process-wide) intra-op threads; 1 is much faster for tiny models on a shared CPU.

    ``tool_parser``: how tool calls are read from the model's text (``hermes``, ``llama3_json``,
    ``mistral``; default: the parser of the ``chat_template`` family, else hermes).

    ``.model`` (the peft model, or the base model when no policy has an adapter), ``.base_model``
    and ``.tokenizer`` are the live objects, for a trainer in the same process.
    """

    supports_constraints = True  # response_format / tool_choice: grammar-masked sampling (constraint.py)
    max_top_logprobs = 20

    def __init__(
        self,
        model_path: str,
        policies: list[str] | dict[str, LoraSpec | None] = ("default",),
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_size: Annotated[int, Field(ge=1)] = 16,
        batch_wait_ms: Annotated[float, Field(ge=0)] = 5,
        lora: LoraSpec | None = None,
        chat_template: str | None = None,
        attn_implementation: str | None = None,
        torch_threads: int | None = None,
        tool_parser: str | None = None,
        merge_lora: bool | None = None,
        static_cache_len: Annotated[int, Field(ge=2)] | None = None,
        compile_step: bool | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        configs = dict(policies) if isinstance(policies, dict) else dict.fromkeys(policies, lora)
        if not configs:
            raise ValidationError("policies: at least one policy name is required")
        self.model_path = str(model_path)
        self.device = torch.device(device)
        self.max_batch_size = max(1, int(max_batch_size))
        self.batch_wait_s = max(0.0, batch_wait_ms / 1000.0)
        self._lora_cfg = configs
        # peft adapter names are module keys: policy names may hold dots or clash with "lora_"
        self._adapter = {p: f"policy{i}" for i, p in enumerate(configs)}
        if torch_threads:
            torch.set_num_threads(int(torch_threads))
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        if chat_template is not None:
            self.tokenizer.chat_template = chat_template if "{" in chat_template else load_template(chat_template)
        self.tool_parser = parser_for(tool_parser, chat_template)
        torch_dtype = getattr(torch, dtype) if dtype != "auto" else "auto"
        kwargs: dict[str, Any] = {"dtype": torch_dtype}
        if attn_implementation:
            kwargs["attn_implementation"] = attn_implementation
        base = AutoModelForCausalLM.from_pretrained(self.model_path, **kwargs).to(self.device).eval()
        self.base_model = base
        self.model = attach_adapters(base, {self._adapter[p]: c for p, c in configs.items() if c is not None})
        self.model.eval()
        self.model.requires_grad_(False)
        # settable at run time; the copy is built at the first batch that uses it
        unmergeable = MergedCopy.unsupported(self.model) if self.model is not base else None
        if merge_lora and unmergeable:
            raise ValidationError(f"merge_lora: {unmergeable}")
        self.merge_lora = (self.device.type == "cuda" and not unmergeable) if merge_lora is None else bool(merge_lora)
        self._merged: MergedCopy | None = None
        self.static_cache_len = int(static_cache_len) if static_cache_len else None
        if self.static_cache_len is not None:
            why = static_supported(base.config, attn_implementation or getattr(base.config, "_attn_implementation", None))
            if why:
                raise ValidationError(f"static_cache_len: {why}")
        self.compile_step = self.device.type == "cuda" if compile_step is None else bool(compile_step)
        self._slots: SlotCache | None = None
        self._compiled: dict[int, Any] = {}
        self._weights_epoch = 0  # bumped after every pause: the live weights may have changed

        self.pad_id = self._pad_id()
        self.eos_ids = self._eos_ids()
        cfg_ctx = getattr(base.config, "max_position_embeddings", None) or 2048
        tok_ctx = getattr(self.tokenizer, "model_max_length", None) or cfg_ctx
        self._max_context = int(min(cfg_ctx, tok_ctx)) if tok_ctx < 10**8 else int(cfg_ctx)
        self._versions = dict.fromkeys(configs, 0)
        self._lock = threading.Lock()  # held by a batch while decoding and by a weight swap
        self._swaps_waiting = 0  # a waiting swap goes before the next batch (no starvation)
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._backlog: deque[_Job] = deque()
        self._worker: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._rng = random.SystemRandom()
        self._grammars: Grammars | None = None
        self._stopping = False  # close() was called: running batches take no new rows
        self.stats = {"batches": 0, "rows": 0, "tokens": 0}  # cumulative, for monitoring and tests

    # ----------------------------------------------------------------------------- setup
    def _pad_id(self) -> int:
        tok = self.tokenizer
        for cand in (tok.pad_token_id, getattr(self.base_model.config, "pad_token_id", None), tok.eos_token_id, 0):
            if isinstance(cand, int):
                return cand
        return 0

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (getattr(self.base_model, "generation_config", None), self.base_model.config, self.tokenizer):
            e = getattr(src, "eos_token_id", None)
            ids.update([e] if isinstance(e, int) else (e or []))
        return ids

    # ----------------------------------------------------------------------------- protocol: info
    def tool_call_markers(self, policy: str) -> tuple[str, ...]:
        """Where this policy's tool-call syntax starts: streamed text is held back from there."""
        return self.tool_parser.markers

    def max_context(self, policy: str) -> int:
        self._check_policy(policy)
        return self._max_context

    def has_adapter(self, policy: str) -> bool:
        """Whether ``policy`` has its own LoRA adapter (else it uses the base weights)."""
        self._check_policy(policy)
        return self._lora_cfg[policy] is not None

    def _tokenizer_for(self, policy: str) -> Any:
        self._check_policy(policy)
        return self.tokenizer

    def vocab_size(self, policy: str) -> int:
        """Ids the model can embed: ``[0, num_embeddings)``."""
        self._check_policy(policy)
        return int(self.base_model.get_input_embeddings().num_embeddings)

    # ----------------------------------------------------------------------------- protocol: generation
    async def generate(self, request: GenerateRequest) -> list[Generation]:
        # no per-token deltas: each one wakes the caller's event loop, 256 wake-ups per echo update for nothing
        return [item async for item in self._items(request, deltas=False) if isinstance(item, Generation)]

    async def stream(self, request: GenerateRequest) -> AsyncIterator[TokenDelta | Generation]:
        async for item in self._items(request, deltas=True):
            yield item

    async def _items(self, request: GenerateRequest, deltas: bool) -> AsyncIterator[TokenDelta | Generation]:
        job = self._submit(request, deltas)
        finished = False
        try:
            while True:
                item = await job.out.get()
                if item is _DONE:
                    finished = True
                    break
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
            for i in sorted(job.finals):
                yield job.finals[i]
        finally:
            if not finished:  # the consumer went away: stop sampling its rows
                job.cancelled = True
                for r in job.rows:
                    r.cancelled = True

    def prompt_ids(self, request: GenerateRequest) -> list[int]:
        """The exact prompt ids a request will be generated from (rendered chat or given ids)."""
        self._check_policy(request.policy)
        ids = self.request_ids(request)
        vocab = self.base_model.get_input_embeddings().num_embeddings
        if any(i < 0 or i >= vocab for i in ids):
            raise ValidationError(f"prompt_ids: token ids must be in [0, {vocab})", policy=request.policy)
        return ids

    def grammars(self) -> Grammars:
        """The compiled-grammar cache over this backend's tokenizer, logits width and stop tokens."""
        if self._grammars is None:
            width = self.base_model.get_output_embeddings().out_features
            self._grammars = Grammars(self.tokenizer, width, self.eos_ids)
        return self._grammars

    def compile_constraint(self, policy: str, constraint: Constraint) -> None:
        """Compile (and cache) ``constraint``'s grammar now, e.g. in a worker thread before ``generate``."""
        self._check_policy(policy)
        self.grammars().compile(constraint)

    def _submit(self, request: GenerateRequest, deltas: bool = True) -> _Job:
        s = request.sampling
        if s.n < 1 or s.max_tokens < 1:
            raise ValidationError("n and max_tokens must be >= 1", policy=request.policy)
        if not s.temperature >= 0 or not 0 < s.top_p <= 1:
            raise ValidationError("temperature must be >= 0 and top_p in (0, 1]", policy=request.policy)
        ids = self.prompt_ids(request)
        if len(ids) + s.max_tokens > self._max_context:
            raise ContextLengthError(f"prompt ({len(ids)} tokens) + max_tokens ({s.max_tokens}) exceeds the context of "
                                     f"{self._max_context} tokens", policy=request.policy)
        if self.static_cache_len is not None and s.n > self.max_batch_size:
            raise ValidationError(f"n ({s.n}) exceeds the static KV cache's {self.max_batch_size} slots "
                                  f"(model.max_batch_size)", policy=request.policy)
        if self.static_cache_len is not None and len(ids) + s.max_tokens > self.static_cache_len:
            raise ContextLengthError(f"prompt ({len(ids)} tokens) + max_tokens ({s.max_tokens}) exceeds the static KV "
                                     f"cache of {self.static_cache_len} columns (model.static_cache_len)",
                                     policy=request.policy)
        seed = s.seed if s.seed is not None else self._rng.getrandbits(62)
        c = request.constraint
        rows = [
            Row(index=i, prompt_ids=ids, sampling=s, seed=int(seed), stream=deltas,
                mask=None if c is None else self.grammars().matcher(c))
            for i in range(s.n)
        ]
        job = _Job(request, ids, rows, asyncio.get_running_loop(), asyncio.Queue(), remaining=s.n, deltas=deltas)
        for r in rows:
            r.owner = job
        self._ensure_worker()
        self._queue.put(job)
        return job

    # ----------------------------------------------------------------------------- weights
    def load_weights(self, policy: str, adapter_state: StateDict | None, version: int) -> None:
        """Swap ``policy``'s weights and set its version; blocks until no batch is decoding.

        ``adapter_state``: for an adapter policy, a peft adapter state dict (as returned by
        ``peft.get_peft_model_state_dict`` or :meth:`adapter_state`); for a base-weights policy, a
        (partial) model state dict loaded into the shared base, which every policy sees.
        ``None`` only bumps the version (weights already changed in place under :meth:`paused`).
        Versions must increase. From async code call it via ``asyncio.to_thread``.
        """
        self._check_policy(policy)
        with self.paused():
            if version <= self._versions[policy]:
                raise ConflictError(f"version {version} is not newer than the served version {self._versions[policy]}",
                                    policy=policy)
            if adapter_state is not None:
                self._apply_state(policy, adapter_state)
            self._versions[policy] = int(version)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold generation between batches (e.g. while a trainer updates ``.model`` in place)."""
        with self._start_lock:
            self._swaps_waiting += 1
        try:
            with self._lock:
                try:
                    yield
                finally:
                    self._weights_epoch += 1  # a merged sampling copy is re-merged before its next use
        finally:
            with self._start_lock:
                self._swaps_waiting -= 1

    def adapter_state(self, policy: str) -> dict[str, torch.Tensor]:
        """A copy of ``policy``'s current adapter weights (peft's state dict keys)."""
        if not self.has_adapter(policy):
            raise ValidationError(f"policy {policy!r} has no LoRA adapter", policy=policy)
        with self._lock:
            return get_adapter_state(self.model, self._adapter[policy])

    def _apply_state(self, policy: str, state: StateDict) -> None:
        try:
            if self._lora_cfg[policy] is not None:
                load_adapter_state(self.model, self._adapter[policy], state)
            else:
                load_base_state(self.base_model, state)
        except ValidationError as e:
            raise ValidationError(e.message, policy=policy) from e

    # ----------------------------------------------------------------------------- worker
    def _ensure_worker(self) -> None:
        with self._start_lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._run, name="swarm-hf-decode", daemon=True)
                self._worker.start()

    def close(self) -> None:
        """Stop the worker thread after the batches already queued."""
        if self._worker is not None and self._worker.is_alive():
            self._queue.put(None)
            self._worker.join(timeout=30)

    def _next_batch(self) -> list[_Job] | None:
        first = self._backlog.popleft() if self._backlog else self._queue.get()
        if first is None:
            return None
        jobs, size = [first], len(first.rows)
        policy = first.request.policy
        for j in list(self._backlog):  # same-policy jobs that waited behind another policy
            if j.request.policy == policy and size + len(j.rows) <= self.max_batch_size:
                self._backlog.remove(j)
                jobs.append(j)
                size += len(j.rows)
        deadline = time.monotonic() + self.batch_wait_s
        while size < self.max_batch_size:
            try:
                j = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if j is None:
                self._queue.put(None)
                break
            if j.request.policy == policy and size + len(j.rows) <= self.max_batch_size:
                jobs.append(j)
                size += len(j.rows)
            else:
                self._backlog.append(j)
        return jobs

    def _run(self) -> None:
        while True:
            jobs = self._next_batch()
            if jobs is None:
                return
            jobs = [j for j in jobs if not j.cancelled]
            if not jobs:
                continue
            while self._swaps_waiting:
                time.sleep(0.001)
            try:
                with self._lock:
                    self._decode(jobs)
            except Exception as e:  # report to every caller instead of killing the worker
                log.exception("decode failed")
                err = e if isinstance(e, BackendError) else BackendError(f"generation failed: {e}")
                for j in jobs:
                    self._send(j, err)

    def _adapter_context(self, policy: str) -> contextlib.AbstractContextManager:
        if self.model is self.base_model:
            return contextlib.nullcontext()
        if self._lora_cfg[policy] is None:
            return self.model.disable_adapter()
        self.model.set_adapter(self._adapter[policy])
        return contextlib.nullcontext()

    def _decode(self, jobs: list[_Job]) -> None:
        for j in jobs:
            j.version = self._versions[j.request.policy]
        rows = [r for j in jobs for r in j.rows]
        self.stats["batches"] += 1
        self.stats["rows"] += len(rows)

        def on_token(row: Row, tok: int, lp: float, text: str) -> None:
            self.stats["tokens"] += 1
            if not row.owner.deltas:
                return
            top = [row.top[-1]] if row.sampling.top_logprobs > 0 else None
            self._send(row.owner, TokenDelta(index=row.index, token_ids=[tok], logprobs=[lp], text=text,
                                             top_logprobs=top))

        def on_finish(row: Row) -> None:
            job: _Job = row.owner
            c = job.request.constraint
            content, calls = self.tool_parser.split(row.text)
            job.finals[row.index] = Generation(
                prompt_ids=list(job.prompt_ids), response_ids=list(row.ids), logprobs=list(row.logprobs), text=content,
                tool_calls=calls, finish_reason=row.finish_reason or "stop", policy_version=job.version,
                constraint=None if c is None else self.grammars().record(c),
                top_logprobs=[list(t) for t in row.top] if row.sampling.top_logprobs > 0 else None)
            job.remaining -= 1
            if job.remaining == 0:
                self._send(job, _DONE)

        def admit(free: int) -> list[Row]:
            joined = self._admit(free)
            for j in joined:
                j.version = self._versions[j.request.policy]
            self.stats["rows"] += sum(len(j.rows) for j in joined)
            jobs.extend(joined)  # the batch's jobs: a failure is reported to every one of them (_run)
            return [r for j in joined for r in j.rows]

        merged = self._merged_model if self.merge_lora and self.model is not self.base_model else None
        weights = StepWeights(self.model, self._adapter_context, self._adapter_name,
                              peft=self.model is not self.base_model, merged=merged)
        def forward_for(batch: list[Row]) -> tuple[Any, dict[str, Any]]:
            return weights.forward([r.owner.request.policy for r in batch])

        common = dict(pad_id=self.pad_id, eos_ids=self.eos_ids, device=self.device, on_token=on_token,
                      on_finish=on_finish, admit=admit, weights=forward_for)
        try:
            if self.static_cache_len is not None:
                decode_static(self.model, self.tokenizer, rows, slots=self._slot_cache(), step_fn=self._step_fn,
                              **common)
            else:
                decode_batch(self.model, self.tokenizer, rows, max_rows=self.max_batch_size, **common)
        finally:
            weights.close()

    def _slot_cache(self) -> SlotCache:
        """The static KV cache (allocated at the first batch): ``max_batch_size`` slots x ``static_cache_len``."""
        if self._slots is None or (self._slots.length, self._slots.slots) != (self.static_cache_len,
                                                                              self.max_batch_size):  # set at run time
            assert self.static_cache_len is not None
            dtype = next(self.base_model.parameters()).dtype
            self._slots = SlotCache(self.base_model.config, self.max_batch_size, self.static_cache_len, dtype,
                                    self.device)
        return self._slots

    def _step_fn(self, model: Any) -> Any:
        """What runs a static decode step of ``model``: compiled once per model object (a CUDA graph on CUDA)."""
        if not self.compile_step:
            return model
        if id(model) not in self._compiled:
            self._compiled[id(model)] = torch.compile(model, mode="reduce-overhead", dynamic=False)
        return self._compiled[id(model)]

    def _merged_model(self, policy: str) -> Any:
        """The sampling copy with ``policy``'s current weights merged (re-merged after any pause)."""
        if self._merged is None:
            self._merged = MergedCopy(self.model)
        adapter = self._adapter_name(policy)
        return self._merged.model_for(adapter, (adapter, self._weights_epoch))

    def _adapter_name(self, policy: str) -> str | None:
        """``policy``'s peft adapter name; None when it runs on the base weights."""
        return self._adapter[policy] if self._lora_cfg[policy] is not None else None

    def _admit(self, free: int) -> list[_Job]:
        """Jobs that arrived while a batch runs and fit in ``free`` rows (continuous batching), of any policy.

        Policies share the batch (``_mixed.py``: each row with its own adapter). None while a weight
        swap waits: the batch drains, the swap goes next.
        """
        if self._swaps_waiting or self._stopping:
            return []
        out: list[_Job] = []
        for j in list(self._backlog):  # same-policy jobs that did not fit before
            if not j.cancelled and len(j.rows) <= free:
                self._backlog.remove(j)
                out.append(j)
                free -= len(j.rows)
        while free > 0:
            try:
                j = self._queue.get_nowait()
            except queue.Empty:
                break
            if j is None:  # close(): finish what runs, take nothing more
                self._stopping = True
                self._queue.put(None)
                break
            if j.cancelled:
                continue
            if len(j.rows) > free:
                self._backlog.append(j)
                break
            out.append(j)
            free -= len(j.rows)
        return out

    @staticmethod
    def _send(job: _Job, item: Any) -> None:
        try:
            job.loop.call_soon_threadsafe(job.out.put_nowait, item)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening
            job.cancelled = True


@BACKENDS.declare("hf")
class HFSettings(derive(HFBackend, skip=("model_path", "policies", "lora"), base=WeightsSection)):  # type: ignore[misc]
    """``backend: hf``: transformers in this process; no ``path`` and no ``gguf``: the tiny model built here."""

    gguf: str | None = None  # a packaged model's name or a .gguf file (swarm/policy/gguf.py)
    warmup: Literal["word_chain", "reading", "none"] | None = None  # the tiny model's warm-up
    seed: int = 0
    tiny_spec: dict[str, int] = Field(default_factory=dict)  # TinySpec overrides (checked when built)

    @model_validator(mode="after")
    def _one_source(self) -> HFSettings:
        if self.path and self.gguf:
            raise ValueError(f"model.path={self.path} and model.gguf={self.gguf} are both set; keep one")
        return self

    def weights(self) -> str:
        """The checkpoint to load: ``path`` (HF id or folder), ``gguf`` (a GGUF file or a packaged model's name,
        converted once: ``swarm/policy/gguf.py``), or the locally built tiny model."""
        if self.path:
            return self.path
        if self.gguf:
            from swarm.policy.gguf import ensure_gguf_model

            return str(ensure_gguf_model(self.gguf))
        from swarm.policy.tiny import ensure_tiny_model

        if self.warmup in (None, "none"):
            return str(ensure_tiny_model(seed=self.seed, spec=self.spec()))
        from swarm.policy.warmup import get_warmup

        return str(ensure_tiny_model(seed=self.seed, spec=self.spec(), warmup=get_warmup(self.warmup)))

    def spec(self) -> TinySpec | None:
        """The tiny model's architecture: :class:`~swarm.policy.tiny.TinySpec` with ``tiny_spec`` overrides
        (e.g. ``{hidden_size: 256, intermediate_size: 1024}``: a 2x wider model, same tokenizer); None = default."""
        from dataclasses import fields

        if not self.tiny_spec:
            return None
        known = {f.name for f in fields(TinySpec)}
        bad = sorted(set(self.tiny_spec) - known)
        if bad:
            raise ConfigError(f"model.tiny_spec.{bad[0]} is unknown; TinySpec fields: {sorted(known)}")
        if "vocab_size" in self.tiny_spec:
            raise ConfigError("model.tiny_spec.vocab_size: the tiny tokenizer is shared by every tiny model; keep 1024")
        return TinySpec(**self.tiny_spec)

    def trainer_weights(self) -> str:
        return self.weights()

    def build(self, policies: list[str], lora: LoraSpec | None) -> HFBackend:
        return HFBackend(self.weights(), list(policies), lora=lora, device=self.device, dtype=self.resolved_dtype(),
                         **self.args())
