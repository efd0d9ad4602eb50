"""Run page links (``POST /v1/runs/{id}/links``) against a real ``harness api``: a link opens
its run's page, record and stream without the tenant's API key, and nothing else of the
tenant's (another run, the tenant's other routes, a read link's answers); it expires, and
deleting it or revoking the key that made it ends it at once, its open stream included. The
page itself in a real headless Chromium."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.api_server import ApiProcess, api, api_env, api_worker  # noqa: F401
from tests.integration.test_api import start, wait_pending, wait_terminal
from tests.integration.test_api_page import Page, chromium  # noqa: F401
from tests.integration.test_api_sse import is_terminal, parse, read_until
from worker.api import tenants

pytestmark = [pytest.mark.redis, pytest.mark.celery]

LONG_TURN = "@text begun\n@stream 300 0.1\n@complete done"


def link(http: httpx.Client, run_id: str, **body: object) -> dict:
    response = http.post(f"/v1/runs/{run_id}/links", json=body)
    assert response.status_code == 201, response.text
    made: dict = response.json()
    return made


def token_of(made: dict) -> str:
    fragment = made["path"].split("#", 1)[1]
    return dict(p.split("=", 1) for p in fragment.split("&"))["link"]


def bearer(api: ApiProcess, token: str) -> httpx.Client:  # noqa: F811
    return httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def stream_ends(response: httpx.Response, within_s: float) -> list[dict]:
    """The stream's messages until it closes; fails if it outlives ``within_s``."""
    seen: list[dict] = []
    buffer = ""
    deadline = time.monotonic() + within_s
    for chunk in response.iter_text():
        buffer += chunk
        *done, buffer = buffer.split("\n\n")
        for block in done:
            seen += parse(block + "\n\n")
        assert time.monotonic() < deadline, "the stream is still open"
    return seen


def test_a_link_opens_its_run_without_the_key_and_never_carries_it(
    api: ApiProcess,  # noqa: F811
) -> None:
    key = api.keys["acme"]
    with api.client("acme") as http:
        run_id = start(http, "@text linked\n@complete linked")
        wait_terminal(http, run_id, 1)
        made = link(http, run_id, mode="read", ttl_s=60)
    assert key not in str(made) and key[3:20] not in str(made)
    assert made["path"].startswith(f"/runs/{run_id}#link=hl_")
    assert made["url"] == api.url + made["path"]
    assert made["mode"] == "read" and made["expires_at"] > time.time() + 50
    token = token_of(made)
    with bearer(api, token) as page_http:
        assert page_http.get(f"/v1/runs/{run_id}").json()["run_id"] == run_id
        assert page_http.get(f"/v1/runs/{run_id}/permissions").status_code == 200
        with page_http.stream("GET", f"/v1/runs/{run_id}/events/stream") as response:
            assert response.status_code == 200
            events = [m for m in read_until(response, is_terminal, 30) if "event" in m]
        assert is_terminal(events[-1]) and events[-1]["data"].count("linked")
    page = httpx.get(f"{api.url}/runs/{run_id}")
    assert page.status_code == 200 and key not in page.text and "prompt(" not in page.text


def test_a_link_is_refused_for_another_run_and_every_other_route_of_its_tenant(
    api: ApiProcess,  # noqa: F811
) -> None:
    with api.client("acme") as http:
        run_id = start(http, "@text mine\n@complete mine")
        other_run = start(http, "@text other\n@complete other")
        wait_terminal(http, run_id, 1)
        wait_terminal(http, other_run, 1)
        token = token_of(link(http, run_id, mode="approve"))
    with bearer(api, token) as page_http:
        for method, path in (
            ("GET", f"/v1/runs/{other_run}"),
            ("GET", f"/v1/runs/{other_run}/events"),
            ("GET", f"/v1/runs/{other_run}/events/stream"),
            ("GET", f"/v1/runs/{other_run}/diff"),
            ("GET", "/v1/runs"),
            ("POST", f"/v1/runs/{other_run}/links"),
        ):
            refused = page_http.request(method, path, json={} if method == "POST" else None)
            assert refused.status_code in (401, 404), (method, path, refused.text)
        for method, path, body in (
            ("POST", f"/v1/runs/{run_id}/turns", {"input": "more"}),
            ("POST", f"/v1/runs/{run_id}/links", {"mode": "approve"}),
            ("POST", f"/v1/runs/{run_id}/cancel", None),
            ("POST", f"/v1/runs/{run_id}/rewind", {"turn": 0}),
            ("PATCH", f"/v1/runs/{run_id}/budget", {"max_turns": 99}),
            ("GET", f"/v1/runs/{run_id}/export", None),
            ("DELETE", f"/v1/runs/{run_id}", None),
        ):
            refused = page_http.request(method, path, json=body)
            assert refused.status_code == 403, (method, path, refused.text)
    with api.client("acme") as http:
        assert http.get(f"/v1/runs/{run_id}").json()["status"] == "idle"  # not ended
    with api.client("other") as http:  # another tenant cannot make a link to acme's run
        assert http.post(f"/v1/runs/{run_id}/links", json={}).status_code == 404


