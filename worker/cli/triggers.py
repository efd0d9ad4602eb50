"""``harness trigger``: runs started by a forge's or a webhook sender's events (docs/api.md,
"Triggers"). ``add`` prints the trigger's id and inbound path (``POST`` there, on the API)
and, unless ``--secret-env`` names the secret, the secret made for it, this once."""

from __future__ import annotations

import argparse
import datetime
import os
from collections.abc import Callable
from typing import Any

from worker.cli import outcome as cli_outcome
from worker.cli import tools as cli_tools
from worker.cli.session import Handler, Session
from worker.errors import InvalidInput

EXITS = {
    "trigger": "0 done, 1 Redis unreachable, 2 bad usage (an invalid trigger, an unknown "
    "trigger, a name taken, a --secret-env variable unset)",
}
Command = Callable[..., argparse.ArgumentParser]


def add_commands(command: Command) -> None:
    trigger = command(
        "trigger",
        "start runs on a forge's or a webhook sender's events",
        "add NAME makes a trigger: the API's POST /v1/triggers/ID takes its source's "
        "deliveries, signed with its secret (github: X-Hub-Signature-256; webhook: Standard "
        "Webhooks), and each one its filter lets through starts a run: the input from "
        "--input-template ({issue.title} and such, from the payload), labelled "
        "trigger=NAME. list shows the triggers (secrets masked), remove NAME removes one, "
        "deliveries NAME shows what came and what it started. --tenant T: API tenant T's "
        "triggers (default: the operator's own, whose runs have no tenant).",
    )
    actions = trigger.add_subparsers(
        dest="action", required=True, metavar="ACTION", help="add, list, remove or deliveries"
    )
    add = actions.add_parser("add", help="make a trigger")
    add.add_argument("name", metavar="NAME", help="its name (lower-case letters, digits, _ -)")
    add.add_argument("--source", required=True, choices=("github", "webhook"))
    add.add_argument(
        "--secret-env",
        metavar="VAR",
        help="the secret the source signs with, read from this environment variable "
        "(default: one is made and printed once)",
    )
    add.add_argument("--event", help="only this event (X-GitHub-Event; a webhook's type)")
    add.add_argument("--action", dest="event_action", metavar="ACTION", help="only this action")
    add.add_argument("--label", help="only when this label was added (label.name)")
    add.add_argument("--starts-with", metavar="TEXT", help="only comments starting with TEXT")
    add.add_argument("--harness", required=True, help="the harness its runs run")
    add.add_argument(
        "--input-template",
        required=True,
        metavar="TEXT",
        help="the run's input; {a.b} is the payload's a.b ({{ and }} are braces)",
    )
    add.add_argument(
        "--label-template",
        action="append",
        default=[],
        metavar="KEY=TEMPLATE",
        help="a label of its runs, its value a template (repeatable)",
    )
    add.add_argument(
        "--repo-from-payload",
        action="store_true",
        help="seed the run with the payload's repository.clone_url (under repo policy)",
    )
    _add_run_options(add)
    for name, text in (
        ("list", "show the triggers"),
        ("remove", "remove a trigger"),
        ("deliveries", "show a trigger's deliveries, newest first"),
    ):
        sub = actions.add_parser(name, help=text)
        if name != "list":
            sub.add_argument("name", metavar="NAME", help="the trigger's name (or id)")
        _add_common(sub)
    _add_common(add)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", metavar="TENANT", help="API tenant TENANT's triggers")
    parser.add_argument("--json", action="store_true", help="JSON output")


