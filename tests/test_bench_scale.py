"""Smoke test of ``benchmarks/bench_scale.py``: a real quick run on memory:// (every
measurement in its own subprocess, as in a full run) prints one parseable row per N and
protocol, and the scale protocol's round costs fewer CAS attempts than hardened's. The
multi-process driver (nodes as worker processes x threads) runs one round on SQLite. The
plots (matplotlib) and the failure rows are checked directly, and the committed plots
against the committed results they were drawn from. No timing is asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_scale  # noqa: E402
from scale_report import (  # noqa: E402
    COLUMNS,
    PLOT_FILES,
    Outcome,
    Row,
    Series,
    load_rows,
    markdown_table,
    plot_svg,
    results_digest,
    text_line,
    write_plots,
)

RUN_WITHIN_S = 120.0
"""Bound on the quick run (it takes about 10 s)."""
SVG = "{http://www.w3.org/2000/svg}"


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    """Run benchmarks/bench_scale.py with ``args`` from the repository root."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_scale.py"), *args],
        capture_output=True,
        text=True,
        timeout=RUN_WITHIN_S,
        cwd=ROOT,
    )


def _quick_run() -> str:
    done = _bench(
        *("--quick", "--stores", "memory", "--no-torch", "--no-plots", "--markdown"),
        *("--steady-intervals", "1"),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_quick_run_prints_parseable_rows_and_scale_saves_cas() -> None:
    out = _quick_run()
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("store "))
    for name, _ in COLUMNS:
        assert name in header, f"column {name!r} missing from {header!r}"
    rows = {}
    for line in lines:
        # The default protocol's rows say so ("scale (default)"); one word here.
        assert "hardened (default)" not in line
        parts = line.replace("scale (default)", "scale").split()
        if len(parts) > 2 and parts[0] == "memory":
            assert "failed" not in line, line
            # store, protocol, N, seconds, cas, lost, announces, kB, kB/node, 4 steady, torch x2
            assert len(parts) == len(COLUMNS), line
            rows[(parts[1], int(parts[2]))] = parts
    assert sorted(rows) == [("hardened", 8), ("hardened", 64), ("scale", 8), ("scale", 64)]
    for (protocol, n), parts in rows.items():
        seconds, cas, lost, announces = float(parts[3]), int(parts[4]), int(parts[5]), int(parts[6])
        assert seconds > 0
        assert 0 <= lost <= cas
        # memory:// has no server counters: the byte columns say so with "-".
        assert parts[7] == parts[8] == parts[9] == "-"
        steady_cas, steady_lost, beats = float(parts[10]), float(parts[11]), float(parts[12])
        # The keep-alive threads ran: some beat landed in the window, in the state (a CAS)
        # or under a node's key. How many depends on the machine's load (docs/benchmarks.md
        # records a window that caught 69.5 of 512), so no rate is asserted.
        assert steady_cas + beats > 0, "no keep-alive beat landed in the steady window"
        assert 0 <= steady_lost <= steady_cas
        assert parts[13] == parts[14] == "-"  # --no-torch
        assert parts[15] == f"1x{n}"  # memory://: one process of N threads
        if protocol == "scale":
            assert announces == n  # every node announced itself once
        else:
            assert announces == 0
            assert cas >= n  # every node compare-and-sets the state to join
    assert int(rows[("scale", 64)][4]) < int(rows[("hardened", 64)][4])
    # The markdown table has the same rows, one cell per column.
    table = [line for line in lines if line.startswith("| memory |")]
    assert len(table) == 4
    assert sum("| scale (default) |" in line for line in table) == 2
    assert all(line.count("|") == len(COLUMNS) + 1 for line in table)


