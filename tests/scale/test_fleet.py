"""FleetBackend: least-loaded routing, publish reaching every replica, version semantics, failures."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from swarm.errors import BackendError, ConflictError, ContextLengthError, ValidationError
from swarm.policy.base import GenerateRequest, SamplingParams
from swarm.policy.echo import EchoBackend
from swarm.policy.fleet import FleetBackend

MSG = [{"role": "user", "content": "hello fleet"}]


def req(n: int = 1, max_tokens: int = 32, **kw: Any) -> GenerateRequest:
    return GenerateRequest("default", messages=MSG, sampling=SamplingParams(max_tokens=max_tokens, n=n, **kw))


class Gated(EchoBackend):
    """An echo replica whose weight loads can be held (``load_gate``) or made to fail."""

    def __init__(self, *a: Any, fail_load: bool = False, fail_generate: bool = False, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.load_gate = threading.Event()
        self.load_gate.set()
        self.loads: list[int] = []
        self.fail_load, self.fail_generate = fail_load, fail_generate

    def load_weights(self, policy: str, adapter_state: Any, version: int) -> None:
        assert self.load_gate.wait(30)
        if self.fail_load:
            raise BackendError("disk full")
        super().load_weights(policy, adapter_state, version)
        self.loads.append(version)

    async def generate(self, request: GenerateRequest) -> list:
        if self.fail_generate:
            raise BackendError("connection refused")
        return await super().generate(request)


def served(fleet: FleetBackend) -> dict[str, int]:
    return {s["name"]: s["served"] for s in fleet.status()}


def test_concurrent_requests_spread_evenly() -> None:
    fleet = FleetBackend({"a": EchoBackend(delay_s=0.2), "b": EchoBackend(delay_s=0.2), "c": EchoBackend(delay_s=0.2)})

    async def run() -> None:
        await asyncio.gather(*(fleet.generate(req()) for _ in range(9)))

    asyncio.run(run())
    assert served(fleet) == {"a": 3, "b": 3, "c": 3}
    assert all(s["in_flight"] == 0 for s in fleet.status())


def test_busy_replica_is_avoided() -> None:
    slow, fast = EchoBackend(delay_s=1.0), EchoBackend()
    fleet = FleetBackend({"slow": slow, "fast": fast})

    async def run() -> None:
        pinned = asyncio.create_task(fleet.generate(req()))  # goes to "slow" (first, all idle)
        await asyncio.sleep(0.05)
        for _ in range(5):  # "slow" has one in flight: every new request goes to "fast"
            await fleet.generate(req())
        await pinned

    asyncio.run(run())
    assert served(fleet) == {"slow": 1, "fast": 5}


def test_capacity_weights_the_load_and_n_counts_samples() -> None:
    fleet = FleetBackend({"big": EchoBackend(delay_s=0.2), "small": EchoBackend(delay_s=0.2)},
                         capacities={"big": 3, "small": 1})

    async def run() -> None:
        await asyncio.gather(*(fleet.generate(req()) for _ in range(8)))

    asyncio.run(run())
    assert served(fleet) == {"big": 6, "small": 2}

    fleet2 = FleetBackend({"a": EchoBackend(delay_s=0.2), "b": EchoBackend(delay_s=0.2)})

    async def run2() -> None:
        first = asyncio.create_task(fleet2.generate(req(n=4)))  # a: 4 samples in flight
        await asyncio.sleep(0.05)
        await asyncio.gather(*(fleet2.generate(req()) for _ in range(3)))  # b: 1, 2, 3 < 4
        await first

    asyncio.run(run2())
    assert served(fleet2) == {"a": 1, "b": 3}


def test_publish_reaches_every_replica() -> None:
    reps = {"a": Gated(), "b": Gated(), "c": Gated()}
    fleet = FleetBackend(reps)
    assert fleet.version("default") == 0
    fleet.load_weights("default", {}, 1)
    fleet.load_weights("default", {}, 2)
    assert fleet.version("default") == 2
    assert all(r.loads == [1, 2] and r.version("default") == 2 for r in reps.values())

    async def burst() -> list:
        return await asyncio.gather(*(fleet.generate(req()) for _ in range(6)))

    gens = asyncio.run(burst())
    assert {g[0].policy_version for g in gens} == {2}
    with pytest.raises(ConflictError):
        fleet.load_weights("default", {}, 2)


def test_no_request_reaches_an_old_replica_after_the_announcement() -> None:
    a, b = Gated(), Gated()
    fleet = FleetBackend({"a": a, "b": b})
    b.load_gate.clear()  # b is slow to load
    pub = threading.Thread(target=fleet.load_weights, args=("default", {}, 1))
    pub.start()
    deadline = time.monotonic() + 10
    while a.version("default") != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fleet.version("default") == 1 and b.version("default") == 0

    async def burst() -> list:
        return await asyncio.gather(*(fleet.generate(req()) for _ in range(10)))

    gens = asyncio.run(burst())
    assert {g[0].policy_version for g in gens} == {1}  # b (still v0) got none of them
    assert served(fleet) == {"a": 10, "b": 0}
    b.load_gate.set()
    pub.join(10)
    gens = asyncio.run(burst())
    assert {g[0].policy_version for g in gens} == {1} and served(fleet)["b"] > 0


def test_requests_wait_while_every_replica_loads() -> None:
    a, b = Gated(), Gated()
    fleet = FleetBackend({"a": a, "b": b})
    a.load_gate.clear()
    b.load_gate.clear()
    pub = threading.Thread(target=fleet.load_weights, args=("default", {}, 1))
    pub.start()
    while fleet.version("default") != 1:
        time.sleep(0.005)

    async def run() -> Any:
        task = asyncio.create_task(fleet.generate(req()))
        await asyncio.sleep(0.2)
        assert not task.done()  # nobody serves v1 yet, and v0 may no longer serve it
        b.load_gate.set()
        return await asyncio.wait_for(task, 10)

    [gen] = asyncio.run(run())
    assert gen.policy_version == 1 and served(fleet) == {"a": 0, "b": 1}
    a.load_gate.set()
    pub.join(10)


def test_no_replica_at_version_times_out() -> None:
    a = Gated()
    fleet = FleetBackend({"a": a}, wait_s=0.2)
    a.load_gate.clear()
    pub = threading.Thread(target=fleet.load_weights, args=("default", {}, 1))
    pub.start()
    while fleet.version("default") != 1:
        time.sleep(0.005)
    with pytest.raises(BackendError, match="serves version 1"):
        asyncio.run(fleet.generate(req()))
    a.load_gate.set()
    pub.join(10)


def test_failed_load_keeps_replica_out_until_a_later_publish() -> None:
    a, b = Gated(), Gated(fail_load=True)
    fleet = FleetBackend({"a": a, "b": b})
    fleet.load_weights("default", {}, 1)  # b fails: announced anyway, a serves it
    st = {s["name"]: s for s in fleet.status()}
    assert st["b"]["versions"] == {"default": 0} and "disk full" in st["b"]["last_error"]

    async def burst() -> list:
        return await asyncio.gather(*(fleet.generate(req()) for _ in range(4)))

    assert {g[0].policy_version for g in asyncio.run(burst())} == {1}
    assert served(fleet) == {"a": 4, "b": 0}
    b.fail_load = False
    fleet.load_weights("default", {}, 2)  # the full state catches b up
    asyncio.run(burst())
    assert served(fleet)["b"] > 0


def test_publish_failing_everywhere_withdraws_the_announcement() -> None:
    fleet = FleetBackend({"a": Gated(fail_load=True), "b": Gated(fail_load=True)})
    with pytest.raises(BackendError, match="no fleet replica took version 1"):
        fleet.load_weights("default", {}, 1)
    assert fleet.version("default") == 0
    [gen] = asyncio.run(fleet.generate(req()))
    assert gen.policy_version == 0


def test_failing_replica_is_retried_elsewhere_and_cooled_down() -> None:
    bad, good = Gated(fail_generate=True), Gated()
    fleet = FleetBackend({"bad": bad, "good": good}, cooldown_s=30)

    async def run() -> list:
        return [await fleet.generate(req()) for _ in range(3)]

    outs = asyncio.run(run())
    assert all(o[0].text == "hello fleet" for o in outs)
    st = {s["name"]: s for s in fleet.status()}
    assert st["bad"]["served"] == 1 and st["bad"]["failures"] == 1 and st["bad"]["down"]
    assert st["good"]["served"] == 3

    only_bad = FleetBackend({"x": Gated(fail_generate=True), "y": Gated(fail_generate=True)}, wait_s=0.1)
    with pytest.raises(BackendError):
        asyncio.run(only_bad.generate(req()))


def test_request_faults_are_not_retried() -> None:
    fleet = FleetBackend({"a": EchoBackend(max_context=64), "b": EchoBackend(max_context=64)})
    with pytest.raises(ContextLengthError):
        asyncio.run(fleet.generate(req(max_tokens=60)))
    assert all(s["failures"] == 0 and not s["down"] for s in fleet.status())


def test_stream_routes_and_releases() -> None:
    fleet = FleetBackend({"a": EchoBackend(), "b": EchoBackend()})

    async def run() -> list:
        return [item async for item in fleet.stream(req())]

    items = asyncio.run(run())
    assert items[-1].text == "hello fleet"
    assert sum(served(fleet).values()) == 1 and all(s["in_flight"] == 0 for s in fleet.status())


def test_replicas_must_agree() -> None:
    with pytest.raises(ValidationError, match="different policies"):
        FleetBackend([EchoBackend(["default"]), EchoBackend(["other"])])
    with pytest.raises(ValidationError, match="at least one"):
        FleetBackend([])


def test_lagging_replica_waits_for_the_next_publish() -> None:
    ahead, behind = EchoBackend(), EchoBackend()
    ahead.load_weights("default", {}, 3)  # e.g. "behind" was restarted on the base weights
    fleet = FleetBackend({"ahead": ahead, "behind": behind})
    assert fleet.version("default") == 3
    asyncio.run(fleet.generate(req()))
    assert served(fleet) == {"ahead": 1, "behind": 0}
