"""The OpenAPI document a platform generates its clients from: whole (no dangling ``$ref``),
every operation named and its errors declared, the JSON bodies typed as JSON, and the event
set and run record as the code's own models."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from adapters.events import EVENT_TYPES
from config import load_settings
from worker.api.app import create_app
from worker.store.records import RunRecord

OPERATIONS = {
    ("post", "/v1/runs"): "createRun",
    ("get", "/v1/runs"): "listRuns",
    ("post", "/v1/runs/{run_id}/turns"): "submitTurn",
    ("get", "/v1/runs/{run_id}"): "getRun",
    ("get", "/v1/runs/{run_id}/events"): "listEvents",
    ("get", "/v1/runs/{run_id}/events/stream"): "streamEvents",
    ("post", "/v1/runs/{run_id}/cancel"): "cancelRun",
    ("delete", "/v1/runs/{run_id}"): "endRun",
    ("get", "/v1/runs/{run_id}/permissions"): "listPermissions",
    ("post", "/v1/runs/{run_id}/permissions/{request_id}"): "answerPermission",
    ("get", "/v1/runs/{run_id}/diff"): "getDiff",
    ("get", "/v1/runs/{run_id}/export"): "exportRun",
    ("post", "/v1/runs/{run_id}/rewind"): "rewindRun",
    ("patch", "/v1/runs/{run_id}/budget"): "updateBudget",
    ("get", "/v1/healthz"): "healthz",
}
ERRORS = {"400", "401", "413", "422", "429", "503"}
"""What every authenticated operation may answer; those of a run add 404."""


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return create_app(load_settings(tenants_file="")).openapi()


def operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            yield method, path, operation


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def test_every_ref_names_a_schema_of_the_document(spec: dict[str, Any]) -> None:
    known = set(spec["components"]["schemas"])
    found = set(refs(spec))
    assert found, "the document refers to no schema at all"
    prefix = "#/components/schemas/"
    assert all(ref.startswith(prefix) for ref in found), found
    assert {ref.removeprefix(prefix) for ref in found} <= known


def test_every_operation_has_its_stable_camel_case_id(spec: dict[str, Any]) -> None:
    ids = {(method, path): op.get("operationId") for method, path, op in operations(spec)}
    assert {key: ids.get(key) for key in OPERATIONS} == OPERATIONS
    assert len(set(ids.values())) == len(ids), "an operation id is used twice"
    for key, name in ids.items():
        assert name and name[0].islower() and "_" not in name, key


def test_every_operation_declares_its_errors_as_the_error_model(spec: dict[str, Any]) -> None:
    for method, path, operation in operations(spec):
        responses = operation["responses"]
        if path == "/v1/healthz":
            assert "503" in responses
            continue
        wanted = ERRORS | ({"404"} if "{run_id}" in path else set())
        assert wanted <= set(responses), (method, path, wanted - set(responses))
        for status in wanted:
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, status)
    error = spec["components"]["schemas"]["ErrorDetail"]
    assert {"type", "message"} <= set(error["required"])


@pytest.mark.parametrize(
    ("path", "model"), [("/v1/runs", "RunCreate"), ("/v1/runs/{run_id}/turns", "TurnCreate")]
)
def test_a_body_is_json_first_and_multipart_with_files_beside(
    spec: dict[str, Any], path: str, model: str
) -> None:
    content = spec["paths"][path]["post"]["requestBody"]["content"]
    assert list(content) == ["application/json", "multipart/form-data"]
    ref = {"$ref": f"#/components/schemas/{model}"}
    assert content["application/json"]["schema"] == ref
    form = content["multipart/form-data"]
    part = form["schema"]["required"][0]
    assert form["schema"]["properties"][part] == ref
    assert form["encoding"][part]["contentType"] == "application/json"
    assert "input" in spec["components"]["schemas"][model]["required"]


def test_every_json_answer_is_typed(spec: dict[str, Any]) -> None:
    for method, path, operation in operations(spec):
        for status, response in operation["responses"].items():
            schema = response.get("content", {}).get("application/json", {}).get("schema")
            if status.startswith("2") and schema is not None:
                assert schema != {} and schema.get("additionalProperties") is not True, (
                    method,
                    path,
                    status,
                )


def test_events_are_one_union_of_the_closed_set_by_type(spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    listed = spec["paths"]["/v1/runs/{run_id}/events"]["get"]["responses"]["200"]
    items = listed["content"]["application/json"]["schema"]["items"]
    assert items == {"$ref": "#/components/schemas/Event"}
    union = schemas["Event"]
    assert union["discriminator"]["propertyName"] == "type"
    assert set(union["discriminator"]["mapping"]) == set(EVENT_TYPES)
    request = schemas["PermissionRequestEvent"]
    assert request["properties"]["type"]["const"] == "permission-request"
    data = schemas["PermissionRequestData"]
    assert {"request_id", "description", "deadline"} <= set(data["properties"])
    assert "type" not in data["properties"]


def test_the_run_record_is_the_stores_model(spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    got = spec["paths"]["/v1/runs/{run_id}"]["get"]["responses"]["200"]["content"]
    assert got["application/json"]["schema"] == {"$ref": "#/components/schemas/RunStatusRecord"}
    status = schemas["RunStatusRecord"]["properties"]
    assert set(RunRecord.model_fields) < set(status)
    assert {"credential_live", "waiting_for_worker"} <= set(status)
    ended = spec["paths"]["/v1/runs/{run_id}"]["delete"]["responses"]["200"]["content"]
    assert ended["application/json"]["schema"] == {"$ref": "#/components/schemas/RunRecord"}
    assert set(schemas["RunRecord"]["properties"]) == set(RunRecord.model_fields)
