"""How to point each real harness CLI at the fake model server without our adapters.

These are the raw invocations verified against the real CLIs (argv, environment, config files in a
throwaway HOME). The smoke test and ``scripts/record-fixtures`` use them to run a CLI before
its adapter exists; the adapters build their own commands.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HARNESSES: tuple[str, ...] = ("claude-code", "codex", "gemini", "opencode", "pi")

BINARIES: dict[str, str] = {
    "claude-code": "claude",
    "codex": "codex",
    "gemini": "gemini",
    "opencode": "opencode",
    "pi": "pi",
}

#: The model each raw invocation asks for. codex gets a slug it knows (an unknown one adds a
#: metadata warning to every run); opencode and pi name the provider configured below.
MODELS: dict[str, str] = {
    "claude-code": "claude-sonnet-4-5",
    "codex": "gpt-5.5",
    "gemini": "gemini-2.5-flash",
    "opencode": "fake/fake-model",
    "pi": "fake-model",
}

#: The API-key variable each CLI reads (granted as a secret in tests).
KEY_ENV: dict[str, str] = {
    "claude-code": "ANTHROPIC_API_KEY",
    "codex": "FAKE_API_KEY",
    "gemini": "GEMINI_API_KEY",
    "opencode": "FAKE_API_KEY",
    "pi": "FAKE_API_KEY",
}
FAKE_KEY = "fake-key-for-tests"

#: A session id of the right shape that no CLI has ever seen.
STALE_SESSION: dict[str, str] = {
    "claude-code": "00000000-0000-4000-8000-000000000000",
    "codex": "00000000-0000-7000-8000-000000000000",
    "gemini": "00000000-0000-4000-8000-000000000000",
    "opencode": "ses_000000000000stalesession0",
    "pi": "00000000-0000-7000-8000-000000000000",
}


@dataclass
class Invocation:
    argv: list[str]
    env: dict[str, str]
    """Non-secret variables; the key is in ``secrets``."""
    secrets: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)
    """Absolute path -> content, written before the run."""

    def write_files(self) -> None:
        for path, content in self.files.items():
            target = Path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)


def raw_invocation(
    harness: str,
    *,
    prompt: str,
    home: str,
    base_url: str,
    bin_dir: str | None = None,
    resume: str | None = None,
    model: str | None = None,
) -> Invocation:
    """The argv/env/files that run ``harness`` for one turn against ``base_url``."""
    exe = BINARIES[harness]
    if bin_dir:
        exe = str(Path(bin_dir) / exe)
    model = model or MODELS[harness]
    secrets = {KEY_ENV[harness]: FAKE_KEY}
    env: dict[str, str] = {"HOME": home}
    files: dict[str, str] = {}
    if harness == "claude-code":
        argv = [exe, "-p", prompt, "--output-format", "stream-json", "--verbose", "--model", model]
        if resume:
            argv += ["--resume", resume]
        argv += ["--allowedTools", "Bash"]
        env.update(
            ANTHROPIC_BASE_URL=base_url,
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            DISABLE_TELEMETRY="1",
            DISABLE_AUTOUPDATER="1",
        )
    elif harness == "codex":
        files[f"{home}/.codex/config.toml"] = (
            f'model = "{model}"\n'
            'model_provider = "fake"\n'
            "[model_providers.fake]\n"
            'name = "Fake local"\n'
            f'base_url = "{base_url}/v1"\n'
            f'env_key = "{KEY_ENV[harness]}"\n'
            'wire_api = "responses"\n'
        )
        if resume:
            argv = [exe, "exec", "resume", resume, "--json", "--skip-git-repo-check", prompt]
        else:
            argv = [exe, "exec", "--json", "--skip-git-repo-check", prompt]
    elif harness == "gemini":
        files[f"{home}/.gemini/settings.json"] = json.dumps(
            {"security": {"auth": {"selectedType": "gemini-api-key"}}}
        )
        argv = [exe, "-m", model, "-p", prompt, "--output-format", "stream-json", "--yolo"]
        if resume:
            argv += ["--resume", resume]
        env.update(GOOGLE_GEMINI_BASE_URL=base_url, GEMINI_CLI_TRUST_WORKSPACE="true")
    elif harness == "opencode":
        provider, _, model_id = model.partition("/")
        files[f"{home}/.config/opencode/opencode.json"] = json.dumps(
            {
                "$schema": "https://opencode.ai/config.json",
                "provider": {
                    provider: {
                        "npm": "@ai-sdk/openai-compatible",
                        "name": "Fake local",
                        "options": {
                            "baseURL": f"{base_url}/v1",
                            "apiKey": "{env:" + KEY_ENV[harness] + "}",
                        },
                        "models": {model_id: {"name": "Fake Model"}},
                    }
                },
                "model": model,
                "autoupdate": False,
                "share": "disabled",
            }
        )
        argv = [exe, "run", "--format", "json", "-m", model]
        if resume:
            argv += ["--session", resume]
        argv.append(prompt)
        env.update(
            OPENCODE_DISABLE_MODELS_FETCH="1",
            OPENCODE_DISABLE_AUTOUPDATE="1",
            OPENCODE_DISABLE_PROJECT_CONFIG="1",
        )
    elif harness == "pi":
        files[f"{home}/.pi/agent/models.json"] = json.dumps(
            {
                "providers": {
                    "fake": {
                        "baseUrl": f"{base_url}/v1",
                        "api": "openai-completions",
                        "apiKey": KEY_ENV[harness],
                        "compat": {
                            "supportsDeveloperRole": False,
                            "supportsReasoningEffort": False,
                        },
                        "models": [
                            {
                                "id": model,
                                "name": "Fake Model",
                                "contextWindow": 128000,
                                "maxTokens": 4096,
                                "cost": {"input": 3, "output": 15, "cacheRead": 0, "cacheWrite": 0},
                            }
                        ],
                    }
                }
            }
        )
        argv = [exe, "-p", "--mode", "json", "--provider", "fake", "--model", model]
        if resume:
            argv += ["--session", resume]
        argv.append(prompt)
        env.update(PI_OFFLINE="1")
    else:
        raise ValueError(f"unknown harness {harness!r}")
    return Invocation(argv, env, secrets, files)


def base_env(home: str, tmpdir: str | None = None) -> dict[str, str]:
    """The small environment every CLI run starts from (like the local sandbox's)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": home,
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }
    if tmpdir:
        env["TMPDIR"] = tmpdir
    return env


