"""A producer's regular expressions and schemas run bounded: in time, in depth, off the
worker's shared threads.

An output schema's ``pattern`` ran on Python's ``re`` inside the worker process: ``^(a+)+$``
against a 28-character answer held the GIL for seconds, and every other turn of the worker
and its ``/metrics`` waited. Patterns now run on RE2 (linear, GIL released) and an answer's
whole check runs in a process of its own, killed at its time limit. References never leave
the schema, a schema that refers to itself in place or nests 300 deep is refused where it is
given, the CLI reads a schema file with a bound, budgets are bounded as run options are,
and ``--allow``/``--deny`` globs match with RE2.
"""

from __future__ import annotations

import fnmatch
import http.server
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.asks import Ask
from adapters.events import TurnComplete
from tests.integration.api_server import (  # noqa: F401 -- fixtures
    ApiProcess,
    api,
    api_env,
    api_worker,
    free_port,
)
from tests.integration.conftest import DEMO, Env, WorkerProcess, make_env, start_worker
from worker.errors import InvalidInput
from worker.options.output_schema import MAX_PATTERNS, check_output_schema
from worker.options.spec import MAX_RULES, parse_options
from worker.permissions import rules
from worker.spend import budgets
from worker.turn import structured

PATHOLOGICAL = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}}}
"""Python's ``re`` takes seconds for ``a`` * 27 + ``b`` (each extra ``a`` doubles it)."""
BACKTRACKING_ANSWER = json.dumps({"a": "a" * 27 + "b"})
FENCE_FLOOD = "```\nx" * 20_000
"""100 KB of opening fences with no closing one: the old fence regex rescanned the rest of
the text from each (15 s; 400 KB took minutes)."""


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def exponential(levels: int) -> dict[str, Any]:
    """A schema with no loop whose check doubles per level (each level tries two branches
    that both lead to the next): bounded only by time."""
    defs: dict[str, Any] = {
        f"n{i}": {"anyOf": [{"$ref": f"#/$defs/n{i + 1}"}, {"$ref": f"#/$defs/n{i + 1}"}]}
        for i in range(levels)
    }
    defs[f"n{levels}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/n0"}


# -- the worker's other turns go on ----------------------------------------------------------


FENCES_HARNESS = """#!{python}
import json, sys
sys.stdin.read()
print(json.dumps({{"type": "complete", "text": {text!r}}}), flush=True)
"""


@pytest.fixture(scope="module")
def metrics_env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    env = make_env(tmp_path_factory.mktemp("regex"), redis_url)
    env.vars["HARNESS_METRICS_PORT"] = str(free_port())
    yield env
    env.close()


@pytest.fixture(scope="module")
def metrics_worker(metrics_env: Env) -> Iterator[WorkerProcess]:
    worker = start_worker(metrics_env)
    yield worker
    worker.stop()


class MetricsProbe:
    """GETs the worker's ``/metrics`` every 0.2 s from another thread: the longest answer."""

    def __init__(self, port: int) -> None:
        self.url, self.slowest, self.failures = f"http://127.0.0.1:{port}/metrics", 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60) as http:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    http.get(self.url).raise_for_status()
                except httpx.HTTPError:
                    self.failures += 1
                self.slowest = max(self.slowest, time.monotonic() - began)
                self._stop.wait(0.2)

    def __enter__(self) -> MetricsProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(70)


