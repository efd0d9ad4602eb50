// The runs list: GET /v1/runs with the tenant's key (kept for this tab, sent only in the
// Authorization header), its filters and cursor; a run opens through a page link made for it.
"use strict";

const KEY = "harness-api-key";
const $ = (id) => document.getElementById(id);
let cursor = null;

const key = () => sessionStorage.getItem(KEY) || "";

function say(text, cls) {
  $("list-status").textContent = text;
  $("list-status").className = cls || "quiet";
}

function query() {
  const q = new URLSearchParams();
  if ($("f-status").value) q.set("status", $("f-status").value);
  if ($("f-harness").value.trim()) q.set("harness", $("f-harness").value.trim());
  for (const label of $("f-label").value.split(/[\s,]+/)) if (label) q.append("label", label);
  q.set("limit", "50");
  return q;
}

async function open(runId, mode) {
  try {
    const made = await (await H.call(key(), "/v1/runs/" + encodeURIComponent(runId) + "/links",
      { method: "POST", body: { mode: mode } })).json();
    // The path: this origin, the token in its fragment (never sent to a server).
    if (typeof made.path !== "string" || !made.path.startsWith("/runs/" + runId + "#")) {
      throw new Error("an unexpected link");
    }
    location.assign(made.path);
  } catch (error) {
    say("could not open " + runId + ": " + error.message, "error");
  }
}

// A group's attempts with the key: each one's open button, a pick (the others are ended),
// and the diff of two.
async function compare(group) {
  $("group").hidden = false;
  $("group-name").textContent = group;
  const box = $("attempts");
  const path = "/v1/groups/" + encodeURIComponent(group);
  box.replaceChildren(H.el("p", { className: "quiet" }, "loading…"));
  try {
    const found = await (await H.call(key(), path)).json();
    H.renderGroup(box, found, {
      open: (a) => open(a.run_id, "approve"),
      pick: (index) => pick(group, index),
    });
    H.renderGroupDiff($("group-diff-box"), found, async (a, b) =>
      (await H.call(key(), path + "/diff?a=" + encodeURIComponent(a) + "&b=" + encodeURIComponent(b))).text());
  } catch (error) {
    box.replaceChildren(H.el("p", { className: "error" }, error.message));
    $("group-diff-box").replaceChildren();
  }
}

async function pick(group, index) {
  const state = $("group-state");
  state.className = "quiet";
  state.textContent = "picking attempt " + index + "…";
  try {
    const picked = await (await H.call(key(), "/v1/groups/" + encodeURIComponent(group) + "/pick",
      { method: "POST", body: { attempt: index } })).json();
    state.className = "ok";
    const ended = Array.isArray(picked.ended) ? picked.ended : [];
    state.textContent = "picked attempt " + H.text(picked.picked, "?") + " (" + H.text(picked.run_id, "?") + ")"
      + (ended.length ? "; ended " + ended.join(", ") : "")
      + (picked.branch ? "; its branch " + picked.branch : "");
  } catch (error) {
    state.className = "error";
    state.textContent = error.message;
  }
  await compare(group);
  list(false);
}

function runRow(run) {
  const openRead = H.el("button", { type: "button", className: "open-read" }, "read");
  openRead.addEventListener("click", () => open(run.run_id, "read"));
  const openApprove = H.el("button", { type: "button", className: "open-approve" }, "approve");
  openApprove.addEventListener("click", () => open(run.run_id, "approve"));
  let group = null;
  if (run.group) {
    group = H.el("button", { type: "button", className: "link compare" },
      H.text(run.group) + (run.attempt !== undefined && run.attempt !== null ? " #" + run.attempt : ""));
    group.addEventListener("click", () => compare(run.group));
  }
  const model = run.model_reported || run.model_served || run.model_requested;
  return H.el("tr", { "data-run": H.text(run.run_id) },
    H.el("td", {}, H.el("code", {}, H.text(run.run_id)),
      run.forked_from ? H.el("div", { className: "meta" }, "forked from " + run.forked_from
        + (run.forked_at_turn !== undefined && run.forked_at_turn !== null ? " at turn " + run.forked_at_turn : "")) : null),
    H.el("td", { className: "nowrap" }, H.text(run.harness)),
    H.el("td", {}, H.statusBadge(run.status)),
    H.el("td", { className: "nowrap" }, H.text(model, "—")),
    H.el("td", { className: "num" }, H.text(run.turns, "0")),
    H.el("td", { className: "num" }, H.int(run.input_tokens) + " / " + H.int(run.output_tokens)),
    H.el("td", { className: "num" }, H.cost(run.cost_usd) || "—"),
    H.el("td", {}, H.el("div", { className: "chips" }, ...H.chips(run.labels))),
    H.el("td", {}, group),
    H.el("td", {}, H.text(H.when(run.created_at), "—")),
    H.el("td", { className: "actions" }, openRead, " ", openApprove));
}

async function list(more) {
  if (!key()) { say("paste the tenant's API key above to list its runs"); return; }
  const q = query();
  if (more && cursor) q.set("cursor", cursor);
  say("loading…");
  try {
    const page = await (await H.call(key(), "/v1/runs?" + q.toString())).json();
    if (!more) $("rows").replaceChildren();
    for (const run of page.runs || []) $("rows").appendChild(runRow(run));
    cursor = page.cursor || null;
    $("more").hidden = !cursor;
    const shown = $("rows").children.length;
    say(shown ? shown + (shown === 1 ? " run" : " runs") + (cursor ? ", more to load" : "") : "no run matches");
  } catch (error) {
    say(error.message, "error");
  }
}

function keyState() {
  $("key-state").textContent = key()
    ? "a key is in use for this tab (sent only in the Authorization header)"
    : "no key yet: kept for this tab only, sent only in the Authorization header";
}

$("key-form").addEventListener("submit", (submitted) => {
  submitted.preventDefault();
  const value = $("key").value.trim();
  $("key").value = ""; // not left in the field
  if (value) sessionStorage.setItem(KEY, value);
  keyState();
  if (openAsked()) return;
  if (asked && key()) compare(asked);
  list(false);
});
$("forget").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  $("rows").replaceChildren();
  $("more").hidden = true;
  keyState();
  say("the key is forgotten");
});
$("filters").addEventListener("submit", (submitted) => { submitted.preventDefault(); list(false); });
$("more").addEventListener("click", () => list(true));
$("group-close").addEventListener("click", () => { $("group").hidden = true; });
keyState();
// /runs#group=NAME (the run page's link to its attempts): that group's attempts; and
// #open=RUN_ID&mode=MODE (the run page's link to another attempt): a page link made for it,
// once a key is in use. The fragment never reaches a server.
const fragment = new URLSearchParams(location.hash.slice(1));
const asked = fragment.get("group");
let opening = /^[A-Za-z0-9_-]{1,64}$/.test(fragment.get("open") || "") ? fragment.get("open") : null;
const openMode = fragment.get("mode") === "approve" ? "approve" : "read";
function openAsked() {
  if (!opening || !key()) return false;
  const runId = opening;
  opening = null;
  say("opening " + runId + "…");
  open(runId, openMode);
  return true;
}
if (!openAsked()) {
  if (asked && key()) compare(asked);
  list(false);
  if (opening) say("paste the tenant's API key above to open " + opening);
}
