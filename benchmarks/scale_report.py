"""The scale benchmark's results: one row per (store, protocol, N), as a text line, a
markdown table, JSON (``--save`` / ``--from-results``) and SVG plots. Measures nothing:
:mod:`bench_scale` runs the nodes and fills the rows."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PLOT_FILES = {
    "time": "scale_time.svg",
    "lost": "scale_lost_cas.svg",
    "bytes": "scale_bytes.svg",
    "steady": "scale_steady_bytes.svg",
}


@dataclass
class Outcome:
    ok: bool
    values: dict[str, Any] = field(default_factory=dict)
    error: str = ""


@dataclass
class Row:
    store: str
    protocol: str
    n: int
    round: Outcome
    steady: Outcome | None
    torch: Outcome | None


COLUMNS = (
    ("store", 6),
    ("protocol", 15),
    ("N", 5),
    ("seconds", 8),
    ("cas", 7),
    ("lost", 7),
    ("announces", 9),
    ("rdzv kB", 9),
    ("kB/node", 7),
    ("steady kB/int", 13),
    ("steady cas/int", 14),
    ("steady lost/int", 15),
    ("steady beats/int", 16),
    ("c10d torch s", 12),
    ("c10d/rdzv", 9),
    ("nodes", 7),
)


def protocol_label(protocol: str) -> str:
    """A row's protocol as printed: the handler's default says so, e.g. ``scale (default)``."""
    from rdzv.api import DEFAULT_PROTOCOL

    return f"{protocol} (default)" if protocol == DEFAULT_PROTOCOL else protocol


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def row_cells(row: Row) -> list[str] | str:
    """The cells of a row after store, protocol and N, or the failure text."""
    if not row.round.ok:
        return f"failed: {row.round.error}"
    r = row.round.values
    kb = None if r["bytes"] is None else r["bytes"] / 1000
    if row.steady is None:
        steady = ["-"] * 4
    elif row.steady.ok:
        s = row.steady.values
        sb = None if s["bytes"] is None else s["bytes"] / 1000
        steady = [_num(sb), _num(s["cas_attempts"]), _num(s["cas_conflicts"])]
        steady.append(_num(s.get("beats", 0.0)))
    else:
        steady = ["failed"] * 4
    torch_s = ratio = "-"
    if row.torch is not None:
        if row.torch.ok:
            t = row.torch.values["seconds"]
            torch_s, ratio = f"{t:.3f}", f"{t / r['seconds']:.1f}x"
        else:
            torch_s = ratio = "failed"
    return [
        f"{r['seconds']:.3f}",
        str(r["cas_attempts"]),
        str(r["cas_conflicts"]),
        str(r["announces"]),
        _num(kb),
        _num(None if kb is None else kb / row.n, 2),
        *steady,
        torch_s,
        ratio,
        str(r.get("nodes", "-")),
    ]


def text_line(row: Row) -> str:
    head = [row.store, protocol_label(row.protocol), str(row.n)]
    cells = row_cells(row)
    widths = [w for _, w in COLUMNS]
    start = " ".join(f"{c:<{w}}" if i < 2 else f"{c:>{w}}" for i, (c, w) in enumerate(
        zip(head, widths[:3], strict=True)))  # fmt: skip
    if isinstance(cells, str):
        return f"{start} {cells}"
    line = start + " " + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths[3:], strict=True))
    notes = []
    if row.steady is not None and not row.steady.ok:
        notes.append(f"steady failed: {row.steady.error}")
    if row.torch is not None and not row.torch.ok:
        notes.append(f"torch failed: {row.torch.error}")
    return line + ("  " + "; ".join(notes) if notes else "")


def text_header() -> str:
    return " ".join(
        f"{name:<{w}}" if i < 2 else f"{name:>{w}}" for i, (name, w) in enumerate(COLUMNS)
    )


def rows_json(rows: Sequence[Row]) -> str:
    return json.dumps([asdict(r) for r in rows], indent=1, sort_keys=True) + "\n"


def save_rows(rows: Sequence[Row], path: Path) -> None:
    path.write_text(rows_json(rows))


def load_rows(path: Path) -> list[Row]:
    def outcome(data: dict[str, Any] | None) -> Outcome | None:
        return None if data is None else Outcome(data["ok"], data["values"], data["error"])

    rows = []
    for d in json.loads(path.read_text()):
        first = outcome(d["round"])
        assert first is not None, f"{path}: a row without a round result"
        rows.append(
            Row(d["store"], d["protocol"], d["n"], first, outcome(d["steady"]), outcome(d["torch"]))
        )
    return rows


def markdown_table(rows: Sequence[Row]) -> str:
    names = [name for name, _ in COLUMNS]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * 2 + "---:|" * (len(names) - 2)]
    for row in rows:
        cells = row_cells(row)
        if isinstance(cells, str):
            cells = [cells.replace("|", "/")] + ["-"] * (len(names) - 4)
        else:
            if row.steady is not None and not row.steady.ok:
                cells[6] = "failed: " + row.steady.error.replace("|", "/")
            if row.torch is not None and not row.torch.ok:
                cells[10] = "failed: " + row.torch.error.replace("|", "/")
        label = protocol_label(row.protocol)
        lines.append("| " + " | ".join([row.store, label, str(row.n), *cells]) + " |")
    return "\n".join(lines)


# -- plots (matplotlib, the `bench` extra) ---------------------------------------------------
Series = tuple[str, Sequence[tuple[float, float | None]]]
"""(label, [(N, value, or None for a point whose measurement failed)]). A point that was
not measured at all (torch beyond :data:`TORCH_MAX_N`) is simply absent."""
STYLE = {"hardened": "-", "scale": "--", "torch": ":"}
"""Line style by protocol (the colour tells the store)."""
COLOURS = {"redis": "#1f77b4", "etcd": "#d62728", "memory": "#2ca02c", "sqlite": "#9467bd"}
COLOUR_OTHER = "#555555"
MARK_COLOUR = "#222222"
"""The legend's failed and zero marks (each point is drawn in its series' colour)."""
PLOT_FORMAT = "rdzv-bench-scale-plot/1"
"""Recorded in each plot's metadata with the digest of the results it was drawn from."""


