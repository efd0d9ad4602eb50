// A group's attempts side by side (GET /v1/groups/{group}): one column each, the picked one
// marked. Used by the run page (with its link) and the runs list (with the key).
"use strict";

// group: the endpoint's answer; options.current: the run id to mark as "this run";
// options.open(run_id): a button per column that opens the attempt, when given.
H.renderGroup = function (container, group, options) {
  const opts = options || {};
  const attempts = Array.isArray(group.attempts) ? group.attempts : [];
  container.replaceChildren();
  if (!attempts.length) {
    container.appendChild(H.el("p", { className: "quiet" }, "no attempts yet"));
    return;
  }
  const columns = H.el("div", { className: "attempts" });
  for (const a of attempts) {
    const picked = group.picked !== null && group.picked !== undefined && group.picked === a.index;
    const mine = opts.current && a.run_id === opts.current;
    const column = H.el("article", {
      className: "attempt" + (picked ? " picked" : "") + (mine ? " current" : ""),
      "data-run": H.text(a.run_id),
    });
    column.appendChild(H.el("h3", {},
      "attempt " + H.text(a.index, "?"), " ",
      picked ? H.el("span", { className: "badge st-picked" }, "picked") : null,
      mine ? H.el("span", { className: "badge" }, "this run") : null));
    const dl = H.el("dl", { className: "facts narrow" });
    H.fact(dl, "run", H.el("code", {}, H.text(a.run_id, "?")));
    H.fact(dl, "harness", H.text(a.harness, "?"));
    H.fact(dl, "model", H.text(a.model, "not reported"));
    H.fact(dl, "status", H.statusBadge(a.status));
    H.fact(dl, "outcome", H.text(a.outcome, "none yet"));
    const diff = a.diff || {};
    H.fact(dl, "changes", H.int(diff.files) + (diff.files === 1 ? " file, +" : " files, +") + H.int(diff.lines_added)
      + " / -" + H.int(diff.lines_removed) + " lines");
    H.fact(dl, "tokens", H.tokens(a.input_tokens, a.output_tokens));
    H.fact(dl, "cost", H.cost(a.cost_usd) || "not priced");
    H.fact(dl, "wall time", H.seconds(a.wall_s));
    column.appendChild(dl);
    if (a.structured !== undefined && a.structured !== null) {
      column.appendChild(H.el("div", { className: "structured" },
        H.block(JSON.stringify(a.structured, null, 2),
          { collapse: true, label: "structured", open: JSON.stringify(a.structured).length <= 400 })));
    }
    if (opts.open && a.run_id && !mine) {
      const button = H.el("button", { type: "button", className: "open-attempt" }, "open");
      button.addEventListener("click", () => opts.open(a.run_id));
      column.appendChild(button);
    }
    columns.appendChild(column);
  }
  container.appendChild(columns);
};
