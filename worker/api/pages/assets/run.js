// The run page: every turn of the run as it streams, grouped by turn, each event shown as what
// it means (docs/events.md); the record's facts on top; the requests waiting for an answer;
// with an approve link, the answers and the steer box; a group's attempts side by side.
"use strict";

const RUN = document.body.dataset.run;
const fragment = new URLSearchParams(location.hash.slice(1));
if (fragment.get("link")) {
  sessionStorage.setItem("link:" + RUN, fragment.get("link"));
  sessionStorage.setItem("mode:" + RUN, fragment.get("mode") === "approve" ? "approve" : "read");
}
history.replaceState(null, "", location.pathname); // the token leaves the address bar
const LINK = sessionStorage.getItem("link:" + RUN) || "";
const APPROVE = sessionStorage.getItem("mode:" + RUN) === "approve";
const $ = (id) => document.getElementById(id);
const api = (path, options) => H.call(LINK, "/v1/runs/" + RUN + path, options);

// -- turns ---------------------------------------------------------------------------------

const turns = new Map();
const requests = new Map(); // request_id -> its row in the stream

function turnOf(n) {
  let t = turns.get(n);
  if (t) return t;
  const state = H.el("span", { className: "badge st-running" }, "running");
  const who = H.el("span", { className: "who" });
  const sum = H.el("span", { className: "sum" });
  const body = H.el("div", { className: "turn-body" });
  const section = H.el("section", { className: "turn", id: "turn-" + n, "data-turn": String(n) },
    H.el("header", { className: "turn-head" }, H.el("h3", {}, "Turn " + n), who, state, sum),
    body);
  $("no-events")?.remove();
  const later = [...turns.keys()].filter((k) => k > n).sort((a, b) => a - b)[0];
  $("events").insertBefore(section, later === undefined ? null : turns.get(later).section);
  t = { n, section, who, state, sum, body, text: null, harness: "", model: null,
        usage: { input: 0, output: 0, cached: 0, cost: null }, gateway: null, final: null };
  turns.set(n, t);
  return t;
}

function summarize(t) {
  const parts = [];
  if (t.model) parts.push(t.model);
  const u = t.final || t.usage;
  parts.push(H.tokens(u.input, u.output) + (t.usage.cached ? " (" + H.int(t.usage.cached) + " cached)" : ""));
  parts.push(H.cost(u.cost) || "not priced");
  if (t.gateway) parts.push("gateway " + H.tokens(t.gateway.input, t.gateway.output) + ", " + t.gateway.requests + (t.gateway.requests === 1 ? " request" : " requests"));
  t.sum.textContent = parts.join(" · ");
}

function row(t, type, id, tag, ...content) {
  const node = H.el("div", { className: "ev ev-" + type, "data-id": id },
    H.el("span", { className: "tag" }, tag), H.el("div", { className: "what" }, ...content));
  t.body.appendChild(node);
  return node;
}

const meta = (...parts) => H.el("div", { className: "meta" }, parts.filter((p) => p).join(" · "));

function activity(t, id, data) {
  const kind = H.text(data.kind, "other");
  if (kind === "network") {
    const where = H.text(data.host, "?") + (data.port ? ":" + data.port : "");
    return row(t, "sandbox-activity", id, data.denied === false ? "network" : "network denied",
      H.el("code", {}, where), " ", H.block(data.description, { mono: false }));
  }
  const tag = { command: "command", file: "file", tool: "tool", model: "model gateway" }[kind] || "activity";
  const mono = kind === "command" || kind === "file";
  const node = row(t, "sandbox-activity", id, tag,
    H.block(H.text(data.description, "(no description)"), { mono: mono }));
  node.classList.add("kind-" + kind);
  return node;
}