@pytest.mark.redis
@pytest.mark.celery
@pytest.mark.slow
@pytest.mark.parametrize("attack", ["backtracking-pattern", "fence-flood"])
def test_a_costly_schema_check_leaves_the_workers_other_turns_running(
    metrics_env: Env, metrics_worker: WorkerProcess, tmp_path: Path, attack: str
) -> None:
    client = metrics_env.client()
    with MetricsProbe(int(metrics_env.vars["HARNESS_METRICS_PORT"])) as probe:
        # The bystander: a turn streaming a line every 0.1 s for 8 s, on the same worker.
        bystander = client.start_run("stdio-json", "@stream 80 0.1", executable=DEMO)
        deadline = time.monotonic() + 30
        while not [e for e in client.events(bystander) if e.type == "assistant-text"]:
            assert time.monotonic() < deadline, "the bystander never started"
            time.sleep(0.05)
        if attack == "backtracking-pattern":
            attacker = client.start_run(
                "stdio-json",
                f"@complete {BACKTRACKING_ANSWER}",
                executable=DEMO,
                output_schema=PATHOLOGICAL,
            )
        else:
            script = tmp_path / "fences-harness"
            script.write_text(FENCES_HARNESS.format(python=sys.executable, text=FENCE_FLOOD))
            script.chmod(0o755)
            attacker = client.start_run(
                "stdio-json", "answer", executable=str(script), output_schema={"type": "object"}
            )
        attacked = client.wait(attacker, 1, timeout=120)
        finished = client.wait(bystander, 1, timeout=120)
    assert attacked.type == "session-error" and attacked.data["reason"] == "invalid-output"
    if attack == "backtracking-pattern":
        assert "does not match '^(a+)+$'" in attacked.data["error"]
    else:
        assert "holds no JSON value" in attacked.data["error"]
    assert finished.type == "turn-complete", finished.data
    stamps = [e.ts for e in client.events(bystander) if e.turn == 1 and e.type == "assistant-text"]
    assert len(stamps) >= 80
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    print(f"{attack}: bystander's longest gap {max(gaps):.2f} s, /metrics {probe.slowest:.2f} s")
    # Lines come every 0.1 s; the old check stopped every thread for 8 s (15 s for the fences).
    assert max(gaps) < 2.5, f"the bystander's events stopped for {max(gaps):.1f} s"
    assert probe.failures == 0 and probe.slowest < 2.5, f"/metrics took {probe.slowest:.1f} s"


# -- one answer's check, bounded -------------------------------------------------------------


def complete(text: str) -> TurnComplete:
    return TurnComplete(text=text)


def test_a_backtracking_pattern_is_matched_in_linear_time() -> None:
    began = time.monotonic()
    checked = structured.check(complete(json.dumps({"a": "a" * 10_000 + "b"})), PATHOLOGICAL)
    assert time.monotonic() - began < 5
    assert checked.type == "session-error" and checked.reason == "invalid-output"
    matching = structured.check(complete(json.dumps({"a": "a" * 10_000})), PATHOLOGICAL)
    assert matching.type == "turn-complete"


def test_an_answer_of_open_fences_is_read_in_linear_time() -> None:
    began = time.monotonic()
    checked = structured.check(complete(FENCE_FLOOD), {"type": "object"})
    assert time.monotonic() - began < 5
    assert checked.type == "session-error" and "holds no JSON value" in checked.error
    fenced = structured.check(complete('Here:\n```json\n{"ok": true}\n```'), {"type": "object"})
    assert isinstance(fenced, TurnComplete) and fenced.structured == {"ok": True}


def test_a_check_past_its_time_is_killed_and_the_answer_not_taken() -> None:
    began = time.monotonic()
    checked = structured.check(complete('"x"'), exponential(40), seconds=1.5)
    assert time.monotonic() - began < 10
    assert checked.type == "session-error" and checked.reason == "invalid-output"
    assert "took over 1.5 s" in checked.error


def test_a_self_referencing_schema_fails_the_turn_rather_than_the_worker() -> None:
    # A schema stored before the entry check refused it still ends as one terminal event.
    checked = structured.check(complete('{"a": 1}'), {"allOf": [{"$ref": "#"}]})
    assert checked.type == "session-error" and checked.reason == "invalid-output"


def test_a_deeply_nested_answer_fails_the_turn_rather_than_the_worker() -> None:
    schema = {"type": "array", "items": {"$ref": "#"}}
    checked = structured.check(complete("[" * 100_000 + "]" * 100_000), schema)
    assert checked.type == "session-error" and checked.reason == "invalid-output"
    deep = structured.check(complete("[" * 600 + "]" * 600), schema)
    assert deep.type == "session-error" and "nest too deep" in deep.error


