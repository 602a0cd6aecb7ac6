"""Smoke test of ``benchmarks/bench_scale.py``: a real quick run on memory:// (every
measurement in its own subprocess, as in a full run) prints one parseable row per N and
protocol, and the scale protocol's round costs fewer CAS attempts than hardened's. The
multi-process driver (nodes as worker processes x threads) runs one round on SQLite. The
SVG plot writer and the failure rows are checked directly. No timing is asserted.
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
from bench_scale import (  # noqa: E402
    COLUMNS,
    Outcome,
    Row,
    Series,
    markdown_table,
    svg_plot,
    text_line,
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
        parts = line.split()
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


def test_svg_plot_is_log_log_deterministic_and_omits_failed_points() -> None:
    series: list[Series] = [
        ("redis hardened", [(8.0, 0.5), (64.0, 20.0), (512.0, None)]),
        ("redis scale", [(8.0, 0.02), (64.0, 0.2), (512.0, 2.0)]),
        ("etcd scale", [(8.0, 0.0), (64.0, None)]),  # nothing drawable: no legend entry
    ]
    svg = svg_plot("t", "N", "s", series)
    assert svg == svg_plot("t", "N", "s", series)
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter(f"{SVG}text")]
    # Decade labels cover the data: x 8..512 -> 1..1,000; y 0.02..20 -> 0.01..100.
    for label in ("1", "10", "100", "1,000", "0.01", "0.1"):
        assert label in texts, f"decade label {label} missing: {texts}"
    assert "redis hardened" in texts and "redis scale" in texts
    assert "etcd scale" not in texts
    assert len(list(root.iter(f"{SVG}circle"))) == 5  # the failed and zero points are omitted
    assert len(list(root.iter(f"{SVG}polyline"))) == 2
    assert bench_scale.svg_plot("empty", "N", "s", []).count("no measured points") == 1


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
    assert result["error"].startswith("not finished 0 s after the start: ")
    assert result["error"].endswith(" of 8 nodes returned")


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
