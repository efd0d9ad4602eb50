"""The ``harness`` command's part of tenants and labels: ``--label`` on ``run``, ``harness list``,
``harness tenant add|list|revoke|rotate`` and ``harness api`` (worker/api/)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

from pydantic import ValidationError

from worker.cli.render import format_since
from worker.cli.session import Handler, Session
from worker.errors import InvalidInput
from worker.options.spec import parse_label
from worker.store.status import RunStatus

EXITS = {
    "list": "0 done, 1 Redis unreachable, 2 bad usage",
    "tenant": "0 done, 2 bad usage, an unknown tenant or an invalid tenants file",
    "api": "0 stopped, 2 invalid settings",
}


def add_run_options(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label of the run, to find it again with `harness list --label` (repeatable)",
    )


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    labels = dict(parse_label(text) for text in args.label or ())
    return {"labels": labels} if labels else {}


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    listing = command(
        "list",
        "list runs, newest first",
        "List the runs made without the API (HARNESS_TENANTS_FILE tenants: --tenant), newest "
        "first, a page at a time, from an index (no scan of Redis).",
    )
    listing.add_argument("--status", choices=get_args(RunStatus), help="only runs of this status")
    listing.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="only runs with it"
    )
    listing.add_argument("--harness", help="only runs of this harness")
    listing.add_argument("--tenant", help="an API tenant's runs")
    listing.add_argument("--limit", type=int, default=50, help="runs per page (default 50)")
    listing.add_argument("--cursor", help="the next page (the cursor a listing printed)")
    listing.add_argument("--json", action="store_true", help="one JSON object per run")

    tenant = command(
        "tenant",
        "manage the API's tenants (HARNESS_TENANTS_FILE)",
        "Add, list, revoke and rotate the tenants of the HTTP API. A new key is printed "
        "once; the file keeps only its SHA-256. The API reads the file again when it "
        "changes: a revoked key stops working at its next request.",
    )
    tenant.add_argument("--file", help="the tenants file (default: HARNESS_TENANTS_FILE)")
    actions = tenant.add_subparsers(
        dest="tenant_action", required=True, metavar="ACTION", help="add, list, revoke or rotate"
    )
    add = actions.add_parser("add", help="a new tenant and its first key")
    add.add_argument("name", metavar="NAME", help="lower-case letters, digits, '_' or '-'")
    for flag, what in (
        ("--harness", "a harness it may run"),
        ("--image", "an image it may ask for"),
        ("--grant", "a grant it may ask for"),
        ("--network", "a network it may ask for"),
        ("--tools", "a tool set it may attach"),
        ("--mcp", "an MCP server it may attach"),
        ("--base-url", "a base URL entry its runs may name (as HARNESS_ALLOWED_BASE_URLS')"),
    ):
        add.add_argument(
            flag,
            action="append",
            metavar="NAME",
            help=f"{what} (repeatable; default: whatever the operator allows)",
        )
    for flag, kind in (
        ("--max-cost-usd", float),
        ("--max-tokens", int),
        ("--max-turns", int),
        ("--max-wall-s", float),
    ):
        add.add_argument(flag, type=kind, help="a ceiling on each run's budget")
    add.add_argument("--rate-limit", type=int, help="requests per window (HARNESS_API_RATE_*)")
    add.add_argument("--webhook-url", help="where its runs deliver webhooks by default")
    actions.add_parser("list", help="the tenants, their key ids and policy").add_argument(
        "--json", action="store_true", help="one JSON object per tenant"
    )
    revoke = actions.add_parser("revoke", help="revoke a tenant, or one key of it")
    revoke.add_argument("name", metavar="NAME", help="the tenant")
    revoke.add_argument("--key", metavar="KEY_ID", help="only this key (its id, from list)")
    rotate = actions.add_parser("rotate", help="a new key; the old ones stop working")
    rotate.add_argument("name", metavar="NAME", help="the tenant")
    rotate.add_argument("--keep-old", action="store_true", help="keep the old keys working")

    api = command("api", "serve the HTTP API", "Serve the HTTP API (docs/api.md).")
    api.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    api.add_argument("--port", type=int, default=8080, help="the port to listen on")


def _list(args: argparse.Namespace, session: Session) -> int:
    renderer = session.renderer
    page = session.client.list_runs(
        status=args.status,
        labels=dict(parse_label(text) for text in args.label),
        harness=args.harness,
        limit=args.limit,
        cursor=args.cursor,
        tenant=args.tenant,
    )
    for record in page["runs"]:
        labels = ",".join(f"{k}={v}" for k, v in sorted((record.get("labels") or {}).items()))
        since = format_since(record["created_at"]) if record.get("created_at") else ""
        renderer.message(
            record,
            f"{record['run_id']}  {record['status']:<8} {record['harness']:<12} "
            f"turns {record['turns']:<3} {since}  {labels}".rstrip(),
        )
    if page["cursor"]:
        renderer.message({"cursor": page["cursor"]}, f"more: --cursor {page['cursor']}")
    return 0


def _path(args: argparse.Namespace) -> Path:
    from config import load_settings

    name = args.file or load_settings().tenants_file
    if not name:
        raise InvalidInput("no tenants file: set HARNESS_TENANTS_FILE or pass --file")
    return Path(name)


def _api(args: argparse.Namespace, session: Session) -> int:
    from worker.api.app import serve

    return serve(args.host, args.port)


def _tenant(args: argparse.Namespace, session: Session) -> int:
    from worker.api import tenants

    path = _path(args)
    if args.tenant_action == "add":
        policy = {
            "harnesses": args.harness,
            "images": args.image,
            "grants": args.grant,
            "networks": args.network,
            "tools": args.tools,
            "mcp": args.mcp,
            "base_urls": args.base_url,
            "max_cost_usd": args.max_cost_usd,
            "max_tokens": args.max_tokens,
            "max_turns": args.max_turns,
            "max_wall_s": args.max_wall_s,
        }
        try:
            chosen = tenants.TenantPolicy(**{k: v for k, v in policy.items() if v is not None})
        except ValidationError as exc:
            errors = "; ".join(str(e["msg"]) for e in exc.errors())
            raise InvalidInput(f"invalid tenant policy: {errors}") from None
        tenant, key = tenants.add_tenant(
            path,
            args.name,
            policy=chosen,
            rate_limit=args.rate_limit,
            webhook_url=args.webhook_url,
        )
        print(f"tenant {tenant.name} added; its key (shown once, keep it):\n{key}")
        print(f"its webhook secret (to verify deliveries):\n{tenant.webhook_secret}")
        return 0
    if args.tenant_action == "rotate":
        tenant, key = tenants.rotate(path, args.name, keep_old=args.keep_old)
        print(f"tenant {tenant.name}: a new key (shown once, keep it):\n{key}")
        return 0
    if args.tenant_action == "revoke":
        tenants.revoke(path, args.name, args.key)
        what = f"key {args.key} of tenant {args.name}" if args.key else f"tenant {args.name}"
        print(f"{what} revoked")
        return 0
    for tenant in tenants.read_tenants(path).values():
        shown = tenant.model_dump(mode="json", exclude={"webhook_secret"})
        shown["keys"] = [{"id": k["id"], "created_at": k["created_at"]} for k in shown["keys"]]
        if args.json:
            print(json.dumps(shown))
        else:
            state = "revoked" if tenant.revoked else f"{len(tenant.keys)} key(s)"
            policy = tenant.policy.model_dump(exclude_none=True)
            print(f"{tenant.name}  {state}  {json.dumps(policy) if policy else ''}".rstrip())
    sys.stdout.flush()
    return 0


HANDLERS: dict[str, Handler] = {"list": _list, "tenant": _tenant, "api": _api}
