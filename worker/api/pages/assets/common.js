// What both pages share: building DOM from data (text only: never markup), formatting, the
// API's calls with a bearer in the Authorization header, and the event stream's reader.
"use strict";

const H = {};

// An element: attrs set as properties (className, hidden, title, type, value, ...) or, for
// data-*/aria-*, as attributes; children are nodes or strings (text nodes: never parsed).
H.el = function (tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (name.startsWith("data-") || name.startsWith("aria-")) node.setAttribute(name, value);
    else node[name] = value;
  }
  H.append(node, ...children);
  return node;
};

H.append = function (node, ...children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
  }
  return node;
};

// A value as text, or the fallback when it is missing: a page never says "undefined".
H.text = function (value, fallback) {
  if (value === undefined || value === null || value === "") return fallback === undefined ? "" : fallback;
  return typeof value === "object" ? JSON.stringify(value) : String(value);
};

H.int = (n) => (typeof n === "number" && isFinite(n) ? Math.round(n).toLocaleString("en") : "0");
H.cost = (usd) => (typeof usd === "number" && isFinite(usd) ? "$" + usd.toFixed(usd < 1 ? 4 : 2) : null);
H.seconds = function (s) {
  if (typeof s !== "number" || !isFinite(s)) return null;
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
  const m = Math.floor(s / 60);
  return m < 60 ? m + " min " + Math.round(s % 60) + " s" : Math.floor(m / 60) + " h " + (m % 60) + " min";
};
H.when = function (unix) {
  if (typeof unix !== "number" || !isFinite(unix)) return null;
  return new Date(unix * 1000).toLocaleString();
};
H.tokens = (input, output) => H.int(input) + " in / " + H.int(output) + " out";

const SHORT = 240;

// Text a person may want whole but not always: inline when short and on one line, else a
// collapsed block (summary: its first line) of monospace.
H.block = function (text, options) {
  const opts = options || {};
  const value = H.text(text);
  const mono = opts.mono !== false;
  if (!opts.collapse && value.length <= (opts.short || SHORT) && !value.includes("\n")) {
    return H.el("span", { className: mono ? "mono inline" : "inline" }, value);
  }
  const first = value.split("\n", 1)[0];
  // A JSON value's first line says nothing ("{"): such a block is named by its label alone.
  const head = /^[[{]$/.test(first.trim()) ? "" : first.length > 80 ? first.slice(0, 80) + "…" : first;
  const summary = (opts.label ? opts.label + (head ? ": " : " ") : "") + head
    + "(".padStart(head ? 2 : 1) + value.length.toLocaleString("en") + " chars)";
  return H.el("details", { className: "long", open: !!opts.open },
    H.el("summary", {}, summary),
    H.el("pre", { className: mono ? "mono" : "prose" }, value));
};

// A JSON text shown pretty when it parses, as it is when not (it may be cut).
H.json = function (text) {
  if (typeof text !== "string") return JSON.stringify(text, null, 2);
  try { return JSON.stringify(JSON.parse(text), null, 2); } catch (error) { return text; }
};

// A JSON text inline as it is when short, else pretty in a collapsed block.
H.jsonBlock = function (text, label) {
  const value = H.text(text);
  return value.length <= SHORT && !value.includes("\n")
    ? H.block(value) : H.block(H.json(value), { collapse: true, label: label });
};

// fetch with the bearer; the JSON error's message (or the status) as the thrown Error's.
H.call = async function (bearer, path, options) {
  const opts = options || {};
  const headers = { "Authorization": "Bearer " + bearer };
  if (opts.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method: opts.method || "GET",
    headers: headers,
    body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
    cache: "no-store",
    credentials: "omit",
    referrerPolicy: "no-referrer",
  });
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    const message = (body && body.error && body.error.message) || response.statusText || "failed";
    const error = new Error("refused (" + response.status + "): " + message);
    error.status = response.status;
    throw error;
  }
  return response;
};

// Server-Sent Events over fetch (an EventSource cannot send an Authorization header): calls
// onEvent(id, type, data) for each message, resumes after the last id when the connection
// drops, returns when the stream ends; throws when it is refused.
H.follow = async function (bearer, path, onEvent) {
  let last = null;
  for (;;) {
    const headers = { "Authorization": "Bearer " + bearer };
    if (last) headers["Last-Event-ID"] = last;
    let response;
    try {
      response = await fetch(path, { headers: headers, cache: "no-store", credentials: "omit" });
    } catch (error) {
      await new Promise((resolve) => setTimeout(resolve, 1000));
      continue;
    }
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      const error = new Error("refused (" + response.status + "): "
        + ((body.error && body.error.message) || response.statusText));
      error.status = response.status;
      throw error;
    }
    try {
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const message = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          let id = null, type = "message";
          const data = [];
          for (const line of message.split("\n")) {
            if (line.startsWith("id: ")) id = line.slice(4);
            else if (line.startsWith("event: ")) type = line.slice(7);
            else if (line.startsWith("data: ")) data.push(line.slice(6));
          }
          if (id === null) continue; // a keep-alive comment, or a retry hint
          last = id;
          let parsed;
          try { parsed = JSON.parse(data.join("\n")); } catch (error) { parsed = {}; }
          onEvent(id, type, parsed && typeof parsed === "object" ? parsed : {});
        }
      }
    } catch (error) {
      await new Promise((resolve) => setTimeout(resolve, 1000)); // dropped: resume after last
    }
  }
};

// A "label: value" line of a <dl> of facts; nothing when the value is missing.
H.fact = function (dl, label, value) {
  if (value === undefined || value === null || value === "") return;
  H.append(dl, H.el("div", {}, H.el("dt", {}, label), H.el("dd", {}, value)));
};

H.chips = function (labels) {
  return Object.entries(labels || {}).map(([k, v]) => H.el("span", { className: "chip" }, k + "=" + v));
};

H.statusBadge = (status) => H.el("span", { className: "badge st-" + H.text(status, "unknown") }, H.text(status, "unknown"));

// A unified diff's text into <pre> `out`: each line a text node coloured by what it is (up
// to a bound; the rest as one text), never parsed as markup.
H.diffInto = function (out, text) {
  out.replaceChildren();
  if (!text) { out.textContent = "(no changes)"; return; }
  const lines = text.split("\n");
  const most = 20000;
  for (const line of lines.slice(0, most)) {
    const cls = line.startsWith("+++") || line.startsWith("---") || line.startsWith("diff ") ? "file"
      : line.startsWith("@@") ? "hunk" : line.startsWith("+") ? "plus" : line.startsWith("-") ? "minus" : "";
    out.appendChild(H.el("span", { className: cls }, line + "\n"));
  }
  if (lines.length > most) out.appendChild(document.createTextNode(lines.slice(most).join("\n")));
};
