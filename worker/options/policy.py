"""Operator policy: what a producer may ask for. Checked by the client for a quick refusal
and enforced again by the worker, which never trusts the message it was handed."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import adapters
from adapters.protocol import Capabilities, TurnRequest
from config import Settings
from config.harnesses import model_keys
from sandbox.network import BridgeConfig, Destination, EgressConfig, Endpoint, base_url_endpoint
from sandbox.store.seeding import SeedError, check_repo_url
from worker.errors import InvalidInput
from worker.options.attachments import AttachmentLimits
from worker.options.base_urls import PolicyEntryError, base_url_allowed
from worker.options.output_schema import check_output_schema
from worker.options.spec import RunOptions, shown


@dataclass(frozen=True)
class Resolved:
    """The operator-approved shape of a run."""

    sandbox: str
    image: str | None
    network: str
    timeout_s: float
    executable: str | None
    memory: str = "2g"
    cpus: float = 2.0
    pids: int = 512
    warnings: tuple[str, ...] = ()
    """What the harness cannot apply of the options (its capabilities say so): the run
    record keeps these, and the run goes on."""


_MEMORY = re.compile(r"^([0-9]+)([bkmg]?)$")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
MIN_MEMORY_BYTES = 6 << 20
"""Docker refuses a container memory limit below 6 MiB."""
RESERVED_PREFIX = "HARNESS_"
"""Never granted, whatever HARNESS_GRANTS says: the worker's settings (its Redis and broker
URLs with their passwords) and the variables the worker sets for a turn."""
MIN_CPUS = 0.01
"""Docker's smallest CPU limit."""


