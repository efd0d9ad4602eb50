"""What a producer asks for: a run's options and one turn's payload, validated where they enter."""

from __future__ import annotations

import re
import secrets
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from adapters import HARNESS_IDS
from worker.errors import InvalidInput
from worker.options import tool_patterns
from worker.options.output_schema import check_output_schema
from worker.options.schema_regex import PatternError

SCHEMA_HARD_MAX_BYTES = 1024 * 1024
"""A schema's size the options accept at all; the operator's bound is checked by policy."""

RUN_ID = re.compile(r"^r[0-9a-f]{24}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# A Docker image reference: [registry[:port]/]name[:tag][@digest], lower-case path components.
# Patterns are applied with fullmatch: "$" alone would accept a trailing newline.
_DOMAIN_PART = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
IMAGE_REF = re.compile(
    rf"^(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@sha256:[a-f0-9]{64})?$"
)
GIT_REF = re.compile(r"^(?!-)(?!.*\.\.)(?!.*//)(?!.*@\{)[A-Za-z0-9_./-]{1,200}(?<![./])$")
"""A branch, tag or commit id: no leading "-" (it becomes an argv value), no "..", no "@{"."""
SESSION_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,199}$")
"""Vendor session ids travel as argv values (``--resume ID``): never with a leading "-"."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # for one-line fields: newlines and tabs too


def shown(value: object, limit: int = 80) -> str:
    """A producer's value for an error message: its repr, cut short (never 10 MiB of it)."""
    if not isinstance(value, str) or len(value) <= limit:
        return repr(value)[: limit + 40]
    return f"{value[:limit]!r}... ({len(value)} characters)"


def new_run_id() -> str:
    return "r" + secrets.token_hex(12)


LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,62}$")
LABEL_VALUE = re.compile(r"^[A-Za-z0-9_.:@/+\-]{0,200}$")
MAX_LABELS = 32


