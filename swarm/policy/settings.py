"""The ``model`` config section of every policy backend, and :data:`BACKENDS`, their registry.

A backend is one module of this package (or a dotted module path elsewhere) that declares its
section once, at the bottom, beside its class::

    @BACKENDS.declare("echo")
    class EchoSettings(derive(EchoBackend, skip=("policies",), base=BackendSection)):
        def build(self, policies, lora):
            return EchoBackend(policies, **self.args())

The section's fields *are* the constructor's parameters (:func:`swarm.settings.derive`), so a
setting is written once; ``backend: echo`` in ``conf/model/*.yaml`` picks it. Light on purpose
(pydantic only): the config is checked before a backend module with torch is imported, except the
ones it names.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from swarm.errors import ConfigError
from swarm.settings import Registry, Section

if TYPE_CHECKING:
    from swarm.lora import LoraSpec
    from swarm.policy.base import PolicyBackend

__all__ = ["BACKENDS", "BackendSection", "WeightsSection", "native_bf16_cpu"]


class BackendSection(Section):
    """What every ``model`` section has besides its backend's own settings."""

    name: str | None = None  # a label (MLflow's swarm.model tag; a fleet replica's name)
    capacity: float = Field(default=1.0, gt=0)  # as a fleet replica: its share of the requests

    def build(self, policies: list[str], lora: LoraSpec | None) -> PolicyBackend:
        """The backend serving ``policies``; trainable ones get LoRA adapters matching ``lora``."""
        raise NotImplementedError

    def trainer_weights(self) -> str:
        """The base weights the trainer loads for this served model (an HF id or a folder)."""
        path = getattr(self, "path", None) or getattr(self, "tokenizer_path", None)
        if not path:
            raise ConfigError("model.path is missing: the trainer needs the base weights of the served model "
                              "(an HF id or a local folder), e.g. model.path=Qwen/Qwen2.5-7B-Instruct")
        return str(path)


class WeightsSection(BackendSection):
    """A backend whose weights the trainer also loads: where they are, their dtype and device."""

    path: str | None = None  # the trainer's base weights (HF id or folder; hf: also what is served)
    dtype: str = "float32"  # of the base weights; auto: bfloat16 on CUDA or a CPU with native bf16
    device: str = "cpu"

    def resolved_dtype(self) -> str:
        """``dtype`` with ``auto`` resolved: bfloat16 on CUDA or a CPU with native bf16, else float32."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if self.device.startswith("cuda") or native_bf16_cpu() else "float32"


def native_bf16_cpu() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX flags in /proc/cpuinfo; Linux only).

    Elsewhere torch emulates bf16 matmuls on the CPU, slower than float32, so ``dtype: auto`` stays float32."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return bool({"avx512_bf16", "amx_bf16"} & set(flags))


BACKENDS = Registry(point="model", key="backend", home="swarm.policy", base=BackendSection)