class _Counting(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:
        type(self).hits.append(self.path)
        body = b'{"type": "object"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def schema_host() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    _Counting.hits = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_remote_reference_is_refused_and_never_fetched(schema_host: str) -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": f"{schema_host}/s.json"}}}
    with pytest.raises(InvalidInput, match="leads nowhere inside the schema"):
        check_output_schema(schema, 1 << 20)
    # Nor when a stored schema reaches the answer's check.
    checked = structured.check(complete('{"a": {}}'), schema)
    assert checked.type == "session-error" and checked.reason == "invalid-output"
    assert _Counting.hits == []


# -- refused where the schema is given -------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        (nested(300), "nested deeper than 64 levels"),
        ({"$ref": "#"}, "refers back to itself without descending"),
        ({"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"not": {"$ref": "#"}}}}, "$ref '#'"),
        ({"$ref": "http://169.254.169.254/latest/meta-data/"}, "other documents are never fetched"),
        ({"$ref": "file:///etc/shadow"}, "leads nowhere inside the schema"),
        ({"$id": "http://attacker.example/", "$ref": "s.json"}, "leads nowhere inside"),
        ({"$ref": "#/$defs/missing"}, "leads nowhere inside the schema"),
        ({"properties": {"a": {"pattern": "(a)\\1"}}}, "pattern '(a)\\\\1' (at /properties/a)"),
        ({"patternProperties": {"^(?=x)": {}}}, "RE2, the linear-time engine"),
        ({"pattern": "(?:[a-z]{500}){500}"}, "invalid repetition size"),
        (
            {"properties": {"a": {"$schema": "https://json-schema.org/draft/2020-12/schema"}}},
            "only its top may",
        ),
        (
            {"properties": {f"k{i}": {"pattern": f"^{i}$"} for i in range(MAX_PATTERNS + 1)}},
            f"over {MAX_PATTERNS} patterns",
        ),
    ],
    ids=[
        "nested-300",
        "self-ref",
        "ref-loop",
        "remote-ref",
        "file-ref",
        "relative-to-remote-id",
        "dangling-pointer",
        "backreference",
        "lookahead",
        "too-large",
        "nested-dialect",
        "too-many-patterns",
    ],
)
def test_a_schema_that_cannot_be_checked_in_bounds_is_refused(
    schema: dict[str, Any], says: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        check_output_schema(schema, 1 << 20)
    assert says in str(refused.value)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "items": {"$ref": "#"}},  # recursion through a part of the value
        {"$defs": {"name": {"type": "string", "pattern": "^[a-z]+$"}}, "$ref": "#/$defs/name"},
        {"$id": "https://example.com/s", "$defs": {"a": {}}, "$ref": "#/$defs/a"},
        {"$ref": "https://json-schema.org/draft/2020-12/schema"},  # a metaschema: held locally
        {"type": "object", "patternProperties": {"^x-[a-z]+$": {"type": "string"}}},
        nested(30),
    ],
)
def test_ordinary_schemas_are_still_taken(schema: dict[str, Any]) -> None:
    assert check_output_schema(schema, 1 << 20) == schema


def test_additional_properties_read_pattern_properties_through_re2() -> None:
    schema = {
        "type": "object",
        "patternProperties": {"^(a+)+$": {"type": "integer"}},
        "additionalProperties": False,
    }
    began = time.monotonic()
    checked = structured.check(complete(json.dumps({"a" * 40 + "b": 1})), schema)
    assert time.monotonic() - began < 5
    assert "does not match any of the regexes" in checked.error
    assert structured.check(complete('{"aaa": 1}'), schema).type == "turn-complete"


# -- the command line reads a schema file with a bound ----------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "HARNESS_REDIS_URL": "redis://127.0.0.1:1/0"},
    )


def test_the_command_line_refuses_a_schema_that_is_not_a_bounded_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.json"
    with huge.open("wb") as out:
        out.truncate(64 << 20)  # sparse: 64 MiB without writing them
    for path, says in [
        ("/dev/zero", "is not a regular file"),
        (str(fifo), "is not a regular file"),
        (str(tmp_path), "is not a regular file"),
        (str(huge), "is over 1048576 bytes"),
        (str(tmp_path / "missing.json"), "No such file or directory"),
    ]:
        began = time.monotonic()
        done = cli("run", "stdio-json", "hi", "--output-schema", path)
        assert time.monotonic() - began < 20
        assert done.returncode == 2, (path, done.stderr)
        assert says in done.stderr and "Traceback" not in done.stderr, done.stderr


# -- budgets are bounded as run options are ---------------------------------------------------


def test_a_budget_change_is_bounded_as_the_run_options_are() -> None:
    settings_ = budgets_settings()
    for name, value in [
        ("max_turns", 10**40),
        ("max_tokens", 10**22),
        ("max_cost_usd", 1e40),
        ("max_cost_usd", float("inf")),
        ("max_wall_s", 1e300),
    ]:
        with pytest.raises(InvalidInput, match=f"{name}: must be at most"):
            budgets.check({name: value}, settings_)
    assert budgets.check({"max_turns": 1_000_000}, settings_) == {"max_turns": 1_000_000}


