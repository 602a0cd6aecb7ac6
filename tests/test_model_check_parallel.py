"""``--workers K`` in random mode: K seeded walks in K spawned processes, merged in order.

Every run here is small (at most 300 moves in all); each spawned worker imports the
model afresh, so a run with workers costs about a second.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from model_check.__main__ import _parser, build_config, main
from model_check.explore import Result, simulate
from model_check.parallel import (
    KILL_WALK_ENV,
    WORKER_DIED_EXIT,
    Job,
    WorkerDied,
    _how_it_ended,
    _run_processes,
)

ROOT = Path(__file__).resolve().parent.parent
QUIET = ["--mode", "random", "--quiet"]
HOLDS = ["--protocol", "hardened", "--nodes", "4", "--steps", "101", "--seed", "5"]
"""hardened at N = 4 without faults: no violation in 101 moves, several walk ends."""
FINDS = ["--nodes", "16", "--min-nodes", "2", "--skew", "4", "--steps", "300", "--seed", "0"]
"""A skewed clock at N = 16: live_node_evicted within 300 moves."""

Capsys = pytest.CaptureFixture[str]


def _walks(args: list[str], workers: int) -> list[Result]:
    """The walks ``--workers`` runs, computed here in this process, as documented: seed
    strings "<seed>/<i>", the steps split evenly (the first walks one move more)."""
    ns = _parser().parse_args([*QUIET, *args])
    cfg, _ = build_config(ns)
    steps = ns.steps
    return [
        simulate(cfg, seed=f"{ns.seed}/{i}", steps=steps // workers + (i < steps % workers))
        for i in range(workers)
    ]


@pytest.mark.parametrize(
    ("args", "workers"), [(HOLDS, 2), (FINDS, 3)], ids=["holds-2-workers", "finds-3-workers"]
)
def test_workers_merge_the_seeded_walks_in_worker_order(
    args: list[str], workers: int, tmp_path: Path, capsys: Capsys
) -> None:
    trace = tmp_path / "t.json"
    run = [*QUIET, *args, "--workers", str(workers), "--json", "--trace-out", str(trace)]
    code = main(run)
    doc = json.loads(capsys.readouterr().out)
    walks = _walks(args, workers)
    assert sum(w.states for w in walks) > 0
    assert doc["params"]["workers"] == workers
    assert (doc["states"], doc["unique"], doc["depth"]) == (
        sum(w.states for w in walks),
        sum(w.unique for w in walks),
        max(w.depth for w in walks),
    )
    ends = doc["walk_ends"]
    assert (ends["checked"], ends["undecided"], ends["longest_continuation_moves"]) == (
        sum(w.ends[0] for w in walks),
        sum(w.ends[1] for w in walks),
        max(w.settle_moves for w in walks),
    )
    found = [w for w in walks if w.violation is not None]
    # HOLDS finds nothing and FINDS finds a violation: guards the branch below, so that
    # the merge, trace and replay checks of FINDS cannot silently stop running.
    assert bool(found) == (args is FINDS)
    if not found:
        assert (code, doc["violation"]) == (0, None)
        return
    # The first walk (in worker order) that found a violation is the one reported.
    first = found[0]
    assert first.violation is not None
    assert code == 1
    assert doc["violation"] == {
        "name": first.violation.name,
        "message": first.violation.message,
        "moves": len(first.path),
    }
    moves = [[m.kind, m.slot] for m in first.path]
    assert json.loads(trace.read_text())["moves"] == moves
    assert main(["--replay", str(trace), "--quiet"]) == 1
    assert f"reproduced {first.violation.name} after {len(moves)} moves" in capsys.readouterr().out


def test_the_output_with_workers_depends_only_on_the_seed_and_k() -> None:
    def run(hash_seed: str, workers: int, seed: str = "5") -> str:
        argv = [*QUIET, *HOLDS[:-1], seed, "--workers", str(workers)]
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        env.pop(KILL_WALK_ENV, None)
        done = subprocess.run(
            [sys.executable, "-m", "model_check", *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,  # guards against a hang only; a run takes about two seconds
            check=False,
        )
        assert done.returncode == 0, done.stderr
        # Everything but the wall-clock seconds of the summary line.
        return done.stdout.split(" sec=")[0]

    two = run("0", 2)
    assert "workers=2" in two and "walk ends checked=" in two
    assert run("1", 2) == two
    # The same steps in one walk, or under another seed, are other walks.
    assert run("0", 1).replace("workers=1", "workers=2") != two
    assert run("0", 2, seed="6").replace("seed=6", "seed=5") != two


def test_a_worker_that_dies_ends_the_run_with_one_line_naming_the_walk(
    monkeypatch: pytest.MonkeyPatch, capsys: Capsys
) -> None:
    monkeypatch.setenv(KILL_WALK_ENV, "1")
    with pytest.raises(WorkerDied) as died:
        main([*QUIET, *HOLDS, "--workers", "3"])
    assert died.value.code == WORKER_DIED_EXIT == 2
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("model_check checks protocol hardened")
    assert lines[1].startswith("model_check protocol=")  # the first two lines only
    lines = err.strip().splitlines()
    assert lines == [f"model_check: error: {died.value.message}"]
    # 101 moves over 3 walks: 34, 34 and 33.
    assert lines[0].startswith(
        'model_check: error: walk 1 of --workers 3 (seed "5/1", 34 moves) was killed by SIGKILL'
    )
    assert "Rerun with --workers 1" in lines[0]
    assert multiprocessing.active_children() == []  # the other walks were stopped


def test_the_cli_exits_2_instead_of_waiting_when_a_worker_dies() -> None:
    env = {**os.environ, KILL_WALK_ENV: "0"}
    done = subprocess.run(
        [sys.executable, "-m", "model_check", *QUIET, *HOLDS, "--workers", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # before the fix the run waited forever; it now ends in about a second
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        'model_check: error: walk 0 of --workers 2 (seed "5/0", 51 moves) was killed by '
        "SIGKILL (the kernel's OOM killer sends it when memory runs out); the other walks "
        "were stopped and there is no result. Rerun with --workers 1 (one process, less "
        "memory in all), fewer --workers or --steps, or with more memory"
    ]
    assert "result=" not in done.stdout


def test_the_kill_hook_is_not_read_without_worker_processes(
    monkeypatch: pytest.MonkeyPatch, capsys: Capsys
) -> None:
    # With --workers 1 the walk runs in the CLI's own process, which the hook must spare.
    monkeypatch.setenv(KILL_WALK_ENV, "0")
    assert main([*QUIET, *HOLDS, "--workers", "1"]) == 0
    assert "result=holds" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("exitcode", "expected"),
    [
        (1, "exited with code 1 without a result (a Python error in the walk prints"),
        (-signal.SIGTERM, "was killed by SIGTERM"),
        (-signal.SIGKILL, "was killed by SIGKILL (the kernel's OOM killer"),
    ],
)
def test_how_a_worker_ended_is_named(exitcode: int, expected: str) -> None:
    assert _how_it_ended(exitcode).startswith(expected)


class _FailingStart:
    """A process context whose second process fails to start; it records every pipe end."""

    def __init__(self) -> None:
        self.ends: list[Connection] = []
        self.processes = 0

    def Pipe(self, duplex: bool) -> tuple[Connection, Connection]:
        reader, writer = multiprocessing.Pipe(duplex=duplex)
        self.ends += [reader, writer]
        return reader, writer

    def Process(self, **kwargs: Any) -> _FakeProcess:
        self.processes += 1
        return _FakeProcess(fail=self.processes == 2)


class _FakeProcess:
    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def start(self) -> None:
        if self.fail:
            raise OSError("no more processes")

    def is_alive(self) -> bool:
        return False

    def join(self, timeout: float | None = None) -> None:
        pass


def test_a_walk_that_cannot_start_leaves_no_pipe_open(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = _FailingStart()
    monkeypatch.setattr("model_check.parallel.multiprocessing.get_context", lambda _: ctx)
    jobs: list[Job] = [([], 0, i, 1) for i in range(3)]
    with pytest.raises(OSError, match="no more processes"):
        _run_processes(jobs, seed=0)
    assert ctx.processes == 2 and len(ctx.ends) == 4  # the third walk was never begun
    assert all(end.closed for end in ctx.ends)
