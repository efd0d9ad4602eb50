"""Malformed and hostile input on every endpoint of the API (a real uvicorn): the answer is
always a JSON error of a documented status, never a 500, never a trace, a URL of ours or a
path, and nothing is created by a refused request."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.api_server import ApiProcess, api, api_env, api_worker  # noqa: F401
from tests.integration.conftest import DEMO

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.slow]

DOCUMENTED = {400, 401, 404, 405, 409, 413, 422, 429}
ROUTES = [
    ("POST", "/v1/runs"),
    ("GET", "/v1/runs"),
    ("POST", "/v1/runs/{id}/turns"),
    ("GET", "/v1/runs/{id}"),
    ("GET", "/v1/runs/{id}/events"),
    ("GET", "/v1/runs/{id}/events/stream"),
    ("POST", "/v1/runs/{id}/cancel"),
    ("DELETE", "/v1/runs/{id}"),
    ("GET", "/v1/runs/{id}/permissions"),
    ("POST", "/v1/runs/{id}/permissions/{id}"),
    ("GET", "/v1/runs/{id}/diff"),
    ("GET", "/v1/runs/{id}/export"),
    ("POST", "/v1/runs/{id}/rewind"),
    ("PATCH", "/v1/runs/{id}/budget"),
]
HOSTILE_IDS = [
    "../../etc/passwd",
    "r" + "0" * 24 + "%00",
    "%2e%2e%2f",
    "r" + "a" * 5000,
    "*",
    "r0000000000000000000000000:events",
    "' OR 1=1 --",
    "\u202erun",
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=20,
)
FIELDS = ["harness", "input", "labels", "webhook_url", "posture", "max_turns", "grants", "turn"]
bodies = st.one_of(
    json_values,
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6),
    st.fixed_dictionaries(
        {"harness": st.just("stdio-json"), "input": st.text(), "executable": st.just(DEMO)},
        optional={"labels": json_values, "max_turns": json_values, "posture": json_values},
    ),
)


def check(response: httpx.Response) -> None:
    assert response.status_code in DOCUMENTED or response.status_code < 300, response.text
    if response.status_code < 400:
        return  # a record holds what the producer sent (its executable's path, say)
    error = response.json()["error"]
    assert set(error) <= {"type", "message", "path"} and error["type"] and error["message"]
    for leak in ("Traceback", "redis://", "amqp://", "/tmp/", "/work/", "whsec_"):
        assert leak not in response.text, (leak, response.text[:500])


@pytest.fixture(scope="module")
def http(api: ApiProcess) -> Any:  # noqa: F811
    with api.client("acme") as client:
        yield client


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(route=st.sampled_from(ROUTES), run_id=st.sampled_from(HOSTILE_IDS), body=bodies)
def test_every_endpoint_answers_hostile_input_with_a_json_error(
    http: httpx.Client, route: tuple[str, str], run_id: str, body: Any
) -> None:
    method, path = route
    target = path.replace("{id}", run_id)
    try:
        content = json.dumps(body, allow_nan=True).encode()
    except (TypeError, ValueError):
        content = b"{"
    response = http.request(
        method, target, content=content, headers={"content-type": "application/json"}
    )
    check(response)
    assert not (method == "POST" and path == "/v1/runs" and response.status_code == 201) or (
        isinstance(body, dict) and body.get("harness") == "stdio-json"
    )


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe not utf-8",
        b'{"harness": "stdio-json", "input": "\\ud800", "executable": "x"}',
        b'{"harness": "stdio-json", "input": "a\\u0000b"}',
        b"[" * 5000 + b"]" * 5000,
        b'{"harness": "stdio-json", "input": "x", "labels": {"\\ud800": "v"}}',
        b'{"harness": "stdio-json", "input": "x", "max_turns": 1e400}',
        b'{"harness": "stdio-json", "input": "x", "max_turns": "NaN"}',
        b'{"harness": 1, "input": 2}',
        b"null",
        b"",
    ],
)
def test_malformed_bodies_are_refused(http: httpx.Client, content: bytes) -> None:
    before = http.get("/v1/runs", params={"limit": 500}).json()["runs"]
    response = http.post("/v1/runs", content=content, headers={"content-type": "application/json"})
    check(response)
    assert response.status_code in (400, 422)
    assert http.get("/v1/runs", params={"limit": 500}).json()["runs"] == before


@pytest.mark.parametrize(
    "params",
    [
        {"cursor": "!!!"},
        {"cursor": "A" * 399},
        {"limit": "0"},
        {"limit": "-1"},
        {"limit": "x"},
        {"label": "nolabel"},
        {"label": "=v"},
        {"status": "x" * 100},
    ],
)
def test_hostile_listing_queries_are_refused(http: httpx.Client, params: dict[str, str]) -> None:
    response = http.get("/v1/runs", params=params)
    check(response)
    assert response.status_code in (400, 422)


@pytest.mark.parametrize(
    "header",
    ["Bearer", "Basic abc", "bearer hk_" + "x" * 10_000, "Bearer  hk_x", "hk_x", "Bearer a b"],
)
def test_hostile_authorization_is_401(api: ApiProcess, header: str) -> None:  # noqa: F811
    response = httpx.get(f"{api.url}/v1/runs", headers={"Authorization": header})
    check(response)
    assert response.status_code in (401, 431)
