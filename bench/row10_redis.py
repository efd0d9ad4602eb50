"""Row 10: the fleet's cost in Redis (issue 19). Measured on a redis-server of this row's own
(no persistence, nothing else talking to it), so that its memory and CPU are ours alone.

- Memory per stored event: the events of every recorded fixture of the five harnesses
  (``tests/fixtures/*/*.events.json``, repeated), and the demo's flood (tiny events, the
  worst case), published by :class:`RedisStreamPublisher` into one stream; its ``MEMORY
  USAGE`` (every element counted) per event, against the same entries written as JSON lines (``id``,
  ``type``, ``data``, ``ts``: everything the entry holds, as ``harness events --json``
  would keep it in a file).
- Memory per idle run: a worker of the row's own on that Redis (local sandbox, the default
  stream limit and retention) runs M runs' no-op first turn; the ``MEMORY USAGE`` of every
  key of those runs (and their share of the set of active runs) once they are idle, per
  run, against the same keys written as JSON.
- Redis CPU per published event: the server's ``used_cpu_user + used_cpu_sys`` while the
  publisher sends the recorded mix, against a bare pipelined XADD of the very same entries
  (read back), in the same batch sizes: 1,000 per call (a flood), 16 (the smallest batch
  the publisher sends as one script call) and one (a quiet harness). Alternating, median
  of 3.
- The memory lines again on a server started with :data:`TUNED`.
- Capacity: how many runs this machine's memory (``MemAvailable``) holds in one Redis,
  idle (as measured) and with their stream full at the default ``HARNESS_STREAM_MAXLEN``
  of recorded events; and how many events per second one Redis core absorbs.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from adapters.events import Event, parse_event
from bench.consume import wait_terminal
from bench.context import NOOP, Bench
from bench.private_redis import PrivateRedis
from bench.stats import mib, p50
from bench.table import Figure, RowResult
from bench.worker import ROOT, demo_executable, make_env, start_worker
from config import Settings
from worker.store.keys import Keys
from worker.store.publisher import SCRIPT_MIN, RedisStreamPublisher

TARGET_RATIO = 1.5
TUNED = {"hash-max-listpack-value": "1024", "stream-node-max-bytes": "1024"}
"""A configuration for fleets of many short runs, measured against the defaults (row 10 of
docs/performance.md): hashes stay listpacks with values up to 1 KiB, and a stream preallocates
1 KiB for its newest node instead of 4 KiB. Since the record keeps its long fields apart and a
short stream is written back at its size after each turn, an idle run costs the same under
both; big streams cost more tuned."""
SIZES = {"full": (100_000, 100), "quick": (20_000, 30), "smoke": (1_000, 3)}
"""Events stored and idle runs made, per profile."""


def recorded_events() -> list[Event]:
    """Every event of every recorded fixture, in fixture order."""
    events: list[Event] = []
    for path in sorted((ROOT / "tests" / "fixtures").glob("*/*.events.json")):
        for item in json.loads(path.read_text())["events"]:
            events.append(parse_event(item["type"], item["data"]))
    return events


def flood_events(n: int) -> list[Event]:
    from adapters.events import AssistantText

    return [AssistantText(text=f"flood {i}") for i in range(n)]


def _line(obj: Any) -> int:
    return len(json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()) + 1


def entry_json_bytes(entry_id: str, fields: dict[str, str]) -> int:
    """One stream entry as a JSON line: its id, type, data (an object) and ts."""
    return _line(
        {
            "id": entry_id,
            "type": fields["type"],
            "data": json.loads(fields["data"]),
            "ts": float(fields["ts"]),
        }
    )


def key_json_bytes(client: redis.Redis, key: str) -> int:
    """A key's content as JSON lines: a hash as one object, a stream as one line per entry,
    a list one line per element, a set as one array, a string as one JSON string."""
    kind = client.type(key)
    if kind == "hash":
        return _line(client.hgetall(key))
    if kind == "stream":
        return sum(entry_json_bytes(i, f) for i, f in client.xrange(key))
    if kind == "list":
        return sum(_line(v) for v in client.lrange(key, 0, -1))
    if kind == "set":
        return _line(sorted(client.smembers(key)))
    if kind == "zset":
        return _line(client.zrange(key, 0, -1, withscores=True))
    if kind == "string":
        return _line(client.get(key))
    return 0


def key_memory(client: redis.Redis, keys: list[str]) -> int:
    """What Redis holds for these keys: ``MEMORY USAGE key SAMPLES 0`` (every element
    counted; the key's name and its entry in the keyspace included), summed. A delta of
    ``used_memory`` would also count client buffers and the keyspace's own resizing, which
    come and go on Redis's schedule."""
    return sum(int(client.memory_usage(key, samples=0) or 0) for key in keys)


def index_share(client: redis.Redis, keys: Keys, run_ids: list[str]) -> tuple[int, int]:
    """The share of ``run_ids`` of the run indexes (the set of active runs, the tenants' sorted
    sets: all their runs, those of a harness, a label): each index's ``MEMORY USAGE`` and
    members as JSON, in proportion to how many of its members are these runs. An index none
    of them is in (another row's tenant, a label of other runs) costs them nothing."""
    held = raw = 0
    indexes = [keys.runs_index(), *client.scan_iter(match=keys.run_list("*") + "*", count=1000)]
    for key in indexes:
        is_zset = client.type(key) == "zset"
        members = client.zcard(key) if is_zset else client.scard(key)
        ours = 0
        for at in range(0, len(run_ids), 1000):
            chunk = run_ids[at : at + 1000]
            if is_zset:  # a score, None for a non-member (a score of 0 is a member)
                ours += sum(score is not None for score in client.zmscore(key, chunk))
            else:
                ours += sum(bool(hit) for hit in client.smismember(key, chunk))
        if ours:
            held += key_memory(client, [key]) * ours // members
            raw += key_json_bytes(client, key) * ours // members
    return held, raw


def floor_bytes(client: redis.Redis, keys: Keys) -> dict[str, int]:
    """What Redis holds for a key of nothing, named as a run's keys are, with a TTL: its fixed
    cost per key (an empty stream: the stream's own; a one-byte string: the key's)."""
    run_id = "f" + uuid.uuid4().hex[:24]
    stream, string = keys.events(run_id), keys.credential(run_id)
    client.xadd(stream, {"type": "x"}, id="1-1")
    client.xdel(stream, "1-1")
    client.set(string, "x")
    for key in (stream, string):
        client.expire(key, 3600)
    found = {
        "empty stream": key_memory(client, [stream]),
        "one-byte string": key_memory(client, [string]),
    }
    client.delete(stream, string)
    return found


def server_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def start_private(directory: Path, config: dict[str, str] | None = None) -> PrivateRedis:
    directory.mkdir(parents=True, exist_ok=True)
    args = [arg for name, value in (config or {}).items() for arg in (f"--{name}", value)]
    server = PrivateRedis(directory, append_only=False, config=args)
    server.start()
    return server


def publish_all(
    client: redis.Redis, key_prefix: str, run_id: str, events: list[Event], batch: int, maxlen: int
) -> RedisStreamPublisher:
    publisher = RedisStreamPublisher(client, Keys(key_prefix), run_id, 1, maxlen=maxlen)
    for at in range(0, len(events), batch):
        if not publisher.publish(events[at : at + batch]):
            raise RuntimeError("the private Redis refused a batch")
    if not publisher.flush(force=True):  # the last batch's call may still be running
        raise RuntimeError("the private Redis refused a batch")
    return publisher


def xadd_all(
    client: redis.Redis,
    key: str,
    entries: list[tuple[str, dict[str, str]]],
    batch: int,
    maxlen: int,
) -> None:
    for at in range(0, len(entries), batch):
        pipe = client.pipeline(transaction=False)
        command = pipe.execute_command
        for entry_id, fields in entries[at : at + batch]:
            command(
                "XADD", key, "MAXLEN", "~", maxlen, entry_id,
                "type", fields["type"], "data", fields["data"], "ts", fields["ts"],
            )  # fmt: skip
        pipe.execute()


def stored_events(
    client: redis.Redis, result: RowResult, n: int, settings: Settings, config: str
) -> float:
    """Memory per stored event for the recorded mix and the flood; returns the recorded
    mix's bytes per event (for the capacity figures)."""
    mixes = {"recorded events": recorded_events(), "flood events": flood_events(n)}
    per_recorded = 0.0
    for name, sample in mixes.items():
        events = (sample * (n // len(sample) + 1))[:n]
        run_id = "m" + uuid.uuid4().hex[:24]
        publisher = publish_all(client, "mem", run_id, events, 1000, settings.stream_maxlen)
        entries = client.xrange(publisher.key)
        raw = sum(entry_json_bytes(i, f) for i, f in entries)
        ours, base = key_memory(client, [publisher.key]) / n, raw / n
        result.checks[f"{name}, {config}: all {n:,} stored"] = len(entries) == n
        result.add(
            Figure(
                f"{config}: memory per stored event ({name}) vs the same entries as JSON lines",
                ours,
                base,
                "B",
                target=f"<= {TARGET_RATIO:g}x",
                met=ours / base <= TARGET_RATIO,
            )
        )
        if name == "recorded events":
            per_recorded = ours
        client.delete(publisher.key)
    return per_recorded


def redis_cpu(client: redis.Redis, result: RowResult, n: int, settings: Settings) -> float:
    """Server CPU per event, ours against bare pipelined XADD; returns ours at 1,000 a call."""
    events = (recorded_events() * (n // 50 + 1))[:n]
    flood_cpu = 0.0
    batches = (
        (1000, "1,000 per call"),
        (SCRIPT_MIN, f"{SCRIPT_MIN} per call"),
        (1, "one per call"),
    )
    for batch, label in batches:
        count = n if batch > 1 else min(n, 20_000)
        ours, base = [], []
        for _ in range(3):
            run_id = "c" + uuid.uuid4().hex[:24]
            cpu = server_cpu(client)
            publisher = publish_all(
                client, "cpu", run_id, events[:count], batch, settings.stream_maxlen
            )
            ours.append((server_cpu(client) - cpu) / count * 1e6)
            entries = client.xrange(publisher.key)
            client.delete(publisher.key)
            scratch = f"cpu:bare:{uuid.uuid4().hex[:8]}"
            cpu = server_cpu(client)
            xadd_all(client, scratch, entries, batch, settings.stream_maxlen)
            base.append((server_cpu(client) - cpu) / count * 1e6)
            client.delete(scratch)
            result.checks[f"Redis CPU ({label}): every event stored"] = len(entries) == count
        result.add(
            Figure(
                f"Redis CPU per published event ({label}) vs pipelined XADD",
                p50(ours),
                p50(base),
                "us",
            )
        )
        if batch > 1:
            flood_cpu = p50(ours)
    return flood_cpu


def idle_runs(
    bench: Bench, url: str, result: RowResult, runs: int, config: str
) -> tuple[float, Settings]:
    """Memory per idle run (one no-op turn each) made by a real worker on the private Redis
    with the default stream limit and retention."""
    defaults = Settings.model_construct(
        stream_maxlen=Settings.model_fields["stream_maxlen"].default,
        retention_s=Settings.model_fields["retention_s"].default,
    )
    env = make_env(
        bench.tmp / f"row10-{uuid.uuid4().hex[:6]}",
        redis_url=url,
        HARNESS_STREAM_MAXLEN=str(defaults.stream_maxlen),
        HARNESS_RETENTION_S=str(defaults.retention_s),
    )
    worker = start_worker(env)
    try:
        client, r = env.client(), env.redis()
        warm = client.start_run("stdio-json", NOOP, executable=demo_executable(), sandbox="local")
        wait_terminal(r, env.keys.events(warm), 1, timeout_s=120)
        made = []
        for _ in range(runs):
            run_id = client.start_run(
                "stdio-json", NOOP, executable=demo_executable(), sandbox="local"
            )
            wait_terminal(r, env.keys.events(run_id), 1, timeout_s=120)
            made.append(run_id)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all(client.status(run_id)["status"] == "idle" for run_id in made):
                break
            time.sleep(0.2)
        raw = held = 0
        encodings: set[str] = set()
        per_key: dict[str, list[int]] = {}
        for run_id in made:
            keys = list(r.scan_iter(match=f"{env.keys.run(run_id)}*", count=1000))
            for key in keys:
                memory, as_json = key_memory(r, [key]), key_json_bytes(r, key)
                held, raw = held + memory, raw + as_json
                name = key.removeprefix(f"{env.keys.prefix}:").replace(run_id, "<id>")
                kind = per_key.setdefault(name, [0, 0, 0])
                kind[0], kind[1], kind[2] = kind[0] + 1, kind[1] + memory, kind[2] + as_json
            encodings.add(f"record {r.object('encoding', env.keys.run(run_id))}")
        shared, shared_json = index_share(r, env.keys, made)
        held, raw = held + shared, raw + shared_json
        per_key["index shares (runs:active, tenant::runs...)"] = [len(made), shared, shared_json]
        ours, base = held / runs, raw / runs
        result.checks[f"idle runs, {config}: all {runs} idle"] = all(
            client.status(run_id)["status"] == "idle" for run_id in made
        )
        result.add(
            Figure(
                f"{config}: memory per idle run (one no-op turn) vs its keys as JSON",
                ours,
                base,
                "B",
                target=f"<= {TARGET_RATIO:g}x",
                met=ours / base <= TARGET_RATIO,
            )
        )
        result.notes.append(
            f"idle runs, {config}: {', '.join(sorted(encodings))}; {len(made)} runs, "
            f"{mib(held):.2f} MiB in all"
        )
        floor = floor_bytes(r, env.keys)
        result.notes.append(
            f"floor, {config}: " + ", ".join(f"{name} {size} B" for name, size in floor.items())
        )
        result.notes.append(
            f"idle run's keys, {config} (runs holding it: MEMORY USAGE / as JSON, B each): "
            + "; ".join(
                f"{name} ({n}: {memory // n} / {as_json // n})"
                for name, (n, memory, as_json) in sorted(per_key.items())
            )
        )
        for run_id in [warm, *made]:
            client.end(run_id, timeout=60)
        return ours, defaults
    finally:
        worker.stop()
        env.close()


def run(bench: Bench) -> RowResult:
    result = RowResult("10", "the fleet's cost in Redis (a redis-server of its own)")
    n, runs = SIZES.get(bench.profile, SIZES["full"])
    # A fresh server per configuration, with the memory measured first.
    server = start_private(bench.tmp / "redis10")
    try:
        client = redis.Redis(port=server.port, decode_responses=True)
        version = client.info("server")["redis_version"]
        per_run, defaults = idle_runs(bench, server.url, result, runs, "Redis defaults")
        per_event = stored_events(client, result, n, defaults, "Redis defaults")
        cpu_us = redis_cpu(client, result, n, defaults)
        client.close()
    finally:
        server.stop()
        subprocess.run(["rm", "-rf", str(bench.tmp / "redis10")], check=False)
    server = start_private(bench.tmp / "redis10-tuned", TUNED)
    try:
        client = redis.Redis(port=server.port, decode_responses=True)
        idle_runs(bench, server.url, result, runs, "tuned")
        stored_events(client, result, n, defaults, "tuned")
        client.close()
    finally:
        server.stop()
        subprocess.run(["rm", "-rf", str(bench.tmp / "redis10-tuned")], check=False)
    available = mem_available()
    full_run = per_run + per_event * defaults.stream_maxlen
    result.add(
        Figure("runs one Redis holds in MemAvailable: idle (defaults, as above)",
               available / per_run, None, "runs"),
        Figure(f"runs one Redis holds in MemAvailable: stream full "
               f"({defaults.stream_maxlen:,} recorded events)", available / full_run, None,
               "runs"),
        Figure("events/s one Redis core absorbs (1,000 per call)", 1e6 / cpu_us, None, "ev/s"),
    )  # fmt: skip
    result.notes.append(
        f"Redis {version}; MemAvailable {available / 2**30:.1f} GiB; a full run "
        f"{mib(full_run):.1f} MiB; retention {defaults.retention_s // 86400} days "
        "(a run is held that long after its last activity); tuned: "
        + ", ".join(f"{k} {v}" for k, v in TUNED.items())
    )
    return result
