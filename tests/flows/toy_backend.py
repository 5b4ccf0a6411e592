"""A policy backend declared out of tree (tests/flows/test_declare.py): this module and a config are all it takes."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from swarm.lora import LoraSpec
from swarm.policy.echo import EchoBackend
from swarm.policy.settings import BACKENDS, BackendSection
from swarm.settings import derive


class ShoutBackend(EchoBackend):
    """The null backend, replying in capitals ``times`` times."""

    def __init__(self, policies: list[str], times: Annotated[int, Field(ge=1)] = 1, max_context: int = 4096) -> None:
        super().__init__(policies, reply="HEY " * times, max_context=max_context)
        self.times = times


@BACKENDS.declare(__name__)
class ShoutSettings(derive(ShoutBackend, skip=("policies",), base=BackendSection)):  # type: ignore[misc]
    def build(self, policies: list[str], lora: LoraSpec | None) -> ShoutBackend:
        return ShoutBackend(list(policies), **self.args())
