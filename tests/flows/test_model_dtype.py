"""``model.dtype: auto`` (conf/model/smollm2.yaml): bfloat16 on CUDA or a CPU with native bf16, else float32."""

from __future__ import annotations

import pytest

from flows.components import model_dtype
from swarm.policy import settings
from swarm.policy.echo import EchoSettings
from swarm.policy.settings import WeightsSection


def weights(**kw: str) -> WeightsSection:
    return WeightsSection(**kw)


def test_auto_is_bf16_only_where_it_is_native(monkeypatch: pytest.MonkeyPatch) -> None:
    assert model_dtype(weights(dtype="float32")) == "float32" and model_dtype(weights()) == "float32"
    assert model_dtype(weights(dtype="auto", device="cuda:0")) == "bfloat16"
    monkeypatch.setattr(settings, "native_bf16_cpu", lambda: False)
    assert model_dtype(weights(dtype="auto", device="cpu")) == "float32"
    monkeypatch.setattr(settings, "native_bf16_cpu", lambda: True)
    assert model_dtype(weights(dtype="auto", device="cpu")) == "bfloat16"
    assert model_dtype(EchoSettings(backend="echo")) == "float32"  # no weights of its own


def test_this_cpus_flags_are_read() -> None:
    assert isinstance(settings.native_bf16_cpu(), bool)
