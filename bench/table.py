"""The shared result model and table printer: our figure, the raw baseline, the ratio."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Figure:
    """One line of the table. ``ratio`` is ours / baseline (whatever the unit)."""

    measure: str
    ours: float | None
    baseline: float | None
    unit: str
    target: str = ""
    met: bool | None = None
    """None when the line has no target of its own (a supporting figure)."""
    ours_text: str | None = None
    """Overrides the printed value (for a figure that is not a number, such as "n/a")."""
    baseline_text: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.ours is None or self.baseline is None or self.baseline == 0:
            return None
        return self.ours / self.baseline


@dataclass
class RowResult:
    row: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    checks: dict[str, bool] = field(default_factory=dict)
    """Correctness checks (every event present and in order, the oversized line counted)."""
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None

    def add(self, *figures: Figure) -> None:
        self.figures.extend(figures)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for fig, out in zip(self.figures, data["figures"], strict=True):
            out["ratio"] = fig.ratio
        return data


def fmt(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    magnitude = abs(value)
    if magnitude >= 10_000:
        text = f"{value:,.0f}"
    elif magnitude >= 100:
        text = f"{value:.0f}"
    elif magnitude >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".rstrip()


def _verdict(fig: Figure) -> str:
    if fig.met is None:
        return ""
    return "met" if fig.met else "MISSED"


def _cells(results: Iterable[RowResult]) -> list[list[str]]:
    rows: list[list[str]] = []
    for result in results:
        if result.skipped:
            rows.append([result.row, result.title, "skipped", "", "", "", result.skipped])
            continue
        for fig in result.figures:
            ratio = fig.ratio
            rows.append(
                [
                    result.row,
                    fig.measure,
                    fig.ours_text if fig.ours_text is not None else fmt(fig.ours, fig.unit),
                    fig.baseline_text
                    if fig.baseline_text is not None
                    else fmt(fig.baseline, fig.unit),
                    "" if ratio is None else f"{ratio:.2f}x",
                    fig.target,
                    _verdict(fig),
                ]
            )
    return rows


HEADER = ["row", "measure", "ours", "baseline", "ratio", "target", ""]


def render_text(results: list[RowResult]) -> str:
    rows = _cells(results)
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(HEADER, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    previous = None
    for row in rows:
        if previous is not None and row[0] != previous:
            lines.append("")
        previous = row[0]
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    checks = [
        f"  row {r.row}: {name}: {'ok' if ok else 'FAILED'}"
        for r in results
        for name, ok in r.checks.items()
    ]
    if checks:
        lines += ["", "correctness checks:", *checks]
    notes = [f"  row {r.row}: {note}" for r in results for note in r.notes]
    if notes:
        lines += ["", "notes:", *notes]
    return "\n".join(lines)


def render_markdown(results: list[RowResult]) -> str:
    rows = _cells(results)
    out = ["| " + " | ".join([*HEADER[:-1], "verdict"]) + " |"]
    out.append("|" + "---|" * len(HEADER))
    for row in rows:
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    return "\n".join(out)
