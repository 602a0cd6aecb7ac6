"""The checker under torch's agent workload: each failure found from outside is a
counterexample first, and the fixed protocols hold in the same configurations.

The agent workload (``ModelConfig.workload == "agent"``, the default) is what
``tests/agents.py`` runs on real processes: a member polls ``num_nodes_waiting()`` at any
moment while its workers run, restarts when the count is above 0, and its workers may fail
(``fail_worker``: next_rendezvous again at once). A pause is no new fault: the scheduler
may leave any process without a step while the others move and time advances.

The real-process regression tests of the same failures are in
``tests/test_agent_workload.py``; the counterexamples are in docs/findings.md (findings 6
to 8). Every exploration here stays below a few tens of thousands of worlds; the larger
configurations of the findings table are measured by ``benchmarks/bench_agent_workload.py``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import spec
from model_check.__main__ import load_trace, main
from model_check.explore import Result, explore, replay
from model_check.model import apply, describe_proc, enabled
from model_check.options import _parser, build_config
from model_check.planted import PLANTED
from model_check.world import (
    CLOSED_JOB_REPORTED,
    COUNT_REFLECTS_ROUND,
    JOBS_NEVER_MIX,
    RESTART_HAS_CAUSE,
    ROUND_END_REPORTED,
    WORLD_SIZE_AGREEMENT,
    Faults,
    ModelConfig,
    Move,
    Pc,
    World,
    decode_cached,
)


def _run(protocol: str, nodes: int, min_nodes: int, max_nodes: int, **extra: Any) -> Result:
    variant = PLANTED[protocol] if protocol.startswith("planted-") else spec.get_variant(protocol)
    cfg = ModelConfig(nodes=nodes, min_nodes=min_nodes, max_nodes=max_nodes, variant=variant)
    return explore(dataclasses.replace(cfg, **extra))


def _moves(result: Result) -> list[str]:
    return [m.kind for m in result.path]


# -- failure 1: a member that restarts at once leaves a paused peer a different world size --


@pytest.mark.parametrize("protocol", ["upstream", "torch-2.13", "planted-old-hardened"])
def test_failure_1_paused_member_returns_another_world_size(protocol: str) -> None:
    r = _run(protocol, 2, 1, 2)
    assert r.violation is not None and r.violation.name == WORLD_SIZE_AGREEMENT
    kinds = _moves(r)
    # Shortest counterexample: the other member's workers fail right after it returned,
    # and the paused one (never scheduled meanwhile) then returns the same round.
    assert "fail_worker" in kinds
    assert not {"crash", "restart_new", "restart_same"} & set(kinds)
    assert len(kinds) == 7


def test_failure_1_old_scale_too() -> None:
    r = _run("planted-old-scale", 2, 1, 2)
    assert r.violation is not None and r.violation.name == WORLD_SIZE_AGREEMENT


def test_failure_1_needs_the_worker_failure() -> None:
    """Without a worker failure (the old workload's assumption) upstream holds at N = 2:
    the agent's restart is what the checker was missing."""
    r = _run("upstream", 2, 1, 2, worker_failures=0)
    assert r.violation is None and not r.truncated


@pytest.mark.parametrize("protocol", ["hardened", "scale"])
def test_fixed_protocols_hold_where_failure_1_was_found(protocol: str) -> None:
    r = _run(protocol, 2, 1, 2)
    assert r.violation is None and not r.truncated


def test_hardened_holds_one_node_above() -> None:
    r = _run("hardened", 3, 2, 3)
    assert r.violation is None and not r.truncated


# -- failure 2: a waiter the completed round did not take keeps every member restarting --


def test_failure_2_surplus_waiter_is_counted() -> None:
    r = _run("planted-waiters-outlive-completion", 3, 2, 2)
    assert r.violation is not None and r.violation.name == RESTART_HAS_CAUSE


def test_failure_2_fixed_in_hardened() -> None:
    # Without the shutdown (35,750 worlds, against 75,226 with it: the benchmark runs that).
    r = _run("hardened", 3, 2, 2, closes=0)
    assert r.violation is None and not r.truncated


# -- failure 3: a query counted from a view older than the round its process joined --------


def test_failure_3_stale_query_after_scale_up() -> None:
    r = _run("hardened", 3, 2, 3, share_views=False)
    assert r.violation is not None and r.violation.name == COUNT_REFLECTS_ROUND
    assert "poll" in _moves(r)


# -- the member dropped from the wait list by a fast new round must still be told ----------


def test_dropped_member_is_counted() -> None:
    r = _run("planted-dropped-member-uncounted", 3, 2, 2)
    assert r.violation is not None and r.violation.name == ROUND_END_REPORTED


# -- failure 5: a dead waiter the rounds keep counting (scale) ----------------------------


def test_failure_5_fixed_scale_holds_with_a_crash_at_n2() -> None:
    """The fixed scale with a crash and a worker failure: every dead node is pruned
    (the counterexample itself needs N = 3 and 400,000 worlds: see the benchmark)."""
    r = _run("scale", 2, 1, 2, faults=Faults(crash=1))
    assert r.violation is None and not r.truncated


# -- the command line shows and replays them ---------------------------------------------


def test_cli_prints_the_counterexample_and_replays_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "f1.json"
    code = main(["--nodes", "2", "--quiet", "--json", "--trace-out", str(trace)])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["result"] == "violated"
    assert doc["violation"]["name"] == WORLD_SIZE_AGREEMENT
    assert doc["params"]["workload"] == "agent"
    assert doc["params"]["worker_failures"] == 1
    assert code == main(["--replay", str(trace), "--json"])
    again = json.loads(capsys.readouterr().out)
    assert again["reproduced"] is True and again["expected"] == WORLD_SIZE_AGREEMENT
    assert again["moves"] == doc["violation"]["moves"] == 7


def test_replayed_path_ends_in_the_violation() -> None:
    cfg = ModelConfig(nodes=2, min_nodes=1, max_nodes=2)
    r = explore(cfg)
    assert r.violation is not None
    steps, _ = replay(cfg, r.path)
    assert WORLD_SIZE_AGREEMENT in [v.name for v in steps[-1][1].violations]
    assert all(not out.violations for _, out in steps[:-1])


def test_the_main_job_finds_failure_1_in_torchs_protocol(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's main job, ``python -m model_check --nodes 8``: torch's protocol under
    torch's agent, the shortest counterexample of world size agreement."""
    code = main(["--nodes", "8", "--json", "--quiet", "--trace-out", str(tmp_path / "t.json")])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["params"]["protocol"] == "upstream"
    assert doc["violation"]["name"] == WORLD_SIZE_AGREEMENT
    assert doc["violation"]["moves"] == 19
    assert "fail_worker" in [m["kind"] for m in doc["counterexample"]["moves"]]


# -- hardened at N = 4, min 2, max 2: a reopen beside a stray member of the closed job ------

JOBS_TRACE = Path(__file__).parent / "traces" / "hardened_n4_jobs_never_mix.json"
"""Found by ``--native --nodes 4 --min-nodes 2 --max-nodes 2 --protocol hardened`` (the
default bounds) after 82,525 distinct worlds, under the first ``jobs_never_mix``, which
counted every live member of the closed job: docs/findings.md, "Re-run on 2026-12-07"."""


def _jobs_trace_world() -> tuple[ModelConfig, World]:
    argv, name, moves = load_trace(JOBS_TRACE)
    assert name == JOBS_NEVER_MIX and len(moves) == 20
    cfg, _ = build_config(_parser().parse_args(argv), replaying=True)
    steps, world = replay(cfg, moves)
    assert len(steps) == 20 and not any(out.violations for _, out in steps)
    return cfg, world


def test_a_reopen_beside_a_stray_member_of_the_closed_job_is_no_mix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The stray member n_1_0 still holds round 0, which ended at move 7; round 1 filled
    # without it, so the closed state no longer lists it. The newcomer reopens the run
    # beside it, and that is no longer reported: the stray trains with nobody.
    assert main(["--replay", str(JOBS_TRACE), "--json", "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["reproduced"] is False and doc["expected"] == JOBS_NEVER_MIX
    cfg, world = _jobs_trace_world()
    stray = world.procs[1]
    assert stray.pc is Pc.MEMBER and stray.returned is not None and stray.returned.round == 0
    # Its keep-alive thread read the closed state (round 2, closed, nobody listed).
    assert stray.local.view.closed and not stray.local.view.is_listed(stray.ident)
    store = decode_cached(world.store) if world.store is not None else None
    assert store is not None and stray.local.job == 0
    assert store.epoch == 1 and not store.closed  # reopened for the next job
    # Its next step is its agent's poll, and it ends the node: it never joins the new job.
    assert [str(m) for m in enabled(world, cfg) if m.slot == 1] == ["poll(1)"]
    out = apply(world, Move("poll", 1), cfg)
    assert not out.violations
    assert out.world.procs[1].pc is Pc.ENDED
    assert "saw the rendezvous closed" in describe_proc(out.world.procs[1])


CLOSED_TRACE = Path(__file__).parent / "traces" / "hardened_n4_closed_job_reported.json"
"""Found by the same search with ``closed_job_reported`` and the old answer (the view's
closed flag alone), after 254,322 distinct worlds: the stray polls the reopened run."""


def test_the_stray_member_is_told_its_run_is_closed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--replay", str(CLOSED_TRACE), "--json", "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["reproduced"] is False and doc["expected"] == CLOSED_JOB_REPORTED
    argv, name, moves = load_trace(CLOSED_TRACE)
    assert name == CLOSED_JOB_REPORTED and len(moves) == 23 and moves[-1] == Move("poll", 1)
    cfg, _ = build_config(_parser().parse_args(argv), replaying=True)
    steps, world = replay(cfg, moves)
    before = steps[-2][1].world.procs[1]
    # The poll's view is the new job's open run, one epoch after the stray's job ...
    view = world.procs[1].control.view
    assert before.local.job == 0 and view.epoch == 1 and not view.closed
    # ... and is_closed() is True there, so the agent ends instead of rejoining.
    assert spec.closed_for(world.procs[1].control)
    assert world.procs[1].pc is Pc.ENDED
    assert "saw the rendezvous closed" in describe_proc(world.procs[1])


def test_the_stray_member_run_needs_an_agent_that_skips_its_polls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Under torch's polling rule (every member polls between two ticks) the run does not
    # exist: the first of the four ticks that expire the leaver is not enabled.
    trace = json.loads(JOBS_TRACE.read_text(encoding="utf-8"))
    trace["argv"] = ["--workload=monitor" if a == "--workload=agent" else a for a in trace["argv"]]
    assert "--workload=monitor" in trace["argv"]
    monitor = tmp_path / "monitor.json"
    monitor.write_text(json.dumps(trace), encoding="utf-8")
    assert main(["--replay", str(monitor), "--json", "--quiet"]) == 2
    assert "move 16 (tick) is not enabled" in capsys.readouterr().err
