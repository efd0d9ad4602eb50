"""Names a tenant chooses that reach shared state are that tenant's own: two tenants of a real
``harness api`` process, each run in a real worker, name the same tool set and the same
durable workspace, and neither reaches the other's.

- Tool sets (local sandbox): tenant ``other`` attaching ``orders`` never reaches ``acme``'s
  private ``orders`` (nor does a run made without a tenant); each tenant reaches its own,
  served with ``tenant=`` (``harness tools serve --tenant``); a set the operator shares
  (``HARNESS_SHARED_TOOL_SETS``) reaches every tenant, and serving it as one tenant's is
  refused.
- Durable workspaces (Docker, the demo image): ``other`` naming ``acme``'s workspace gets a
  workspace of its own: it reads none of ``acme``'s files, and what it plants in its HOME
  never reaches ``acme``'s container.
"""

from __future__ import annotations

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

from tests.conftest import ROOT
from tests.integration.api_server import ApiProcess, start_api
from tests.integration.conftest import DEMO, Env, WorkerProcess, make_env, start_worker
from tests.security.conftest import ContainerAudit, start_scoped_worker
from worker.client import HarnessClient
from worker.errors import InvalidInput

pytestmark = [pytest.mark.redis, pytest.mark.celery]

PRIVATE = "acme-private-7f3c9b"


def acme_lookup(order_id: int) -> str:
    """Look up an order (acme's own data)."""
    return f"{PRIVATE} order {order_id}"


def common_lookup(order_id: int) -> str:
    """Look up an order (the operator's set, shared with every tenant)."""
    return f"common order {order_id}"


def start(http: httpx.Client, text: str, **options: Any) -> str:
    response = http.post("/v1/runs", json={"harness": "stdio-json", "input": text, **options})
    assert response.status_code == 201, response.text
    run_id: str = response.json()["run_id"]
    return run_id


def turn_texts(client: HarnessClient, run_id: str, turn: int) -> list[str]:
    ended = client.wait(run_id, turn, timeout=90)
    assert ended.type == "turn-complete", ended.data
    return [
        e.data["text"]
        for e in client.events(run_id)
        if e.turn == turn and e.type == "assistant-text"
    ]


class Served:
    """Tool sets served in threads of this process, stopped after the test."""

    def __init__(self, client: HarnessClient) -> None:
        self.client = client
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, name: str, handler: Any, tenant: str | None = None) -> None:
        thread = threading.Thread(
            target=self.client.serve_tools,
            args=(name, [handler]),
            kwargs={"tenant": tenant, "stop": self.stop},
            daemon=True,
        )
        thread.start()
        self.threads.append(thread)
        stored = f"{tenant}.{name}" if tenant else name
        wait_for(lambda: self.client.redis.exists(self.client.keys.tool_definitions(stored)))

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(10)


def wait_for(ready: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, "not ready in time"
        time.sleep(0.05)


# -- tool sets -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tools_env(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Env]:
    env = make_env(
        tmp_path_factory.mktemp("tenant-tools"),
        redis_url,
        HARNESS_TOOL_CALL_TIMEOUT_S="3",
        HARNESS_SHARED_TOOL_SETS="common",
    )
    yield env
    for client in env.clients:
        client.close()


@pytest.fixture(scope="module")
def tools_api(tools_env: Env) -> Iterator[ApiProcess]:
    worker = start_worker(tools_env)
    api = start_api(tools_env)
    api.add_tenant("acme")
    api.add_tenant("other")
    yield api
    api.stop()
    worker.stop()


@pytest.fixture
def served(tools_env: Env) -> Iterator[Served]:
    made = Served(tools_env.client())
    yield made
    made.close()


def test_a_tenant_attaching_another_tenants_tool_set_name_never_reaches_it(
    tools_env: Env, tools_api: ApiProcess, served: Served
) -> None:
    served.start("orders", acme_lookup, tenant="acme")
    client = tools_env.client()
    call = '@tool orders acme_lookup {"order_id": 7}'
    with tools_api.client("other") as other:
        stolen = start(other, call, executable=DEMO, tools=["orders"])
    said = turn_texts(client, stolen, 1)
    assert not any(PRIVATE in text for text in said), said
    [result] = [e.data for e in client.events(stolen) if e.type == "tool-result"]
    assert not result["ok"]
    assert "no server of tool set orders answered" in result["output"]

    with tools_api.client("acme") as acme:
        own = start(acme, call, executable=DEMO, tools=["orders"])
    assert f"tool orders.acme_lookup ok: {PRIVATE} order 7" in turn_texts(client, own, 1)

    # A run made without a tenant keeps today's unscoped name: acme's set is not it either.
    direct = client.start_run("stdio-json", call, executable=DEMO, tools=["orders"])
    assert not any(PRIVATE in text for text in turn_texts(client, direct, 1))


def test_each_tenant_reaches_its_own_set_served_with_harness_tools_serve_tenant(
    tools_env: Env, tools_api: ApiProcess, served: Served
) -> None:
    served.start("orders", acme_lookup, tenant="acme")
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "tools", "serve", "--tenant", "other", "orders",
         "tests.integration.tool_handlers:HANDLERS"],
        cwd=ROOT, env={**os.environ, **tools_env.vars}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        r = tools_env.redis()
        wait_for(lambda: r.exists(tools_env.keys.tool_definitions("other.orders")))
        client = tools_env.client()
        with tools_api.client("other") as other:
            run_id = start(
                other,
                '@tool orders lookup {"order_id": 3}\n@tools orders',
                executable=DEMO,
                tools=["orders"],
            )
        said = turn_texts(client, run_id, 1)
        assert 'tool orders.lookup ok: {"id":3,"status":"shipped"}' in said
        assert not any("acme_lookup" in text or PRIVATE in text for text in said), said
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(10)