def budgets_settings() -> Any:
    from config import Settings

    return Settings(_env_file=None)  # type: ignore[call-arg]


@pytest.mark.redis
@pytest.mark.celery
def test_the_api_and_the_command_line_refuse_a_budget_of_1e40(
    api: ApiProcess,  # noqa: F811
    api_env: Env,  # noqa: F811
) -> None:
    with api.client("acme") as http:
        made = http.post(
            "/v1/runs", json={"harness": "stdio-json", "input": "hi", "executable": DEMO}
        )
        assert made.status_code == 201, made.text
        run_id = made.json()["run_id"]
        for body in (
            {"max_turns": 10**40},
            {"max_turns": 1e40},
            {"max_cost_usd": 1e40},
            {"max_tokens": 10**22},
            {"max_wall_s": 1e300},
        ):
            refused = http.patch(f"/v1/runs/{run_id}/budget", json=body)
            assert refused.status_code == 422, (body, refused.status_code, refused.text)
            assert refused.json()["error"]["path"] == f"body.{next(iter(body))}"
        budget = http.patch(f"/v1/runs/{run_id}/budget", json={}).json()["budget"]
    assert all(value is None or value <= 10**12 for value in budget.values()), budget
    env = {**os.environ, **api_env.vars}
    for flag, value in [
        ("--max-cost-usd", "1e40"),
        ("--max-tokens", str(10**22)),
        ("--max-turns", "1e40"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "worker.cli", "budget", run_id, flag, value],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert done.returncode == 2, (flag, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr


@pytest.mark.redis
@pytest.mark.celery
def test_the_api_refuses_an_unbounded_schema_with_a_4xx(api: ApiProcess) -> None:  # noqa: F811
    with api.client("acme") as http:
        for schema in (nested(300), {"$ref": "#"}, {"$ref": "http://127.0.0.1:1/x"}):
            body = {"harness": "stdio-json", "input": "hi", "executable": DEMO}
            refused = http.post("/v1/runs", json={**body, "output_schema": schema})
            assert 400 <= refused.status_code < 500, refused.text
            assert refused.headers["content-type"].startswith("application/json")


# -- --allow and --deny globs ----------------------------------------------------------------


def test_a_deny_glob_against_a_long_command_does_not_hold_the_gil() -> None:
    glob = "Bash(*" + "a" * 490 + "b)"
    ask = Ask(native_id=1, tool="Bash", input={}, command="a" * (4 << 20))
    longest, stop = [0.0], threading.Event()

    def tick() -> None:
        last = time.monotonic()
        while not stop.is_set():
            time.sleep(0.005)
            now = time.monotonic()
            longest[0] = max(longest[0], now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        time.sleep(0.05)
        began = time.monotonic()
        for _ in range(5):
            assert rules.first_match([glob], ask) is None
        took = time.monotonic() - began
    finally:
        stop.set()
        ticker.join()
    # fnmatch held the GIL for about 2 s per call here.
    assert longest[0] < 0.5, f"another thread waited {longest[0]:.2f} s"
    # Nor does the glob's worker thread burn the CPU: an RE2 whose DFA outgrew a 1 MiB
    # budget fell back to its NFA from the second call on, 30-40 s a call here.
    assert took < 10, f"5 matches took {took:.1f} s"


_GLOB_CHARS = st.sampled_from(list("ab-!]^[*?\\&|~ z\né"))


@settings(max_examples=3000, deadline=None)
@given(st.text(_GLOB_CHARS, max_size=10), st.text(_GLOB_CHARS, max_size=8))
def test_a_glob_matches_what_fnmatch_matches(glob: str, subject: str) -> None:
    ask = Ask(native_id=1, tool="Bash", input={}, command=subject or "x")
    expected = fnmatch.fnmatchcase(subject or "x", glob.strip()) if glob.strip() else True
    if glob.strip().endswith(":*"):
        return  # Claude Code's PREFIX:* form, checked by the rule tests
    assert rules.matches(f"Bash({glob})", ask) is expected


def test_a_run_takes_at_most_max_rules_patterns() -> None:
    with pytest.raises(InvalidInput, match=f"at most {MAX_RULES} patterns"):
        parse_options(harness="stdio-json", deny=tuple(f"Bash(x{i})" for i in range(MAX_RULES + 1)))
    assert parse_options(harness="stdio-json", deny=("Bash(rm *)",)).deny == ("Bash(rm *)",)
