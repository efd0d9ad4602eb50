"""Names a producer chooses that reach shared state belong to its tenant (docs/api.md, "Tenants").

A tool set (``tools=[NAME]``: the Redis stream its servers read, :meth:`Keys.tool_calls`) and
a durable workspace (``workspace=NAME``: a folder on the run's host, and the HOME in it that
every run naming it shares) are found by a name the producer chose. Hostile by default: two
tenants that choose the same name must never meet there, or one reads the other's files and
answers, or plants what the other's sandbox runs. :func:`owned` is the one place such a name
becomes the name shared state knows: ``TENANT.NAME`` for a run of an API tenant (a tenant's
name holds no ``.``, so the part before the first ``.`` is always the tenant's whole name: no
tenant can write another's), the name as it is for a run made without a tenant (a producer
with Redis access, the operator's own code or CLI, which sees everything anyway).

The operator shares a tool set with every tenant on purpose (``HARNESS_SHARED_TOOL_SETS``):
its name stays as it is for every run, served by a server started without a tenant. A
platform serves one tenant's own set with ``serve_tools(NAME, handlers, tenant=T)`` (``harness
tools serve --tenant T``). Durable workspaces are never shared across tenants.

Labels need nothing here: a tenant's runs are listed from its own index
(:meth:`Keys.run_list`). Every other producer-chosen value is per run (its keys hold the run
id) or an operator's name checked against the operator's policy.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from worker.errors import InvalidInput

TENANT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
"""A tenant's name (``HARNESS_TENANTS_FILE``): never a ``.`` in it (see :func:`owned`)."""
SEPARATOR = "."


def check_tenant(tenant: str) -> str:
    """``tenant`` when it is a tenant's name; InvalidInput otherwise."""
    if not isinstance(tenant, str) or not TENANT_NAME.fullmatch(tenant):
        raise InvalidInput(
            f"invalid tenant name {str(tenant)[:80]!r}: 1 to 63 lower-case letters, digits, "
            "'_' or '-'"
        )
    return tenant


def owned(tenant: str | None, name: str, *, shared: Collection[str] = ()) -> str:
    """The name shared state knows for ``name`` chosen by a run of ``tenant``: its tenant's
    own (``TENANT.NAME``), or ``name`` itself when there is no tenant or the operator shares
    it (``shared``)."""
    if not tenant or name in shared:
        return name
    return f"{check_tenant(tenant)}{SEPARATOR}{name}"
