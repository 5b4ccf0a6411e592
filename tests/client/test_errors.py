"""One exception tree: the client's ClientError and the app's ApiError are SwarmErrors (ClientError a RuntimeError too)."""

from __future__ import annotations

import httpx
import pytest

from swarm.client import ClientError, SwarmClient
from swarm.errors import SwarmError
from swarm.web.errors import ApiError, from_swarm_error


def test_client_error_is_a_swarm_error_and_a_runtime_error() -> None:
    err = ClientError("refused", status_code=403, episode_id="ep_1")
    assert isinstance(err, SwarmError) and isinstance(err, RuntimeError)
    assert str(err) == "refused (episode_id=ep_1)" and err.status_code == 403 and err.episode_id == "ep_1"
    assert ClientError("unreachable").status_code is None


def test_sdk_raises_client_error_with_the_gateway_message() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"error": {"type": "authentication_error", "message": "bad key"}})

    client = SwarmClient("http://127.0.0.1:9", transport=httpx.MockTransport(answer))
    with pytest.raises(SwarmError) as info:
        client.begin(task="t")
    assert isinstance(info.value, ClientError) and info.value.status_code == 401 and "bad key" in str(info.value)


def test_api_error_is_a_swarm_error_that_maps_to_itself() -> None:
    err = ApiError(409, "taken", code="conflict", param="id")
    assert isinstance(err, SwarmError) and err.status_code == 409 and err.error_type == "conflict_error"
    assert from_swarm_error(err) is err and str(err) == "taken"
