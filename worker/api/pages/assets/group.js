// A group's attempts side by side (GET /v1/groups/{group}): one column each, the picked one
// marked. Used by the run page (with its link: read only) and the runs list (with the key:
// also the pick and the diff of two).
"use strict";

H.outcomeBadge = function (outcome) {
  const text = H.text(outcome, "none yet");
  const cls = outcome === "complete" ? "st-complete" : outcome === "in-progress" ? "st-running"
    : outcome ? "st-failed" : "";
  return H.el("span", { className: "badge " + cls }, text);
};

// Whether an attempt may still change (the run page reads the group again until none may).
H.attemptRunning = (a) => a.outcome === "in-progress" || a.status === "starting" || a.status === "running";

// group: the endpoint's answer. options.current: the run id marked "this run";
// options.open(attempt): a button per other column that opens it; options.openHref(attempt):
// a link instead; options.pick(index): a pick button per column while none is picked (a
// first click asks to confirm, the second picks: the others are ended).
H.renderGroup = function (container, group, options) {
  const opts = options || {};
  const attempts = Array.isArray(group.attempts) ? group.attempts : [];
  container.replaceChildren();
  if (!attempts.length) {
    container.appendChild(H.el("p", { className: "quiet" }, "no attempts yet"));
    return;
  }
  const chosen = group.picked !== null && group.picked !== undefined;
  const columns = H.el("div", { className: "attempts" });
  for (const a of attempts) {
    const picked = chosen && group.picked === a.index;
    const mine = opts.current && a.run_id === opts.current;
    const column = H.el("article", {
      className: "attempt" + (picked ? " picked" : "") + (mine ? " current" : ""),
      "data-run": H.text(a.run_id),
      "data-index": H.text(a.index),
    });
    column.appendChild(H.el("h3", {},
      "attempt " + H.text(a.index, "?"), " ", H.outcomeBadge(a.outcome), " ",
      picked ? H.el("span", { className: "badge st-picked" }, "picked") : null, " ",
      mine ? H.el("span", { className: "badge" }, "this run") : null));
    const dl = H.el("dl", { className: "facts narrow" });
    H.fact(dl, "run", H.el("code", {}, H.text(a.run_id, "?")));
    H.fact(dl, "harness", H.text(a.harness, "?"));
    H.fact(dl, "model", H.text(a.model, "not reported"));
    H.fact(dl, "status", H.statusBadge(a.status));
    H.fact(dl, "turns", H.text(a.turns, "0"));
    const diff = a.diff || {};
    H.fact(dl, "changes", H.el("span", {}, H.int(diff.files) + (diff.files === 1 ? " file, " : " files, "),
      H.el("span", { className: "plus" }, "+" + H.int(diff.lines_added)), " / ",
      H.el("span", { className: "minus" }, "-" + H.int(diff.lines_removed)), " lines"));
    H.fact(dl, "tokens", H.tokens(a.input_tokens, a.output_tokens));
    H.fact(dl, "cost", H.cost(a.cost_usd) || "not priced");
    H.fact(dl, "wall time", H.seconds(a.wall_s) || "not yet");
    column.appendChild(dl);
    const answer = H.el("div", { className: "answer-of" }, H.el("div", { className: "meta" }, "answer"));
    answer.appendChild(typeof a.answer === "string" && a.answer
      ? H.block(a.answer, { mono: false, short: 400 }) : H.el("span", { className: "quiet" }, "none yet"));
    column.appendChild(answer);
    if (a.structured !== undefined && a.structured !== null) {
      column.appendChild(H.el("div", { className: "structured" },
        H.block(JSON.stringify(a.structured, null, 2),
          { collapse: true, label: "structured", open: JSON.stringify(a.structured).length <= 400 })));
    }
    const actions = H.el("div", { className: "row actions" });
    if (a.run_id && !mine && opts.openHref) {
      actions.appendChild(H.el("a", { className: "open-attempt", href: opts.openHref(a) }, "open attempt " + H.text(a.index)));
    } else if (a.run_id && !mine && opts.open) {
      const button = H.el("button", { type: "button", className: "open-attempt" }, "open");
      button.addEventListener("click", () => opts.open(a));
      actions.appendChild(button);
    }
    if (opts.pick && !chosen && typeof a.index === "number") {
      const button = H.el("button", { type: "button", className: "pick" }, "pick");
      button.addEventListener("click", () => {
        if (!button.classList.contains("confirm")) {
          button.classList.add("confirm");
          button.textContent = "pick attempt " + a.index + ": end the others?";
          return;
        }
        button.disabled = true;
        opts.pick(a.index);
      });
      actions.appendChild(button);
    }
    if (actions.children.length) column.appendChild(actions);
    columns.appendChild(column);
  }
  container.appendChild(columns);
};

// The diff of two attempts: a choice of A and B and, on Show, fetchDiff(a, b)'s text
// (GET /v1/groups/{group}/diff) coloured by line.
H.renderGroupDiff = function (container, group, fetchDiff) {
  const attempts = (Array.isArray(group.attempts) ? group.attempts : []).filter((a) => typeof a.index === "number");
  container.replaceChildren();
  if (attempts.length < 2) return;
  const choice = (id, selected) => {
    const select = H.el("select", { id: id });
    for (const a of attempts) select.appendChild(H.el("option", { value: String(a.index) }, "attempt " + a.index));
    select.value = String(selected.index);
    return select;
  };
  const a = choice("diff-a", attempts[0]), b = choice("diff-b", attempts[1]);
  const out = H.el("pre", { className: "diff mono", id: "group-diff", hidden: true });
  const state = H.el("span", { className: "quiet", role: "status" });
  const form = H.el("form", { className: "row", id: "diff-form" },
    H.el("strong", {}, "Diff of two:"), H.el("label", {}, "from ", a), H.el("label", {}, "to ", b),
    H.el("button", { type: "submit" }, "Show the diff"), state);
  form.addEventListener("submit", async (submitted) => {
    submitted.preventDefault();
    if (a.value === b.value) { state.textContent = "choose two different attempts"; return; }
    state.textContent = "loading…";
    try {
      const text = await fetchDiff(a.value, b.value);
      H.diffInto(out, text);
      out.hidden = false;
      state.textContent = "attempt " + a.value + " → attempt " + b.value;
    } catch (error) {
      state.textContent = error.message;
    }
  });
  container.append(form, out);
};