def test_a_tool_set_the_operator_shares_reaches_every_tenant_and_no_tenant_serves_it(
    tools_env: Env, tools_api: ApiProcess, served: Served
) -> None:
    served.start("common", common_lookup)
    client = tools_env.client()
    for tenant in ("acme", "other"):
        with tools_api.client(tenant) as http:
            run_id = start(
                http,
                '@tool common common_lookup {"order_id": 5}',
                executable=DEMO,
                tools=["common"],
            )
        assert "tool common.common_lookup ok: common order 5" in turn_texts(client, run_id, 1)
    with pytest.raises(InvalidInput, match="shared with every tenant"):
        client.serve_tools("common", [acme_lookup], tenant="acme")
    with pytest.raises(InvalidInput, match="invalid tenant name"):
        client.serve_tools("orders", [acme_lookup], tenant="acme.x")


# -- durable workspaces ----------------------------------------------------------------------


def _listing(path: str = ".") -> str:
    """A ``@run`` line printing the names in ``path`` (``~``: HOME); no shell, no spaces."""
    target = f"__import__('os').path.expanduser('{path}')"
    return f"@run python3 -c print(sorted(__import__('os').listdir({target})))"


def _write(path: str, text: str) -> str:
    target = f"__import__('os').path.expanduser('{path}')"
    return f"@run python3 -c open({target},'w').write('{text}')"


@pytest.mark.docker
def test_a_tenant_naming_another_tenants_durable_workspace_gets_its_own(
    docker_env: Env, audit: ContainerAudit
) -> None:
    worker: WorkerProcess = start_scoped_worker(docker_env)
    api = start_api(docker_env)
    try:
        api.add_tenant("acme")
        api.add_tenant("other")
        client = docker_env.client()
        shared = {"executable": "harness-demo", "workspace": "shared"}
        with api.client("acme") as acme:
            first = start(
                acme,
                "\n".join([_write("notes.txt", PRIVATE), _write("~/acme-home", PRIVATE)]),
                **shared,
            )
            turn_texts(client, first, 1)

            with api.client("other") as other:
                second = start(
                    other,
                    "\n".join(
                        [
                            _listing("."),
                            _listing("~"),
                            "@run cat notes.txt",
                            _write("~/planted", "from-other"),
                        ]
                    ),
                    **shared,
                )
                seen = "\n".join(turn_texts(client, second, 1))
            assert PRIVATE not in seen and "acme-home" not in seen, seen
            assert "No such file" in seen

            # acme's next turn, in acme's container, finds nothing of other's in its HOME.
            response = acme.post(f"/v1/runs/{first}/turns", json={"input": _listing("~")})
            assert response.status_code == 202, response.text
            mine = "\n".join(turn_texts(client, first, 2))
            assert "acme-home" in mine and "planted" not in mine, mine

        durable = Path(docker_env.vars["HARNESS_WORKSPACE_ROOT"]) / "docker" / "durable"
        assert sorted(p.name for p in durable.iterdir()) == ["acme.shared", "other.shared"]
        assert (durable / "acme.shared" / "notes.txt").read_text() == PRIVATE
        assert not (durable / "acme.shared" / ".home" / "planted").exists()
        assert (durable / "other.shared" / ".home" / "planted").exists()
        for run_id in (first, second):
            client.end(run_id, timeout=60)
    finally:
        api.stop()
        worker.stop()