@dataclass
class RawRun:
    argv: list[str]
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    duration_s: float
    timed_out: bool

    def json_lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.stdout.decode("utf-8", "replace").splitlines():
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                out.append(value)
        return out


def run(
    invocation: Invocation, cwd: str, timeout: float, extra_env: Mapping[str, str] = {}
) -> RawRun:
    """Runs one invocation with stdin closed, in its own process group, killed at ``timeout``."""
    invocation.write_files()
    env = base_env(invocation.env["HOME"], os.environ.get("TMPDIR"))
    env.update(invocation.env)
    env.update(invocation.secrets)
    env.update(extra_env)
    started = time.monotonic()
    proc = subprocess.Popen(
        invocation.argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        stdout, stderr = proc.communicate()
    finally:
        _kill_group(proc)
    return RawRun(
        invocation.argv,
        None if timed_out else proc.returncode,
        stdout,
        stderr,
        time.monotonic() - started,
        timed_out,
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the whole process group, SIGKILL a second later to whatever is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
        os.killpg(proc.pid, signal.SIGKILL)


def session_id_from(harness: str, messages: Iterable[dict[str, Any]]) -> str | None:
    """The harness's session id in its JSON output (first one found)."""
    for message in messages:
        if harness == "claude-code" and isinstance(message.get("session_id"), str):
            return str(message["session_id"])
        if harness == "codex" and message.get("type") == "thread.started":
            return str(message.get("thread_id"))
        if harness == "gemini" and message.get("type") == "init":
            return str(message.get("session_id"))
        if harness == "opencode" and isinstance(message.get("sessionID"), str):
            return str(message["sessionID"])
        if harness == "pi" and message.get("type") == "session":
            return str(message.get("id"))
    return None


def cli_version(bin_dir: str, harness: str) -> str:
    """The CLI's own ``--version`` output (first line)."""
    out = subprocess.run(
        [str(Path(bin_dir) / BINARIES[harness]), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=base_env(os.environ.get("HOME", "/tmp")),
    )
    return (
        (out.stdout.strip() or out.stderr.strip()).splitlines()[0]
        if (out.stdout.strip() or out.stderr.strip())
        else "unknown"
    )


def new_uuid() -> str:
    return str(uuid.uuid4())