function workspace(t, id, data) {
  const added = data.added || [], modified = data.modified || [], deleted = data.deleted || [];
  const count = (n, list) => (typeof n === "number" ? n : list.length);
  const files = count(data.added_count, added) + count(data.modified_count, modified)
    + count(data.deleted_count, deleted);
  const head = data.rewound_to !== null && data.rewound_to !== undefined
    ? "rewound to turn " + data.rewound_to + ": " : "";
  const what = files || data.lines_added || data.lines_removed
    ? [head + files + (files === 1 ? " file" : " files") + " changed, ",
       H.el("span", { className: "plus" }, "+" + H.int(data.lines_added)), " ",
       H.el("span", { className: "minus" }, "-" + H.int(data.lines_removed)), " lines"]
    : [head + "no files changed"];
  const list = H.el("ul", { className: "files mono" });
  for (const [mark, paths, cls] of [["+", added, "plus"], ["~", modified, "mod"], ["-", deleted, "minus"]]) {
    for (const path of paths) list.appendChild(H.el("li", { className: cls }, mark + " " + path));
  }
  const shown = added.length + modified.length + deleted.length;
  const notes = [];
  if (shown < files) notes.push((files - shown) + " more not listed");
  if (data.large && data.large.length) notes.push("by hash and size only: " + data.large.join(", "));
  if (data.complete === false) notes.push("snapshot cut short" + (data.note ? ": " + data.note : ""));
  else if (data.note) notes.push(data.note);
  if (data.pushed_branch) notes.push("pushed to " + data.pushed_branch);
  const content = [H.el("div", {}, ...what)];
  if (shown) content.push(shown > 12 ? H.el("details", { className: "long" }, H.el("summary", {}, "the files"), list) : list);
  if (notes.length) content.push(meta(...notes));
  if (head === "" && files > 0) {
    const out = H.el("pre", { className: "diff mono", hidden: true });
    const button = H.el("button", { type: "button", className: "load-diff", "data-turn": String(t.n) }, "Show the diff");
    button.addEventListener("click", () => toggleDiff(t.n, button, out));
    content.push(H.el("div", {}, button), out);
  }
  return row(t, "workspace", id, "workspace", ...content);
}

async function toggleDiff(n, button, out) {
  if (!out.hidden) { out.hidden = true; button.textContent = "Show the diff"; return; }
  out.hidden = false;
  button.textContent = "Hide the diff";
  if (out.dataset.loaded) return;
  out.textContent = "loading…";
  try {
    const text = await (await api("/diff?turn=" + n)).text();
    out.dataset.loaded = "1";
    H.diffInto(out, text);
  } catch (error) {
    out.textContent = error.message;
  }
}