def test_a_read_link_cannot_answer_and_an_approve_link_can(
    api: ApiProcess,  # noqa: F811
) -> None:
    with api.client("acme") as http:
        run_id = start(http, "@ask touch linked.txt\n@complete asked", posture="ask")
        request_id = wait_pending(http, run_id)[0]["request_id"]
        read = token_of(link(http, run_id, mode="read"))
        made = link(http, run_id, mode="approve")
        approve = token_of(made)
    answer = f"/v1/runs/{run_id}/permissions/{request_id}"
    with bearer(api, read) as page_http:
        assert page_http.post(answer, json={"decision": "allow"}).status_code == 403
    with bearer(api, approve) as page_http:
        # The link answers as itself: a user it names is not taken on its word.
        said = page_http.post(answer, json={"decision": "allow", "by": "ceo"})
        assert said.status_code == 200, said.text
    with api.client("acme") as http:
        assert wait_terminal(http, run_id, 1)["type"] == "turn-complete"
        events = http.get(f"/v1/runs/{run_id}/events").json()
    decisions = [e["data"] for e in events if e["type"] == "permission-decision"]
    assert [d["by"] for d in decisions] == [f"api:acme:link:{made['link_id']}"]


def test_a_link_expires_and_its_life_is_bounded(api: ApiProcess) -> None:  # noqa: F811
    with api.client("acme") as http:
        run_id = start(http, "@complete brief")
        wait_terminal(http, run_id, 1)
        too_long = http.post(f"/v1/runs/{run_id}/links", json={"ttl_s": 10**7})
        assert too_long.status_code == 422 and "HARNESS_API_LINK_MAX_TTL_S" in too_long.text
        assert http.post(f"/v1/runs/{run_id}/links", json={"mode": "admin"}).status_code == 422
        token = token_of(link(http, run_id, ttl_s=2))
    with bearer(api, token) as page_http:
        assert page_http.get(f"/v1/runs/{run_id}").status_code == 200
        time.sleep(2.5)
        assert page_http.get(f"/v1/runs/{run_id}").status_code == 401


def test_deleting_a_link_ends_it_and_its_open_stream_at_once(
    api: ApiProcess,  # noqa: F811
) -> None:
    with api.client("acme") as http:
        run_id = start(http, LONG_TURN)
        made = link(http, run_id)
        token = token_of(made)
        with bearer(api, token) as page_http:
            with page_http.stream("GET", f"/v1/runs/{run_id}/events/stream") as response:
                assert response.status_code == 200
                deleted = http.delete(f"/v1/runs/{run_id}/links/{made['link_id']}")
                assert deleted.status_code == 204
                ended = stream_ends(response, 5)
            assert not any(map(is_terminal, ended))  # ended by the delete, not the run
            assert page_http.get(f"/v1/runs/{run_id}").status_code == 401
        again = http.delete(f"/v1/runs/{run_id}/links/{made['link_id']}")
        assert again.status_code == 404
        http.delete(f"/v1/runs/{run_id}")


def test_revoking_the_key_that_made_a_link_ends_it_and_its_open_stream(
    api: ApiProcess,  # noqa: F811
) -> None:
    api.add_tenant("rotating")
    with api.client("rotating") as http:
        run_id = start(http, LONG_TURN)
        token = token_of(link(http, run_id))
    with bearer(api, token) as page_http:
        with page_http.stream("GET", f"/v1/runs/{run_id}/events/stream") as response:
            assert response.status_code == 200
            _, api.keys["rotating"] = tenants.rotate(api.tenants_file, "rotating")
            ended = stream_ends(response, 5)
        assert not any(map(is_terminal, ended))
        assert page_http.get(f"/v1/runs/{run_id}").status_code == 401
    with api.client("rotating") as http:  # the new key makes links again
        assert http.get(f"/v1/runs/{run_id}").status_code == 200
        http.delete(f"/v1/runs/{run_id}")


@pytest.mark.slow
def test_the_page_opens_with_a_read_link_and_refuses_it_for_another_run(
    api: ApiProcess,  # noqa: F811
    chromium: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    import websockets

    with api.client("acme") as http:
        run_id = start(http, "@text shown on the page\n@complete page read")
        other_run = start(http, "@text not yours\n@complete other")
        wait_terminal(http, other_run, 1)
        made = link(http, run_id, mode="read")
    token = token_of(made)

    async def scenario() -> None:
        async with websockets.connect(chromium, max_size=2**26) as socket:
            page = Page(socket)
            await page.call("Page.enable")
            await page.call("Page.navigate", url=made["url"])
            await page.until(
                "document.querySelector('#events').innerText.includes('turn complete: page read')"
            )
            assert token not in await page.evaluate("location.href")  # the token left the URL
            assert await page.evaluate("document.querySelector('button.allow')") is None
            # The same link on another run's page opens nothing of it.
            other_url = f"{api.url}/runs/{other_run}#link={token}&mode=read"
            await page.call("Page.navigate", url=other_url)
            await page.until(
                "/401|unknown or revoked/.test(document.querySelector('#status').innerText)"
            )
            assert "not yours" not in await page.evaluate("document.body.innerText")

    asyncio.run(scenario())