def parse_label(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (``--label``, the API's ``label=`` filter) as its two parts."""
    key, sep, value = text.partition("=")
    if not sep:
        raise InvalidInput(f"invalid label {shown(text)}: expected KEY=VALUE")
    return next(iter(check_labels({key: value}).items()))


def check_labels(labels: object) -> dict[str, str]:
    """A run's labels, or InvalidInput: up to 32, a key of 1 to 63 letters, digits, '_',
    '.', '-' or '/' (starting with a letter or a digit), a value of up to 200 of those or
    ':', '@', '+'."""
    if not isinstance(labels, dict):
        raise InvalidInput("invalid request: labels: expected an object of KEY: VALUE strings")
    if len(labels) > MAX_LABELS:
        raise InvalidInput(f"invalid request: labels: at most {MAX_LABELS} labels")
    for key, value in labels.items():
        if not isinstance(key, str) or not LABEL_KEY.fullmatch(key):
            raise InvalidInput(
                f"invalid request: labels: invalid key {shown(key)}: 1 to 63 letters, digits, "
                "'_', '.', '-' or '/', starting with a letter or a digit"
            )
        if not isinstance(value, str) or not LABEL_VALUE.fullmatch(value):
            raise InvalidInput(
                f"invalid request: labels.{key}: invalid value {shown(value)}: up to 200 "
                "letters, digits, '_', '.', ':', '@', '/', '+' or '-'"
            )
    return dict(labels)


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise InvalidInput(f"invalid run id {shown(run_id)}: expected 'r' and 24 hex digits")
    return run_id


SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
"""A tool set's or an operator's MCP server's name (``--tools``, ``--mcp``): it becomes part
of the tools' names each CLI shows its model."""
MAX_SERVERS = 16
"""At most this many tool sets, and as many MCP servers, attached to one run."""
MAX_FALLBACK_MODELS = 8
"""At most this many ``--fallback-model`` names (each a request the gateway may send again)."""
MAX_RULES = 100
"""At most this many ``--allow`` patterns, and as many ``--deny``."""
OUTCOME_MAX_CHARS = 64 * 1024
"""The longest ``--outcome`` rubric: it is part of every grader turn's input."""
MAX_ITERATIONS = 50
"""The most turns one outcome may be graded over (``--max-iterations``)."""
BUDGET_MAXIMA: dict[str, int] = {
    "max_cost_usd": 1_000_000,
    "max_tokens": 10**12,
    "max_turns": 1_000_000,
    "max_wall_s": 10**9,
}
"""The largest value of each budget limit a producer may ask for (here, in ``harness
budget`` and in the API's ``PATCH .../budget``), whatever the operator's ceiling."""


class RunOptions(BaseModel):
    """A run's options, fixed at ``start_run`` and stored in the run record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    harness: str
    model: str | None = Field(None, max_length=200)
    system_prompt: str | None = Field(None, max_length=1_000_000)
    posture: Literal["strict", "auto", "dangerous", "ask"] = "auto"
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    grants: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    """Tool sets served by producer code the harness may call (``--tools``, docs/mcp.md)."""
    mcp: tuple[str, ...] = ()
    """MCP servers of the operator's (``HARNESS_MCP_SERVERS``) the harness may call (``--mcp``)."""
    sandbox: Literal["docker", "local"] | None = None
    image: str | None = None
    network: Literal["none", "bridge", "host", "egress"] | None = None
    resume_session: str | None = None
    base_url: str | None = Field(None, max_length=2000)
    fallback_models: tuple[str, ...] = ()
    """Models the model gateway asks in turn when the model asked for fails (5xx, 529):
    ``--fallback-model``, repeatable (before the operator's HARNESS_FALLBACK_MODELS)."""
    executable: str | None = Field(None, max_length=4096)
    timeout_s: float | None = Field(None, gt=0)
    memory: str | None = Field(None, pattern=r"^[0-9]{1,15}[bkmg]?$")
    """The container's memory limit (bytes, or a number with b, k, m or g), within policy."""
    cpus: float | None = Field(None, gt=0, le=1024)
    pids: int | None = Field(None, gt=0, le=10_000_000)
    workspace: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    """A durable workspace name shared across runs; None gives the run its own."""
    max_cost_usd: float | None = Field(None, gt=0, le=BUDGET_MAXIMA["max_cost_usd"])
    """The run's budget in USD (``worker.spend.budgets``), within the operator's ceiling."""
    max_tokens: int | None = Field(None, gt=0, le=BUDGET_MAXIMA["max_tokens"])
    """The run's budget in tokens, input (replayed context included) plus output."""
    max_turns: int | None = Field(None, gt=0, le=BUDGET_MAXIMA["max_turns"])
    """The most turns the run may begin (turns the worker sends again after a park count)."""
    max_wall_s: float | None = Field(None, gt=0, le=BUDGET_MAXIMA["max_wall_s"])
    """The most seconds the run's turns may run in all."""
    on_limit: Literal["park", "fail"] | None = None
    """A turn that meets a rate limit or a quota with a reset: park the run until the reset
    and send the turn again (``park``), or end it there (``fail``); None: the operator's
    HARNESS_ON_LIMIT."""
    producer: str | None = Field(None, pattern=r"^[A-Za-z0-9_.:@-]{1,64}$")
    """Who submitted the run: turns waiting for a concurrency slot of a key are served
    fairly across producers (``worker.spend.slots``)."""
    key_slots: dict[str, int] | None = None
    """Per limited grant (``HARNESS_KEY_SLOTS``), the most of its key's slots this run's
    producer holds at once (within the operator's limit): a tenant's policy sets it."""
    repo: str | None = Field(None, max_length=2000)
    """A git repository the worker clones into the workspace before the first turn."""
    ref: str | None = None
    """The branch, tag or commit of ``repo`` (default: the remote's HEAD)."""
    archive: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    """The SHA-256 of an archive the producer uploaded for the worker to unpack into the
    workspace (the client sets it; the upload is checked against it)."""
    archive_bytes: int | None = Field(None, ge=0)
    push_branch: str | None = None
    """A branch of ``repo`` the worker pushes each turn's snapshot to, as a commit."""
    output_schema: dict[str, Any] | None = None
    """A JSON Schema every turn's final answer must meet (a turn may give its own): the
    answer's JSON value is ``turn-complete``'s ``structured``."""
    outcome: str | None = Field(None, min_length=1, max_length=OUTCOME_MAX_CHARS)
    """A rubric the run's result must meet (``--outcome``): after each completed turn a
    grader judges it, and its feedback is the next turn's input until it is met or
    ``max_iterations`` turns were graded (worker/outcomes/)."""
    max_iterations: int | None = Field(None, ge=1, le=MAX_ITERATIONS)
    """The most turns graded against ``outcome`` (None: 3)."""
    grader: str | None = None
    """The harness of the outcome's grader (None: the run's own)."""
    grader_model: str | None = Field(None, max_length=200)
    """The grader's model (None: the run's own when the grader is the run's harness)."""

    @field_validator("*", mode="before")
    @classmethod
    def _encodable(cls, value: Any) -> Any:
        # A lone surrogate has no UTF-8: it could reach neither Redis nor a broker message.
        texts = value if isinstance(value, list | tuple) else (value,)
        for text in texts:
            if isinstance(text, str) and not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError(
                        f"must be valid Unicode text, not {shown(text)} (a lone surrogate)"
                    ) from None
        return value

    @field_validator("output_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if info.context and info.context.get(STORED):
            # A run record's options were checked when the run was made; a check made stricter
            # since must not make the run unreadable (its turns still check answers in bounds).
            return value
        return _valid_schema(value)

    @field_validator("harness", "grader")
    @classmethod
    def _known_harness(cls, value: str | None) -> str | None:
        if value is not None and value not in HARNESS_IDS:
            raise ValueError(f"unknown harness {shown(value)}; known: {', '.join(HARNESS_IDS)}")
        return value

    @field_validator("model", "system_prompt", "executable", "base_url", "outcome")
    @classmethod
    def _no_control(cls, value: str | None) -> str | None:
        if value is not None and "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value

    @field_validator("model", "grader_model")
    @classmethod
    def _model_name(cls, value: str | None) -> str | None:
        if value is not None and (
            not value.strip() or _CONTROL.search(value) or value.startswith("-")
        ):
            raise ValueError("must be a plain model name (it becomes an argv value)")
        return value

    @field_validator("fallback_models")
    @classmethod
    def _fallback_models(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(value) > MAX_FALLBACK_MODELS:
            raise ValueError(f"at most {MAX_FALLBACK_MODELS} fallback models")
        for model in value:
            if not model.strip() or len(model) > 200 or _CONTROL.search(model):
                raise ValueError(f"invalid fallback model {shown(model)}: a plain model name")
        return value

    @field_validator("allow", "deny")
    @classmethod
    def _patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(value) > MAX_RULES:
            raise ValueError(f"at most {MAX_RULES} patterns (each is tried on every request)")
        for pattern in value:
            # Patterns become argv values of variadic flags: a leading "-" would be a flag.
            if not pattern or len(pattern) > 500 or _CONTROL.search(pattern) or pattern[0] == "-":
                raise ValueError(
                    f"invalid tool pattern {shown(pattern)}: 1 to 500 characters, no "
                    "control characters, not starting with '-'"
                )
            try:
                tool_patterns.check_pattern(pattern)
            except PatternError as exc:
                raise ValueError(f"invalid tool pattern {shown(pattern)}: {exc}") from None
        return value

    @field_validator("grants")
    @classmethod
    def _grant_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(
                    f"invalid grant name {shown(name)}: use an environment variable name"
                )
        return value

    @field_validator("key_slots")
    @classmethod
    def _key_slots(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        for name, most in (value or {}).items():
            if not ENV_NAME.fullmatch(name) or not 1 <= most <= 10**6:
                raise ValueError(
                    f"invalid key slots {shown(name)}={most}: a grant name and 1 to 1000000"
                )
        return value

    @field_validator("tools", "mcp")
    @classmethod
    def _server_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not SERVER_NAME.fullmatch(name):
                raise ValueError(
                    f"invalid server name {shown(name)}: 1 to 32 letters, digits, '_' or '-'"
                )
        if len(set(value)) != len(value) or len(value) > MAX_SERVERS:
            raise ValueError(f"at most {MAX_SERVERS} names, each once")
        return value

    @model_validator(mode="after")
    def _one_server_per_name(self) -> RunOptions:
        both = set(self.tools) & set(self.mcp)
        if both:
            raise ValueError(f"{', '.join(sorted(both))}: attached both as --tools and --mcp")
        return self

    @field_validator("image")
    @classmethod
    def _image_ref(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 255 or not IMAGE_REF.fullmatch(value)):
            raise ValueError(
                f"invalid image reference {shown(value)}: expected [registry/]name[:tag][@digest]"
            )
        return value

    @field_validator("resume_session")
    @classmethod
    def _session_id(cls, value: str | None) -> str | None:
        if value is not None and not SESSION_ID.fullmatch(value):
            raise ValueError(
                f"invalid vendor session id {shown(value)}: up to 200 letters, digits, "
                "'_', '.', ':' or '-', starting with a letter, a digit or '_'"
            )
        return value

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"^https?://[^\s/?#]+[^\s]*$", value):
            raise ValueError(f"invalid base URL {shown(value)}: expected http(s)://host[/path]")
        return value

    @field_validator("repo")
    @classmethod
    def _repo(cls, value: str | None) -> str | None:
        if value is not None and (
            not value.strip() or _CONTROL.search(value) or value.startswith("-") or " " in value
        ):
            raise ValueError(f"invalid repository URL {shown(value)}")
        return value

    @field_validator("ref", "push_branch")
    @classmethod
    def _git_ref(cls, value: str | None) -> str | None:
        if value is not None and not GIT_REF.fullmatch(value):
            raise ValueError(
                f"{shown(value)} is not a git branch, tag or commit: letters, digits, '_', "
                "'.', '/' or '-', not starting with '-', without '..'"
            )
        return value

    @model_validator(mode="after")
    def _one_seed(self) -> RunOptions:
        if self.repo and self.archive:
            raise ValueError("a run is seeded from --repo or from --archive, not both")
        if self.ref and not self.repo:
            raise ValueError("--ref needs --repo")
        if self.push_branch and not self.repo:
            raise ValueError("--push-branch needs --repo (it pushes to the seed repository)")
        return self

    @model_validator(mode="after")
    def _graded(self) -> RunOptions:
        if self.outcome is None and (
            self.max_iterations is not None or self.grader or self.grader_model
        ):
            raise ValueError("--max-iterations, --grader and --grader-model need --outcome")
        if self.outcome is not None and not self.outcome.strip():
            raise ValueError("outcome: an empty rubric")
        return self

    @field_validator("executable")
    @classmethod
    def _executable(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or _CONTROL.search(value)):
            raise ValueError("must be a path to a program")
        return value


STORED = "stored"
"""Validation context key: the values come from a run record, not from a producer."""


def _valid_schema(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    try:
        return check_output_schema(value, SCHEMA_HARD_MAX_BYTES)
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None


class AttachmentRef(BaseModel):
    """One attachment of a turn as its message names it: uploaded through Redis (its chunks
    at ``Keys.attachment``), checked again by the worker against these facts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,99}$")
    size: int = Field(ge=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    media_type: Literal[
        "image/png", "image/jpeg", "image/gif", "image/webp", "application/octet-stream"
    ]


class TurnPayload(BaseModel):
    """The Celery message of one turn. Never holds a secret: grants travel by name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str
    turn: int = Field(ge=1)
    input: str
    not_before: float | None = None
    """Unix time before which the turn must not run: a parked run's turn, sent with a
    countdown to its reset (worker/spend/parking.py); a copy delivered early is sent on again."""
    attachments: tuple[AttachmentRef, ...] = ()
    output_schema: dict[str, Any] | None = None
    """This turn's schema, in place of the run's ``output_schema``."""
    messages: tuple[dict[str, Any], ...] = ()
    """The messages (``harness steer``) whose texts are this turn's input, each published as a
    ``user-message`` after its ``turn-started`` (worker/control/messages.py)."""

    @field_validator("output_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return _valid_schema(value)

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, value: str) -> str:
        if not RUN_ID.fullmatch(value):
            raise ValueError("invalid run id")
        return value


def parse_options(**fields: object) -> RunOptions:
    """Build RunOptions, turning validation failures into one readable InvalidInput."""
    try:
        return RunOptions(**fields)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise InvalidInput(_describe(exc)) from None


_EXPECTED_FORM = {
    "memory": "a memory size: a number of bytes, or a number followed by b, k, m or g (512m, 2g)",
    "workspace": "a workspace name: 1 to 64 letters, digits, '_', '.' or '-', starting with "
    "a letter or a digit",
    "archive": "the SHA-256 of the uploaded archive (64 hex digits)",
    "producer": "a producer id: 1 to 64 letters, digits, '_', '.', ':', '@' or '-'",
}
"""What a field with a ``pattern`` expects, in words: pydantic's own message would print
the regular expression to the producer."""


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "input"
        if error["type"] == "string_pattern_mismatch":
            form = _EXPECTED_FORM.get(where, "the documented form")
            message = f"{shown(error['input'])} is not {form}"
        elif error["type"] == "extra_forbidden":
            message = "unknown option (refused rather than ignored)"
        else:
            message = error["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}")
    return "invalid request: " + "; ".join(parts)
