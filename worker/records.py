"""Run records: the hash ``harness:run:{run_id}`` (CONTRACT.md, "Run record")."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from worker.errors import RunBusy, RunEnded, RunNotFound
from worker.keys import Keys, SyncRedis
from worker.spec import RunOptions

CONTRACT_FIELDS = (
    "run_id",
    "harness",
    "status",
    "turns",
    "session_id",
    "resumed",
    "model_requested",
    "model_reported",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "sandbox",
    "container_id",
    "queue",
    "created_at",
    "updated_at",
    "last_error",
)
_INTS = {"turns", "input_tokens", "output_tokens", "current_turn", "cached_input_tokens"}
_FLOATS = {"cost_usd", "created_at", "updated_at", "lease_until"}
_BOOLS = {"resumed"}
_JSON = {"options", "carry", "warnings"}

IN_FLIGHT = ("starting", "running")
FINISHED = ("ended", "failed")

# Atomically take the next turn number, refusing a busy or finished run.
_BEGIN_TURN = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {-1, ''} end
if status == 'ended' or status == 'failed' then return {-3, status} end
if status == 'starting' or status == 'running' then
  return {-2, redis.call('HGET', KEYS[1], 'current_turn') or ''}
end
local turn = redis.call('HINCRBY', KEYS[1], 'turns', 1)
redis.call('HSET', KEYS[1], 'status', 'running', 'current_turn', turn, 'updated_at', ARGV[1])
return {turn, status}
"""

# Add a turn's usage to the totals (cost stays empty until a harness prices something), then
# mark the turn finished if it is still the run's current turn and the run is not ended.
_FINISH_TURN = """
redis.call('HINCRBY', KEYS[1], 'input_tokens', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'output_tokens', ARGV[5])
redis.call('HINCRBY', KEYS[1], 'cached_input_tokens', ARGV[6])
if ARGV[7] ~= '' then
  local cost = redis.call('HGET', KEYS[1], 'cost_usd')
  if not cost or cost == '' then
    redis.call('HSET', KEYS[1], 'cost_usd', ARGV[7])
  else
    redis.call('HINCRBYFLOAT', KEYS[1], 'cost_usd', ARGV[7])
  end
end
local current = redis.call('HGET', KEYS[1], 'current_turn')
if current ~= ARGV[1] then return 0 end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'running' or status == 'starting' then
  redis.call('HSET', KEYS[1], 'status', ARGV[2])
end
redis.call('HSET', KEYS[1], 'updated_at', ARGV[3])
return 1
"""


# The first turn's run leaves "starting" once a worker has its sandbox (never after an end).
_MARK_RUNNING = """
if redis.call('HGET', KEYS[1], 'status') == 'starting' then
  redis.call('HSET', KEYS[1], 'status', 'running', 'updated_at', ARGV[1])
  return 1
end
return 0
"""


def decode(raw: dict[str, str]) -> dict[str, Any]:
    """A record as typed values: ints, floats, booleans, JSON, and None for empty."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if value == "":
            out[key] = None
        elif key in _INTS:
            out[key] = int(float(value))
        elif key in _FLOATS:
            out[key] = float(value)
        elif key in _BOOLS:
            out[key] = value == "1"
        elif key in _JSON:
            out[key] = json.loads(value)
        else:
            out[key] = value
    for key in CONTRACT_FIELDS:
        out.setdefault(key, None)
    return out


@dataclass
class RunStore:
    redis: SyncRedis
    keys: Keys
    retention_s: int

    def __post_init__(self) -> None:
        self._begin = self.redis.register_script(_BEGIN_TURN)
        self._finish = self.redis.register_script(_FINISH_TURN)
        self._running = self.redis.register_script(_MARK_RUNNING)

    def create(self, run_id: str, options: RunOptions, queue: str, sandbox: str) -> None:
        now = time.time()
        fields = {
            "run_id": run_id,
            "harness": options.harness,
            "status": "starting",
            "turns": 1,
            "current_turn": 1,
            "session_id": "",
            "resumed": "",
            "model_requested": options.model or "",
            "model_reported": "",
            "input_tokens": 0,
            "output_tokens": 0,
            "cached_input_tokens": 0,
            "cost_usd": "",
            "sandbox": sandbox,
            "container_id": "",
            "queue": queue,
            "created_at": now,
            "updated_at": now,
            "last_error": "",
            "options": options.model_dump_json(),
            "carry": "{}",
        }
        pipe = self.redis.pipeline()
        pipe.hset(self.keys.run(run_id), mapping=fields)
        pipe.sadd(self.keys.runs_index(), run_id)
        pipe.execute()

    def raw(self, run_id: str) -> dict[str, str]:
        data: dict[str, str] = self.redis.hgetall(self.keys.run(run_id))
        if not data:
            raise RunNotFound(run_id)
        return data

    def get(self, run_id: str) -> dict[str, Any]:
        return decode(self.raw(run_id))

    def options(self, run_id: str) -> RunOptions:
        return RunOptions.model_validate_json(self.raw(run_id)["options"])

    def begin_turn(self, run_id: str) -> int:
        code, detail = self._begin(keys=[self.keys.run(run_id)], args=[time.time()])
        code = int(code)
        if code == -1:
            raise RunNotFound(run_id)
        if code == -2:
            raise RunBusy(run_id, int(detail) if detail else None)
        if code == -3:
            raise RunEnded(run_id, str(detail))
        return code

    def mark_running(self, run_id: str) -> None:
        self._running(keys=[self.keys.run(run_id)], args=[time.time()])

    def update(self, run_id: str, **fields: Any) -> None:
        encoded = {k: _encode(v) for k, v in fields.items()}
        encoded["updated_at"] = str(time.time())
        self.redis.hset(self.keys.run(run_id), mapping=encoded)

    def finish_turn(
        self,
        run_id: str,
        turn: int,
        *,
        status: str,
        usage: tuple[int, int, int, float | None],
        fields: dict[str, Any],
    ) -> bool:
        """Add the turn's usage to the run totals and set the run idle (or failed)."""
        key = self.keys.run(run_id)
        input_tokens, output_tokens, cached, cost = usage
        if fields:
            self.redis.hset(key, mapping={k: _encode(v) for k, v in fields.items()})
        args = [str(turn), status, time.time(), input_tokens, output_tokens, cached]
        args.append("" if cost is None else repr(float(cost)))
        return bool(self._finish(keys=[key], args=args))

    def expire(self, run_id: str, seconds: int) -> None:
        pipe = self.redis.pipeline()
        for key in self.keys.run_keys(run_id):
            pipe.expire(key, seconds)
        pipe.execute()

    def append_transcript(self, run_id: str, turn: int, text_in: str, text_out: str) -> None:
        entry = json.dumps({"turn": turn, "input": text_in, "output": text_out})
        self.redis.rpush(self.keys.transcript(run_id), entry)

    def transcript(self, run_id: str) -> list[dict[str, Any]]:
        raw: list[str] = self.redis.lrange(self.keys.transcript(run_id), 0, -1)
        return [json.loads(item) for item in raw]


def _encode(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, dict | list | tuple):
        return json.dumps(value)
    return str(value)