function show(id, type, data) {
  const n = parseInt(id.split("-")[0], 10) || 0;
  const t = turnOf(n);
  if (type !== "assistant-text") t.text = null;
  switch (type) {
    case "turn-started": {
      t.harness = H.text(data.harness);
      t.who.textContent = [H.text(data.harness, "harness ?"), "attempt " + H.text(data.attempt, "1")].join(" · ");
      return row(t, type, id, "started",
        "input of " + H.int(data.input_chars) + " chars",
        data.trace_id ? meta("trace " + data.trace_id) : null);
    }
    case "session": {
      if (data.model) { t.model = H.text(data.model); summarize(t); }
      return row(t, type, id, "session",
        H.el("code", {}, H.text(data.session_id, "(no id)")), " ",
        data.resumed ? "resumed" : "new", " · model ", H.text(data.model, "not reported"));
    }
    case "assistant-text": {
      const piece = H.text(data.text);
      if (t.text) {
        // Gemini streams pieces of one message, the others whole blocks: a block goes on a
        // line of its own unless the text between them already holds a space.
        const joined = t.harness.startsWith("gemini") || /\s$/.test(t.text.textContent) || /^\s/.test(piece);
        t.text.textContent += (joined ? "" : "\n") + piece;
        return t.text;
      }
      const node = H.el("div", { className: "prose" }, piece);
      row(t, type, id, "assistant", node);
      t.text = node;
      return node;
    }
    case "sandbox-activity": return activity(t, id, data);
    case "permission-request": {
      const content = [H.el("span", { className: "strong" }, H.text(data.description, "a permission"))];
      if (data.command) content.push(H.el("div", {}, H.el("code", {}, "$ " + data.command)));
      if (data.tool) content.push(meta("tool " + data.tool, data.input_chars ? H.int(data.input_chars) + " chars of input" : ""));
      if (data.input) content.push(H.jsonBlock(data.input, "input"));
      if (data.deadline) {
        const deadline = meta("denied unanswered at " + H.when(data.deadline));
        deadline.classList.add("deadline");
        content.push(deadline);
      }
      const node = row(t, type, id, "asks", ...content);
      node.classList.add("open-request");
      requests.set(H.text(data.request_id), node);
      return node;
    }
    case "permission-decision": {
      const allowed = data.decision === "allow";
      const asked = requests.get(H.text(data.request_id));
      if (asked) {
        asked.classList.remove("open-request");
        asked.classList.add(allowed ? "allowed" : "denied");
        asked.querySelector(".deadline")?.remove(); // answered: no longer waiting for it
      }
      const node = row(t, type, id, allowed ? "allowed" : "denied",
        (allowed ? "allowed" : "denied") + " (" + H.text(data.scope, "once") + ") by ",
        H.el("code", {}, H.text(data.by, "unknown")),
        data.message ? H.el("div", {}, "told the model: ", H.block(data.message, { mono: false })) : null);
      node.classList.add(allowed ? "allowed" : "denied");
      return node;
    }
    case "tool-call": {
      const cut = data.input_chars && data.input && data.input_chars > data.input.length
        ? meta("input cut: " + H.int(data.input_chars) + " chars in all") : null;
      return row(t, type, id, "tool call",
        H.el("code", { className: "strong" }, H.text(data.server, "?") + "." + H.text(data.tool, "?")), " ",
        H.jsonBlock(H.text(data.input, "{}"), "input"), cut);
    }
    case "tool-result": {
      const ok = data.ok !== false;
      const node = row(t, type, id, ok ? "tool result" : "tool failed",
        "tool result (" + (ok ? "ok" : "error") + ", " + H.int(data.duration_ms) + " ms): ",
        H.block(H.text(data.output, "(no output)")),
        data.output_chars && data.output && data.output_chars > data.output.length
          ? meta("output cut: " + H.int(data.output_chars) + " chars in all") : null);
      if (!ok) node.classList.add("failed");
      return node;
    }
    case "usage": {
      const source = H.text(data.source, "harness");
      if (source === "gateway") {
        const g = t.gateway || (t.gateway = { input: 0, output: 0, requests: 0 });
        g.input += data.input_tokens || 0; g.output += data.output_tokens || 0; g.requests += 1;
        if (data.model && !t.model) t.model = H.text(data.model);
      } else {
        t.usage.input += data.input_tokens || 0;
        t.usage.output += data.output_tokens || 0;
        t.usage.cached += data.cached_input_tokens || 0;
        if (typeof data.cost_usd === "number") t.usage.cost = (t.usage.cost || 0) + data.cost_usd;
      }
      summarize(t);
      return row(t, type, id, source === "harness" ? "usage" : "usage (" + source + ")",
        H.tokens(data.input_tokens, data.output_tokens),
        data.cached_input_tokens ? " (" + H.int(data.cached_input_tokens) + " cached)" : "",
        H.cost(data.cost_usd) ? " · " + H.cost(data.cost_usd) : "",
        data.model ? " · served by " + data.model : "");
    }
    case "workspace": return workspace(t, id, data);
    case "parked": {
      t.state.textContent = "parked";
      t.state.className = "badge st-parked";
      return row(t, type, id, "parked",
        "parked (" + H.text(data.reason, "limit") + ") until " + H.text(H.when(data.resume_at), "?"),
        meta("turn " + H.text(data.next_turn, "?") + " sends the same input again"));
    }
    case "user-message": {
      return row(t, type, id, "message",
        H.el("div", {}, H.el("span", { className: "strong" }, H.text(data.by, "someone")), " said (",
          H.text(data.mode, "?"), ", delivered ", H.text(data.delivery, "?"), "):"),
        H.el("div", { className: "prose quote" }, H.text(data.text)));
    }
    case "outcome-evaluation": {
      const verdict = data.satisfied ? "satisfied" : "not satisfied";
      return row(t, type, id, "graded",
        H.el("div", {}, H.el("span", { className: "strong" },
          "iteration " + H.text(data.iteration, "?") + ": " + verdict),
          " · grader run ", H.el("code", {}, H.text(data.grader_run_id, "?"))),
        H.el("div", { className: "prose quote" }, H.text(data.feedback, "(no feedback)")),
        meta(H.tokens(data.input_tokens, data.output_tokens) + " tokens", H.cost(data.cost_usd) || "not priced"));
    }
    case "turn-complete": {
      if (data.model) t.model = H.text(data.model);
      t.final = { input: data.input_tokens || 0, output: data.output_tokens || 0,
                  cost: typeof data.cost_usd === "number" ? data.cost_usd : t.usage.cost };
      summarize(t);
      t.state.textContent = "complete";
      t.state.className = "badge st-complete";
      const answer = H.el("div", {}, H.el("span", { className: "strong" }, "turn complete: "),
        H.el("span", { className: "prose answer" }, H.text(data.text)));
      const node = row(t, type, id, "answer", answer,
        "structured" in data ? H.block(JSON.stringify(data.structured, null, 2), { collapse: true, label: "structured" }) : null,
        meta("model " + H.text(data.model, "not reported"), H.tokens(data.input_tokens, data.output_tokens) + " tokens",
          H.cost(data.cost_usd) || "not priced",
          data.exit_code !== null && data.exit_code !== undefined ? "exit " + data.exit_code : ""));
      return node;
    }
    case "session-error": {
      summarize(t);
      const parked = t.state.textContent === "parked"; // its retry is the next turn
      t.state.textContent = (parked ? "parked: " : "failed: ") + H.text(data.reason, "unknown reason");
      t.state.className = "badge " + (parked ? "st-parked" : "st-failed");
      const retry = data.retryable
        ? "retryable" + (typeof data.retry_after_s === "number" ? " after " + H.seconds(data.retry_after_s) : "")
        : "not retryable";
      const node = row(t, type, id, "failed",
        H.el("div", { className: "strong" }, H.text(data.reason, "unknown reason") + ": " + H.text(data.error, "(no message)")),
        meta(retry, data.exit_code !== null && data.exit_code !== undefined ? "exit " + data.exit_code : ""),
        data.stderr_tail ? H.block(data.stderr_tail, { collapse: true, label: "stderr" }) : null);
      node.classList.add("failed");
      return node;
    }
    default:
      return row(t, "other", id, "event " + type, H.block(JSON.stringify(data), { collapse: true, label: "data" }));
  }
}

