"""A run page at ``/runs/{id}``: the run live, as ``--follow`` shows it, its workspace diff and
buttons for its pending permission requests.

The page itself holds no data (it is the same for every run and needs no key); its script
reads a page link's token from the URL fragment (``/runs/ID#link=TOKEN&mode=MODE``, as
``POST /v1/runs/{id}/links`` makes it: a fragment never reaches a server or a log), keeps it
for the tab (``sessionStorage``: a reload still works) and calls the API with it: the event
stream through ``fetch`` (an ``EventSource`` cannot send an Authorization header), the
record, the pending requests, the diff and, with an ``approve`` link, the answers. The token
opens that run alone (worker/api/links.py); the page never asks for, nor holds, an API key.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from worker.api.errors import not_found
from worker.options.spec import RUN_ID

router = APIRouter()

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>run RUN_ID</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; max-width: 60em; }
#status { font-weight: bold; }
#events { white-space: pre-wrap; font-family: ui-monospace, monospace; background: #f6f6f6;
  padding: .8em; min-height: 6em; }
.event-turn-complete { color: #060; } .event-session-error { color: #a00; }
.event-tool-call, .event-tool-result { color: #036; }
.request { border: 1px solid #c90; padding: .5em; margin: .5em 0; }
#diff { white-space: pre; font-family: ui-monospace, monospace; overflow-x: auto; }
</style></head>
<body>
<h1>Run <code>RUN_ID</code></h1>
<p>Status: <span id="status">connecting</span></p>
<h2>Turn</h2>
<div id="events"></div>
<h2>Waiting for you</h2>
<div id="requests"><p>nothing</p></div>
<h2>Workspace diff</h2>
<button id="load-diff">Show the diff</button>
<div id="diff"></div>
<script>
"use strict";
const RUN = "RUN_ID";
const fragment = new URLSearchParams(location.hash.slice(1));
if (fragment.get("link")) {
  sessionStorage.setItem("link:" + RUN, fragment.get("link"));
  sessionStorage.setItem("mode:" + RUN, fragment.get("mode") || "read");
}
history.replaceState(null, "", location.pathname);
const LINK = sessionStorage.getItem("link:" + RUN) || "";
const APPROVE = sessionStorage.getItem("mode:" + RUN) === "approve";
const auth = { "Authorization": "Bearer " + LINK };
const $ = (id) => document.getElementById(id);

async function api(path, options) {
  const response = await fetch("/v1/runs/" + RUN + path,
    Object.assign({ headers: Object.assign({}, auth, { "Content-Type": "application/json" }) },
                  options || {}));
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error((body.error && body.error.message) || response.statusText);
  }
  return response;
}

// One line per event, from its data's fields as docs/events.md names them.
function describe(type, data) {
  switch (type) {
    case "assistant-text": return data.text;
    case "turn-complete": return "turn complete: " + (data.text || "");
    case "session-error": return "turn failed: " + data.reason + ": " + data.error;
    case "tool-call": return "tool " + data.server + "." + data.tool + " " + data.input;
    case "tool-result":
      return "tool result (" + (data.ok ? "ok" : "error") + ", " + data.duration_ms + " ms): "
        + data.output;
    case "sandbox-activity": return data.kind + ": " + data.description;
    case "permission-request": return "asks: " + (data.description || data.command || "");
    case "permission-decision": return data.decision + " (" + data.by + ")";
    default: return "[" + type + "]";
  }
}

function show(type, data) {
  const line = document.createElement("div");
  line.className = "event event-" + type;
  line.textContent = describe(type, data);
  $("events").appendChild(line);
}

async function refresh() {
  const record = await (await api("")).json();
  $("status").textContent = record.status + " (turn " + record.current_turn + ")";
  const waiting = await (await api("/permissions")).json();
  const box = $("requests");
  box.replaceChildren();
  if (!waiting.length) box.innerHTML = "<p>nothing</p>";
  for (const request of waiting) {
    const div = document.createElement("div");
    div.className = "request";
    const what = document.createElement("code");
    what.textContent = request.tool + ": " + (request.description || request.command || "");
    div.appendChild(what);
    for (const decision of APPROVE ? ["allow", "deny"] : []) {
      const button = document.createElement("button");
      button.textContent = decision === "allow" ? "Approve" : "Deny";
      button.className = decision;
      button.onclick = async () => {
        await api("/permissions/" + request.request_id,
                  { method: "POST", body: JSON.stringify({ decision: decision }) });
        refresh();
      };
      div.appendChild(button);
    }
    box.appendChild(div);
  }
}

async function follow() {
  let last = null;
  for (;;) {
    const headers = Object.assign({}, auth, last ? { "Last-Event-ID": last } : {});
    try {
      const response = await fetch("/v1/runs/" + RUN + "/events/stream", { headers: headers });
      if (!response.ok) { $("status").textContent = "refused: " + response.status; return; }
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) { refresh(); $("status").textContent += " - stream ended"; return; }
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\\n\\n")) >= 0) {
          const block = buffer.slice(0, end); buffer = buffer.slice(end + 2);
          let id = null, type = "message", data = [];
          for (const line of block.split("\\n")) {
            if (line.startsWith("id: ")) id = line.slice(4);
            else if (line.startsWith("event: ")) type = line.slice(7);
            else if (line.startsWith("data: ")) data.push(line.slice(6));
          }
          if (id === null) continue;
          last = id;
          show(type, JSON.parse(data.join("\\n")));
          if (type === "permission-request" || type === "permission-decision"
              || type === "turn-complete" || type === "session-error") refresh();
        }
      }
    } catch (error) {
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  }
}

if (!LINK) {
  $("status").textContent = "this page opens with a run page link (POST /v1/runs/"
    + RUN + "/links)";
  throw new Error("no page link");
}
$("load-diff").onclick = async () => {
  try { $("diff").textContent = await (await api("/diff")).text() || "(no changes)"; }
  catch (error) { $("diff").textContent = error.message; }
};
refresh().catch((error) => { $("status").textContent = error.message; });
follow();
</script>
</body></html>
"""


@router.get("/runs/{run_id}", response_class=HTMLResponse, include_in_schema=False)
async def run_page(run_id: str) -> HTMLResponse:
    if not RUN_ID.fullmatch(run_id):
        raise not_found(run_id)
    return HTMLResponse(
        _PAGE.replace("RUN_ID", run_id),
        headers={
            "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
            "style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'",
            "Referrer-Policy": "no-referrer",
        },
    )