def memory_bytes(text: str) -> int:
    """``2g``, ``512m``, ``1048576`` as bytes; ValueError when it is not such a size."""
    match = _MEMORY.match(text)
    if not match:
        raise ValueError(f"invalid memory size {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


def _allowed(value: str, allowed: tuple[str, ...]) -> bool:
    return "*" in allowed or value in allowed


def _image_allowed(image: str, harness: str, allowed: tuple[str, ...]) -> bool:
    """HARNESS_ALLOWED_IMAGES entries are ``IMAGE`` (any harness), ``HARNESS=IMAGE`` or
    ``HARNESS=*`` (that harness only), or ``*`` (anything)."""
    for entry in allowed:
        name, sep, value = entry.partition("=")
        if not sep:
            if entry in ("*", image):
                return True
        elif name.strip() == harness and value.strip() in ("*", image):
            return True
    return False


def resolve(options: RunOptions, settings: Settings) -> Resolved:
    """Apply operator policy to a producer's options, or raise InvalidInput naming the rule."""
    sandbox, image = _sandbox_and_image(options, settings)
    check_base_url(
        options.base_url, settings.allowed_base_urls, "operator policy HARNESS_ALLOWED_BASE_URLS"
    )
    network = _network(options, settings)
    executable = _executable(options, settings)
    _check_grants(options, settings)
    timeout = options.timeout_s or settings.turn_timeout_s
    if timeout > settings.max_turn_timeout_s:
        raise InvalidInput(
            f"timeout {timeout:g}s exceeds the operator's ceiling of "
            f"{settings.max_turn_timeout_s:g}s (HARNESS_MAX_TURN_TIMEOUT_S)"
        )
    memory, cpus, pids = _limits(options, settings)
    if options.repo:
        try:
            check_repo_url(options.repo, settings.repo_schemes, settings.repo_hosts)
        except SeedError as exc:
            raise InvalidInput(
                f"--repo: {exc} (operator policy HARNESS_REPO_SCHEMES, HARNESS_REPO_HOSTS)"
            ) from None
    warnings = capability_warnings(options)
    if sandbox == "docker" and network == "bridge" and not settings.bridge_isolation:
        warnings += (UNISOLATED_BRIDGE,)
    keys = model_keys(settings.model_keys)
    if settings.model_gateway == "off" and any(name in keys for name in options.grants):
        warnings += (GATEWAY_OFF,)
    check_posture(options, settings)
    return Resolved(sandbox, image, network, timeout, executable, memory, cpus, pids, warnings)


def _sandbox_and_image(options: RunOptions, settings: Settings) -> tuple[str, str | None]:
    harness = options.harness
    sandbox = options.sandbox or settings.sandbox
    if sandbox != settings.sandbox and not _allowed(sandbox, settings.allowed_sandboxes):
        raise InvalidInput(
            f"sandbox {sandbox!r} is not allowed (operator policy HARNESS_ALLOWED_SANDBOXES)"
        )
    configured = settings.image_for(harness)
    image = options.image or configured
    if (
        options.image
        and options.image != configured
        and not _image_allowed(options.image, harness, settings.allowed_images)
    ):
        raise InvalidInput(
            f"image {options.image!r} is not allowed for {harness} "
            "(operator policy HARNESS_ALLOWED_IMAGES)"
        )
    if sandbox == "docker" and not image:
        raise InvalidInput(f"no image is configured for {harness} (HARNESS_IMAGES)")
    return sandbox, image


GATEWAY_OFF = (
    "model keys enter the sandbox as they are (HARNESS_MODEL_GATEWAY=off): any command the "
    "agent runs can read them"
)
UNISOLATED_BRIDGE = (
    "network bridge is not isolated on this worker (HARNESS_BRIDGE_ISOLATION=false): the run "
    "shares Docker's default bridge and can reach other runs and this host's services"
)


def check_base_url(url: str | None, allowed: tuple[str, ...], rule: str) -> None:
    """Refuse a base URL that ``allowed`` (a policy's entries, docs/security.md) does not
    admit, naming ``rule``: the one check of the operator's policy (client and worker, by
    :func:`resolve`) and of a tenant's (the API). A harness sends its model credential
    there, whatever the network."""
    if url is None:
        return
    try:
        ok = base_url_allowed(url, allowed)
    except PolicyEntryError as exc:
        raise InvalidInput(f"--base-url refused: {rule} has an invalid {exc}") from None
    except ValueError as exc:
        raise InvalidInput(f"--base-url {shown(url)} refused: {exc} ({rule})") from None
    if not ok:
        raise InvalidInput(f"--base-url {shown(url)} is not allowed ({rule})")


def _network(options: RunOptions, settings: Settings) -> str:
    harness = options.harness
    network = options.network or settings.network
    if not _allowed(network, settings.allowed_networks):
        raise InvalidInput(
            f"network {network!r} is not allowed (operator policy HARNESS_ALLOWED_NETWORKS)"
        )
    if network == "egress" and options.base_url and not settings.egress_allow_base_url:
        endpoint = base_url_endpoint(options.base_url)
        if endpoint not in settings.egress_allow.get(harness, ()):
            raise InvalidInput(
                f"--base-url cannot be reached with network egress: {endpoint} is not in "
                f"{harness}'s allowlist (operator policy HARNESS_EGRESS_ALLOW, "
                "HARNESS_EGRESS_ALLOW_BASE_URL)"
            )
    return network


def _executable(options: RunOptions, settings: Settings) -> str | None:
    executable = options.executable
    if options.harness == "stdio-json":
        if not executable:
            raise InvalidInput("the stdio-json harness needs --executable PATH")
        if not _allowed(executable, settings.allowed_executables):
            raise InvalidInput(
                f"executable {executable!r} is not allowed "
                "(operator policy HARNESS_ALLOWED_EXECUTABLES)"
            )
    elif executable:
        raise InvalidInput("--executable is only accepted for the stdio-json harness")
    return executable


def grants_for(harness: str, grants: tuple[str, ...] | list[str], settings: Settings) -> list[str]:
    """Of ``grants``, those the operator allows ``harness`` (HARNESS_GRANTS): a group of
    attempts over several harnesses gives each the keys its own CLI may take."""
    allowed = settings.grants.get(harness, ())
    return [name for name in grants if _allowed(name, allowed)]


def _check_grants(options: RunOptions, settings: Settings) -> None:
    harness = options.harness
    allowed_grants = settings.grants.get(harness, ())
    for name in options.grants:
        if name.startswith(RESERVED_PREFIX):
            raise InvalidInput(f"grant {name!r} is reserved: HARNESS_ variables are the worker's")
        if not _allowed(name, allowed_grants):
            raise InvalidInput(
                f"grant {name!r} is not allowed for {harness} (operator policy HARNESS_GRANTS)"
            )


def _limits(options: RunOptions, settings: Settings) -> tuple[str, float, int]:
    """The container's memory, CPUs and pids, within the operator's ceilings."""
    memory = options.memory or settings.memory
    if options.memory is not None:
        wanted = memory_bytes(options.memory)
        if wanted > memory_bytes(settings.max_memory):
            raise InvalidInput(
                f"memory {options.memory} exceeds the operator's ceiling of "
                f"{settings.max_memory} (HARNESS_MAX_MEMORY)"
            )
        if wanted < MIN_MEMORY_BYTES:
            raise InvalidInput(f"memory {options.memory} is below Docker's minimum of 6m")
    cpus = options.cpus or settings.cpus
    if options.cpus is not None and options.cpus > settings.max_cpus:
        raise InvalidInput(
            f"cpus {options.cpus:g} exceeds the operator's ceiling of {settings.max_cpus:g} "
            "(HARNESS_MAX_CPUS)"
        )
    if options.cpus is not None and options.cpus < MIN_CPUS:
        # Docker reads a limit that rounds to 0 nano-CPUs as "no limit".
        raise InvalidInput(f"cpus {options.cpus:g} is below the minimum of {MIN_CPUS:g}")
    pids = options.pids or settings.pids
    if options.pids is not None and options.pids > settings.max_pids:
        raise InvalidInput(
            f"pids {options.pids} exceeds the operator's ceiling of {settings.max_pids} "
            "(HARNESS_MAX_PIDS)"
        )
    return memory, cpus, pids


def check_posture(options: RunOptions, settings: Settings) -> None:
    """Refuse ``--posture ask`` where the operator forbids it or the harness cannot ask."""
    if options.posture != "ask":
        return
    if not settings.permission_ask:
        raise InvalidInput("--posture ask is not allowed by the operator (HARNESS_PERMISSION_ASK)")
    if not adapters.get(options.harness).CAPABILITIES.permission_ask:
        raise InvalidInput(
            f"{options.harness} cannot hand us a permission decision live (capability "
            "permission_ask is false): use --posture strict, auto or dangerous"
        )


def egress_config(settings: Settings) -> EgressConfig:
    """The egress gateway's settings (network ``egress``) from operator policy."""
    return EgressConfig(
        scope=settings.key_prefix,
        subnet=settings.egress_subnet,
        outside_network=settings.egress_outside_network,
        image=settings.egress_gateway_image,
        hosts=dict(settings.egress_hosts),
        resolvers=tuple(settings.egress_resolvers),
        allow={
            harness: (*(Endpoint.parse(h) for h in hosts), *_collector(settings))
            for harness, hosts in settings.egress_allow.items()
        },
        allow_base_url=settings.egress_allow_base_url,
    )


def bridge_config(settings: Settings) -> BridgeConfig:
    """Network ``bridge``'s settings (``HARNESS_BRIDGE_*``) from operator policy."""
    return BridgeConfig(
        isolate=settings.bridge_isolation,
        allow=tuple(Destination.parse(d) for d in settings.bridge_allow),
        guard_image=settings.egress_gateway_image,
    )


def collector_url(settings: Settings) -> str | None:
    """Where the harness CLIs send their own telemetry (``HARNESS_HARNESS_TELEMETRY``): the
    operator's ``HARNESS_HARNESS_TELEMETRY_ENDPOINT``, else the worker's own
    ``OTEL_EXPORTER_OTLP_ENDPOINT``; None while that telemetry is off."""
    if not settings.harness_telemetry:
        return None
    url = settings.harness_telemetry_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    return url.strip().rstrip("/") or None


def _collector(settings: Settings) -> tuple[Endpoint, ...]:
    endpoint = base_url_endpoint(collector_url(settings))
    return (Endpoint.parse(endpoint),) if endpoint else ()


def egress_allowlist(settings: Settings, harness: str, base_url: str | None) -> list[str]:
    """What a run of ``harness`` may reach with network ``egress`` (``host:port``), as the
    gateway applies it (``harness status`` shows it)."""
    return [str(e) for e in egress_config(settings).allowlist(harness, base_url_endpoint(base_url))]


def capability_warnings(options: RunOptions) -> tuple[str, ...]:
    """Refuse what the harness cannot do at all; name what it cannot apply as asked.

    Driven by the adapter's capabilities (docs/adapters.md, "Capabilities"), so that a flag that
    lies changes what producers are told: a session offered to a harness that cannot resume
    is refused (``session_resume``); permission rules a harness cannot enforce are accepted
    with a warning (``permission_policy``, docs/adapters.md, "Capabilities": the run records
    it, and the container stays the boundary); a model a harness cannot be told is a warning
    (``model_selection``). A system prompt without a channel is no warning: it rides in the
    input (:func:`fit_request`).
    """
    harness = options.harness
    adapter = adapters.get(harness)
    caps: Capabilities = adapter.CAPABILITIES
    if options.resume_session and not caps.session_resume:
        raise InvalidInput(
            f"{harness} cannot resume a session (capability session_resume is false): "
            "drop --resume-session"
        )
    warnings: list[str] = []
    patterns = (*options.allow, *options.deny)
    detail = adapter.policy_warning(
        TurnRequest(input="", posture=options.posture, allow=options.allow, deny=options.deny)
    )
    unapplied = options.posture not in ("dangerous", "ask")  # ask: asked of us, not applied
    if caps.permission_policy == "none" and (patterns or unapplied):
        warnings.append(
            detail
            or f"{harness} enforces no permission policy (permission_policy none): the "
            f"posture {options.posture!r} and any allow/deny pattern are not applied; only "
            "the sandbox confines it"
        )
    elif caps.permission_policy == "posture-only" and patterns:
        warnings.append(
            detail
            or f"{harness} enforces the posture, and permission rules only as far as its own "
            "switches go (permission_policy posture-only): these patterns apply to whole "
            f"tools at most, or not at all: {', '.join(patterns)}"
        )
    elif detail:
        warnings.append(detail)
    if options.model and not caps.model_selection:
        warnings.append(
            f"{harness} cannot be told a model (model_selection is false): "
            f"--model {options.model} is not passed to it"
        )
    return tuple(warnings)


def fit_request(request: TurnRequest, caps: Capabilities) -> TurnRequest:
    """The turn request as the harness can take it: what it has no channel for is moved or
    dropped here, once, rather than in each adapter. A system prompt without a system-prompt
    channel rides at the head of the input (where the harness listens: docs/adapters.md); a
    model it cannot be told is not handed to its adapter (the run's warning says so). An
    output schema the harness has no option for joins its system prompt; every attachment is
    named at the end of the input (a harness with an image input gets its images there too)."""
    changes: dict[str, object] = {}
    if request.output_schema is not None and caps.structured_output != "native":
        instruction = schema_instruction(request.output_schema)
        system = f"{request.system_prompt}\n\n{instruction}" if request.system_prompt else None
        request = dataclasses.replace(request, system_prompt=system or instruction)
    if request.attachments:
        request = dataclasses.replace(request, input=request.input + attachment_note(request))
    if request.system_prompt and not caps.system_prompt:
        changes.update(input=f"{request.system_prompt}\n\n{request.input}", system_prompt=None)
    if request.model and not caps.model_selection:
        changes["model"] = None
    return dataclasses.replace(request, **changes) if changes else request  # type: ignore[arg-type]


def schema_instruction(schema: Mapping[str, Any]) -> str:
    """How a harness without a schema option is told the shape of its final answer."""
    return (
        "Your final answer must be one JSON value, and nothing else (no prose around it, no "
        "code fence), that validates against this JSON Schema:\n"
        + json.dumps(schema, ensure_ascii=False, indent=1)
    )


def attachment_note(request: TurnRequest) -> str:
    """The lines naming a turn's attachments, appended to its input."""
    lines = [f"- {a.path} ({a.media_type}, {a.size} bytes)" for a in request.attachments]
    return "\n\nAttached files (paths relative to the working directory):\n" + "\n".join(lines)


def attachment_warning(request: TurnRequest, caps: Capabilities) -> str | None:
    """What the run's warnings say when the turn's images reach the harness only as files."""
    if caps.attachments == "images" or not any(a.image for a in request.attachments):
        return None
    return (
        f"turn {request.turn}: the harness has no image input; its images were named in the "
        "input as files in the workspace"
    )


def attachment_limits(settings: Settings) -> AttachmentLimits:
    return AttachmentLimits(
        settings.attach_max_bytes, settings.attach_max_files, settings.attach_max_total_bytes
    )


def check_schema(schema: object, settings: Settings) -> dict[str, Any] | None:
    """A run's or a turn's output schema within the operator's bound (None: none given)."""
    if schema is None:
        return None
    return check_output_schema(schema, settings.output_schema_max_bytes)


def check_input(text: str, settings: Settings) -> None:
    """Refuse a turn input that is empty, holds a NUL, is not valid UTF-8 or is too big.

    The client calls it before creating anything; the worker again before it prepares a
    sandbox. A lone surrogate (U+D800 to U+DFFF) is what invalid UTF-8 becomes in Python
    (``surrogateescape`` decoding of argv, or a producer's own decoding): it has no UTF-8, so
    no harness could be handed it.
    """
    if not text.strip():
        raise InvalidInput("the turn input is empty")
    if "\x00" in text:
        raise InvalidInput("the turn input contains a NUL character")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"the turn input {not_utf8(text, exc)}") from None
    if size > settings.max_input_bytes:
        raise InvalidInput(
            f"the turn input is {size} bytes, over the operator's limit of "
            f"{settings.max_input_bytes} (HARNESS_MAX_INPUT_BYTES)"
        )


def not_utf8(text: str, exc: UnicodeEncodeError) -> str:
    """The end of a sentence saying why ``text`` has no UTF-8 form (``exc`` from encoding it)."""
    char = text[exc.start]
    if 0xDC80 <= ord(char) <= 0xDCFF:  # surrogateescape's stand-in for an undecodable byte
        what = f"byte 0x{ord(char) - 0xDC00:02x}"
    else:
        what = f"a lone surrogate U+{ord(char):04X}"
    return f"is not valid UTF-8 text ({what} at character {exc.start})"


def resolve_secrets(options: RunOptions, settings: Settings) -> dict[str, str]:
    """Granted values, from the worker's own environment. Only names the policy allows."""
    allowed = settings.grants.get(options.harness, ())
    values: dict[str, str] = {}
    for name in options.grants:
        if name.startswith(RESERVED_PREFIX) or not _allowed(name, allowed):
            raise InvalidInput(f"grant {name!r} is not allowed for {options.harness}")
        value = os.environ.get(name)
        if value is None:
            raise InvalidInput(f"grant {name!r} is not available on this worker")
        values[name] = value
    return values
