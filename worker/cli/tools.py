"""Tools for the agent on the command line: ``--tools`` and ``--mcp`` on ``run``, and
``harness tools serve NAME MODULE:OBJECT``, which answers a tool set's calls with the
functions of a Python module (docs/mcp.md)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from worker.cli.session import Handler, Session
from worker.errors import InvalidInput

EXITS = {
    "tools": "0 stopped (interrupted), 1 Redis unreachable, 2 bad usage (no such "
    "MODULE:OBJECT, a handler without types, an invalid name or tenant)",
}
Command = Callable[..., argparse.ArgumentParser]


def add_commands(command: Command) -> None:
    tools = command(
        "tools",
        "serve a tool set to the runs that attached it",
        "serve NAME MODULE:OBJECT answers the calls of tool set NAME for every run started "
        "with --tools NAME, until interrupted. OBJECT (in MODULE, imported from the current "
        "directory or PYTHONPATH) is a function, a list of functions or a {name: function} "
        "dict: each one's typed parameters give its tool's schema, its docstring the "
        "description; what it returns is the result, what it raises the error the agent "
        "gets. A server answers up to --concurrency calls at once (a thread each). Start "
        "several to share the calls: one that dies loses none. With --tenant T "
        "the set is API tenant T's own: only T's runs reach it, and T's runs reach no set "
        "of that name served without --tenant (unless HARNESS_SHARED_TOOL_SETS shares it).",
    )
    tools.add_argument("action", choices=["serve"], help="serve: answer the set's calls")
    tools.add_argument("name", metavar="NAME", help="the tool set (--tools NAME on run)")
    tools.add_argument("handlers", metavar="MODULE:OBJECT", help="where its functions are")
    tools.add_argument(
        "--tenant",
        metavar="TENANT",
        help="serve API tenant TENANT's own set of that name (default: the set of runs made "
        "without a tenant, and of every tenant when the operator shares it)",
    )
    tools.add_argument(
        "--lease",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long a call this server took stays its own once it stops renewing its claim "
        "(it dies): then another server takes it (default 30)",
    )
    tools.add_argument(
        "--concurrency",
        type=int,
        default=8,
        metavar="N",
        help="how many calls this server answers at once, each handler on a thread of its "
        "own (1 to 256, default 8); it takes a call only when one of them is free",
    )


def add_run_options(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--tools",
        action="append",
        default=[],
        metavar="NAME",
        help="a tool set served by producer code (harness tools serve NAME ...) the agent "
        "may call (repeatable)",
    )
    run.add_argument(
        "--mcp",
        action="append",
        default=[],
        metavar="NAME",
        help="an MCP server the operator defines in HARNESS_MCP_SERVERS the agent may call "
        "(repeatable; its credentials stay with the worker)",
    )


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"tools": tuple(args.tools), "mcp": tuple(args.mcp)}


def load(spec: str) -> object:
    """``MODULE:OBJECT`` imported (the current directory first on the path)."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise InvalidInput(f"expected MODULE:OBJECT, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInput(f"cannot import {module_name}: {exc}") from None
    found = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise InvalidInput(f"{module_name} has no {attribute}")
        found = getattr(found, part)
    return found


def _tools(args: argparse.Namespace, session: Session) -> int:
    handlers = load(args.handlers)
    stop = threading.Event()
    whose = f" of tenant {args.tenant}" if args.tenant else ""
    print(f"harness: serving tool set {args.name}{whose} (interrupt to stop)", file=sys.stderr)
    try:
        session.client.serve_tools(
            args.name,
            handlers,
            tenant=args.tenant,
            stop=stop,
            lease_s=args.lease,
            concurrency=args.concurrency,
        )
    except KeyboardInterrupt:
        stop.set()
    return 0


HANDLERS: dict[str, Handler] = {"tools": _tools}
