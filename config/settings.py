"""Typed settings, read from ``HARNESS_*`` environment variables (and an optional ``.env``).

Every variable is listed with its default in ``config/.env.example``; a test keeps the two
in sync. ``load_settings()`` turns a validation failure into :class:`SettingsError` naming
the variable, so a worker with a bad setting fails at start with a sentence, not a trace.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from config.harnesses import DEFAULT_GRANTS, DEFAULT_IMAGES

CommaList = Annotated[tuple[str, ...], NoDecode]
Mapping = Annotated[dict[str, str], NoDecode]
GrantMap = Annotated[dict[str, tuple[str, ...]], NoDecode]

DEFAULT_EGRESS_ALLOW: dict[str, tuple[str, ...]] = {
    "claude-code": ("api.anthropic.com:443",),
    "codex": ("api.openai.com:443",),
    "gemini": ("generativelanguage.googleapis.com:443",),
    "opencode": (),
    "pi": (),
    "stdio-json": (),
}
"""The vendors' model APIs; OpenCode and Pi talk to whichever provider they are configured
for, so operators name theirs."""


class McpUpstream(BaseModel):
    """An MCP server the operator names (``HARNESS_MCP_SERVERS``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    url: str = Field(pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict)


class SettingsError(ValueError):
    """A setting is missing or invalid; the message names the variable."""


def _split(value: object) -> object:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="HARNESS_", env_file=".env", extra="ignore", frozen=True
    )

    # Where things live
    broker_url: str = "redis://127.0.0.1:6379/0"
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field("harness", pattern=r"^[A-Za-z0-9_.-]{1,32}$")

    # Sandboxes
    sandbox: Literal["docker", "local"] = "docker"
    images: Mapping = Field(default_factory=lambda: dict(DEFAULT_IMAGES))
    network: Literal["none", "bridge", "host", "egress"] = "bridge"
    workspace_root: str = "/tmp/harness-worker"
    container_user: str = Field("1000:1000", pattern=r"^[0-9]{1,10}(:[0-9]{1,10})?$")
    read_only_root: bool = True
    memory: str = Field("2g", pattern=r"^[0-9]+[bkmg]?$")
    cpus: float = Field(2.0, ge=0.01, le=256)  # below 0.01, Docker reads 0 CPUs as unlimited
    pids: int = Field(512, gt=0, le=1_000_000)
    docker_url: str | None = None
    """Docker daemon to use (default: DOCKER_HOST or the local socket)."""
    warm_pool: int = Field(0, ge=0, le=64)
    """Started containers kept waiting per image (default network and limits), so that a new
    run's first turn skips container create and start."""
    egress_allow: GrantMap = Field(default_factory=lambda: dict(DEFAULT_EGRESS_ALLOW))
    """Network ``egress``: per harness, the hosts its runs may reach through the gateway,
    ``harness=host:port|host:port;harness2=...`` (a harness not named: its defaults)."""
    egress_allow_base_url: bool = False
    """Network ``egress``: also allow the host and port of a run's ``--base-url``."""
    egress_hosts: Mapping = Field(default_factory=dict)
    """Network ``egress``: names pinned to addresses for the gateway (``name=ip,...``). The
    gateway resolves every other name itself and refuses private, loopback and link-local
    addresses; a pinned name may have one."""
    egress_resolvers: CommaList = ()
    """Network ``egress``: DNS servers of the gateway (default: its container's own)."""
    egress_subnet: str = "172.30.240.0/24"
    """Network ``egress``: the subnet of the egress network (one per Docker host and key
    prefix; ``.1`` and ``.2`` are the gateway's)."""
    egress_outside_network: str = "bridge"
    """Network ``egress``: the Docker network through which the gateway reaches allowed hosts."""
    egress_gateway_image: str = "harness-worker/gateway:1"
    """The egress gateway's image; its iptables also installs network ``bridge``'s rules."""
    bridge_isolation: bool = True
    """Network ``bridge``: runs join a network of ours on which they reach neither each
    other, nor this host's services, nor a private or link-local address (cloud metadata)
    unless HARNESS_BRIDGE_ALLOW lists it; false: Docker's default bridge, where they do
    (each such run records a warning)."""
    bridge_allow: CommaList = ()
    """Network ``bridge``: private or host destinations its runs may still reach, as IPv4
    ``ADDRESS[/PREFIX][:PORT]`` (TCP): a model proxy on this host, say."""

    # The model gateway (worker/gateway/): model keys stay in the worker
    model_gateway: Literal["on", "off"] = "on"
    """``on``: a granted model key (HARNESS_MODEL_KEYS) never enters a sandbox; the harness
    holds a stand-in and its model requests go through the turn's gateway, which swaps it for
    the key. ``off``: keys enter the sandbox as they are (each run records a warning)."""
    model_keys: CommaList = ()
    """Variable names that are model keys besides the five CLIs' own
    (worker/gateway/upstreams.py)."""
    model_upstreams: GrantMap = Field(default_factory=dict)
    """Per harness, where its model requests go instead of the vendor's API:
    ``HARNESS=URL,...`` (a company's LLM proxy, a self-hosted model). A producer's
    ``--base-url`` (where HARNESS_ALLOWED_BASE_URLS allows it) comes first."""
    model_request_max_bytes: int = Field(32 * 1024 * 1024, gt=0)
    """The largest model request body the gateway takes (a larger one is answered 413)."""
    model_max_connections: int = Field(32, gt=0, le=10_000)
    """Connections one turn may hold open to its model gateway at once (one more is answered
    503 and closed): a turn cannot exhaust the worker's descriptors, which its other turns
    share."""
    model_ca_file: str | None = None
    """A PEM file of CAs the model gateway trusts for its upstreams besides the system's (a
    company's LLM proxy with an internal CA). Names HARNESS_EGRESS_HOSTS pins are connected to
    at their address by the gateway too."""
    model_relay_port: int = Field(47311, gt=0, lt=65536)
    """The loopback port, inside a run's container, on which the harness reaches its gateway."""
    fallback_models: GrantMap = Field(default_factory=dict)
    """Per harness, models the gateway asks in turn when the model asked for fails (5xx, 529):
    ``harness=M1|M2;harness2=M3``. A producer's ``--fallback-model`` comes first."""
    fallback_on_429: bool = False
    """Also fall back when the model answers 429 (a rate limit): by default that parks the turn."""

    # Operator policy: what a producer may ask for ("*" allows anything)
    allowed_images: CommaList = ()
    """Images a producer may name besides the configured ones: ``IMAGE`` for any harness,
    ``HARNESS=IMAGE`` or ``HARNESS=*`` for one harness."""
    allowed_sandboxes: CommaList = ()
    """Sandbox backends a producer may ask for besides HARNESS_SANDBOX (default: none)."""
    allowed_networks: CommaList = ("none", "bridge", "egress")
    allowed_executables: CommaList = ("harness-demo",)
    allowed_base_urls: CommaList = ()
    """Base URLs a producer may point a harness at (``--base-url``), where the harness sends
    its granted model key: ``*``, a host (``*.example.com``: its subdomains), ``host:port`` or
    a URL prefix (``https://host:port/path``). Default: none."""
    grants: GrantMap = Field(default_factory=lambda: dict(DEFAULT_GRANTS))
    """Per harness, the grant names a producer may ask for: ``harness=A|B;harness2=C``."""
    max_memory: str = Field("8g", pattern=r"^[0-9]+[bkmg]?$")
    max_cpus: float = Field(4.0, gt=0)
    max_pids: int = Field(4096, gt=0)
    max_turn_timeout_s: float = Field(3600.0, gt=0)
    max_input_bytes: int = Field(16 * 1024 * 1024, gt=0)
    max_waiting_messages: int = Field(100, gt=0)
    """At most this many messages (``harness steer``) wait for one run at once: one more is
    refused until turns take them."""

    # Work in and out: seeding a run's workspace, snapshots after every turn, diff/export/rewind
    repo_schemes: CommaList = ("https",)
    """URL schemes a producer's ``--repo`` may use (https, http, ssh, git, file)."""
    repo_hosts: CommaList = ("*",)
    """Hosts a ``--repo`` may name ("*": any public host). A host that resolves to a loopback,
    private or link-local address is refused unless it is named here."""
    repo_credentials: Mapping = Field(default_factory=dict)
    """Per repository host, the worker environment variable holding its git token
    (``host=VAR,host2=VAR2``): used by the worker for the clone and pushes only."""
    repo_timeout_s: float = Field(300.0, gt=0)
    archive_max_bytes: int = Field(100 * 1024 * 1024, gt=0)
    """The largest ``--archive`` a producer may upload, in bytes."""
    archive_max_files: int = Field(50_000, gt=0)
    archive_max_unpacked_bytes: int = Field(2 * 1024**3, gt=0)
    archive_max_ratio: float = Field(200.0, gt=1)
    """The largest compression ratio of an archive member (a zip bomb is refused)."""
    attach_max_bytes: int = Field(10 * 1024 * 1024, gt=0)
    """The largest file a turn may attach (``--attach``), in bytes."""
    attach_max_files: int = Field(10, gt=0)
    """The most files one turn may attach."""
    attach_max_total_bytes: int = Field(25 * 1024 * 1024, gt=0)
    """The most bytes one turn's attachments may hold together."""
    output_schema_max_bytes: int = Field(64 * 1024, gt=0)
    """The largest ``--output-schema`` (as JSON), in bytes."""
    snapshots: bool = True
    """Snapshot every turn's workspace (the ``workspace`` event, diff, export, rewind)."""
    snapshot_ignore: CommaList = ("node_modules", "__pycache__", ".venv")
    """Paths a snapshot skips besides .home and .git: a name matches that name anywhere in
    the tree (fnmatch patterns allowed), a name with a "/" a path from the workspace."""
    snapshot_max_file_bytes: int = Field(10 * 1024 * 1024, gt=0)
    """A larger file is recorded by its hash and size, not its content."""
    snapshot_max_files: int = Field(200_000, gt=0)
    snapshot_max_bytes: int = Field(2 * 1024**3, gt=0)
    snapshot_timeout_s: float = Field(120.0, gt=0)
    snapshot_watch: bool = True
    """Rescan only the folders inotify saw change since the last snapshot (a full walk every
    16th); false walks every snapshot's whole tree: for workspaces whose writes do not reach
    the worker's inotify (a Docker daemon in a VM, NFS, FUSE)."""
    export_max_bytes: int = Field(1024**3, gt=0)
    """The largest workspace ``harness export`` hands out, uncompressed, in bytes."""
    workspace_reply_timeout_s: float = Field(120.0, gt=0)
    """How long diff, export and rewind wait for the run's host to answer."""

    # Spend and limits (docs/events.md): run budgets, parking on rate limits and quotas, key slots
    max_run_cost_usd: float = Field(0.0, ge=0)
    """The largest budget in USD a run may have (0: no ceiling)."""
    max_run_tokens: int = Field(0, ge=0)
    """The largest budget in tokens (input, replayed context included, plus output) a run may
    have (0: no ceiling)."""
    max_run_turns: int = Field(0, ge=0)
    """The most turns a run may be allowed (0: no ceiling)."""
    max_run_wall_s: float = Field(0.0, ge=0)
    """The most seconds a run's turns may be allowed to run in all (0: no ceiling)."""
    run_cost_usd: float = Field(0.0, ge=0)
    """A run's budget in USD when its producer names none (0: the ceiling, if any)."""
    run_tokens: int = Field(0, ge=0)
    """A run's budget in tokens when its producer names none (0: the ceiling, if any)."""
    run_turns: int = Field(0, ge=0)
    """A run's budget in turns when its producer names none (0: the ceiling, if any)."""
    run_wall_s: float = Field(0.0, ge=0)
    """A run's budget in seconds of turns when its producer names none (0: the ceiling)."""
    on_limit: Literal["park", "fail"] = "park"
    """A turn that meets a rate limit, or a quota with a reset time: ``park`` the run and send
    the turn again at the reset (or after a backoff), or ``fail`` (the producer decides)."""
    max_parks: int = Field(5, ge=0)
    """The most times one run is parked; the next limit ends its turn for the producer."""
    park_max_s: float = Field(6 * 3600.0, gt=0)
    """The longest wait for a reset a run is parked for; a reset further away fails the turn."""
    backoff_base_s: float = Field(30.0, gt=0)
    """A rate limit without a reset time parks the run for this, doubled at every park in a
    row, with jitter (between half and all of it)."""
    backoff_max_s: float = Field(900.0, gt=0)
    """The longest such backoff."""
    key_slots: Mapping = Field(default_factory=dict)
    """Per grant name, the most turns that may run at once, fleet-wide, on one value of it
    (``OPENAI_API_KEY=4,ANTHROPIC_API_KEY=2``); a grant not named is not limited."""
    slot_retry_s: float = Field(2.0, gt=0)
    """How often a turn waiting for a slot asks again (it is sent back to its queue with this
    countdown, holding no worker meanwhile)."""

    # Turns
    turn_timeout_s: float = Field(1800.0, gt=0)
    idle_timeout_s: float = Field(600.0, gt=0)
    grader_timeout_s: float = Field(600.0, gt=0)
    """The longest a run's outcome grader (``--outcome``) may take to judge one turn: its
    turn's timeout (worker/outcomes/)."""
    schedule_tick_s: float = Field(1.0, gt=0, le=60)
    """How often every worker looks for due schedules (worker/schedules/firing.py): a
    schedule fires within about this long of its time."""
    schedule_max_failures: int = Field(3, ge=1)
    """A schedule whose firings fail this many times in a row pauses itself, saying why
    (worker/schedules/)."""
    schedule_history: int = Field(100, ge=1, le=10_000)
    """How many of a schedule's firings its history keeps (newest first; the history also
    expires HARNESS_RETENTION_S after its last firing)."""
    exit_grace_s: float = Field(2.0, ge=0)
    """After the harness's final message, how long it may take to exit before it is killed."""
    kill_grace_s: float = Field(1.0, ge=0)
    """Between SIGTERM and SIGKILL when a turn is stopped."""
    shutdown_grace_s: float = Field(10.0, ge=0)
    """On a warm shutdown, how long in-flight turns may still run before they are stopped."""
    max_line_bytes: int = Field(8 * 1024 * 1024, gt=1024)
    coalesce_text_chars: int = Field(0, ge=0, le=1024 * 1024)
    """Consecutive ``assistant-text`` events read together (already in one batch of the
    harness's output: none waits for more) are published as one stream entry of up to this
    many characters of text (adapters/stream.py, ``StreamDriver.coalesce_chars``). 0: one
    entry per harness line."""

    # Permission requests answered live (--posture ask; worker/permissions/requests.py)
    permission_ask: bool = True
    """Whether producers may start runs with ``--posture ask``."""
    permission_timeout_s: float = Field(600.0, gt=0, le=7 * 24 * 3600)
    """How long a permission request waits for its answer before it is denied. The turn and
    idle timeouts stand still while a request waits; this wait runs instead."""

    # Tools for the agent (worker/tools/; docs/mcp.md)
    mcp_servers: dict[str, McpUpstream] = Field(default_factory=dict)
    """The MCP servers (streamable HTTP) a run may attach with ``--mcp NAME``, as JSON:
    ``{"NAME": {"url": "https://...", "headers": {"Authorization": "Bearer ..."}}}``. The
    worker forwards calls with these headers; they never enter a sandbox, a stream or a log."""
    tool_call_timeout_s: float = Field(60.0, gt=0, le=3600)
    """How long one tool call waits for its answer; past it the harness gets an error result
    and the turn goes on. The idle timeout stands still while a call waits."""
    tool_result_max_chars: int = Field(100_000, gt=0, le=10_000_000)
    """The most of a tool's result a harness gets; a longer one is cut, and says so."""
    tool_calls_in_flight: int = Field(8, gt=0, le=256)
    """At most this many tool calls of one run wait at once; more are refused at once."""
    shared_tool_sets: CommaList = ()
    """Tool sets the operator shares with every API tenant: a tenant's run that attaches one
    reaches the set of that name served without a tenant. Any other set a tenant's run names
    is that tenant's own (worker/options/tenant_names.py)."""

    # Redis retention
    stream_maxlen: int = Field(100_000, gt=0)
    retention_s: int = Field(7 * 24 * 3600, gt=0)
    idempotency_ttl_s: int = Field(24 * 3600, gt=0, le=30 * 24 * 3600)
    """How long an ``Idempotency-Key`` (``start_run``/``submit_turn``, the API's header)
    returns its first answer (worker/store/idempotency.py)."""
    run_lease_s: int = Field(3600, gt=0)

    # Workers
    concurrency: int = Field(32, gt=0, le=1024)
    pool: Literal["threads", "prefork", "solo"] = "threads"
    host_queue: str = Field("", pattern=r"^[A-Za-z0-9_.@:-]*$")
    """Override of this worker's host queue. By default it names where a run's sandbox lives:
    ``<key_prefix>.host.docker.<daemon ID head>.<mark>`` for Docker (every worker on one
    daemon shares it), ``<key_prefix>.host.local.<hostname>`` for the local sandbox
    (sandbox/identity.py). Later turns of a run whose sandbox lives there are routed to it."""
    harness_queues: CommaList = ()
    """Harness queues this worker consumes (default: all)."""
    reap_interval_s: float = Field(60.0, gt=0)
    resend_after_s: float = Field(300.0, gt=0)
    """A turn still not taken by any worker this long after it was sent is sent again by the
    reaper (a message held by a killed worker can be lost to the broker); the redelivery
    guard makes the copy harmless if the first one turns up after all."""
    heartbeat_ttl_s: int = Field(30, ge=2)
    """A turn's owner heartbeat lives this long; a turn without one is closed as worker-lost."""
    visibility_timeout_s: int = Field(0, ge=0)
    """Broker redelivery delay for unacknowledged turns; 0 = above the longest allowed turn."""
    host_timeout_s: float = Field(30.0, gt=0)
    """A queue's consumer heartbeat lives this long: a worker silent this long is away."""
    host_wait_s: float = Field(600.0, gt=0)
    """How long a turn waits, queued, for a worker on its run's host before it ends with a
    ``sandbox`` error (the run and its workspace are kept: submit the turn again later)."""
    metrics_port: int = Field(9540, ge=0, le=65535)
    """Port of the worker's Prometheus endpoint (0: off). Several workers on one machine
    need one port each; in containers every worker can keep the default."""
    metrics_addr: str = "127.0.0.1"
    """Address the metrics endpoint listens on: this machine only by default (0.0.0.0: every
    interface, for a Prometheus elsewhere; keep that port away from the runs' networks)."""
    log_format: Literal["auto", "json", "text"] = "auto"
    """Worker log lines: json, text (key=value), or auto (json unless stderr is a terminal)."""
    harness_telemetry: bool = False
    """Route the harness CLIs' own OpenTelemetry (Claude Code, Gemini CLI, Codex) to the
    collector at ``harness_telemetry_endpoint`` (docs/observability.md); off: their own
    defaults, which export nothing."""
    harness_telemetry_endpoint: str = ""
    """The collector's OTLP/HTTP base URL as a harness reaches it from its sandbox (default:
    the worker's own ``OTEL_EXPORTER_OTLP_ENDPOINT``). Allowed through the egress gateway
    while ``harness_telemetry`` is on."""
    harness_telemetry_prompts: bool = False
    """Let the CLIs' telemetry carry prompt text (off: they are told never to export it)."""
    stall_report_s: float = Field(60.0, ge=0)
    """A turn whose harness has been silent this long has what it is doing (its last event,
    its sandbox's processes and connections) written for ``harness status``, again at this
    interval while the silence lasts (0: never). An idle or turn timeout says it anyway."""

    # The HTTP API (harness api; docs/api.md)
    tenants_file: str = ""
    """The tenants and their keys (JSON, or TOML when it ends in ``.toml``); without one
    every request but ``/v1/healthz`` is refused (401)."""
    api_max_body_bytes: int = Field(17 * 1024 * 1024, gt=0)
    """The largest request body (413 above): a turn input up to HARNESS_MAX_INPUT_BYTES and
    its JSON around it (a run created with an archive may add HARNESS_ARCHIVE_MAX_BYTES)."""
    api_rate_limit: int = Field(600, ge=0)
    """Requests per tenant per window (0: no limit); a tenant's own ``rate_limit`` is
    bounded by it."""
    api_rate_window_s: int = Field(60, gt=0)
    """The rate limit's window, in seconds."""
    api_failed_auth_limit: int = Field(20, ge=0)
    """Requests with a wrong key one client address may send per HARNESS_API_RATE_WINDOW_S
    (0: no limit); past it every request of that address bearing a key is refused (429)
    until the window ends. The address is the connection's peer (behind a proxy, the
    proxy's)."""
    api_streams_per_tenant: int = Field(50, ge=0)
    """Event streams one tenant may hold open at once on one API process (0: no limit;
    429 past it)."""
    api_keepalive_s: float = Field(15.0, gt=0)
    """A comment line on an idle event stream this often (proxies drop silent ones)."""
    api_cors_origins: CommaList = ()
    """Origins a browser may call the API from; none (the default) sends no CORS headers."""
    api_read_batch: int = Field(256, gt=0, le=4096)
    """Run streams one XREAD of the shared stream reader names at most."""
    api_metrics_port: int = Field(0, ge=0, le=65535)
    """Where the API process serves its Prometheus ``/metrics`` (open event streams, webhook
    deliveries), on HARNESS_METRICS_ADDR; 0 (the default): not served."""
    api_drain_s: float = Field(10.0, gt=0, le=600)
    """On SIGTERM, how long ``harness api`` drains before it exits: open event streams are
    told to reconnect and closed at once, other requests and webhook deliveries in flight
    get this long to finish (those still running are cut; a cut delivery is due again)."""
    api_link_max_ttl_s: int = Field(3600, gt=0, le=7 * 86400)
    """The longest life of a run page link (``POST /v1/runs/{id}/links``)."""
    webhook_schemes: CommaList = ("https",)
    """Schemes a webhook URL may use (``http``, ``https``)."""
    webhook_hosts: CommaList = ("*",)
    """Hosts a webhook may be delivered to: ``*`` is any host whose addresses are all
    public; a loopback, private or metadata address only when named here."""
    webhook_timeout_s: float = Field(10.0, gt=0)
    """One delivery attempt's deadline, all of it: resolving the host, connecting, sending,
    the reply's status (a receiver that trickles its reply is cut off here)."""
    webhook_concurrency: int = Field(50, gt=0)
    """Deliveries in flight at once on one API process."""
    webhook_per_tenant: int = Field(10, gt=0)
    """Of those, how many one tenant's deliveries may hold (a slow receiver of one tenant
    holds no more than this; the others go on)."""
    webhook_per_host: int = Field(10, gt=0)
    """Of those, how many may go to one ``host:port`` at once (whoever's they are)."""
    webhook_retry_for_s: float = Field(24 * 3600.0, gt=0)
    """A delivery no 2xx has answered is retried, with backoff, for this long."""
    webhook_backoff_s: float = Field(1.0, gt=0)
    """The first retry's delay, doubled at each retry up to 10 minutes."""
    webhook_poll_s: float = Field(0.5, gt=0)
    """How often the API looks for new events to deliver and deliveries due."""
    webhook_lease_s: float = Field(60.0, gt=0)
    """A delivery being sent is due again after this if its process never says how it went
    (it died): above HARNESS_WEBHOOK_TIMEOUT_S."""

    @field_validator(
        "allowed_images",
        "allowed_sandboxes",
        "allowed_networks",
        "allowed_executables",
        "allowed_base_urls",
        "bridge_allow",
        "harness_queues",
        "repo_schemes",
        "repo_hosts",
        "snapshot_ignore",
        "egress_resolvers",
        "api_cors_origins",
        "webhook_schemes",
        "webhook_hosts",
        "shared_tool_sets",
        "model_keys",
        mode="before",
    )
    @classmethod
    def _comma_list(cls, value: object) -> object:
        return _split(value)

    @field_validator("key_slots", mode="before")
    @classmethod
    def _slot_map(cls, value: object) -> object:
        if isinstance(value, str):
            result: dict[str, str] = {}
            for item in value.split(","):
                if not item.strip():
                    continue
                name, sep, count = item.partition("=")
                if not sep or not name.strip() or not count.strip().isdigit():
                    raise ValueError(f"expected GRANT=N pairs, got {item.strip()!r}")
                result[name.strip()] = count.strip()
            return result
        return value

    @field_validator("egress_allow", mode="before")
    @classmethod
    def _egress_map(cls, value: object) -> object:
        if isinstance(value, str):
            result: dict[str, tuple[str, ...]] = dict(DEFAULT_EGRESS_ALLOW)
            for item in value.split(";"):
                if not item.strip():
                    continue
                name, sep, hosts = item.partition("=")
                if not sep or not name.strip():
                    raise ValueError(f"expected harness=host:port|host:port, got {item.strip()!r}")
                result[name.strip()] = tuple(h.strip() for h in hosts.split("|") if h.strip())
            return result
        return value

    @field_validator("egress_hosts", mode="before")
    @classmethod
    def _pinned_hosts(cls, value: object) -> object:
        if isinstance(value, str):
            result: dict[str, str] = {}
            for item in value.split(","):
                if not item.strip():
                    continue
                name, sep, address = item.partition("=")
                if not sep or not name.strip() or not address.strip():
                    raise ValueError(f"expected name=address pairs, got {item.strip()!r}")
                result[name.strip().lower()] = address.strip()
            return result
        return value

    @field_validator("docker_url", "model_ca_file", mode="before")
    @classmethod
    def _empty_is_default(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("model_upstreams", mode="before")
    @classmethod
    def _upstream_map(cls, value: object) -> object:
        if isinstance(value, str):
            result: dict[str, tuple[str, ...]] = {}
            for item in value.split(","):
                if not item.strip():
                    continue
                name, sep, url = item.partition("=")
                if not sep or not name.strip() or not url.strip():
                    raise ValueError(f"expected harness=URL pairs, got {item.strip()!r}")
                result[name.strip()] = (url.strip(),)
            return result
        return value

    @field_validator("fallback_models", mode="before")
    @classmethod
    def _fallback_map(cls, value: object) -> object:
        if isinstance(value, str):
            result: dict[str, tuple[str, ...]] = {}
            for item in value.split(";"):
                if not item.strip():
                    continue
                name, sep, models = item.partition("=")
                if not sep or not name.strip():
                    raise ValueError(f"expected harness=MODEL|MODEL pairs, got {item.strip()!r}")
                result[name.strip()] = tuple(m.strip() for m in models.split("|") if m.strip())
            return result
        return value

    @field_validator("images", mode="before")
    @classmethod
    def _image_map(cls, value: object) -> object:
        if isinstance(value, str):
            result = dict(DEFAULT_IMAGES)
            for item in value.split(","):
                if not item.strip():
                    continue
                name, sep, image = item.partition("=")
                if not sep or not name.strip() or not image.strip():
                    raise ValueError(f"expected harness=image pairs, got {item.strip()!r}")
                result[name.strip()] = image.strip()
            return result
        return value

    @field_validator("repo_credentials", mode="before")
    @classmethod
    def _credential_map(cls, value: object) -> object:
        if isinstance(value, str):
            result: dict[str, str] = {}
            for item in value.split(","):
                if not item.strip():
                    continue
                host, sep, variable = item.partition("=")
                if not sep or not host.strip() or not variable.strip():
                    raise ValueError(f"expected host=VARIABLE pairs, got {item.strip()!r}")
                result[host.strip().lower()] = variable.strip()
            return result
        return value

    @field_validator("mcp_servers", mode="before")
    @classmethod
    def _mcp_json(cls, value: object) -> object:
        # From the environment pydantic-settings decodes the JSON itself; given as a value
        # (load_settings(mcp_servers='{...}')), it is decoded here.
        if isinstance(value, str):
            try:
                return json.loads(value or "{}")
            except ValueError as exc:
                raise ValueError(f"expected a JSON object: {exc}") from None
        return value

    @field_validator("grants", mode="before")
    @classmethod
    def _grant_map(cls, value: object) -> object:
        if isinstance(value, str):
            result: dict[str, tuple[str, ...]] = dict(DEFAULT_GRANTS)
            for item in value.split(";"):
                if not item.strip():
                    continue
                name, sep, names = item.partition("=")
                if not sep or not name.strip():
                    raise ValueError(f"expected harness=NAME|NAME pairs, got {item.strip()!r}")
                result[name.strip()] = tuple(n.strip() for n in names.split("|") if n.strip())
            return result
        return value

    @model_validator(mode="after")
    def _coherent(self) -> Settings:
        if self.turn_timeout_s > self.max_turn_timeout_s:
            raise ValueError("HARNESS_TURN_TIMEOUT_S exceeds HARNESS_MAX_TURN_TIMEOUT_S")
        if self.webhook_lease_s <= self.webhook_timeout_s:
            # A delivery still being sent would be taken, and sent again, by another process.
            raise ValueError("HARNESS_WEBHOOK_LEASE_S must exceed HARNESS_WEBHOOK_TIMEOUT_S")
        return self

    @property
    def broker_visibility_timeout_s(self) -> int:
        """The broker's redelivery delay: above the longest turn a producer may ask for."""
        if self.visibility_timeout_s:
            return self.visibility_timeout_s
        return int(self.max_turn_timeout_s + self.shutdown_grace_s + 300)

    def image_for(self, harness: str) -> str | None:
        return self.images.get(harness)


def load_settings(**overrides: object) -> Settings:
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = "_".join(str(p) for p in error["loc"]).upper()
            name = f"HARNESS_{loc}" if loc else "settings"
            problems.append(f"{name}: {error['msg']}")
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()
