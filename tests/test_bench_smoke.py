"""Smoke tests of ``benchmarks/bench_stores.py``, ``benchmarks/bench_handler.py``,
``benchmarks/bench_model_check.py``, ``benchmarks/bench_commutation.py`` and
``benchmarks/bench_agent_workload.py``: a real quick run of each (the figures themselves
are for the docs, not asserted), and their refusal of bad flags.
``tests/test_bench_scale.py`` covers the scale benchmark."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^(memory|sqlite)\s+(hardened|scale)\s+2\s+(\d+\.\d+)\s+(\d+\.\d)\s+(\d+\.\d)$")


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_bench_stores_prints_a_row_per_store_and_protocol() -> None:
    done = _run("bench_stores.py", "--sizes", "2", "--stores", "memory,sqlite")
    assert done.returncode == 0, done.stderr
    rows = [m.groups() for m in map(ROW.match, done.stdout.splitlines()) if m]
    assert [(store, protocol) for store, protocol, *_ in rows] == [
        ("memory", "hardened"),
        ("memory", "scale"),
        ("sqlite", "hardened"),
        ("sqlite", "scale"),
    ], done.stdout
    for _, protocol, _, reads, cas in rows:
        assert float(reads) >= 1.0  # every node read the state at least once
        # hardened: every node writes itself in; scale: one fold for the whole round
        assert (float(cas) >= 1.0) if protocol == "hardened" else (float(cas) <= 1.0)
    assert re.search(r"^sqlite\s+\d+\.\d{3}\s+\d+\.\d{3}", done.stdout, re.M), done.stdout


def test_bench_stores_repeat_shows_the_median_and_the_slowest_round() -> None:
    done = _run(
        "bench_stores.py",
        "--sizes",
        "2",
        "--stores",
        "memory",
        "--protocols",
        "hardened",
        "--repeat",
        "3",
    )
    assert done.returncode == 0, done.stderr
    assert "3 rounds per row" in done.stdout, done.stdout
    row = re.compile(
        r"^memory\s+hardened\s+2\s+(\d+\.\d{3})\s+(\d+\.\d{3})\s+(\d+\.\d)\s+(\d+\.\d)$"
    )
    rows = [m.groups() for m in map(row.match, done.stdout.splitlines()) if m]
    assert len(rows) == 1, done.stdout
    median, slowest, reads, cas = map(float, rows[0])
    assert median <= slowest
    assert reads >= 1.0 and cas >= 1.0  # means over the rounds: every node read and wrote


def test_bench_stores_refuses_bad_flags() -> None:
    done = _run("bench_stores.py", "--protocols", "fastest", "--stores", "memory")
    assert done.returncode == 2
    assert "unknown protocol variant 'fastest'" in done.stderr
    done = _run("bench_stores.py", "--sizes", "8,x", "--stores", "memory")
    assert done.returncode == 2
    assert "comma-separated integers" in done.stderr
    done = _run("bench_stores.py", "--sizes", "2", "--stores", "memory", "--repeat", "0")
    assert done.returncode == 2
    assert "--repeat must be between 1 and 10000, got 0" in done.stderr


def test_bench_handler_runs_threads_and_processes() -> None:
    done = _run("bench_handler.py", "--sizes", "2", "--modes", "threads,processes", "--no-torch")
    assert done.returncode == 0, done.stderr
    assert "torch=off (--no-torch)" in done.stdout
    row = re.compile(r"^(memory|sqlite)\s+(threads|processes)\s+2\s+\d+\.\d{3}\s+(\d+)\s+(\d+)\s")
    rows = [m.groups() for m in map(row.match, done.stdout.splitlines()) if m]
    # memory:// lives in one process, so it has no processes row
    assert [(store, mode) for store, mode, _, _ in rows] == [
        ("memory", "threads"),
        ("sqlite", "threads"),
        ("sqlite", "processes"),
    ], done.stdout
    for _, _, cas, conflicts in rows:
        # The handler's default protocol (scale) admits the round in one fold: at least
        # one compare-and-set, and never all of them lost.
        assert int(cas) >= 1 and 0 <= int(conflicts) < int(cas)


def test_bench_model_check_quick_prints_both_tables() -> None:
    done = _run("bench_model_check.py", "--quick")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    exhaustive = re.findall(r"^\| exhaustive \| (\d) \| (on|off) \| (\d+) \|", out, re.M)
    assert [(n, sym) for n, sym, _ in exhaustive] == [
        (str(n), sym) for n in range(2, 6) for sym in ("on", "off")
    ], out
    for (_, _, on), (_, _, off) in zip(exhaustive[::2], exhaustive[1::2], strict=True):
        assert int(on) <= int(off)  # the symmetry reduction never adds states
    walks = re.findall(r"^\| (hardened|scale) \| 64 \| (\w+) \| (\d+) \| (\d+) \|", out, re.M)
    # Every fault, and still no violation; every walk's end was decided.
    assert [(p, v) for p, v, _, _ in walks] == [("hardened", "none"), ("scale", "none")], out
    assert all(int(checked) >= 1 and undecided == "0" for _, _, checked, undecided in walks)
    # Old (the pinned commit), interpreted and compiled: the same searches, counted alike.
    compared = re.findall(
        r"^\| ([^|]+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| ([\d.]+)x \| (\w+) \|$",
        out,
        re.M,
    )
    assert [row[0] for row in compared] == ["light N=5", "hardened N=3 --crash 1"], out
    for _, distinct, generated, old, plain, compiled, ratio, same in compared:
        assert same == "yes" and int(distinct) > 0 and int(generated) >= int(distinct)
        assert min(int(old), int(plain), int(compiled)) > 0 and float(ratio) > 0


def test_bench_commutation_counts_commuting_pairs_of_moves() -> None:
    done = _run(
        "bench_commutation.py",
        "--walks", "2", "--moves", "40", "--", "--protocol", "hardened", "--nodes", "2",
        "--crash", "1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("model: --protocol hardened --nodes 2 --crash 1\n")
    worlds = re.search(r"worlds with moves of >= 2 processes: (\d+);", done.stdout)
    assert worlds is not None and int(worlds.group(1)) > 0, done.stdout
    row = re.compile(r"^  (\w+(?: \w+)?) x (\w+(?: \w+)?)\s+(\d+)\s+(\d+)\s+(\d+)%$")
    rows: dict[tuple[str, str], tuple[int, int]] = {}
    for line in done.stdout.splitlines():
        m = row.match(line)
        if m:
            rows[(m.group(1), m.group(2))] = (int(m.group(3)), int(m.group(4)))
    assert all(k <= n for n, k in rows.values()), rows
    # Both processes start before time advances, and starting one never changes the other.
    pairs, commuting = rows[("start", "start")]
    assert pairs >= 1 and commuting == pairs
    # One crash budget: a crash disables every other crash, so two never commute.
    assert rows[("fault", "fault")][1] == 0


def test_bench_commutation_refuses_bad_flags() -> None:
    done = _run("bench_commutation.py", "--walks", "0")
    assert done.returncode == 2
    assert "--walks must be between 1 and 10000, got 0" in done.stderr
    done = _run("bench_commutation.py", "--", "--nodes", "0")
    assert done.returncode == 2
    assert "model options --nodes 0: --nodes 0 must be in 1..1024" in done.stderr


def test_bench_agent_workload_prints_a_verdict_per_row() -> None:
    done = _run("bench_agent_workload.py", "--match", "dropped member")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if "planted-dropped" in line]
    assert len(rows) == 1
    assert "| violated | round_end_reported | 13 |" in rows[0]
    bad = _run("bench_agent_workload.py", "--match", "no such finding")
    assert bad.returncode == 2 and "no row matches 'no such finding'" in bad.stderr