// -- the record, the requests, the steer box, the group ------------------------------------

async function refresh() {
  const record = await (await api("")).json();
  $("status").textContent = H.text(record.status, "unknown") + " · turn " + H.text(record.current_turn, "0");
  $("status").className = "badge st-" + H.text(record.status, "unknown");
  const dl = $("facts");
  dl.replaceChildren();
  H.fact(dl, "harness", H.text(record.harness));
  const model = record.model_reported || record.model_served
    || (record.model_requested ? record.model_requested + " (asked)" : null);
  H.fact(dl, "model", H.text(model, "not reported"));
  H.fact(dl, "turns", H.text(record.turns, "0"));
  H.fact(dl, "tokens", H.tokens(record.input_tokens, record.output_tokens)
    + (record.cached_input_tokens ? " (" + H.int(record.cached_input_tokens) + " cached)" : ""));
  H.fact(dl, "cost", H.cost(record.cost_usd) || "not priced");
  if (record.gateway_requests) {
    H.fact(dl, "at the gateway", H.tokens(record.gateway_input_tokens, record.gateway_output_tokens)
      + " · " + H.int(record.gateway_requests) + " requests");
  }
  H.fact(dl, "wall time", H.seconds(record.wall_s));
  H.fact(dl, "session", record.session_id ? H.el("code", {}, record.session_id) : null);
  if (record.forked_from) {
    H.fact(dl, "forked from", H.el("span", {}, H.el("code", {}, H.text(record.forked_from)),
      record.forked_at_turn !== undefined && record.forked_at_turn !== null ? " at turn " + record.forked_at_turn : ""));
  }
  if (record.group) {
    H.fact(dl, "group", H.el("span", {}, H.el("code", {}, H.text(record.group)),
      record.attempt !== undefined && record.attempt !== null ? " · attempt " + record.attempt : ""));
  }
  if (record.outcome) {
    H.fact(dl, "outcome", H.text(record.outcome) + (record.outcome_iterations
      ? " · " + H.int(record.outcome_iterations) + " graded" : ""));
  }
  H.fact(dl, "network", H.text(record.network));
  H.fact(dl, "started", H.when(record.created_at));
  if (record.status === "parked") H.fact(dl, "resumes", H.when(record.resume_at));
  if (record.budget_exceeded) H.fact(dl, "budget spent", H.text(record.budget_exceeded.budget, "a limit"));
  if (record.last_error) H.fact(dl, "last error", H.block(record.last_error, { mono: false }));
  $("labels").replaceChildren(...H.chips(record.labels));
  if (record.group) loadGroup(record.group); // this run's own change shows in its column
  await showRequests();
}

async function showRequests() {
  const waiting = await (await api("/permissions")).json();
  const box = $("requests");
  box.replaceChildren();
  if (!waiting.length) box.appendChild(H.el("p", { className: "quiet" }, "nothing"));
  for (const request of waiting) {
    const div = H.el("div", { className: "request" },
      H.el("div", { className: "strong" }, H.text(request.tool, "a tool") + ": "
        + H.text(request.description || request.command, "(no description)")));
    if (request.command) div.appendChild(H.el("div", {}, H.el("code", {}, "$ " + request.command)));
    if (request.input) div.appendChild(H.jsonBlock(request.input, "input"));
    for (const decision of APPROVE ? ["allow", "deny"] : []) {
      const button = H.el("button", { type: "button", className: decision }, decision === "allow" ? "Approve" : "Deny");
      button.addEventListener("click", async () => {
        button.disabled = true;
        try {
          await api("/permissions/" + encodeURIComponent(request.request_id),
            { method: "POST", body: { decision: decision } });
        } catch (error) {
          div.appendChild(H.el("div", { className: "error" }, error.message));
        }
        showRequests().catch(() => {});
      });
      div.appendChild(button);
    }
    box.appendChild(div);
  }
}

