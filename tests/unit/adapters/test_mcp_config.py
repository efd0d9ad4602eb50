"""Each adapter loads the run's MCP servers its CLI's own way (docs/mcp.md), headless, per
turn: the bridge's command in the CLI's configuration, the credential passed on by name
only, the attached tools allowed unless ``--posture ask``. What the CLIs make of it is shown
live (tests/conformance/test_tools_live.py)."""

from __future__ import annotations

import json
import tomllib

import pytest

import adapters
from adapters import pi_mcp, pi_rpc
from adapters.protocol import Command, McpServer, TurnRequest

BRIDGE = ("python3", "/w/.home/.harness/mcp-bridge.py", "/w/.home/.harness/mcp.sock", "orders")
ORDERS = McpServer("orders", BRIDGE, env=("HARNESS_RUN_TOKEN",), tools=("lookup", "cancel"))
HOME = "/w/.home"


def command(harness: str, **fields: object) -> Command:
    request = TurnRequest(
        "q", workspace="/w", home=HOME, model="m", executable="x", mcp_servers=(ORDERS,), **fields
    )  # type: ignore[arg-type]
    return adapters.get(harness).build_command(request)


def test_claude_code_gets_only_the_runs_servers_and_allows_their_tools() -> None:
    built = command("claude-code")
    argv = list(built.argv)
    path = argv[argv.index("--mcp-config") + 1]
    assert "--strict-mcp-config" in argv
    config = json.loads(built.files[path])["mcpServers"]["orders"]
    assert [config["command"], *config["args"]] == list(BRIDGE)
    assert config["env"] == {"HARNESS_RUN_TOKEN": "${HARNESS_RUN_TOKEN}"}
    assert "mcp__orders" in argv[argv.index("--allowedTools") :]


def test_claude_code_asks_for_attached_tools_under_posture_ask() -> None:
    argv = list(command("claude-code", posture="ask").argv)
    assert "--mcp-config" in argv and "mcp__orders" not in argv


def test_codex_names_the_server_in_its_config_and_passes_the_credential_by_name() -> None:
    built = command("codex")
    config = tomllib.loads(built.files[f"{HOME}/.codex/config.toml"])
    assert config["mcp_servers"]["orders"] == {
        "command": "python3",
        "args": list(BRIDGE[1:]),
        "env_vars": ["HARNESS_RUN_TOKEN"],
        "default_tools_approval_mode": "approve",
    }


@pytest.mark.parametrize(("posture", "trusted"), [("auto", True), ("ask", False)])
def test_gemini_has_the_server_in_the_runs_settings(posture: str, trusted: bool) -> None:
    settings = json.loads(command("gemini", posture=posture).files[f"{HOME}/.gemini/settings.json"])
    server = settings["mcpServers"]["orders"]
    assert [server["command"], *server["args"]] == list(BRIDGE) and server["trust"] is trusted
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"  # kept beside it


def test_opencode_has_a_local_server_in_its_config() -> None:
    built = command("opencode")
    config = json.loads(built.files[f"{HOME}/.config/opencode/opencode.json"])
    assert config["mcp"]["orders"] == {
        "type": "local",
        "command": list(BRIDGE),
        "enabled": True,
        "environment": {"HARNESS_RUN_TOKEN": "{env:HARNESS_RUN_TOKEN}"},
    }


def test_pi_loads_the_extension_and_names_the_attached_tools_in_its_allowlist() -> None:
    built = command("pi")
    argv = list(built.argv)
    path = argv[argv.index("-e") + 1]
    assert built.files[path] == pi_mcp.EXTENSION
    allowed = argv[argv.index("--tools") + 1].split(",")
    assert {"orders_lookup", "orders_cancel"} <= set(allowed)
    assert json.loads(built.env["HARNESS_PI_MCP"]) == [{"name": "orders", "command": list(BRIDGE)}]


def test_pi_asks_for_attached_tools_under_posture_ask() -> None:
    request = TurnRequest("q", home=HOME, model="m", posture="ask", mcp_servers=(ORDERS,))
    asked = pi_rpc.build_command(request).env["HARNESS_ASK_TOOLS"].split(",")
    assert {"orders_lookup", "orders_cancel"} <= set(asked)


def test_stdio_json_gets_the_common_shape_file() -> None:
    built = command("stdio-json")
    path = built.env["HARNESS_MCP_CONFIG"]
    assert json.loads(built.files[path]) == {
        "mcpServers": {"orders": {"command": "python3", "args": list(BRIDGE[1:]), "env": {}}}
    }


@pytest.mark.parametrize("harness", adapters.HARNESS_IDS)
def test_no_server_no_mcp_configuration(harness: str) -> None:
    request = TurnRequest("q", workspace="/w", home=HOME, model="m", executable="x")
    built = adapters.get(harness).build_command(request)
    text = "\n".join([*built.argv, *built.env.values(), *built.files.values()])
    assert "mcp-bridge" not in text and "--mcp-config" not in built.argv


def test_opencode_asks_for_attached_tools_under_posture_ask() -> None:
    built = command("opencode", posture="ask")
    config = json.loads(built.files[f"{HOME}/.config/opencode/opencode.json"])
    assert config["permission"]["orders_*"] == "ask"
