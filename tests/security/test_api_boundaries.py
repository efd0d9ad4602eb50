"""The HTTP API's clients stay within their own bounds: one client's event id, key, stream
count or wrong guesses never reach another's streams; a revoked key's stream ends; Redis
away is a 503; every response forbids framing and sniffing; each request leaves a log line.

Against real ``harness api`` processes (the CLI), a real worker and Redis; the run page in a
real headless Chromium.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.private_redis import PrivateRedis
from tests.conftest import ROOT
from tests.integration.api_server import ApiProcess, start_api
from tests.integration.conftest import DEMO, Env, WorkerProcess, make_env, start_worker
from tests.integration.test_api import start, wait_terminal
from tests.integration.test_api_page import Page, chromium  # noqa: F401 -- a fixture
from worker.api import tenants
from worker.errors import InvalidInput
from worker.options.spec import new_run_id
from worker.store.listing import encode_cursor

pytestmark = [pytest.mark.redis, pytest.mark.celery]

BEYOND = "1-99999999999999999999"
"""Two whole numbers, the second past 2**64 - 1: Redis refuses it as a stream id."""
LARGEST = "18446744073709551615-18446744073709551615"
TERMINAL = ("turn-complete", "session-error")


def start_harness_api(env: Env, name: str = "api", **overrides: str) -> ApiProcess:
    """``harness api`` (the Procfile's command) for ``env``, logging JSON; ready when it
    returns."""
    tenants_file = overrides.pop("HARNESS_TENANTS_FILE", str(env.tmp / f"{name}-tenants.json"))
    defaults = {"HARNESS_LOG_FORMAT": "json", "HARNESS_API_STREAMS_PER_TENANT": "50"}
    return start_api(
        env, name, procfile=True, HARNESS_TENANTS_FILE=tenants_file, **{**defaults, **overrides}
    )


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    e = make_env(
        tmp_path_factory.mktemp("boundaries"),
        redis_url,
        HARNESS_API_KEEPALIVE_S="0.5",
        HARNESS_PERMISSION_TIMEOUT_S="60",
    )
    yield e
    e.close()


@pytest.fixture(scope="module")
def worker(env: Env) -> Iterator[WorkerProcess]:
    started = start_worker(env)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def served(env: Env, worker: WorkerProcess) -> Iterator[ApiProcess]:
    api = start_harness_api(env)
    api.add_tenant("acme")
    api.add_tenant("other")
    yield api
    api.stop()


def _messages(text: str) -> list[dict[str, Any]]:
    found = []
    for block in text.split("\n\n"):
        message: dict[str, Any] = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                message["comment"] = line[1:].strip()
            elif line:
                name, _, value = line.partition(": ")
                message[name] = value
        if message:
            found.append(message)
    return found


async def read_stream(
    http: httpx.AsyncClient,
    path: str,
    *,
    until: Any = lambda m: m.get("event") in TERMINAL,
    timeout: float = 30,
    **kwargs: Any,
) -> tuple[int, list[tuple[float, dict[str, Any]]], bool]:
    """The status, each message with the time it arrived, and whether the stream ended by
    itself (False: ``until`` matched, or ``timeout`` passed)."""
    got: list[tuple[float, dict[str, Any]]] = []
    async with http.stream("GET", path, **kwargs) as response:
        if response.status_code != 200:
            await response.aread()
            return response.status_code, [(time.monotonic(), response.json())], True
        buffer = ""
        try:
            async with asyncio.timeout(timeout):
                async for chunk in response.aiter_text():
                    buffer += chunk
                    *done, buffer = buffer.split("\n\n")
                    for message in _messages("\n\n".join(done)):
                        got.append((time.monotonic(), message))
                        if until(message):
                            return 200, got, False
        except TimeoutError:
            return 200, got, False
        return 200, got, True


def _client(api: ApiProcess, tenant: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=api.url,
        headers={"Authorization": f"Bearer {api.keys[tenant]}"},
        timeout=httpx.Timeout(60, connect=10),
    )


def _listed(api: ApiProcess, tenant: str, run_id: str) -> list[str]:
    with api.client(tenant) as http:
        return [e["id"] for e in http.get(f"/v1/runs/{run_id}/events").json()]


# -- one event id, every entry point -------------------------------------------------------


def test_an_event_id_redis_refuses_is_a_400_and_other_tenants_streams_go_on(
    served: ApiProcess,
) -> None:
    with served.client("acme") as http:
        watched = start(http, "@sleep 1\n@stream 60 0.1\n@complete watched")
    with served.client("other") as http:
        own = start(http, "@sleep 20\n@complete own")
    texts = asyncio.Event()
    statuses: list[int] = []

    async def watch() -> list[tuple[float, dict[str, Any]]]:
        async with _client(served, "acme") as http:

            def until(message: dict[str, Any]) -> bool:
                if message.get("event") == "assistant-text":
                    texts.set()
                return message.get("event") in TERMINAL

            _, got, _ = await read_stream(http, f"/v1/runs/{watched}/events/stream", until=until)
            return got

    async def attack() -> tuple[float, float]:
        await asyncio.wait_for(texts.wait(), 30)
        began = time.monotonic()
        async with _client(served, "other") as http:
            while time.monotonic() < began + 3:
                path = f"/v1/runs/{own}/events/stream"
                async with http.stream("GET", path, headers={"Last-Event-ID": BEYOND}) as r:
                    statuses.append(r.status_code)
                    if r.status_code == 200:  # the stream held open meanwhile
                        await asyncio.sleep(began + 3 - time.monotonic())
                    else:
                        await r.aread()
                await asyncio.sleep(0.05)
        return began, time.monotonic()

    async def scenario() -> tuple[list[tuple[float, dict[str, Any]]], tuple[float, float]]:
        return await asyncio.gather(watch(), attack())

    got, (began, ended) = asyncio.run(scenario())
    ids = [m["id"] for _, m in got if "id" in m]
    assert ids == _listed(served, "acme", watched)  # every event, in order, once
    arrivals = [at for at, m in got if m.get("event") == "assistant-text"]
    during = [at for at in arrivals if began - 0.5 <= at <= ended + 0.5]
    gaps = [b - a for a, b in itertools.pairwise(during)]
    assert during and max(gaps, default=0) < 1.5, f"tenant A's stream stalled: {gaps}"
    assert statuses and set(statuses) == {400}, statuses
    with served.client("other") as http:
        listed = http.get(f"/v1/runs/{own}/events", params={"after": BEYOND})
        assert listed.status_code == 400, listed.text
        assert listed.json()["error"]["type"] == "invalid_input"
        http.post(f"/v1/runs/{own}/cancel")


@pytest.mark.parametrize(
    "bad",
    [
        BEYOND,
        "18446744073709551616-0",
        "nan",
        "-1-0",
        "1--1",
        " 1-0",
        "1-0 ",
        "1",
        "1-",
        "+1-0",
        "0x1-0",
        "\u0661-\u0660",  # Arabic-Indic digits: Python's int() takes them, Redis does not
    ],
)
def test_an_event_id_is_checked_alike_at_every_entry_point(served: ApiProcess, bad: str) -> None:
    with served.client("acme") as http:
        run_id = start(http, "@complete ids")
        wait_terminal(http, run_id, 1)
        path = f"/v1/runs/{run_id}"
        answers = [
            http.get(f"{path}/events", params={"after": bad}),
            http.get(f"{path}/events/stream", params={"after": bad}),
        ]
        if bad.isascii() and bad == bad.strip():  # a header: ASCII, its edges' spaces dropped
            answers.append(http.get(f"{path}/events/stream", headers={"Last-Event-ID": bad}))
        for answer in answers:
            assert answer.status_code == 400, (answer.request.url, answer.text)
            error = answer.json()["error"]
            assert error["type"] == "invalid_input" and "TURN-SEQ" in error["message"]
        top = http.get(f"{path}/events", params={"after": LARGEST})
        assert top.status_code == 200 and top.json() == []


def test_the_client_and_the_cli_refuse_an_event_id_redis_refuses(
    served: ApiProcess, env: Env
) -> None:
    with served.client("acme") as http:
        run_id = start(http, "@complete cli")
        wait_terminal(http, run_id, 1)
    client = env.client()
    with pytest.raises(InvalidInput, match="TURN-SEQ"):
        list(client.events(run_id, after=BEYOND))
    with pytest.raises(InvalidInput, match="TURN-SEQ"):
        next(client.follow(run_id, 1, after=BEYOND))
    assert list(client.events(run_id, after=LARGEST)) == []
    for follow in ((), ("--follow",)):
        done = subprocess.run(
            [sys.executable, "-m", "worker.cli", "events", run_id, "--after", BEYOND, *follow],
            cwd=ROOT,
            env={**os.environ, **env.vars},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert "invalid event id" in done.stderr and "Traceback" not in done.stderr


def test_a_stream_key_redis_refuses_ends_its_own_streams_only(served: ApiProcess, env: Env) -> None:
    with served.client("other") as http:
        broken = start(http, "@complete soon broken")
        wait_terminal(http, broken, 1)  # idle: its stream stays open, nothing more written
    with served.client("acme") as http:
        watched = start(http, "@sleep 1\n@stream 50 0.1\n@complete watched")
    r = env.redis()
    key, kept = env.keys.events(broken), env.keys.events(broken) + ":kept"
    opened, texts = asyncio.Event(), asyncio.Event()

    async def victim() -> tuple[bool, float]:
        async with _client(served, "other") as http:

            def until(message: dict[str, Any]) -> bool:
                if message.get("event") in TERMINAL:
                    opened.set()
                return False

            _, _, ended = await read_stream(
                http, f"/v1/runs/{broken}/events/stream", until=until, timeout=20
            )
            return ended, time.monotonic()

    async def watch() -> list[tuple[float, dict[str, Any]]]:
        async with _client(served, "acme") as http:

            def until(message: dict[str, Any]) -> bool:
                if message.get("event") == "assistant-text":
                    texts.set()
                return message.get("event") in TERMINAL

            path = f"/v1/runs/{watched}/events/stream"
            _, got, _ = await read_stream(http, path, until=until, timeout=30)
            return got

    async def corrupt() -> float:
        await asyncio.wait_for(opened.wait(), 30)
        await asyncio.wait_for(texts.wait(), 30)
        r.rename(key, kept)
        r.set(key, "not a stream")  # XREAD on it: WRONGTYPE, a reply error for this key alone
        return time.monotonic()

    async def scenario() -> Any:
        return await asyncio.gather(victim(), watch(), corrupt())

    try:
        (ended, ended_at), got, broke_at = asyncio.run(scenario())
    finally:
        r.delete(key)
        if r.exists(kept):
            r.rename(kept, key)
    assert ended and ended_at - broke_at < 5, "the broken run's stream did not end"
    ids = [m["id"] for _, m in got if "id" in m]
    assert ids == _listed(served, "acme", watched)
    after = [at for at, m in got if m.get("event") == "assistant-text" and at > broke_at]
    assert after, "tenant A got nothing once another run's key broke"
    gaps = [b - a for a, b in itertools.pairwise([broke_at, *after])]
    assert max(gaps) < 1.5, gaps
    assert "sse.stream_failed" in served.logs()


# -- keys and limits ------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["tenant", "key"])
def test_a_revoked_key_s_open_stream_ends_within_seconds(served: ApiProcess, how: str) -> None:
    name = f"leaving-{how}"
    served.add_tenant(name)
    with served.client(name) as http:
        run_id = start(http, "@sleep 15\n@complete too late")
    opened = asyncio.Event()

    async def listen() -> tuple[bool, float, list[dict[str, Any]]]:
        async with _client(served, name) as http:

            def until(message: dict[str, Any]) -> bool:
                if message.get("event") == "turn-started":
                    opened.set()
                return False

            _, got, ended = await read_stream(
                http, f"/v1/runs/{run_id}/events/stream", until=until, timeout=12
            )
            return ended, time.monotonic(), [m for _, m in got]

    async def revoke() -> float:
        await asyncio.wait_for(opened.wait(), 30)
        if how == "tenant":
            tenants.revoke(served.tenants_file, name)
        else:
            (key,) = tenants.read_tenants(served.tenants_file)[name].keys
            tenants.revoke(served.tenants_file, name, key.id)
        return time.monotonic()

    async def scenario() -> Any:
        return await asyncio.gather(listen(), revoke())

    (ended, ended_at, messages), revoked_at = asyncio.run(scenario())
    assert ended, "the revoked key's stream kept streaming"
    assert ended_at - revoked_at < 5
    assert not any(m.get("event") in TERMINAL for m in messages)
    with served.client(name) as http:
        assert http.get(f"/v1/runs/{run_id}/events/stream").status_code == 401


def test_one_tenant_holds_at_most_its_share_of_streams(env: Env, worker: WorkerProcess) -> None:
    api = start_harness_api(env, "capped", HARNESS_API_STREAMS_PER_TENANT="2")
    try:
        api.add_tenant("greedy")
        api.add_tenant("neighbour")
        with api.client("greedy") as http:
            run_id = start(http, "@sleep 20\n@complete held")
        with api.client("neighbour") as http:
            theirs = start(http, "@sleep 20\n@complete theirs")
        path = f"/v1/runs/{run_id}/events/stream"
        with api.client("greedy") as first, api.client("greedy") as second:
            with first.stream("GET", path) as one, second.stream("GET", path) as two:
                assert one.status_code == two.status_code == 200
                with api.client("greedy") as extra, extra.stream("GET", path) as third:
                    assert third.status_code == 429  # read no further: a 200 would stream on
                    third.read()
                assert third.json()["error"]["type"] == "too_many_streams"
                assert int(third.headers["Retry-After"]) > 0
                theirs_path = f"/v1/runs/{theirs}/events/stream"
                with api.client("neighbour") as other, other.stream("GET", theirs_path) as own:
                    assert own.status_code == 200
            deadline = time.monotonic() + 10  # both closed: the slots come back
            while True:
                with api.client("greedy") as again, again.stream("GET", path) as reopened:
                    if reopened.status_code == 200:
                        break
                assert time.monotonic() < deadline, "the closed streams' slots never came back"
                time.sleep(0.2)
        for tenant, run in (("greedy", run_id), ("neighbour", theirs)):
            with api.client(tenant) as http:
                http.post(f"/v1/runs/{run}/cancel")
    finally:
        api.stop()


@pytest.fixture(scope="module")
def five_streams(env: Env, worker: WorkerProcess) -> Iterator[ApiProcess]:
    """A ``harness api`` whose tenants hold at most 5 event streams each."""
    api = start_harness_api(env, "five", HARNESS_API_STREAMS_PER_TENANT="5")
    yield api
    api.stop()


async def _statuses_at_once(api: ApiProcess, tenant: str, path: str, count: int) -> list[int]:
    """``count`` streams of ``path`` opened at once, each on its connection: the statuses
    they answered, taken while all of them are open (the admitted ones close after)."""
    async with _client(api, tenant) as http:  # up to 100 connections at once
        requests = [http.build_request("GET", path) for _ in range(count)]
        answers = await asyncio.gather(*(http.send(r, stream=True) for r in requests))
        try:
            return [answer.status_code for answer in answers]
        finally:
            for answer in answers:
                await answer.aclose()


def _all_slots_free(api: ApiProcess, tenant: str, path: str) -> None:
    """The tenant's 5 slots come back (within seconds: a closed stream is noticed at its
    next keep-alive) and not one more: 5 open at once, a sixth is refused."""
    deadline = time.monotonic() + 10
    while asyncio.run(_statuses_at_once(api, tenant, path, 5)) != [200] * 5:
        assert time.monotonic() < deadline, "the closed streams' slots never came back"
        time.sleep(0.2)

    async def five_and_one() -> tuple[list[int], int]:
        async with _client(api, tenant) as http:
            held = [await http.send(http.build_request("GET", path), stream=True) for _ in range(5)]
            try:
                async with http.stream("GET", path) as sixth:
                    return [h.status_code for h in held], sixth.status_code
            finally:
                for answer in held:
                    await answer.aclose()

    assert asyncio.run(five_and_one()) == ([200] * 5, 429)


def test_streams_opened_at_once_get_exactly_the_tenant_s_share(five_streams: ApiProcess) -> None:
    five_streams.add_tenant("racer")
    with five_streams.client("racer") as http:
        run_id = start(http, "@sleep 30\n@complete held")
    path = f"/v1/runs/{run_id}/events/stream"
    try:
        statuses = asyncio.run(_statuses_at_once(five_streams, "racer", path, 20))
        assert sorted(statuses) == [200] * 5 + [429] * 15, statuses
        _all_slots_free(five_streams, "racer", path)
    finally:
        with five_streams.client("racer") as http:
            http.post(f"/v1/runs/{run_id}/cancel")


def test_streams_that_ended_with_their_run_give_their_slots_back(
    five_streams: ApiProcess,
) -> None:
    five_streams.add_tenant("finisher")
    with five_streams.client("finisher") as http:
        run_id = start(http, "@complete done")
        wait_terminal(http, run_id, 1)
        assert http.delete(f"/v1/runs/{run_id}", params={"wait": 30}).status_code == 200
    path = f"/v1/runs/{run_id}/events/stream"

    async def read_all_at_once() -> list[tuple[int, bool]]:
        async with _client(five_streams, "finisher") as http:
            read = await asyncio.gather(
                *(read_stream(http, path, until=lambda _: False) for _ in range(5))
            )
        return [(status, ended) for status, _, ended in read]

    assert asyncio.run(read_all_at_once()) == [(200, True)] * 5
    _all_slots_free(five_streams, "finisher", path)


def test_a_stream_whose_client_left_before_its_answer_gives_its_slot_back(
    five_streams: ApiProcess,
) -> None:
    """Each client closes its connection as soon as its request is sent: the slot the route
    took for it comes back once the server sees it gone."""
    key = five_streams.add_tenant("leaver")
    with five_streams.client("leaver") as http:
        run_id = start(http, "@sleep 30\n@complete held")
    path = f"/v1/runs/{run_id}/events/stream"
    host, port = five_streams.url.removeprefix("http://").split(":")
    request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n\r\n"

    def answered() -> int:
        lines = [json.loads(x) for x in five_streams.logs().splitlines() if x.startswith("{")]
        return sum(x.get("event") == "api.request" and x.get("path") == path for x in lines)

    try:
        for _ in range(10):
            with socket.create_connection((host, int(port))) as gone:
                gone.sendall(request.encode())
        deadline = time.monotonic() + 10
        while answered() < 10:  # every one of them handled before the slots are counted
            assert time.monotonic() < deadline, f"{answered()} of 10 requests handled"
            time.sleep(0.1)
        _all_slots_free(five_streams, "leaver", path)
    finally:
        with five_streams.client("leaver") as http:
            http.post(f"/v1/runs/{run_id}/cancel")


def test_wrong_keys_from_one_address_are_refused_after_a_few(
    tmp_path: Path, redis_url: str
) -> None:
    own = make_env(tmp_path, redis_url)  # its own prefix: the counts are this test's alone
    api = start_harness_api(own, "guessed", HARNESS_API_FAILED_AUTH_LIMIT="3")
    try:
        api.add_tenant("acme")
        with httpx.Client(base_url=api.url, timeout=30) as http:
            for n in range(3):
                wrong = http.get("/v1/runs", headers={"Authorization": f"Bearer hk_guess{n}"})
                assert wrong.status_code == 401, wrong.text
            refused = http.get("/v1/runs", headers={"Authorization": "Bearer hk_guess9"})
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["type"] == "rate_limited"
            assert 0 < int(refused.headers["Retry-After"]) <= 61
            right = {"Authorization": f"Bearer {api.keys['acme']}"}
            assert http.get("/v1/runs", headers=right).status_code == 429  # a hit: no answer
            for path in (f"/v1/runs/{new_run_id()}", f"/v1/runs/{new_run_id()}/events/stream"):
                assert http.get(path, headers=right).status_code == 429, path  # nor of a run
            assert http.get("/v1/runs").status_code == 401  # no key: nothing guessed
    finally:
        api.stop()


def test_a_run_record_redis_refuses_answers_nothing_before_the_key_is_checked(
    served: ApiProcess, env: Env
) -> None:
    """The run's owner is read with the wrong-key count, before the key is checked: a record
    Redis refuses to read as one (WRONGTYPE) must still leave a wrong key a plain 401."""
    run_id = new_run_id()
    r = env.redis()
    r.set(env.keys.run(run_id), "not a hash")
    try:
        wrong = {"Authorization": "Bearer hk_not-a-key"}
        with httpx.Client(base_url=served.url, timeout=30) as http:
            for path in (f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/events/stream"):
                answer = http.get(path, headers=wrong)
                assert answer.status_code == 401, (path, answer.text)
    finally:
        r.delete(env.keys.run(run_id))


@pytest.mark.parametrize("limits", ["on", "off"])
def test_redis_away_is_a_503_with_retry_after_on_every_route(
    tmp_path: Path, private_redis: PrivateRedis, limits: str
) -> None:
    away = make_env(tmp_path, private_redis.url)
    off = {"HARNESS_API_RATE_LIMIT": "0", "HARNESS_API_FAILED_AUTH_LIMIT": "0"}
    api = start_harness_api(away, "away", **(off if limits == "off" else {}))
    try:
        api.add_tenant("acme")
        with api.client("acme") as http:
            assert http.get("/v1/runs").status_code == 200
            private_redis.stop()
            run = f"/v1/runs/{new_run_id()}"
            requests = [
                ("GET", "/v1/runs", None),
                ("POST", "/v1/runs", {"harness": "stdio-json", "executable": DEMO, "input": "x"}),
                ("GET", run, None),
                ("GET", f"{run}/events", None),
                ("GET", f"{run}/events/stream", None),
                ("POST", f"{run}/cancel", None),
                ("DELETE", run, None),
            ]
            for method, path, body in requests:
                answer = http.request(method, path, json=body)
                assert answer.status_code == 503, (method, path, answer.text)
                assert answer.json()["error"]["type"] == "unavailable"
                assert int(answer.headers["Retry-After"]) > 0
                assert str(private_redis.port) not in answer.text
            private_redis.start()
            deadline = time.monotonic() + 10
            while http.get("/v1/runs").status_code != 200:
                assert time.monotonic() < deadline, "the API did not come back with Redis"
                time.sleep(0.2)
        assert "Traceback" not in api.logs()
    finally:
        api.stop()


# -- small inputs ---------------------------------------------------------------------------


@pytest.mark.parametrize("score", [math.nan, math.inf, -math.inf])
def test_a_cursor_that_is_no_number_is_a_400(served: ApiProcess, score: float) -> None:
    cursors = [encode_cursor(score, new_run_id()), base64.urlsafe_b64encode(b"nan").decode()]
    with served.client("acme") as http:
        for cursor in cursors:
            answer = http.get("/v1/runs", params={"cursor": cursor})
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["type"] == "invalid_input"


@pytest.mark.parametrize("name", ["..", ".", "../../x.txt", "a/../../..", ".hidden"])
def test_an_attachment_name_stays_a_file_name_of_the_upload(served: ApiProcess, name: str) -> None:
    run = {"harness": "stdio-json", "executable": DEMO, "input": "@attachments\n@complete listed"}
    with served.client("acme") as http:
        created = http.post(
            "/v1/runs",
            files=[
                ("run", (None, json.dumps(run), "application/json")),
                ("attachment", (name, b"attached bytes\n", "text/plain")),
            ],
        )
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        wait_terminal(http, run_id, 1)
        texts = [
            e["data"]["text"]
            for e in http.get(f"/v1/runs/{run_id}/events").json()
            if e["type"] == "assistant-text"
        ]
    (line,) = [t for t in texts if ".attachments/turn-1/" in t]
    shown = line.split()[0].rsplit("/", 1)[-1]
    assert shown and not shown.startswith(".") and "/" not in shown and shown != ".."


def test_every_response_forbids_framing_and_sniffing(served: ApiProcess) -> None:
    with served.client("acme") as http:
        run_id = start(http, "@complete headers")
        answers = [
            httpx.get(f"{served.url}/runs/{run_id}"),  # the run page
            http.get("/v1/runs"),
            http.get(f"/v1/runs/{new_run_id()}"),  # 404
            httpx.get(f"{served.url}/v1/runs"),  # 401
            http.get("/v1/runs", params={"limit": "x"}),  # 422
            httpx.get(f"{served.url}/v1/healthz"),
            httpx.get(f"{served.url}/openapi.json"),
        ]
        with http.stream("GET", f"/v1/runs/{run_id}/events/stream") as streamed:
            answers.append(streamed)
    for answer in answers:
        where = f"{answer.request.method} {answer.request.url.path} {answer.status_code}"
        assert answer.headers.get("x-frame-options") == "DENY", where
        assert answer.headers.get("x-content-type-options") == "nosniff", where
        assert "frame-ancestors 'none'" in answer.headers.get("content-security-policy", ""), where
    with socket.create_connection(("127.0.0.1", int(served.url.rsplit(":", 1)[1]))) as raw:
        raw.sendall(b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n")
        head = raw.recv(65536).decode().lower()
    assert head.startswith("http/1.1 413") and "x-frame-options: deny" in head, head
    assert "x-content-type-options: nosniff" in head and "frame-ancestors 'none'" in head
    page = answers[0].headers["content-security-policy"]
    assert "connect-src 'self'" in page and "script-src 'self'" in page
    assert "unsafe-inline" not in page  # the pages' scripts are files the app serves


def test_harness_api_logs_each_request_without_its_secrets(served: ApiProcess) -> None:
    secret_query = "team=query-secret-value"
    with served.client("acme") as http:
        run_id = start(http, "@complete logged")
        assert http.get("/v1/runs", params={"label": secret_query}).status_code == 200
        headers = {"Last-Event-ID": BEYOND}
        with http.stream("GET", f"/v1/runs/{run_id}/events/stream", headers=headers) as bad:
            assert bad.status_code == 400
    path = f"/v1/runs/{run_id}/events/stream"
    deadline = time.monotonic() + 5
    while True:
        lines = [json.loads(x) for x in served.logs().splitlines() if x.startswith("{")]
        requests = [x for x in lines if x.get("event") == "api.request"]
        logged = [x for x in requests if x.get("path") == path and x.get("status") == 400]
        if logged or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert logged, f"no line for the refused stream among {len(requests)} request lines"
    (line,) = logged
    assert line["level"] == "info" and line["method"] == "GET" and line["tenant"] == "acme"
    assert line["duration_ms"] >= 0 and line["client"] == "127.0.0.1"
    text = served.logs()
    assert "query-secret-value" not in text
    for key in served.keys.values():
        assert key not in text


# -- the run page ---------------------------------------------------------------------------


@pytest.mark.slow
def test_the_run_page_shows_why_a_turn_failed_and_its_tool_calls(
    served: ApiProcess,
    env: Env,
    chromium: str,  # noqa: F811
) -> None:
    import websockets

    with served.client("acme") as http:
        run_id = start(http, "@error the model said no")
        wait_terminal(http, run_id, 1)
        url = http.post(f"/v1/runs/{run_id}/links", json={}).json()["url"]
    # A tool call as the worker publishes one (docs/events.md), after the failed turn: the
    # run is idle, so its stream stays open and the page shows what comes.
    r = env.redis()
    call = {"call_id": "c1", "server": "orders", "tool": "lookup", "input": '{"id": 7}'}
    call["input_chars"] = 9
    result = {"call_id": "c1", "ok": True, "output": "shipped", "output_chars": 7}
    result["duration_ms"] = 12

    async def scenario() -> str:
        async with websockets.connect(chromium, max_size=2**26) as socket:
            page = Page(socket)
            await page.call("Page.enable")
            await page.call("Page.navigate", url=url)
            events = "document.querySelector('#events').innerText"
            await page.until(f"{events}.includes('the model said no')")
            for seq, (kind, data) in enumerate((("tool-call", call), ("tool-result", result))):
                fields = {"type": kind, "data": json.dumps(data), "ts": str(time.time())}
                r.xadd(env.keys.events(run_id), fields, id=f"1-{900 + seq}")
            await page.until(f"{events}.includes('shipped')")
            text: str = await page.evaluate(events)
            return text

    text = asyncio.run(scenario())
    assert "undefined" not in text
    assert "harness-error: the model said no" in text
    assert "orders.lookup" in text and '{"id": 7}' in text
    assert "tool result (ok, 12 ms): shipped" in text