def _add_run_options(add: argparse.ArgumentParser) -> None:
    """The options of the runs it starts, as ``harness run``'s."""
    for flag, kind, text in (
        ("--model", str, "the model"),
        ("--system-prompt", str, "a system prompt"),
        ("--image", str, "the container image"),
        ("--executable", str, "the harness program (stdio-json)"),
        ("--timeout", float, "each turn's wall-clock limit, in seconds"),
        ("--repo", str, "seed the workspace from this repository"),
        ("--ref", str, "with --repo: the branch, tag or commit"),
        ("--push-branch", str, "push each turn to this branch"),
        ("--max-cost-usd", float, "the run's budget in USD"),
        ("--max-tokens", int, "the run's budget in tokens"),
        ("--max-turns", int, "the run's budget in turns"),
        ("--max-wall-s", float, "the run's budget in seconds"),
    ):
        add.add_argument(flag, type=kind, help=text)
    add.add_argument("--posture", choices=("strict", "auto", "dangerous", "ask"))
    add.add_argument("--network", choices=("none", "bridge", "host", "egress"))
    add.add_argument("--sandbox", choices=("docker", "local"))
    for flag in ("--allow", "--deny", "--grant"):
        add.add_argument(flag, action="append", default=[], metavar="VALUE", help="repeatable")
    cli_tools.add_run_options(add)
    cli_outcome.add_run_options(add)


def _run_options(args: argparse.Namespace) -> dict[str, Any]:
    options = {
        "model": args.model,
        "system_prompt": args.system_prompt,
        "image": args.image,
        "executable": args.executable,
        "timeout_s": args.timeout,
        "repo": args.repo,
        "ref": args.ref,
        "push_branch": args.push_branch,
        "max_cost_usd": args.max_cost_usd,
        "max_tokens": args.max_tokens,
        "max_turns": args.max_turns,
        "max_wall_s": args.max_wall_s,
        "posture": args.posture,
        "network": args.network,
        "sandbox": args.sandbox,
        "allow": args.allow,
        "deny": args.deny,
        "grants": args.grant,
        **cli_tools.run_options(args),
        **cli_outcome.run_options(args),
    }
    return {k: v for k, v in options.items() if v is not None and v != [] and v != ()}


def _label_templates(items: list[str]) -> dict[str, str]:
    found = {}
    for item in items:
        key, sep, template = item.partition("=")
        if not sep:
            raise InvalidInput(f"--label-template {item[:80]!r}: expected KEY=TEMPLATE")
        found[key] = template
    return found


def _secret(var: str | None) -> str | None:
    if var is None:
        return None
    value = os.environ.get(var)
    if not value:
        raise InvalidInput(f"--secret-env {var}: the variable is not set")
    return value


def _trigger(args: argparse.Namespace, session: Session) -> int:
    client, renderer = session.client, session.renderer
    if args.action == "add":
        made = client.add_trigger(
            args.name,
            source=args.source,
            harness=args.harness,
            input_template=args.input_template,
            secret=_secret(args.secret_env),
            filter={
                "event": args.event,
                "action": args.event_action,
                "label": args.label,
                "starts_with": args.starts_with,
            },
            label_templates=_label_templates(args.label_template),
            repo_from_payload=args.repo_from_payload,
            run=_run_options(args),
            tenant=args.tenant,
        )
        text = f"trigger {made['name']} added: {made['id']}\ndeliveries go to POST {made['path']}"
        if made["secret"]:
            text += f"\nits secret (shown once, keep it):\n{made['secret']}"
        renderer.message(made, text)
        return 0
    if args.action == "list":
        found = client.list_triggers(tenant=args.tenant)
        lines = [
            f"{t['name']}  {t['id']}  {t['source']}  {_filter(t['filter'])}  {t['harness']}"
            for t in found
        ]
        renderer.message({"triggers": found}, "\n".join(lines) or "no triggers")
        return 0
    if args.action == "remove":
        removed = client.remove_trigger(args.name, tenant=args.tenant)
        renderer.message(removed, f"trigger {removed['name']} removed")
        return 0
    records = client.trigger_deliveries(args.name, tenant=args.tenant)
    lines = [
        f"{_when(d['received_at'])}  {d['status']:<9}  {d['delivery_id'] or '-'}  "
        f"{d['run_id'] or '-'}  {d['reason']}".rstrip()
        for d in records
    ]
    renderer.message({"deliveries": records}, "\n".join(lines) or "no deliveries")
    return 0


def _filter(spec: dict[str, Any]) -> str:
    shown = [f"{k}={v}" for k, v in spec.items() if v is not None]
    return ",".join(shown) or "every event"


def _when(stamp: float) -> str:
    return datetime.datetime.fromtimestamp(stamp).isoformat(timespec="seconds")


HANDLERS: dict[str, Handler] = {"trigger": _trigger}