def _matplotlib() -> Any:
    """pyplot, set up for reproducible SVG (Agg, text kept as text, fixed ids)."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise SystemExit(
            "bench_scale: the plots need matplotlib: pip install -e '.[bench]' (or pass --no-plots)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "svg.hashsalt": "rdzv-bench-scale",  # element ids do not change between runs
            "svg.fonttype": "none",  # text stays text: readable, searchable, small
            "font.size": 11,
            "axes.titlesize": 12,
        }
    )
    return plt


def plot_svg(
    title: str, xlabel: str, ylabel: str, series: Sequence[Series], *, digest: str = ""
) -> str:
    """A log-log line plot as SVG text, deterministic for the same input and matplotlib.

    Each series is a line with a marker per measured point. A failed point (None) is not
    dropped: it is drawn as a cross in its series' colour in a band above the plot, at its
    N, with its own element id (``failed-<label>-<N>``) and a legend entry. A zero, which a log axis
    cannot show, is drawn as a hollow marker on the bottom edge (``zero-<label>-<N>``).
    ``digest`` (of the results drawn) is written into the SVG's metadata."""
    plt = _matplotlib()
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(8.0, 4.6), layout="constrained")
    edge = ax.get_xaxis_transform()  # x in data, y in axes fractions (0 bottom, 1 top)
    handles: list[Any] = []
    failing = [label for label, points in series if any(y is None for _, y in points)]
    zeros = [label for label, points in series if any(y == 0 for _, y in points)]
    failed_any, zero_any = bool(failing), bool(zeros)
    for label, points in series:
        store, _, protocol = label.partition(" ")
        colour = COLOURS.get(store, COLOUR_OTHER)
        style = STYLE.get(protocol, STYLE["torch"] if "torch" in label else "-")
        good = [(x, y) for x, y in points if y is not None and y > 0]
        if good:
            ax.plot(*zip(*good, strict=True), style, marker="o", color=colour)
        handles.append(Line2D([], [], ls=style, marker="o", color=colour, label=label))
        # Failed points go in a band above the plot and zeros on its bottom edge, outside
        # the data's range; each series gets its own row there, so two series failing at
        # the same N stay two marks of two colours.
        for x, y in points:
            if y is None:
                ax.plot(
                    [x], [1.04 + 0.055 * failing.index(label)], "x", color=colour,
                    markersize=9, mew=2.5, transform=edge, clip_on=False,
                    gid=f"failed-{label}-{x:g}".replace(" ", "-"),
                )  # fmt: skip
            elif y == 0:
                ax.plot(
                    [x], [0.025 * zeros.index(label)], "o", mfc="white", mew=1.5,
                    color=colour, markersize=7, transform=edge, clip_on=False,
                    gid=f"zero-{label}-{x:g}".replace(" ", "-"),
                )  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.grid(True, which="major", color="#dddddd")
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.set_title(title, pad=8 + 14 * len(failing))  # above the band of failed points
    if failed_any:
        handles.append(
            Line2D(
                [],
                [],
                ls="",
                marker="x",
                color=MARK_COLOUR,
                mew=2.5,
                label="failed (above the plot)",
            )
        )
    if zero_any:
        handles.append(
            Line2D(
                [],
                [],
                ls="",
                marker="o",
                mfc="white",
                color=MARK_COLOUR,
                label="zero (bottom edge)",
            )
        )
    if handles:
        ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    else:
        ax.text(0.5, 0.5, "no measured points", transform=ax.transAxes, ha="center")
    out = io.StringIO()
    fig.savefig(
        out,
        format="svg",
        metadata={"Date": None, "Description": f"{PLOT_FORMAT} results-sha256={digest}"},
    )
    plt.close(fig)
    return out.getvalue()