def test_failed_rows_say_why() -> None:
    failed = Row(
        "redis", "hardened", 1024, Outcome(False, error="RuntimeError: timed out"), None, None
    )
    assert text_line(failed).split()[3:] == ["failed:", "RuntimeError:", "timed", "out"]
    ok = Outcome(
        True,
        {"seconds": 2.0, "bytes": 5000, "cas_attempts": 3, "cas_conflicts": 1, "announces": 9},
    )
    steady_failed = Row("etcd", "hardened", 8, ok, Outcome(False, error="no round"), None)
    line = text_line(steady_failed)
    assert "steady failed: no round" in line
    assert line.split()[3:9] == ["2.000", "3", "1", "9", "5.0", "0.62"]
    wrapped = (
        "RuntimeError: a rendezvous failed: [RendezvousTimeoutError('the join operation of "
        "node host_12_345 did not finish before its deadline')]"
    )
    assert bench_scale._short(wrapped) == (
        "RendezvousTimeoutError: the join operation did not finish before its deadline"
    )
    table = markdown_table([failed, steady_failed]).splitlines()
    assert all(row.count("|") == len(COLUMNS) + 1 for row in table)
    assert "failed: RuntimeError: timed out" in table[2]


def _ids(svg: str) -> set[str]:
    return {e.get("id", "") for e in ET.fromstring(svg).iter()}


def test_plots_mark_failed_and_zero_points_instead_of_dropping_them() -> None:
    series: list[Series] = [
        ("redis hardened", [(8.0, 0.5), (64.0, 20.0), (512.0, None)]),
        ("redis scale", [(8.0, 0.02), (64.0, 0.2), (512.0, 2.0)]),
        ("etcd scale", [(8.0, 0.0), (64.0, None)]),  # nothing on the log axis itself
    ]
    svg = plot_svg("t", "N", "s", series, digest="abc")
    assert svg == plot_svg("t", "N", "s", series, digest="abc")  # reproducible
    ids = _ids(svg)
    assert {"failed-redis-hardened-512", "failed-etcd-scale-64", "zero-etcd-scale-8"} <= ids
    assert not {i for i in ids if i.startswith(("failed-redis-scale", "zero-redis"))}
    texts = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")]
    # Every series is in the legend, with the marks' meaning; N is labelled as numbers.
    for label in ("redis hardened", "redis scale", "etcd scale", "failed (above the plot)"):
        assert label in texts, texts
    assert "zero (bottom edge)" in texts and "512" in texts
    assert "rdzv-bench-scale-plot/1 results-sha256=abc" in svg
    assert "no measured points" in plot_svg("empty", "N", "s", [])


def test_committed_plots_are_fresh_and_mark_every_failed_point(tmp_path: Path) -> None:
    folder = ROOT / "docs" / "benchmarks"
    rows = load_rows(folder / "scale_results.json")
    written = write_plots(rows, tmp_path)
    command = "python3 benchmarks/bench_scale.py --from-results docs/benchmarks/scale_results.json"
    stale = [p.name for p in written if p.read_text() != (folder / p.name).read_text()]
    assert stale == [], f"plots are stale: run {command} (stale: {stale})"
    plots = {key: (folder / name).read_text() for key, name in PLOT_FILES.items()}
    for svg in plots.values():
        assert f"results-sha256={results_digest(rows)}" in svg
    failures = 0
    for row in rows:
        point = f"{row.store}-{row.protocol}-{row.n}"
        if not row.round.ok:
            for key in ("time", "lost", "bytes", "steady"):
                assert f"failed-{point}" in _ids(plots[key]), (key, point)
                failures += 1
        elif row.steady is not None and not row.steady.ok:
            assert f"failed-{point}" in _ids(plots["steady"]), point
            failures += 1
    assert failures > 0  # the committed run has failed points: the check above is not empty


def test_a_measurement_that_overruns_its_cap_reports_how_far_it_got() -> None:
    # The steady part sleeps 4 s (2 settling + 2 window intervals of 1 s); a slack of
    # -(cap + 4 s) sets the watchdog to fire at once, long before the nodes can return.
    job: dict[str, object] = {"kind": "steady", "url": "memory://w", "server": None}
    job |= {"port": 0, "protocol": "scale", "n": 8, "cap": 30.0, "intervals": 2}
    slack = -(30.0 + bench_scale._steady_s(job))
    assert slack == -34.0
    code = (
        f"import json, sys, bench_scale as b; b.WATCHDOG_SLACK_S = {slack!r}; "
        f"b.child({json.dumps(json.dumps(job))})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=RUN_WITHIN_S,
        cwd=ROOT / "benchmarks",
    )
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith(bench_scale.RESULT_PREFIX), done.stderr
    result = json.loads(line[len(bench_scale.RESULT_PREFIX) :])
    assert result["ok"] is False
    assert result["error"].startswith("not finished 0 s after the nodes were released: ")
    assert result["error"].endswith(" of 8 nodes returned")


