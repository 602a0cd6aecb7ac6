"""Swarm mode (``python -m model_check swarm``, :mod:`model_check.swarm`).

The planted bug ``planted-crowded-ranks`` needs a second round that completes with 7 or
more participants: no search at N <= 4 can see it, and at N = 8 with every fault its
shortest counterexample found here (149 moves) is far beyond breadth-first search. Swarm
mode finds it in 3 walks of at most 900 moves (about 10 s of CPU) and its trace replays.
The same seed gives the same output, also under another PYTHONHASHSEED. The whole file
takes about 25 s of CPU (more wall time on a loaded machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import spec
from model_check import swarm
from model_check.__main__ import main
from model_check.explore import explore
from model_check.planted import CROWD, CROWDED_RANKS
from model_check.world import FAULT_KINDS, Faults, ModelConfig

ROOT = Path(__file__).resolve().parent.parent
EVERY_FAULT = [
    "--nodes=8",
    "--crash=3",
    "--restart-new=2",
    "--cas-unknown=2",
    "--store-down=2",
    "--skew=4",
    "--quiet",
]
"""N = 8 with every fault the docs' random runs use (a restart under the same identity is
finding 4, identity reuse, which the handler's nonce rules out)."""
PLANTED = [
    "swarm",
    "--protocol=planted-crowded-ranks",
    *EVERY_FAULT,
    "--walks=3",
    "--walk-moves=900",
    "--seed=0",
]
SMALL_HARDENED = [
    "swarm",
    "--protocol=hardened",
    *EVERY_FAULT,
    "--walks=6",
    "--walk-moves=150",
    "--seed=3",
]

Capsys = pytest.CaptureFixture[str]


def _run(args: list[str], capsys: Capsys) -> tuple[int, str]:
    code = main(args)
    out, _ = capsys.readouterr()
    return code, out


def test_swarm_finds_the_crowded_ranks_bug_at_n8_and_its_trace_replays(
    tmp_path: Path, capsys: Capsys
) -> None:
    trace = tmp_path / "crowd.json"
    code, out = _run([*PLANTED, f"--trace-out={trace}"], capsys)
    assert code == 1, out
    assert "violated: completion_assigns_ranks in 1 walk (shortest 149 moves, walk 2)" in out
    assert 'found by walk 2 (seed "swarm/0/2"): crash=0 restart_new=1 ' in out
    assert "round 1 completed with ranks [0, 1, 2, 3, 4, 5, 5]" in out
    assert out.rstrip().endswith("result=violated")
    doc = json.loads(trace.read_text(encoding="utf-8"))
    assert "--restart-new=1" in doc["argv"] and "--crash=0" in doc["argv"]  # the walk's knobs
    code, replayed = _run(["--replay", str(trace), "--quiet"], capsys)
    assert code == 1
    assert replayed.rstrip().endswith("reproduced completion_assigns_ranks after 149 moves")


def test_swarm_on_hardened_at_n8_holds_with_coverage_and_repeats(capsys: Capsys) -> None:
    code, out = _run(SMALL_HARDENED, capsys)
    assert code == 0, out
    assert "violations=0" in out
    lines = {line.split(":", 1)[0]: line for line in out.splitlines()}
    assert lines["swarm"].startswith("swarm: walks=6 of 6 ")
    coverage = lines["coverage"]
    worlds = int(coverage.split("distinct worlds=")[1].split()[0])
    hit = int(coverage.split("table rows hit=")[1].split()[0])
    assert worlds > 300 and hit >= 10, coverage
    assert "rows join" in lines
    assert any(line.startswith("rows never hit (") for line in out.splitlines())
    assert "livelock=0" in lines["properties"]
    assert "sec=" not in out  # the wall time is on stderr only
    code_again, again = _run(SMALL_HARDENED, capsys)
    assert (code_again, again) == (code, out)
    # This process's PYTHONHASHSEED is pytest's (random unless set); another one, fixed:
    proc = subprocess.run(
        [sys.executable, "-m", "model_check", *SMALL_HARDENED],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "12345"},
        timeout=300,
        check=False,
    )
    assert (proc.returncode, proc.stdout) == (code, out)


