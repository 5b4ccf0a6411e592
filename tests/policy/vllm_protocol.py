"""vLLM's HTTP protocol at one pinned release, as data: the fields of every model our client sends or reads.

Pinned: vLLM v0.33.0 (PyPI wheel ``vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl``, whose
``vllm/_version.py`` records ``commit_id = 'g4ba787ec9'``, i.e. vllm-project/vllm@4ba787ec9). Each
dict below is the model's pydantic fields (or dataclass fields) with the annotation copied verbatim
from that release's source file named in the comment above it; private attributes
(``_DEFAULT_SAMPLING_PARAMS``, ``StructuredOutputsParams._backend*``) are left out because a
request cannot set them. ``tests/policy/test_vllm_contract.py`` checks our client against these and
``FakeVLLM`` (``tests/policy/test_vllm.py``) answers with exactly these shapes via :func:`dump`.

Not here: vLLM itself (never imported), the chat / tokenize / responses routes (we do not call them).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "RELEASE", "COMMIT", "MODELS", "ALIASES", "REMOVED_GUIDED_FIELDS", "STREAM_CHUNK_FIELDS",
    "STREAM_CHOICE_FIELDS", "dump",
]

RELEASE = "v0.33.0"
COMMIT = "4ba787ec9"

MODELS: dict[str, dict[str, str]] = {
    # vllm/entrypoints/openai/completion/protocol.py @ v0.33.0: class CompletionRequest(OpenAIBaseModel)
    "CompletionRequest": {
        "model": "str | None",
        "prompt": "list[Annotated[int, Field(ge=0)]] | list[list[Annotated[int, Field(ge=0)]]] | str | list[str] | None",
        "echo": "bool | None",
        "frequency_penalty": "float | None",
        "logit_bias": "dict[str, float] | None",
        "logprobs": "int | None",
        "max_tokens": "int | None",
        "n": "int",
        "presence_penalty": "float | None",
        "seed": "int | None",
        "stop": "StopParam",
        "stream": "bool | None",
        "stream_options": "StreamOptions | None",
        "suffix": "str | None",
        "temperature": "float | None",
        "top_p": "float | None",
        "user": "str | None",
        "use_beam_search": "bool",
        "top_k": "int | None",
        "min_p": "float | None",
        "repetition_penalty": "float | None",
        "watermarking": "bool | None",
        "length_penalty": "float",
        "stop_token_ids": "list[int] | None",
        "include_stop_str_in_output": "bool",
        "ignore_eos": "bool",
        "min_tokens": "int",
        "skip_special_tokens": "bool | None",
        "spaces_between_special_tokens": "bool",
        "truncate_prompt_tokens": "Annotated[int, Field(ge=-1, le=_INT64_MAX)] | None",
        "truncation_side": "Literal['left', 'right'] | None",
        "allowed_token_ids": "list[int] | None",
        "prompt_logprobs": "int | None",
        "logprob_token_ids": "list[int] | None",
        "bad_words": "list[str]",
        "prompt_embeds": "bytes | list[bytes] | None",
        "add_special_tokens": "bool",
        "response_format": "AnyResponseFormat | None",
        "structured_outputs": "StructuredOutputsParams | None",
        "priority": "int",
        "request_id": "str",
        "session_id": "str | None",
        "return_tokens_as_token_ids": "bool | None",
        "return_token_ids": "bool | None",
        "return_weight_versions": "bool",
        "routed_experts_prompt_start": "int",
        "return_token_offsets": "bool | None",
        "mm_payload": "MMPayload",
        "return_mm_kwargs": "bool | None",
        "cache_salt": "str | None",
        "kv_transfer_params": "dict[str, Any] | None",
        "ec_transfer_params": "dict[str, Any] | None",
        "vllm_xargs": "dict[str, str | int | float | list[str | int | float]] | None",
        "repetition_detection": "RepetitionDetectionParams | None",
        "thinking_token_budget": "ThinkingTokenBudget",
        "stream_interval": "Annotated[int, Field(ge=1)] | None",
    },
    # vllm/sampling_params.py @ v0.33.0: @dataclass class StructuredOutputsParams (init fields)
    "StructuredOutputsParams": {
        "json": "str | dict | None",
        "regex": "str | None",
        "choice": "list[str] | None",
        "grammar": "str | None",
        "json_object": "bool | None",
        "disable_any_whitespace": "bool",
        "disable_additional_properties": "bool",
        "whitespace_pattern": "str | None",
        "structural_tag": "str | None",
    },
    # vllm/entrypoints/openai/completion/protocol.py @ v0.33.0: class CompletionLogProbs
    "CompletionLogProbs": {
        "text_offset": "list[int]",
        "token_logprobs": "list[float | None]",
        "tokens": "list[str]",
        "top_logprobs": "list[dict[str, float] | None]",
    },
    # vllm/entrypoints/openai/completion/protocol.py @ v0.33.0: class CompletionResponseChoice
    "CompletionResponseChoice": {
        "index": "int",
        "text": "str",
        "logprobs": "CompletionLogProbs | None",
        "finish_reason": "str | None",
        "stop_reason": "int | str | None",
        "token_ids": "list[int] | None",
        "prompt_logprobs": "list[dict[int, Logprob] | None] | None",
        "prompt_token_ids": "list[int] | None",
        "routed_experts": "str | None",
        "weight_versions": "list[WeightVersionSpan] | None",
    },
    # vllm/entrypoints/openai/completion/protocol.py @ v0.33.0: class CompletionResponse
    "CompletionResponse": {
        "id": "str",
        "object": "Literal['text_completion']",
        "created": "int",
        "model": "str",
        "choices": "list[CompletionResponseChoice]",
        "service_tier": "Literal['auto', 'default', 'flex', 'scale', 'priority'] | None",
        "system_fingerprint": "str | None",
        "usage": "UsageInfo",
        "kv_transfer_params": "dict[str, Any] | None",
        "ec_transfer_params": "dict[str, Any] | None",
        "metrics": "PerRequestMetrics | None",
    },
    # vllm/entrypoints/openai/completion/protocol.py @ v0.33.0: class CompletionResponseStreamChoice
    "CompletionResponseStreamChoice": {
        "index": "int",
        "text": "str",
        "logprobs": "CompletionLogProbs | None",
        "finish_reason": "str | None",
        "stop_reason": "int | str | None",
        "prompt_token_ids": "list[int] | None",
        "token_ids": "list[int] | None",
        "weight_versions": "list[WeightVersionSpan] | None",
    },
    # vllm/entrypoints/openai/completion/protocol.py @ v0.33.0: class CompletionStreamResponse
    "CompletionStreamResponse": {
        "id": "str",
        "object": "str",
        "created": "int",
        "model": "str",
        "choices": "list[CompletionResponseStreamChoice]",
        "usage": "UsageInfo | None",
        "system_fingerprint": "str | None",
        "metrics": "PerRequestMetrics | None",
        "kv_transfer_params": "dict[str, Any] | None",
    },
    # vllm/entrypoints/serve/engine/protocol.py @ v0.33.0: class UsageInfo
    "UsageInfo": {
        "prompt_tokens": "int",
        "total_tokens": "int",
        "completion_tokens": "int | None",
        "prompt_tokens_details": "PromptTokenUsageInfo | None",
        "completion_tokens_details": "CompletionTokenUsageInfo | None",
    },
    # vllm/entrypoints/serve/engine/protocol.py @ v0.33.0: class PromptTokenUsageInfo
    "PromptTokenUsageInfo": {
        "cached_tokens": "int | None",
        "created_cache_tokens": "int | None",
        "multimodal_tokens": "dict[str, int] | None",
    },
    # vllm/entrypoints/serve/engine/protocol.py @ v0.33.0: class ErrorInfo / class ErrorResponse
    "ErrorInfo": {"message": "str", "type": "str", "param": "str | None", "code": "int"},
    "ErrorResponse": {"error": "ErrorInfo"},
    # vllm/entrypoints/serve/engine/protocol.py @ v0.33.0: class ModelPermission / ModelCard / ModelList
    "ModelPermission": {
        "id": "str",
        "object": "str",
        "created": "int",
        "allow_create_engine": "bool",
        "allow_sampling": "bool",
        "allow_logprobs": "bool",
        "allow_search_indices": "bool",
        "allow_view": "bool",
        "allow_fine_tuning": "bool",
        "organization": "str",
        "group": "str | None",
        "is_blocking": "bool",
    },
    "ModelCard": {
        "id": "str",
        "object": "str",
        "created": "int",
        "owned_by": "str",
        "root": "str | None",
        "parent": "str | None",
        "max_model_len": "int | None",
        "permission": "list[ModelPermission]",
    },
    "ModelList": {"object": "str", "data": "list[ModelCard]"},
    # vllm/entrypoints/serve/lora/protocol.py @ v0.33.0 (pydantic BaseModel; routes in
    # vllm/entrypoints/serve/lora/api_router.py, only with VLLM_ALLOW_RUNTIME_LORA_UPDATING)
    "LoadLoRAAdapterRequest": {
        "lora_name": "str",
        "lora_path": "str",
        "load_inplace": "bool",
        "is_3d_lora_weight": "bool",
    },
    "UnloadLoRAAdapterRequest": {"lora_name": "str", "lora_int_id": "int | None"},
}

# type aliases used above, as defined at v0.33.0
ALIASES: dict[str, str] = {
    # vllm/entrypoints/generate/base/protocol.py
    "StopParam": "str | Annotated[list[str], Field(max_length=envs.VLLM_MAX_STOP_STRINGS)] | None",
    "MMPayload": "Literal['tensors', 'none']",
    # vllm/sampling_params.py (plus a BeforeValidator)
    "ThinkingTokenBudget": "int | None",
}

# vllm/entrypoints/serve/engine/protocol.py @ v0.33.0: _REMOVED_GUIDED_FIELDS. OpenAIBaseModel has
# extra="allow": these (and any unknown field) are accepted and silently ignored, so a request that
# still used them would run unconstrained.
REMOVED_GUIDED_FIELDS = frozenset({
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
    "guided_whitespace_pattern",
})

# A streamed chunk is ``chunk.model_dump_json(exclude_unset=True)``
# (vllm/entrypoints/openai/completion/serving.py @ v0.33.0, completion_stream_generator): only the
# fields passed to the constructors are present; ``usage`` only with continuous usage stats and
# ``system_fingerprint`` only on a terminal chunk when the server has one (we ask for neither).
STREAM_CHUNK_FIELDS = frozenset({"id", "object", "created", "model", "choices", "kv_transfer_params"})
STREAM_CHOICE_FIELDS = frozenset({
    "index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids",
    "weight_versions",
})


def dump(model: str, /, **values: Any) -> dict[str, Any]:
    """``model(**values).model_dump()`` as JSON: every field present, unset nullable ones None.

    None is the default of every nullable response field here except ``UsageInfo.completion_tokens``
    (0), which callers always give.

    Refuses a field the model lacks and a missing field that is not nullable, so a fake built with
    it cannot drift from the pinned shapes.
    """
    fields = MODELS[model]
    extra = set(values) - set(fields)
    if extra:
        raise KeyError(f"{model} has no field(s) {sorted(extra)} at vLLM {RELEASE}")
    out = {}
    for name, ann in fields.items():
        if name in values:
            out[name] = values[name]
        elif ann.replace(" ", "").endswith("|None"):
            out[name] = None
        else:
            raise KeyError(f"{model}.{name} ({ann}) has no null default: give it")
    return out