def test_the_workers_start_up_is_not_charged_to_the_cap() -> None:
    # The watchdog fires 1 s after the release; the workers' start-up is made 2 s longer
    # than that (as torch's import makes it, about 3 s a process). The round of 8 nodes
    # on memory:// still finishes: only the time after the release counts.
    job: dict[str, object] = {"kind": "round", "url": "memory://s", "server": None}
    job |= {"port": 0, "protocol": "scale", "n": 8, "cap": 30.0}
    code = (
        "import json, sys, time, bench_scale as b; b.WATCHDOG_SLACK_S = -29.0\n"
        "init = b.Nodes.__init__\n"
        "def slow(self, *a, **k):\n"
        "    time.sleep(2.0)\n"
        "    init(self, *a, **k)\n"
        "b.Nodes.__init__ = slow\n"
        f"b.child({json.dumps(json.dumps(job))})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=RUN_WITHIN_S,
        cwd=ROOT / "benchmarks",
    )
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith(bench_scale.RESULT_PREFIX), done.stderr
    result = json.loads(line[len(bench_scale.RESULT_PREFIX) :])
    assert result["ok"] is True, result


def test_split_nodes_and_default_procs() -> None:
    assert bench_scale.split_nodes(10, 3) == [4, 3, 3]
    assert bench_scale.split_nodes(2, 8) == [1, 1]  # no process without a node
    assert sum(bench_scale.split_nodes(1024, 32)) == 1024
    assert bench_scale.default_procs("memory", 1024) == 1  # memory:// lives in one process
    per = bench_scale.THREADS_PER_PROC
    assert bench_scale.default_procs("redis", per) == 1
    assert bench_scale.default_procs("redis", per + 1) == 2
    assert bench_scale.default_procs("etcd", 1024) == -(-1024 // per)


def test_nodes_spread_over_processes_rendezvous_together(tmp_path: Path) -> None:
    # Three worker processes (3 + 3 + 2 threads) on one SQLite file form one round of 8.
    url = f"sqlite://{tmp_path / 'rdzv.db'}"
    job: dict[str, object] = {"kind": "steady", "url": url, "server": None, "port": 0}
    job |= {"protocol": "scale", "n": 8, "cap": 60.0, "intervals": 1, "procs": 3}
    nodes = bench_scale.Nodes(job, "5")
    try:
        assert nodes.shape == "3x2-3"
        assert len({w.proc.pid for w in nodes.workers}) == 3
        seconds, sums = nodes.rendezvous(60.0)
        assert seconds > 0
        assert sums["announces"] == 8  # every node of every process announced once
        assert sums["cas_attempts"] >= 1
        again = nodes.sums()
        assert again["announces"] == 8
    finally:
        nodes.stop()
    assert all(w.proc.returncode == 0 for w in nodes.workers)


def test_memory_cannot_span_processes() -> None:
    done = _bench("--stores", "memory", "--procs", "2")
    assert done.returncode == 2
    assert "memory:// keeps its data inside one process" in done.stderr


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_steady_interval_must_be_positive(value: str) -> None:
    done = _bench("--steady-interval", value)
    assert done.returncode == 2
    assert "--steady-interval must be a positive number of seconds" in done.stderr


@pytest.mark.parametrize("value", ["x", "0", "61", ","])
def test_wait_slices_must_be_seconds(value: str) -> None:
    done = _bench("--wait-slices", value)
    assert done.returncode == 2
    assert "--wait-slices" in done.stderr


def test_wait_slices_measure_each_row_once_per_slice() -> None:
    done = _bench(
        *("--sizes", "8", "--stores", "memory", "--protocols", "scale"),
        *("--no-torch", "--no-plots", "--no-steady", "--wait-slices", "0.5,5"),
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("memory ")]
    assert [(r[1], r[2], r[3], r[4]) for r in rows] == [
        ("scale", "0.5s", "slice", "8"),
        ("scale", "5s", "slice", "8"),
    ]
    assert all(float(r[5]) > 0 for r in rows), rows  # both measured, neither failed