def results_digest(rows: Sequence[Row]) -> str:
    """The digest of ``rows`` as :func:`save_rows` writes them."""
    return hashlib.sha256(rows_json(rows).encode("utf-8")).hexdigest()


def write_plots(rows: Sequence[Row], folder: Path) -> list[Path]:
    """Draw the four plots of ``rows`` into ``folder`` (see :data:`PLOT_FILES`)."""
    combos = sorted({(r.store, r.protocol) for r in rows}, key=lambda c: c)

    def series(pick: Any) -> list[Series]:
        return [
            (
                f"{store} {protocol}",
                [(float(r.n), pick(r)) for r in rows if (r.store, r.protocol) == (store, protocol)],
            )
            for store, protocol in combos
        ]

    def ok_round(key: str) -> Any:
        return lambda r: r.round.values[key] if r.round.ok else None

    torch_points: dict[int, float | None] = {
        r.n: r.torch.values["seconds"] if r.torch.ok else None for r in rows if r.torch is not None
    }
    time_series = series(ok_round("seconds"))
    if torch_points:
        time_series.append(("c10d torch", sorted((float(n), t) for n, t in torch_points.items())))
    # No steady window after a failed round: that point failed too.
    steady = series(
        lambda r: r.steady.values["bytes"] if r.steady is not None and r.steady.ok else None
    )
    digest = results_digest(rows)
    plots = {
        "time": ("Time to complete one min = max = N rendezvous", "seconds", time_series),
        "lost": (
            "Lost CAS (conflicts) per rendezvous, all nodes",
            "lost compare-and-sets",
            series(ok_round("cas_conflicts")),
        ),
        "bytes": (
            "Bytes moved by the server during one rendezvous",
            "bytes (server counters)",
            series(ok_round("bytes")),
        ),
        "steady": (
            "Steady state: server bytes per keep-alive interval",
            "bytes per interval",
            steady,
        ),
    }
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for key, (title, ylabel, data) in plots.items():
        path = folder / PLOT_FILES[key]
        path.write_text(plot_svg(title, "N (nodes)", ylabel, data, digest=digest))
        written.append(path)
    return written
