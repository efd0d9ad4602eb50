"""Operator policy: what a producer may ask for. Checked by the client for a quick refusal
and enforced again by the worker, which never trusts the message it was handed."""

from __future__ import annotations

import os
from dataclasses import dataclass

from config import Settings
from worker.errors import InvalidInput
from worker.spec import RunOptions


@dataclass(frozen=True)
class Resolved:
    """The operator-approved shape of a run."""

    sandbox: str
    image: str | None
    network: str
    timeout_s: float
    executable: str | None


def _allowed(value: str, allowed: tuple[str, ...]) -> bool:
    return "*" in allowed or value in allowed


def resolve(options: RunOptions, settings: Settings) -> Resolved:
    """Apply operator policy to a producer's options, or raise InvalidInput naming the rule."""
    harness = options.harness
    sandbox = options.sandbox or settings.sandbox

    configured = settings.image_for(harness)
    image = options.image or configured
    if (
        options.image
        and options.image != configured
        and not _allowed(options.image, settings.allowed_images)
    ):
        raise InvalidInput(
            f"image {options.image!r} is not allowed for {harness} "
            "(operator policy HARNESS_ALLOWED_IMAGES)"
        )
    if sandbox == "docker" and not image:
        raise InvalidInput(f"no image is configured for {harness} (HARNESS_IMAGES)")

    network = options.network or settings.network
    if not _allowed(network, settings.allowed_networks):
        raise InvalidInput(
            f"network {network!r} is not allowed (operator policy HARNESS_ALLOWED_NETWORKS)"
        )

    executable = options.executable
    if harness == "stdio-json":
        if not executable:
            raise InvalidInput("the stdio-json harness needs --executable PATH")
        if not _allowed(executable, settings.allowed_executables):
            raise InvalidInput(
                f"executable {executable!r} is not allowed "
                "(operator policy HARNESS_ALLOWED_EXECUTABLES)"
            )
    elif executable:
        raise InvalidInput("--executable is only accepted for the stdio-json harness")

    allowed_grants = settings.grants.get(harness, ())
    for name in options.grants:
        if not _allowed(name, allowed_grants):
            raise InvalidInput(
                f"grant {name!r} is not allowed for {harness} (operator policy HARNESS_GRANTS)"
            )

    timeout = options.timeout_s or settings.turn_timeout_s
    if timeout > settings.max_turn_timeout_s:
        raise InvalidInput(
            f"timeout {timeout:g}s exceeds the operator's ceiling of "
            f"{settings.max_turn_timeout_s:g}s (HARNESS_MAX_TURN_TIMEOUT_S)"
        )
    return Resolved(sandbox, image, network, timeout, executable)


def check_input(text: str, settings: Settings) -> None:
    if not text.strip():
        raise InvalidInput("the turn input is empty")
    if "\x00" in text:
        raise InvalidInput("the turn input contains a NUL character")
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > settings.max_input_bytes:
        raise InvalidInput(
            f"the turn input is {size} bytes, over the operator's limit of "
            f"{settings.max_input_bytes} (HARNESS_MAX_INPUT_BYTES)"
        )


def resolve_secrets(options: RunOptions, settings: Settings) -> dict[str, str]:
    """Granted values, from the worker's own environment. Only names the policy allows."""
    allowed = settings.grants.get(options.harness, ())
    values: dict[str, str] = {}
    for name in options.grants:
        if not _allowed(name, allowed):
            raise InvalidInput(f"grant {name!r} is not allowed for {options.harness}")
        value = os.environ.get(name)
        if value is None:
            raise InvalidInput(f"grant {name!r} is not available on this worker")
        values[name] = value
    return values