def test_swarm_json_document(capsys: Capsys) -> None:
    code, out = _run([*SMALL_HARDENED, "--walks=2", "--json"], capsys)
    doc: dict[str, Any] = json.loads(out)
    assert (code, doc["format"], doc["result"]) == (0, swarm.SWARM_FORMAT, "holds")
    assert doc["walks_run"] == 2 and doc["violation"] is None and doc["violations"] == []
    rows = doc["coverage"]["rows"]
    assert len(rows) == doc["coverage"]["rows_total"]
    assert doc["coverage"]["never_hit"] == [
        f"{r['row']} -> {r['action']}" for r in rows if not r["hits"]
    ]
    names = {p["name"] for p in doc["properties"]}
    assert {"calls_end_as_specified", "livelock", "completion_assigns_ranks"} <= names
    assert "wall_seconds" not in doc


def test_knobs_are_a_function_of_the_seed_within_the_caps() -> None:
    caps = swarm.Caps(Faults(3, 2, 1, 2, 2, 1), closes=1, worker_failures=2, skew=4, late=3)
    drawn = [swarm.draw_knobs(caps, 8, 7, i) for i in range(64)]
    assert drawn == [swarm.draw_knobs(caps, 8, 7, i) for i in range(64)]
    assert drawn != [swarm.draw_knobs(caps, 8, 8, i) for i in range(64)]
    for k in drawn:
        for kind in FAULT_KINDS:
            assert 0 <= getattr(k.faults, kind) <= getattr(caps.faults, kind)
        assert 0 <= k.closes <= 1 and 0 <= k.worker_failures <= 2
        assert 0 <= k.skew <= 4 and 0 <= k.late <= 3
        assert sorted(k.start_order) == list(range(8))
        assert all(w in swarm.WEIGHTS for w in k.weights)
    for kind in FAULT_KINDS:  # each fault kind is left out of some walks, and in others
        assert {getattr(k.faults, kind) == 0 for k in drawn} == {True, False}


def test_crowded_ranks_is_hardened_below_the_crowd() -> None:
    """By construction no search with fewer than CROWD processes can see the bug: its
    search space is hardened's, world for world."""
    assert CROWD == 7
    for variant in (spec.get_variant("hardened"), CROWDED_RANKS):
        cfg = ModelConfig(
            nodes=3, min_nodes=2, max_nodes=3, variant=variant, workload="ticks", worker_failures=0
        )
        r = explore(cfg)
        # (95 before a shutdown closed the run and then left it, for a reused run id)
        assert (r.violation, r.unique) == (None, 160), variant.name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["swarm", "--steps=10"], "--steps sets random mode's total moves"),
        (["swarm", "--walks=0"], "--walks must be in 1..1000000, got 0"),
        (["swarm", "--walk-moves=0"], "--walk-moves must be in 1..100000, got 0"),
        (["swarm", "--mode=random"], "'swarm' is --mode swarm"),
        (["swarm", "--workers=2"], "--workers applies to --mode random"),
        (["swarm", "--max-depth=3"], "swarm mode (a swarm of walks) uses --walks"),
        (["swarm", "--keep-going"], "--keep-going applies to the exhaustive search"),
        (["--walks=3"], "--walks applies to --mode swarm"),
        (["--mode=random", "--walk-moves=3"], "random mode uses --steps"),
        (["swarm", "--nodes=2000"], "--nodes 2000 must be in 1..1024 for --mode swarm"),
        (["swarm", "--walks=x"], "argument --walks: invalid int value: 'x'"),
    ],
)
def test_bad_swarm_flags_are_one_line_errors(args: list[str], message: str, capsys: Capsys) -> None:
    code = main(args)
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("model_check: error: "), err
    assert message in err


def test_an_interrupted_swarm_reports_the_walks_done(
    monkeypatch: pytest.MonkeyPatch, capsys: Capsys
) -> None:
    real = swarm.simulate  # type: ignore[attr-defined]  # the walk swarm mode calls
    calls = []

    def second_walk_interrupted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C, or SIGTERM (the CLI turns it into the same)
        return real(*args, **kwargs)

    monkeypatch.setattr(swarm, "simulate", second_walk_interrupted)
    code, out = _run([*SMALL_HARDENED, "--walks=4", "--walk-moves=50"], capsys)
    assert code == 3, out
    assert "swarm: walks=1 of 4 " in out and "INTERRUPTED" in out
    assert out.rstrip().endswith("result=bounded")
