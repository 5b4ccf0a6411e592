"""``model.dtype: auto`` (conf/model/smollm2.yaml): bfloat16 on CUDA or a CPU with native bf16, else float32."""

from __future__ import annotations

import pytest

from flows import components
from flows.components import model_dtype
from flows.config import HFModel


def hf(**kw: str) -> HFModel:
    return HFModel(backend="hf", **kw)


def test_auto_is_bf16_only_where_it_is_native(monkeypatch: pytest.MonkeyPatch) -> None:
    assert model_dtype(hf(dtype="float32")) == "float32" and model_dtype(hf()) == "float32"
    assert model_dtype(hf(dtype="auto", device="cuda:0")) == "bfloat16"
    monkeypatch.setattr(components, "native_bf16_cpu", lambda: False)
    assert model_dtype(hf(dtype="auto", device="cpu")) == "float32"
    monkeypatch.setattr(components, "native_bf16_cpu", lambda: True)
    assert model_dtype(hf(dtype="auto", device="cpu")) == "bfloat16"


def test_this_cpus_flags_are_read() -> None:
    assert isinstance(components.native_bf16_cpu(), bool)