// The attempts of the run's group, read with the page's link (when a link may) and again
// every few seconds while one of them may still change. Opening another attempt, picking one
// and the diff of two take the tenant's key: they are on the runs list.
let groupTimer = null;
let groupAsked = 0; // only the latest read renders and schedules the next

async function loadGroup(name) {
  $("group").hidden = false;
  $("group-name").textContent = name;
  const box = $("attempts");
  const listed = "/runs#group=" + encodeURIComponent(name);
  const elsewhere = H.el("a", { href: listed, className: "group-list" }, "the runs list");
  if (document.body.dataset.groupsByLink !== "True") {
    box.replaceChildren(H.el("p", { className: "quiet" },
      "a page link opens this run alone: compare its attempts on ", elsewhere, " (with the tenant's key)"));
    return;
  }
  clearTimeout(groupTimer);
  const asked = ++groupAsked;
  try {
    const group = await (await H.call(LINK, "/v1/groups/" + encodeURIComponent(name))).json();
    if (asked !== groupAsked) return;
    const mode = APPROVE ? "approve" : "read";
    H.renderGroup(box, group, {
      current: RUN,
      openHref: (a) => "/runs#open=" + encodeURIComponent(a.run_id) + "&mode=" + mode
        + "&group=" + encodeURIComponent(name),
    });
    box.appendChild(H.el("p", { className: "quiet" },
      group.picked === null || group.picked === undefined
        ? ["pick one or see the diff of two on ", elsewhere, " (with the tenant's key)"]
        : ["attempt " + group.picked + " was picked; the diff of two is on ", elsewhere]));
    const attempts = Array.isArray(group.attempts) ? group.attempts : [];
    if (attempts.some(H.attemptRunning)) groupTimer = setTimeout(() => loadGroup(name), 3000);
  } catch (error) {
    if (asked !== groupAsked) return;
    box.replaceChildren(H.el("p", { className: "quiet" }, error.message + "; compare the attempts on ", elsewhere));
  }
}

function steerBox() {
  if (!APPROVE) return; // a read link shows no box
  $("steer").hidden = false;
  $("steer-form").addEventListener("submit", async (submitted) => {
    submitted.preventDefault();
    const text = $("steer-text").value;
    const result = $("steer-result");
    if (!text.trim()) return;
    $("steer-send").disabled = true;
    result.className = "quiet";
    result.textContent = "sending…";
    try {
      const response = await api("/messages", { method: "POST", body: { text: text, mode: $("steer-mode").value } });
      const body = await response.json().catch(() => ({}));
      result.className = "ok";
      const how = { "sent-to-turn": "sent to turn ", "queued": "queued behind turn ",
                    "started": "started turn " }[body && body.state];
      result.textContent = "accepted (" + response.status + ")"
        + (how ? ": " + how + H.text(body.turn, "?") : "")
        + (body && body.message_id ? " · " + body.message_id : "");
      $("steer-text").value = "";
    } catch (error) {
      result.className = "error";
      result.textContent = error.status === 409 ? "not sent: " + error.message : error.message;
    } finally {
      $("steer-send").disabled = false;
    }
  });
}

// -- start ---------------------------------------------------------------------------------

const RECHECK = new Set(["permission-request", "permission-decision", "turn-complete",
  "session-error", "parked", "user-message", "session", "turn-started"]);

async function main() {
  if (!LINK) {
    $("status").textContent = "this page opens with a run page link (POST /v1/runs/" + RUN + "/links)";
    return;
  }
  steerBox();
  refresh().catch((error) => { $("status").textContent = error.message; });
  let pending = null;
  try {
    await H.follow(LINK, "/v1/runs/" + RUN + "/events/stream", (id, type, data) => {
      show(id, type, data);
      if (RECHECK.has(type) && !pending) {
        pending = setTimeout(() => { pending = null; refresh().catch(() => {}); }, 150);
      }
    });
    await refresh().catch(() => {});
    $("status").textContent += " · stream ended";
  } catch (error) {
    $("status").textContent = error.message;
  }
}

main();
