"""/openapi.json describes every route, and a bounded schemathesis run over it never gets a 5xx."""

from __future__ import annotations

from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

ROUTES = {"/health", "/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/episodes",
          "/v1/episodes/{episode_id}/heartbeat", "/v1/episodes/{episode_id}/end", "/v1/episodes/{episode_id}/abort",
          "/v1/steps", "/v1/events", "/v1/feedback", "/v1/pool/stats", "/v1/pool/steps", "/v1/pool/steps/{step_id}",
          "/v1/pool/episodes", "/v1/pool/episodes/{episode_id}", "/v1/pool/leases",
          "/v1/pool/leases/{lease_id}/ack", "/v1/pool/labels"}


def test_openapi_lists_every_route(gateway: Any) -> None:
    spec = gateway.http.get("/openapi.json").json()
    assert ROUTES <= set(spec["paths"])
    params = {p["name"] for p in spec["paths"]["/v1/pool/steps"]["get"]["parameters"]}
    assert {"task", "policy", "source", "reward_status", "episode_status", "episode_id", "group_id",
            "max_staleness", "nonzero_variance", "label", "limit", "with_tokens"} <= params


def test_no_5xx_on_generated_requests(gateway: Any) -> None:
    """A few schemathesis-generated requests per operation (derandomized: the same every run)."""
    schema = schemathesis.openapi.from_url(gateway.url + "/openapi.json")
    headers = {"Authorization": f"Bearer {gateway.episode()['api_key']}"}
    seen = 0
    for result in schema.get_all_operations():
        op = result.ok()

        @given(case=op.as_strategy())
        @settings(max_examples=6, deadline=None, derandomize=True, database=None,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            response = case.call(headers=headers, timeout=30)
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path} query={case.query} body={str(case.body)[:300]}: "
                f"{response.status_code} {response.text[:300]}")
            if response.status_code >= 400:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}

        check()
        seen += 1
    assert seen >= len(ROUTES)
