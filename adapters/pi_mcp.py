"""pi's MCP client: an extension the pi adapter ships (pi 0.73.1 has none of its own, by
design), as it ships one for the permission gate (:mod:`adapters.pi_rpc`).

:data:`EXTENSION` (written into the run's HOME, loaded with ``-e``) launches each server
``HARNESS_PI_MCP`` names (JSON ``[{"name", "command"}]``; the commands are the worker's
bridge, which reads the run's credential from pi's environment) and registers each of its
tools as ``SERVER_TOOL``; :func:`tool_names` adds them to ``--tools`` (the operator attached
them). A
call is ``tools/call``; an error result is thrown, which pi reports to the model as an error.
A server that fails to start is said on stderr and its tools are left out.
"""

from __future__ import annotations

import json

from adapters.protocol import TurnRequest

EXTENSION_PATH = ".pi/harness-mcp.ts"
"""Under the run's HOME."""

EXTENSION = """\
// harness-worker: the run's MCP servers as pi tools.
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";

function client(command: string[]) {
  const child = spawn(command[0], command.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
  const waiting = new Map<number, (message: any) => void>();
  let next = 0;
  createInterface({ input: child.stdout }).on("line", (line) => {
    let message: any;
    try { message = JSON.parse(line); } catch { return; }
    const done = waiting.get(message.id);
    if (done) { waiting.delete(message.id); done(message); }
  });
  const closed = new Promise<any>((resolve) =>
    child.on("close", () => resolve({ error: { message: "the MCP server exited" } })));
  const send = (message: any) => child.stdin.write(JSON.stringify(message) + "\\n");
  const request = (method: string, params: any) => {
    const id = ++next;
    const answer = new Promise<any>((resolve) => waiting.set(id, resolve));
    send({ jsonrpc: "2.0", id, method, params });
    return Promise.race([answer, closed]);
  };
  // Between calls the server must not keep pi alive (it exits when its turn is done);
  // during one it must (nothing else may be pending then).
  const held = (on: boolean) => {
    for (const handle of [child, child.stdin, child.stdout] as any[]) {
      if (on) handle.ref?.(); else handle.unref?.();
    }
  };
  const call = async (method: string, params: any) => {
    held(true);
    try { return await request(method, params); } finally { held(false); }
  };
  return { child, send, request, call, release: () => held(false) };
}

function register(pi: any, server: string, mcp: any, tool: any): string {
  const name = `${server}_${tool.name}`;
  pi.registerTool({
    name,
    label: name,
    description: tool.description ?? name,
    parameters: tool.inputSchema ?? { type: "object", properties: {} },
    async execute(_id: string, params: any) {
      const arguments_ = params ?? {};
      const answer = await mcp.call("tools/call", { name: tool.name, arguments: arguments_ });
      const text = (answer.result?.content ?? []).map((c: any) => c.text ?? "").join("");
      if (answer.error || answer.result?.isError) {
        throw new Error(text || answer.error?.message || "the tool failed");
      }
      return { content: [{ type: "text", text }], details: {} };
    },
  });
  return name;
}

export default async function (pi: any) {
  const servers = JSON.parse(process.env.HARNESS_PI_MCP ?? "[]");
  const names: string[] = [];
  const clients: any[] = [];
  const info = { name: "harness-pi", version: "1" };
  for (const server of servers) {
    const mcp = client(server.command);
    clients.push(mcp);
    process.on("exit", () => mcp.child.kill());
    const hello = await mcp.request("initialize", {
      protocolVersion: "2025-06-18", capabilities: {}, clientInfo: info,
    });
    if (hello.error) {
      console.error(`MCP server ${server.name} failed to load: ${hello.error.message}`);
      continue;
    }
    mcp.send({ jsonrpc: "2.0", method: "notifications/initialized" });
    const listed = await mcp.request("tools/list", {});
    for (const tool of listed.result?.tools ?? []) names.push(register(pi, server.name, mcp, tool));
    mcp.release();
  }
  pi.on("session_start", () => pi.setActiveTools([...new Set([...pi.getActiveTools(), ...names])]));
  pi.on("session_shutdown", () => clients.forEach((mcp) => mcp.child.kill()));
}
"""


def tool_names(request: TurnRequest) -> list[str]:
    """The attached tools as pi names them, for its ``--tools`` allowlist (which drops any
    tool it does not name, an extension's too): listed by the worker when the turn began."""
    return [f"{s.name}_{tool}" for s in request.mcp_servers for tool in s.tools]


def extension(request: TurnRequest) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The argv, environment and files that load the run's servers into pi; nothing when
    the run attached none."""
    if not request.mcp_servers:
        return [], {}, {}
    path = f"{request.home.rstrip('/')}/{EXTENSION_PATH}"
    servers = [{"name": s.name, "command": list(s.command)} for s in request.mcp_servers]
    return ["-e", path], {"HARNESS_PI_MCP": json.dumps(servers)}, {path: EXTENSION}
