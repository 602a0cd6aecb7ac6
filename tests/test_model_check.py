"""The model checker: golden counts, planted bugs, determinism, replay, symmetry.

Every exploration here is small (a few thousand states at most) so the file runs in well
under a minute on one core. Most run the light workload (:data:`LIGHT`: one poll per tick,
no worker failure), whose spaces stay small: they test the checker's machinery and the
protocol's older findings. The agent workload's own findings are in
``tests/test_model_check_agent.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import model_check.canon as canon_module
import model_check.explore as explore_module
import spec
from model_check.__main__ import main
from model_check.canon import ENCODED_FIELDS, Canon, plain_fingerprint
from model_check.explore import (
    doomed_from,
    explore,
    on_timeless_cycle,
    replay,
    settle_limit,
    simulate,
)
from model_check.model import (
    apply,
    enabled,
    forget_stale_announcement,
    forget_stale_sightings,
    forget_stale_watch,
    node_id,
    rotate_beat_values,
    unfinished_calls,
)
from model_check.model import initial_world as make_initial
from model_check.planted import PLANTED
from model_check.world import (
    CALLS_END,
    STALE_SIGHTING,
    Faults,
    ModelConfig,
    Move,
    Pc,
    Proc,
    Returned,
    Violation,
    World,
)
from spec import NodeId, RendezvousState

ROOT = Path(__file__).resolve().parent.parent

LIGHT: dict[str, object] = {"workload": "ticks", "worker_failures": 0}
"""The light workload: each member polls once per tick after its keep-alive, and no
member's workers fail (see ``ModelConfig.workload``)."""
LIGHT_ARGS = ["--workload", "ticks", "--worker-failures", "0"]
"""The same, as command-line options."""


def _cli(args: list[str], hashseed: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONHASHSEED=hashseed, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "model_check", "--quiet", *LIGHT_ARGS, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
        check=False,
    )


def strip(text: str) -> str:
    return re.sub(r"sec=\S+", "sec=X", text)


def _summary(stdout: str) -> dict[str, str]:
    last = stdout.strip().splitlines()[-1]
    return dict(part.split("=", 1) for part in last.split())


# -- golden numbers, independent of the hash seed ------------------------------------------
LATE3 = ["--nodes", "3", "--min-nodes", "2", "--max-nodes", "3", "--late-starts"]
GOLDEN = [
    (["--nodes", "2"], 48, 32, 12, 0),
    (["--nodes", "3", "--min-nodes", "2", "--max-nodes", "3"], 150, 79, 18, 0),
    # Upstream's late-arrival race (docs/model_checker.md): calls_end_as_specified, found
    # after the whole space was searched, so the counts are those of the full space.
    (LATE3, 10531, 5215, 38, 1),
    # hardened: its local liveness clock (first-seen times of heartbeats and the last
    # call) is part of every world, and the symmetry reduction covers it (125 distinct
    # worlds with --no-symmetry); sightings the store has moved past are forgotten. Its
    # shutdown closes the run and then leaves it (a reused run id), 16 worlds more than
    # a close alone (87, 58, 23).
    (
        [
            *("--nodes", "2", "--min-nodes", "2", "--max-nodes", "3"),
            *("--join-timeout", "1", "--last-call", "2", "--protocol", "hardened"),
        ],
        103,
        67,
        24,
        0,
    ),
]


@pytest.mark.parametrize(("args", "states", "unique", "depth", "code"), GOLDEN)
def test_golden_counts_are_independent_of_the_hash_seed(
    args: list[str], states: int, unique: int, depth: int, code: int, tmp_path: Path
) -> None:
    outputs = []
    for seed in ("0", "12345"):
        proc = _cli(args, seed, tmp_path)
        assert proc.returncode == code, proc.stdout + proc.stderr
        got = _summary(proc.stdout)
        assert (int(got["states"]), int(got["unique"]), int(got["depth"])) == (
            states,
            unique,
            depth,
        )
        outputs.append(re.sub(r"sec=\S+", "sec=X", proc.stdout))
    assert outputs[0] == outputs[1]


def test_same_seed_prints_identical_output_including_counterexamples(tmp_path: Path) -> None:
    args = ["--nodes", "2", "--min-nodes", "2", "--max-nodes", "2", "--crash", "1"]
    runs = []
    for hashseed in ("1", "2"):
        proc = _cli([*args, "--trace-out", "t.json"], hashseed, tmp_path)
        assert proc.returncode == 1
        runs.append(re.sub(r"sec=\S+", "sec=X", proc.stdout))
    assert runs[0] == runs[1]
    assert "VIOLATION dead_member_unreported" in runs[0]


def test_random_mode_same_seed_same_output(tmp_path: Path) -> None:
    args = ["--mode", "random", "--nodes", "16", "--steps", "400", "--seed", "7"]
    a = _cli(args, "3", tmp_path)
    b = _cli(args, "4", tmp_path)
    assert a.returncode == b.returncode == 0, a.stdout + a.stderr
    assert strip(a.stdout) == strip(b.stdout)
    other = _cli([*args[:-1], "8"], "3", tmp_path)
    assert other.returncode == 0
    assert "seed=8" in other.stdout.splitlines()[1]


# -- the four known weaknesses of upstream --------------------------------------------------
WEAKNESSES = [
    (["--nodes", "2", "--min-nodes", "2", "--max-nodes", "2", "--skew", "4"], "live_node_evicted"),
    (
        ["--nodes", "2", "--min-nodes", "2", "--max-nodes", "2", "--crash", "1"],
        "dead_member_unreported",
    ),
    (
        [
            "--nodes",
            "2",
            "--min-nodes",
            "2",
            "--max-nodes",
            "3",
            "--join-timeout",
            "1",
            "--last-call",
            "2",
        ],
        "quorum_never_completes",
    ),
    (
        ["--nodes", "3", "--min-nodes", "2", "--max-nodes", "2", "--duplicate-identity"],
        "ranks_distinct",
    ),
]


@pytest.mark.parametrize(("args", "name"), WEAKNESSES)
def test_upstream_weakness_is_found_and_replays(
    args: list[str], name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "cex.json"
    assert main([*LIGHT_ARGS, *args, "--quiet", "--trace-out", str(trace)]) == 1
    out = capsys.readouterr().out
    assert f"VIOLATION {name}:" in out
    assert f"replay: python -m model_check --replay {trace}" in out
    assert re.search(r"^\s+1\. ", out, re.M)
    doc = json.loads(trace.read_text())
    assert doc["violation"]["name"] == name
    assert main(["--replay", str(trace)]) == 1
    replayed = capsys.readouterr().out
    assert f"reproduced {name}" in replayed


def test_weakness_needs_its_fault_or_timing(capsys: pytest.CaptureFixture[str]) -> None:
    # The same configurations without the fault / timing flag hold.
    assert (
        main([*LIGHT_ARGS, "--nodes", "2", "--min-nodes", "2", "--max-nodes", "2", "--quiet"]) == 0
    )
    assert (
        main([*LIGHT_ARGS, "--nodes", "3", "--min-nodes", "2", "--max-nodes", "2", "--quiet"]) == 0
    )
    assert "result=holds" in capsys.readouterr().out


# -- planted bugs ----------------------------------------------------------------------------
def _cfg(**kw: object) -> ModelConfig:
    return ModelConfig(**{**LIGHT, **kw})  # type: ignore[arg-type]


PLANTED_CASES = [
    (
        _cfg(nodes=3, min_nodes=2, max_nodes=3, variant=PLANTED["planted-ignores-min"]),
        {"completion_assigns_ranks"},
    ),
    (
        _cfg(nodes=2, min_nodes=2, max_nodes=3, variant=PLANTED["planted-reversed-ranks"]),
        {"complete_ranks_distinct", "completion_assigns_ranks"},
    ),
    (
        _cfg(
            nodes=3,
            min_nodes=2,
            max_nodes=3,
            late_starts=True,
            variant=PLANTED["planted-no-epilogue"],
        ),
        {"complete_round_not_empty"},
    ),
    (
        _cfg(nodes=2, min_nodes=2, max_nodes=3, variant=PLANTED["planted-busy-keep-alive"]),
        {"livelock"},
    ),
    (
        _cfg(nodes=2, min_nodes=1, max_nodes=2, cas_ignores_token=True),
        {"closed_reopens_empty", "ranks_distinct", "world_size_agreement", "return_is_member"},
    ),
]


@pytest.mark.parametrize(("cfg", "names"), PLANTED_CASES)
def test_planted_bug_is_caught_with_a_replayable_counterexample(
    cfg: ModelConfig, names: set[str]
) -> None:
    result = explore(cfg)
    assert result.violation is not None
    assert result.violation.name in names
    steps, world = replay(cfg, result.path)
    if result.violation.name == "livelock":
        cycle = on_timeless_cycle(world, cfg)
        assert cycle and all(m.kind != "tick" for m in cycle)
    else:
        assert result.violation.name in {v.name for v in steps[-1][1].violations}


def test_the_correct_protocol_holds_in_the_planted_configurations() -> None:
    # hardened, not upstream: with late starts upstream has the late-arrival race that
    # calls_end_as_specified finds (test_upstream_late_arrival_race_is_found).
    for cfg, _ in PLANTED_CASES:
        fixed = _cfg(
            nodes=cfg.nodes,
            min_nodes=cfg.min_nodes,
            max_nodes=cfg.max_nodes,
            late_starts=cfg.late_starts,
            variant=spec.HARDENED,
        )
        assert explore(fixed).violation is None


AGENT_WORKLOAD_PLANTED = {
    # The agent-workload fixes (docs/findings.md, findings 6 to 8), each undone.
    "planted-old-hardened": spec.HARDENED,
    "planted-old-scale": spec.SCALE,
    "planted-waiters-outlive-completion": spec.HARDENED,
    "planted-scale-waiters-outlive-completion": spec.SCALE,
    "planted-dropped-member-uncounted": spec.HARDENED,
}


SWARM_PLANTED = {
    # Out of exhaustive reach (tests/test_model_check_swarm.py finds it by swarm mode).
    "planted-crowded-ranks": spec.HARDENED,
}
REUSE_PLANTED = {
    # tests/test_model_check_reuse.py finds them with --next-job.
    "planted-reopen-forgets-job": spec.HARDENED,
    "planted-reopen-under-members": spec.HARDENED,
}


def test_planted_variants_are_derived_from_upstream_or_scale() -> None:
    for variant in PLANTED.values():
        keys = variant.name == "planted-unwatched-standby"
        parents = {**AGENT_WORKLOAD_PLANTED, **SWARM_PLANTED, **REUSE_PLANTED}
        parent = parents.get(variant.name, spec.SCALE if keys else spec.UPSTREAM)
        assert variant.parent == parent.name
        assert variant.changes


# -- the general liveness property: calls_end_as_specified ---------------------------------
LIVENESS_PLANTED = [
    # A participant of a complete round keeps waiting: calls stay pending forever.
    (
        _cfg(nodes=2, min_nodes=2, max_nodes=2, variant=PLANTED["planted-never-finishes"]),
        "is pending",
    ),
    (
        _cfg(nodes=3, min_nodes=2, max_nodes=3, variant=PLANTED["planted-never-finishes"]),
        "is pending",
    ),
    # Nobody can join: every call times out although min_nodes processes are calling.
    (_cfg(nodes=2, min_nodes=2, max_nodes=2, variant=PLANTED["planted-never-joins"]), "timeout"),
    (_cfg(nodes=3, min_nodes=2, max_nodes=3, variant=PLANTED["planted-never-joins"]), "timeout"),
]


@pytest.mark.parametrize(("cfg", "symptom"), LIVENESS_PLANTED)
def test_planted_call_that_never_ends_is_caught_by_the_liveness_property(
    cfg: ModelConfig, symptom: str
) -> None:
    result = explore(cfg)
    assert result.violation is not None
    assert result.violation.name == CALLS_END
    assert symptom in result.violation.message
    assert result.path
    steps, world = replay(cfg, result.path)
    assert not steps[-1][1].violations  # no safety property is involved
    problems = doomed_from(world, cfg)
    assert problems is not None and any(symptom in p for p in problems)
    # The unplanted protocol holds in the same configuration.
    fixed = _cfg(nodes=cfg.nodes, min_nodes=cfg.min_nodes, max_nodes=cfg.max_nodes)
    assert explore(fixed).violation is None


def test_liveness_counterexample_replays_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "never.json"
    args = ["--protocol", "planted-never-finishes", "--nodes", "2", "--min-nodes", "2"]
    assert main([*LIGHT_ARGS, *args, "--max-nodes", "2", "--quiet", "--trace-out", str(trace)]) == 1
    out = capsys.readouterr().out
    assert f"VIOLATION {CALLS_END}:" in out
    assert main(["--replay", str(trace)]) == 1
    assert f"reproduced {CALLS_END}" in capsys.readouterr().out


def test_upstream_late_arrival_race_is_found_and_hardened_holds() -> None:
    # A process arrives just before another's join deadline: min_nodes is reached and the
    # last call starts, but the first process's deadline passes first; it withdraws and
    # times out, leaving the arrival alone (it times out too).
    cfg = _cfg(nodes=3, min_nodes=2, max_nodes=3, late_starts=True)
    result = explore(cfg)
    assert result.violation is not None and result.violation.name == CALLS_END
    assert "ended wrongly" in result.violation.message
    _, world = replay(cfg, result.path)
    assert doomed_from(world, cfg) is not None
    hardened = _cfg(nodes=3, min_nodes=2, max_nodes=3, late_starts=True, variant=spec.HARDENED)
    assert explore(hardened).violation is None


def test_random_walk_end_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _cfg(nodes=3, min_nodes=2, max_nodes=3, variant=PLANTED["planted-never-finishes"])
    result = simulate(cfg, seed="1", steps=300)
    assert result.violation is not None and result.violation.name == CALLS_END
    _, world = replay(cfg, result.path)
    assert doomed_from(world, cfg) is not None
    # Upstream: every walk end is checked and acceptable.
    ok = simulate(_cfg(nodes=3, min_nodes=2, max_nodes=3), seed="1", steps=2000)
    assert ok.violation is None
    checked, undecided = ok.ends
    assert checked > 1 and undecided == 0
    args = ["--mode", "random", "--nodes", "4", "--steps", "500", "--seed", "2", "--quiet"]
    assert main([*LIGHT_ARGS, *args]) == 0
    assert f"{CALLS_END}: walk ends checked=" in capsys.readouterr().out


def test_a_short_walk_is_continued_long_enough_to_decide_its_end(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 16 processes after 60 moves need more than 60 moves of continuation to settle; the
    # bound grows with the processes (it was min(2000, --steps), and this end undecided).
    args = ["--protocol", "hardened", "--mode", "random", "--nodes", "16", "--steps", "60"]
    assert main([*LIGHT_ARGS, *args, "--seed", "1", "--crash", "1", "--quiet"]) == 0
    assert f"{CALLS_END}: walk ends checked=1 undecided=0" in capsys.readouterr().out
    assert (settle_limit(2), settle_limit(16), settle_limit(1024)) == (2000, 4000, 20_000)


def test_the_continuation_serves_each_process_until_it_waits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # One move per process in turn lets all of them read before any writes, so all but one
    # compare-and-set of each pass lose: 1,183 moves to settle this walk's end, against 184
    # when each process runs until it waits. The output says how long the end took.
    args = ["--protocol", "hardened", "--mode", "random", "--nodes", "32", "--steps", "200"]
    faults = ["--seed", "1", "--crash", "1", "--cas-unknown", "1", "--quiet"]
    assert main([*LIGHT_ARGS, *args, *faults]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith(f"{CALLS_END}: walk ends"))
    took = int(line.split("longest continuation ")[1].split()[0])
    assert "checked=1 undecided=0" in line and f"of {settle_limit(32)} moves" in line
    assert 0 < took < 400
    assert main([*LIGHT_ARGS, *args, *faults, "--json"]) == 0
    ends = json.loads(capsys.readouterr().out)["walk_ends"]
    assert ends == {
        "checked": 1,
        "undecided": 0,
        "longest_continuation_moves": took,
        "continuation_bound_moves": settle_limit(32),
    }


def test_max_depth_checks_every_run_up_to_the_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The trace goes to tmp_path, not to the default file in the working directory.
    trace = str(tmp_path / "depth.json")
    crash = ["--nodes", "2", "--min-nodes", "2", "--crash", "1", "--quiet", "--trace-out", trace]
    # Weakness 2 needs 14 moves: a bound of 13 cannot see it and says so, 14 finds it.
    assert main([*LIGHT_ARGS, *crash, "--max-depth", "13"]) == 3
    out = capsys.readouterr().out
    assert "BOUND REACHED: --max-depth=13" in out and "depth=13" in out
    assert main([*LIGHT_ARGS, *crash, "--max-depth", "14"]) == 1
    assert "VIOLATION dead_member_unreported" in capsys.readouterr().out
    # A bound beyond the whole space changes nothing: complete, same worlds, graph checked.
    whole = explore(_cfg(nodes=2, min_nodes=1, max_nodes=2))
    bounded = explore(_cfg(nodes=2, min_nodes=1, max_nodes=2), max_depth=whole.depth + 1)
    assert not bounded.truncated and bounded.unique == whole.unique
    cut = explore(_cfg(nodes=2, min_nodes=1, max_nodes=2), max_depth=whole.depth - 1)
    assert cut.truncated and cut.unique < whole.unique


def test_an_interrupted_search_keeps_what_it_checked() -> None:
    cfg = _hardened(nodes=3, min_nodes=2, max_nodes=3, faults=Faults(crash=1))
    whole = explore(cfg, keep_fingerprints=True)
    assert not whole.truncated and whole.unique > 500
    seen = 0

    def interrupt_at_300(world: World) -> None:
        nonlocal seen
        seen += 1
        if seen == 300:
            raise KeyboardInterrupt

    cut = explore(cfg, keep_fingerprints=True, visit=interrupt_at_300)
    assert cut.truncated and cut.bound == "interrupted" and cut.violation is None
    assert 0 < cut.checked_depth < whole.depth and cut.unique == 300
    # The claim "every run of at most D moves was checked" is exactly --max-depth D's part.
    bounded = explore(cfg, keep_fingerprints=True, max_depth=cut.checked_depth)
    assert bounded.fingerprints is not None and cut.fingerprints is not None
    assert bounded.fingerprints <= cut.fingerprints
    deeper = explore(cfg, keep_fingerprints=True, max_depth=cut.checked_depth + 2)
    assert deeper.fingerprints is not None and not deeper.fingerprints <= cut.fingerprints


def test_an_interrupt_while_deciding_the_graph_properties_keeps_the_whole_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = _hardened(nodes=3, min_nodes=2, max_nodes=3, faults=Faults(crash=1))
    whole = explore(cfg)

    def interrupted(self: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(explore_module._Graph, "doomed", interrupted)
    cut = explore(cfg)
    assert cut.truncated and cut.bound == "interrupted-graph"
    assert (cut.unique, cut.states, cut.checked_depth) == (whole.unique, whole.states, whole.depth)


def _wait_for(stream: IO[bytes], marker: bytes, within_s: float) -> None:
    """Read ``stream`` until ``marker`` shows, for at most ``within_s`` seconds."""
    seen = b""
    deadline = time.monotonic() + within_s
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        while marker not in seen:  # bounded by the deadline
            left = deadline - time.monotonic()
            assert left > 0, f"no {marker!r} within {within_s} s: {seen[-500:]!r}"
            if selector.select(timeout=left):
                chunk = os.read(stream.fileno(), 4096)
                assert chunk, f"the stream ended before {marker!r}: {seen[-500:]!r}"
                seen += chunk


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_the_command_line_reports_an_interrupted_search(signal_name: str) -> None:
    # Hardened at N = 3 with every fault takes over 20 minutes: stopped at its first
    # progress line, it must say how far it checked and exit 3.
    args = "--protocol hardened --nodes 3 --crash 1 --restart-new 1 --cas-unknown 1"
    argv = [*args.split(), "--store-down", "1", "--skew", "4"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "model_check", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
        # A job started in the background of a script inherits SIGINT ignored; Ctrl-C
        # reaches a foreground run, which this one stands for.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stderr is not None
        _wait_for(proc.stderr, b"progress ", within_s=120.0)
        proc.send_signal(getattr(signal, signal_name))
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.decode()
    assert proc.returncode == 3, text
    match = re.search(
        r"BOUND REACHED: interrupted \(Ctrl-C or SIGTERM\) after \d+ s: every "
        r"run of at most (\d+) moves was checked, with no violation",
        text,
    )
    assert match is not None, text
    summary = _summary(text)
    assert summary["result"] == "bounded"
    assert 0 < int(match.group(1)) <= int(summary["depth"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-depth", "-1"], "--max-depth must be >= 0, got -1"),
        (["--mode", "random", "--max-depth", "3"], "random mode uses --steps"),
    ],
)
def test_bad_max_depth_is_a_usage_error(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_the_default_run_holds_every_property(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*LIGHT_ARGS, "--nodes", "8", "--quiet"]) == 0
    assert "result=holds" in capsys.readouterr().out


def test_a_node_standing_by_for_a_dead_round_is_caught_and_the_protocols_hold() -> None:
    # planted-unwatched-standby is scale before nodes standing by watched the round's
    # first participant: one node forms a round alone and crashes, the other arrives
    # later and stands by on the redundancy list (max_nodes 1) for ever. Standing by only counts as
    # an acceptable end while the round has a live participant, and a dead node may not
    # stay listed while others run, so the liveness property reports it.
    base: dict[str, object] = {
        "nodes": 2,
        "min_nodes": 1,
        "max_nodes": 1,
        "late": 1,
        "faults": Faults(crash=1),
    }
    cfg = _cfg(variant=PLANTED["planted-unwatched-standby"], **base)
    result = explore(cfg)
    assert result.violation is not None and result.violation.name == CALLS_END
    assert "stands by for round 0, whose participants have all crashed or ended" in (
        result.violation.message
    )
    assert re.search(
        r"dead and listed: n_\d_0 is still listed as a participant", result.violation.message
    )
    steps, world = replay(cfg, result.path)
    assert not steps[-1][1].violations  # no safety property is involved
    assert doomed_from(world, cfg) is not None
    for variant in (spec.SCALE, spec.HARDENED, spec.UPSTREAM):
        assert explore(_cfg(variant=variant, **base)).violation is None, variant.name


def _progress(world: World, cfg: ModelConfig) -> Move:
    """The first enabled move that is neither a fault nor a shutdown."""
    return next(m for m in enabled(world, cfg) if m.kind in ("io", "wake", "tick"))


def test_a_dead_node_must_not_stay_listed_while_others_run() -> None:
    cfg = _cfg(nodes=2, min_nodes=2, max_nodes=2, faults=Faults(crash=1), variant=spec.HARDENED)
    world = make_initial(cfg)
    for move in [Move("start", 0), Move("start", 1)]:
        world = apply(world, move, cfg).world
    for _ in range(200):  # bounded: the round completes in a few moves
        if all(p.returned for p in world.procs):
            break
        world = apply(world, _progress(world, cfg), cfg).world
    assert unfinished_calls(world, cfg) == []
    world = apply(world, Move("crash", 0), cfg).world
    dead = world.procs[0].ident
    assert f"dead and listed: {dead} is still listed as a participant" in unfinished_calls(
        world, cfg
    )
    # The survivor's heartbeats find it expired and prune it (hardened also ends the
    # broken round); then nothing is wrong any more.
    for _ in range(200):  # bounded: a few ticks until the expiry
        if not any(p.startswith("dead and listed") for p in unfinished_calls(world, cfg)):
            break
        world = apply(world, _progress(world, cfg), cfg).world
    assert dead not in spec.decode(world.store or b"").heartbeat_map()
    assert not any(p.startswith("dead and listed") for p in unfinished_calls(world, cfg))


def test_a_close_must_end_every_call() -> None:
    cfg = _cfg(nodes=2, min_nodes=2, max_nodes=2)
    world = make_initial(cfg)
    for move in [Move("start", 0), Move("start", 1), Move("io", 0), Move("io", 1)]:
        world = apply(world, move, cfg).world
    while not all(p.returned for p in world.procs):  # bounded: the round completes
        world = apply(world, enabled(world, cfg)[0], cfg).world
    assert unfinished_calls(world, cfg) == []
    world = apply(world, Move("shutdown", 0), cfg).world
    while world.procs[0].control.phase is not spec.Phase.IDLE:  # bounded: one close op
        world = apply(world, Move("ctl_io", 0), cfg).world
    assert spec.decode(world.store or b"").closed
    # Process 1 is still a member of a closed rendezvous: not an acceptable end...
    assert any("closed" in p for p in unfinished_calls(world, cfg))
    # ...until its next poll sees the close and it ends.
    world = apply(world, Move("tick"), cfg).world
    while enabled(world, cfg):  # bounded: keep-alive then poll
        world = apply(world, enabled(world, cfg)[0], cfg).world
    assert unfinished_calls(world, cfg) == []


# -- symmetry ----------------------------------------------------------------------------------
def _hardened(**kw: object) -> ModelConfig:
    return _cfg(variant=spec.HARDENED, **kw)


SYMMETRY_CASES = [
    _cfg(nodes=2, min_nodes=1, max_nodes=2),
    _cfg(nodes=3, min_nodes=2, max_nodes=3, late_starts=True),
    _cfg(nodes=3, min_nodes=2, max_nodes=2, faults=Faults(crash=1)),
    _cfg(nodes=4, min_nodes=3, max_nodes=4),
    _cfg(nodes=3, min_nodes=2, max_nodes=2, skew_ticks=4),
    # The local liveness clock (hardened): each node's first-seen times name other nodes.
    _hardened(nodes=2, min_nodes=2, max_nodes=3, join_ticks=1, last_call_ticks=2),
    _hardened(nodes=3, min_nodes=2, max_nodes=3, late=1, max_rounds=1),
    _hardened(nodes=3, min_nodes=2, max_nodes=3, faults=Faults(crash=1)),
]


def test_variants_with_the_local_liveness_clock_are_searched_with_symmetry(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--nodes", "3", "--min-nodes", "2", "--max-nodes", "3", "--protocol", "hardened"]
    args += ["--max-rounds", "1", "--closes", "0", "--quiet"]
    assert main([*LIGHT_ARGS, *args]) == 0
    reduced = capsys.readouterr().out
    assert main([*LIGHT_ARGS, *args, "--no-symmetry"]) == 0
    full = capsys.readouterr().out
    assert " symmetry=on " in reduced.splitlines()[1]
    assert " symmetry=off " in full.splitlines()[1]
    assert int(_summary(reduced)["unique"]) < int(_summary(full)["unique"])


@pytest.mark.parametrize("cfg", SYMMETRY_CASES)
def test_reduced_and_unreduced_search_agree(cfg: ModelConfig) -> None:
    canon = Canon(cfg)
    full_classes: set[bytes] = set()

    def collect(world: World) -> None:
        full_classes.add(canon.fingerprint(world))

    v_full: list[tuple[Violation, list[Move]]] = []
    v_red: list[tuple[Violation, list[Move]]] = []
    full = explore(
        cfg, symmetry=False, visit=collect, stop_on_violation=False, violations_out=v_full
    )
    reduced = explore(
        cfg, symmetry=True, keep_fingerprints=True, stop_on_violation=False, violations_out=v_red
    )
    assert reduced.fingerprints == full_classes
    assert {v.name for v, _ in v_full} == {v.name for v, _ in v_red}
    assert reduced.unique <= full.unique
    assert canon.fallbacks == 0


# -- exact abstractions of the local liveness records ------------------------------------------
def _forgotten(world: World, cfg: ModelConfig) -> World:
    return dataclasses.replace(
        world, procs=forget_stale_sightings(world.procs, world.store, world.used, cfg)
    )


def _rotated(world: World, cfg: ModelConfig) -> World:
    return rotate_beat_values(world, cfg.beat_modulus)


def _announcement_forgotten(world: World, cfg: ModelConfig) -> World:
    return forget_stale_announcement(world, cfg)


TWO_STORE_FAULTS = _hardened(
    nodes=2,
    min_nodes=2,
    max_nodes=2,
    max_rounds=1,
    closes=0,
    faults=Faults(cas_unknown=1, store_down=1),
)

ABSTRACTION_CASES = [
    # forget_stale_sightings (hardened's sightings of heartbeats in the state)
    pytest.param(
        _hardened(nodes=3, min_nodes=2, max_nodes=3, max_rounds=1, faults=Faults(crash=1)),
        "forget_stale",
        _forgotten,
        id="forget-crash",
    ),
    pytest.param(
        _hardened(
            nodes=2, min_nodes=1, max_nodes=2, closes=0, faults=Faults(crash=1, restart_same=1)
        ),
        "forget_stale",
        _forgotten,
        id="forget-restart-same",
    ),
    pytest.param(
        _hardened(nodes=2, min_nodes=2, max_nodes=2, skew_ticks=2, faults=Faults(cas_unknown=1)),
        "forget_stale",
        _forgotten,
        id="forget-skew-cas-unknown",
    ),
    pytest.param(
        # Two faults can fail a keep-alive's write and then its poll's, so the member
        # idles into the next tick with what it saw now: the sightings of now stay.
        TWO_STORE_FAULTS,
        "forget_stale",
        _forgotten,
        id="forget-two-store-faults",
    ),
    pytest.param(
        # An expiry of one interval: after both faults fail a keep-alive and its poll,
        # the node can find its own heartbeat expired when its next keep-alive is
        # pending; it prunes itself and writes none, so sightings of its value stay.
        dataclasses.replace(TWO_STORE_FAULTS, keep_alive_max_attempt=1),
        "forget_stale",
        _forgotten,
        id="forget-expired-sighting",
    ),
    # rotate_beat_values (scale's heartbeat keys)
    pytest.param(
        _cfg(nodes=2, min_nodes=1, max_nodes=2, variant=spec.SCALE, faults=Faults(crash=1)),
        "rotate_beats",
        _rotated,
        id="rotate-crash",
    ),
    pytest.param(
        _cfg(
            nodes=2,
            min_nodes=1,
            max_nodes=2,
            variant=spec.SCALE,
            max_rounds=1,
            closes=0,
            faults=Faults(crash=1, restart_new=1),
        ),
        "rotate_beats",
        _rotated,
        id="rotate-restart-new",
    ),
    # forget_stale_announcement (scale's record of its latest announcement)
    pytest.param(
        _cfg(nodes=3, min_nodes=2, max_nodes=2, variant=spec.SCALE, max_rounds=1, closes=0),
        "forget_announce",
        _announcement_forgotten,
        id="announce",
    ),
    pytest.param(
        _cfg(
            nodes=2,
            min_nodes=1,
            max_nodes=2,
            variant=spec.SCALE,
            faults=Faults(crash=1, restart_new=1),
        ),
        "forget_announce",
        _announcement_forgotten,
        id="announce-restart",
    ),
]


@pytest.mark.parametrize(("cfg", "knob", "abstract"), ABSTRACTION_CASES)
def test_abstraction_commutes_with_every_move(
    cfg: ModelConfig, knob: str, abstract: Callable[[World, ModelConfig], World]
) -> None:
    """The abstraction is exact: over every world the unabstracted model reaches,
    abstracting before a move or after it gives the same world, the same moves and the
    same violations (so both searches visit the same classes and decide the same)."""
    if knob == "forget_stale":
        off = dataclasses.replace(cfg, forget_stale=False)
    elif knob == "forget_announce":
        off = dataclasses.replace(cfg, forget_announce=False)
    else:
        off = dataclasses.replace(cfg, rotate_beats=False)
    changed, _ = _commutes(cfg, off, abstract)
    assert changed > 0  # the case does reach worlds the abstraction changes


FULL_CHECKS_ENV = "RDZV_FULL_CHECKS"
COMMUTE_STRIDE = 3
"""The commutation checks below visit every world of their spaces but, unless
``RDZV_FULL_CHECKS=1``, check the moves of every third one (in the search's breadth-first
order, which does not depend on the hash seed): the full checks take about 10 minutes of
CPU, too long for every CI run (docs/model_checker.md says how to run them)."""


def _commutes(
    cfg: ModelConfig,
    off: ModelConfig,
    abstract: Callable[[World, ModelConfig], World],
    skip: Callable[[World, Move, World], bool] | None = None,
) -> tuple[int, int]:
    """Over every world ``off`` (``cfg`` without the abstraction) reaches (every
    :data:`COMMUTE_STRIDE`-th unless ``RDZV_FULL_CHECKS=1``), check that
    abstracting before a move or after it gives the same world, the same moves and the
    same violations, except for the moves ``skip`` names. Returns how many worlds the
    abstraction changed and how many moves were skipped."""
    worlds: list[World] = []
    explore(off, symmetry=False, visit=worlds.append, stop_on_violation=False)
    changed = skipped = 0
    stride = 1 if os.environ.get(FULL_CHECKS_ENV) == "1" else COMMUTE_STRIDE
    for world in worlds[::stride]:
        small = abstract(world, off)
        changed += small != world
        moves = enabled(world, off)
        assert enabled(small, cfg) == moves
        for move in moves:
            full, reduced = apply(world, move, off), apply(small, move, cfg)
            if skip is not None and skip(world, move, full.world):
                skipped += 1
                continue
            assert plain_fingerprint(abstract(full.world, off), cfg) == plain_fingerprint(
                reduced.world, cfg
            ), (world, move)
            assert [v.name for v in full.violations] == [v.name for v in reduced.violations]
    return changed, skipped


WATCH_CASE = _cfg(
    nodes=3,
    min_nodes=2,
    max_nodes=3,
    variant=spec.SCALE,
    max_rounds=1,
    closes=0,
    faults=Faults(crash=1),
)
"""The smallest space found where a watch record outlives four beats of its node, so
that the model's counts modulo 4 bring a replaced value back (its search without
:func:`forget_stale_watch` gives 12,452 distinct worlds modulo 4 and 14,180 modulo 16;
with it, 7,150 for both)."""


def _wraps(world: World, move: Move, after: World) -> bool:
    """Whether ``move`` makes a watch record match its node's key again without the
    watcher reading it: the node's count went round the model's modulus while the
    record was stale. Real counts (modulo 2**31) never come back this way."""
    keys, keys_after = dict(world.beats), dict(after.beats)
    for slot, (p, q) in enumerate(zip(world.procs, after.procs, strict=True)):
        if move.kind == "io" and move.slot == slot and p.local.phase is spec.Phase.WATCHING:
            continue
        now = {n: v for n, v, _ in q.local.watch}
        for n, v, _ in p.local.watch:
            if keys.get(n) != v and n in now and keys_after.get(n) == now[n]:
                return True
    return False


def test_forgetting_watch_records_commutes_with_every_move_but_a_wrap() -> None:
    """``forget_stale_watch`` is exact with respect to real heartbeat counts: over every
    world the model reaches without it, forgetting before a move or after it gives the
    same world and the same violations, except for moves where the model's small
    modulus wraps a count back onto a stale record (which real counts never do, and
    which the abstraction rules out: see the next test)."""
    cfg = WATCH_CASE
    assert cfg.forgets_stale_watch
    off = dataclasses.replace(cfg, forget_watch=False)
    changed, wraps = _commutes(cfg, off, forget_stale_watch, skip=_wraps)
    assert changed > 0
    assert wraps > 0  # the case does reach the model's wrap


def test_forgetting_the_watch_records_of_nodes_standing_by_commutes_too() -> None:
    """Nodes standing by for a complete round watch its first participant from their
    join operation (and it watches them): the same exactness holds there. A late
    process stands by on the redundancy list of a full round whose member is alive or
    has crashed. (Also checked, too slow for the suite at 3 minutes: N = 3, min 1, max 2,
    one late process, one crash, one round: 12,282 worlds changed.)"""
    cfg = _cfg(
        nodes=2, min_nodes=1, max_nodes=1, late=1, variant=spec.SCALE, faults=Faults(crash=1)
    )
    assert cfg.forgets_stale_watch
    off = dataclasses.replace(cfg, forget_watch=False)
    watched_standing_by: list[World] = []

    def standing_by_watcher(world: World) -> None:
        state = spec.decode(world.store) if world.store is not None else None
        for p in world.procs:
            standing = state is not None and p.ident in (*state.wait_list, *state.redundancy_list)
            if standing and p.local.op is spec.Op.JOIN and p.local.watch:
                watched_standing_by.append(world)

    explore(off, symmetry=False, visit=standing_by_watcher, stop_on_violation=False)
    assert watched_standing_by  # the case reaches nodes that watch while standing by
    changed, _ = _commutes(cfg, off, forget_stale_watch, skip=_wraps)
    assert changed > 0


def test_with_watch_records_forgotten_the_beat_modulus_changes_nothing() -> None:
    """Once stale watch records are forgotten, no record lives long enough for a count to
    wrap onto it: the search finds as many worlds and the same verdict with heartbeat
    counts modulo 4 (the model's) as modulo 16. Without the abstraction the two differ
    (12,452 and 14,180 worlds), and the rule is off where a count can restart."""
    four = explore(WATCH_CASE, symmetry=False)
    sixteen = explore(dataclasses.replace(WATCH_CASE, beat_modulus=16), symmetry=False)
    kept = explore(dataclasses.replace(WATCH_CASE, forget_watch=False), symmetry=False)
    assert (four.violation, sixteen.violation, kept.violation) == (None, None, None)
    assert four.unique == sixteen.unique < kept.unique
    for off in (
        dataclasses.replace(WATCH_CASE, faults=Faults(crash=1, restart_same=1)),
        dataclasses.replace(WATCH_CASE, duplicate_identity=True),
        dataclasses.replace(WATCH_CASE, variant=spec.HARDENED),
    ):
        assert not off.forgets_stale_watch


VIEW_CASES = [
    dataclasses.replace(TWO_STORE_FAULTS, closes=1),
    _hardened(nodes=3, min_nodes=2, max_nodes=3, max_rounds=1, faults=Faults(crash=1)),
    _cfg(nodes=2, min_nodes=1, max_nodes=2, faults=Faults(cas_unknown=1, store_down=1)),
    _cfg(nodes=2, min_nodes=1, max_nodes=2, faults=Faults(store_down=1), cas_ignores_token=True),
]


@pytest.mark.parametrize("cfg", VIEW_CASES)
def test_views_left_out_of_the_fingerprint_change_no_future(cfg: ModelConfig) -> None:
    """Where ``canon.relevant_view`` leaves a process's view out, replacing that view by
    another (the empty state) changes nothing a move can tell: the same moves, then
    worlds with the same fingerprint and the same violations."""
    worlds: list[World] = []
    explore(cfg, symmetry=False, visit=worlds.append, stop_on_violation=False)
    swapped = 0
    for world in worlds:
        procs = tuple(
            p
            if canon_module.relevant_view(p, world, cfg) or p.local.view == spec.EMPTY_STATE
            else dataclasses.replace(p, local=dataclasses.replace(p.local, view=spec.EMPTY_STATE))
            for p in world.procs
        )
        if procs == world.procs:
            continue
        swapped += 1
        other = dataclasses.replace(world, procs=procs)
        assert plain_fingerprint(other, cfg) == plain_fingerprint(world, cfg)
        moves = enabled(world, cfg)
        assert enabled(other, cfg) == moves
        for move in moves:
            a, b = apply(world, move, cfg), apply(other, move, cfg)
            assert plain_fingerprint(a.world, cfg) == plain_fingerprint(b.world, cfg), (
                world,
                move,
            )
            assert [v.name for v in a.violations] == [v.name for v in b.violations]
    assert swapped > 0


@pytest.mark.parametrize(
    "cfg", [c.values[0] for c in ABSTRACTION_CASES if c.values[1] == "forget_stale"]
)
def test_forgetting_after_a_move_looks_at_what_changed_and_misses_nothing(
    cfg: ModelConfig,
) -> None:
    """A move forgets only in the processes it changed and in entries of nodes whose stored
    heartbeat changed; forgetting over every process and entry afterwards finds nothing
    more, in every world the search reaches (it would find the entries missed)."""
    worlds: list[World] = []
    explore(cfg, symmetry=False, visit=worlds.append, stop_on_violation=False)
    elsewhere = 0
    """Moves that made another process's sighting stale (by writing a heartbeat)."""
    for world in worlds:
        for move in enabled(world, cfg):
            after = apply(world, move, cfg).world
            assert _forgotten(after, cfg) == after, (world, move)
            if move.kind != "tick":
                elsewhere += any(
                    _stale(q) > _stale(p)
                    for slot, (p, q) in enumerate(zip(world.procs, after.procs, strict=True))
                    if slot != move.slot
                )
    assert elsewhere > 0


@pytest.mark.parametrize("forget", [True, False])
def test_a_tick_never_makes_a_replaced_heartbeat_value_equal_again(forget: bool) -> None:
    """Stored heartbeats and sightings are capped at a floor as time passes; a sighting of
    a value the store has replaced must not match it once both sit at the floor (the
    real values stay different), whether or not stale sightings are forgotten."""
    cfg = dataclasses.replace(_hardened(nodes=2, min_nodes=1, max_nodes=2), forget_stale=forget)
    t, expiry = cfg.tick_ms, cfg.settings.heartbeat_expiry
    floor = -expiry - t
    me, gone = node_id(0), node_id(1)
    state = spec.EMPTY_STATE.evolve(
        complete=True,
        participants={me: 0, gone: 1},
        last_heartbeats={me: 0, gone: floor},
    )
    local = spec.Local(
        me,
        view=state,
        token=1,
        synced_at=0,
        seen_beats=((me, 0, 0), (gone, floor + t, -t)),
    )
    world = World(
        spec.encode(state, cfg.variant.name),
        (
            Proc(me, Pc.MEMBER, local, spec.Local(me), beating=True),
            Proc(gone, Pc.CRASHED, spec.Local(gone), spec.Local(gone)),
        ),
        used=(1, 0, 0, 0, 0, 0),
    )
    after = apply(world, Move("tick"), cfg).world
    seen = {n: (v, at) for n, v, at in after.procs[0].local.seen_beats}
    # The keep-alive after the tick read the store: the other node's value differs from
    # the one seen, so its age restarts now (not carried over, so not expired, and not
    # pruned); a sighting of now may then be forgotten.
    assert seen[gone] == ((STALE_SIGHTING, STALE_SIGHTING) if forget else (floor, 0))
    assert gone in spec.decode(after.store or b"").participant_nodes()


def _stale(p: Proc) -> int:
    return sum(v == STALE_SIGHTING for _, v, _ in p.local.seen_beats)


def test_rotating_beat_values_shrinks_the_search_and_is_off_where_inexact() -> None:
    cfg = _cfg(nodes=2, min_nodes=1, max_nodes=2, variant=spec.SCALE, faults=Faults(crash=1))
    assert cfg.rotates_beat_values
    kept = explore(dataclasses.replace(cfg, rotate_beats=False), symmetry=False)
    rotated = explore(cfg, symmetry=False)
    assert rotated.unique < kept.unique
    assert (rotated.violation, kept.violation) == (None, None)
    for off in (
        dataclasses.replace(cfg, faults=Faults(crash=1, restart_same=1)),
        dataclasses.replace(cfg, duplicate_identity=True),
        dataclasses.replace(cfg, variant=spec.HARDENED),
    ):
        assert not off.rotates_beat_values


def test_forgetting_stale_sightings_shrinks_the_search_and_keeps_its_verdict() -> None:
    cfg = _hardened(nodes=3, min_nodes=2, max_nodes=3, faults=Faults(crash=1))
    kept = explore(dataclasses.replace(cfg, forget_stale=False))
    forgot = explore(cfg)
    assert forgot.unique < kept.unique
    assert (forgot.violation, kept.violation) == (None, None)
    for off in (
        dataclasses.replace(cfg, duplicate_identity=True),
        dataclasses.replace(cfg, cas_ignores_token=True),
        dataclasses.replace(cfg, variant=spec.SCALE),
        dataclasses.replace(cfg, variant=spec.UPSTREAM),
    ):
        assert not off.forgets_stale_sightings


def test_the_fingerprints_encode_every_field_of_a_world() -> None:
    for cls in (World, Proc, Returned, spec.Local, RendezvousState):
        names = {f.name for f in dataclasses.fields(cls) if f.compare}
        assert names == ENCODED_FIELDS[cls.__name__], f"{cls.__name__}: update model_check/canon.py"


def _members(state: RendezvousState) -> set[NodeId]:
    return {
        *(n for n, _ in state.participants),
        *state.wait_list,
        *state.redundancy_list,
        *(n for n, _ in state.last_heartbeats),
    }


def identities(world: World) -> list[NodeId]:
    """Every identity ``world`` mentions anywhere, sorted."""
    ids: set[NodeId] = set()
    for p in world.procs:
        for local in (p.local, p.control):
            ids.update((p.ident, local.node), _members(local.view))
            ids.update(n for n, _, _ in local.seen_beats)
    if world.completion is not None:
        ids.update(world.completion.waiting)
    if world.store is not None:
        ids.update(_members(spec.decode(world.store)))
    return sorted(ids)


def _relabel_state(
    state: RendezvousState, mapping: dict[NodeId, NodeId], ranks: bool
) -> RendezvousState:
    return RendezvousState.build(
        round=state.round,
        epoch=state.epoch,
        complete=state.complete,
        closed=state.closed,
        deadline=state.deadline,
        participants={mapping[n]: r if ranks else 0 for n, r in state.participants},
        wait_list=[mapping[n] for n in state.wait_list],
        redundancy_list=[mapping[n] for n in state.redundancy_list],
        last_heartbeats={mapping[n]: t for n, t in state.last_heartbeats},
    )


def relabel(world: World, mapping: dict[NodeId, NodeId], *, ranks: bool = True) -> World:
    """``world`` with every identity ``n`` renamed ``mapping[n]`` everywhere: processes,
    the store, local views and local liveness clocks (re-sorted by node, as the machine
    keeps them). Ranks stay attached to their nodes, or are all set to 0."""
    store = world.store
    if store is not None:
        state, protocol = spec.decode_with_protocol(store)
        assert protocol is not None
        store = spec.encode(_relabel_state(state, mapping, ranks), protocol)

    def lane(local: spec.Local) -> spec.Local:
        return dataclasses.replace(
            local,
            node=mapping[local.node],
            view=_relabel_state(local.view, mapping, ranks),
            seen_beats=tuple(sorted((mapping[n], v, t) for n, v, t in local.seen_beats)),
        )

    procs = []
    for p in world.procs:
        returned = p.returned
        if returned is not None and not ranks:
            returned = dataclasses.replace(returned, rank=0)
        procs.append(
            dataclasses.replace(
                p,
                ident=mapping[p.ident],
                local=lane(p.local),
                control=lane(p.control),
                returned=returned,
            )
        )
    completion = world.completion
    if completion is not None:
        completion = dataclasses.replace(
            completion, waiting=tuple(sorted(mapping[n] for n in completion.waiting))
        )
    return dataclasses.replace(world, store=store, procs=tuple(procs), completion=completion)


def isomorphism_class(world: World, cfg: ModelConfig) -> bytes:
    """By brute force: the smallest unreduced fingerprint over every renaming of the
    identities among themselves and every order of the process slots, ranks erased (what
    the reduced fingerprint is defined to identify)."""
    ids = identities(world)
    best: bytes | None = None
    for image in itertools.permutations(ids):
        renamed = relabel(world, dict(zip(ids, image, strict=True)), ranks=False)
        for procs in itertools.permutations(renamed.procs):
            fp = plain_fingerprint(dataclasses.replace(renamed, procs=procs), cfg)
            best = fp if best is None or fp < best else best
    assert best is not None
    return best


HARDENED_WALKS = [
    _hardened(nodes=3, min_nodes=2, max_nodes=3, late=1, faults=Faults(crash=1)),
    _hardened(
        nodes=3,
        min_nodes=2,
        max_nodes=3,
        late_starts=True,
        faults=Faults(crash=1, restart_new=1, restart_same=1, cas_unknown=1, store_down=1),
    ),
]


@settings(max_examples=100, deadline=None)
@given(
    case=st.sampled_from(range(len(HARDENED_WALKS))),
    choices=st.lists(st.integers(min_value=0, max_value=10_000), min_size=10, max_size=150),
    data=st.data(),
)
def test_hardened_fingerprints_do_not_depend_on_identities(
    case: int, choices: list[int], data: st.DataObject
) -> None:
    """Every world of a random hardened schedule (N = 3, crash, restarts, lost writes,
    late starts) keeps its reduced fingerprint when its identities are renamed by a
    random permutation, onto the same identities or partly onto unused ones."""
    cfg = HARDENED_WALKS[case]
    canon = Canon(cfg)
    world = make_initial(cfg)
    for choice in choices:
        moves = enabled(world, cfg)
        if not moves:
            break
        world = apply(world, moves[choice % len(moves)], cfg).world
        ids = identities(world)
        pool = [node_id(i) for i in range(len(ids) + 2)]
        image = data.draw(st.permutations(pool))[: len(ids)]
        renamed = relabel(world, dict(zip(ids, image, strict=True)))
        assert canon.fingerprint(renamed) == canon.fingerprint(world)
    assert canon.fallbacks == 0


EXACT_CASES = [
    _hardened(nodes=3, min_nodes=3, max_nodes=3, max_rounds=1, closes=0, faults=Faults(crash=1)),
    _hardened(nodes=3, min_nodes=2, max_nodes=3, max_rounds=1, closes=0, late=1),
    _hardened(nodes=2, min_nodes=2, max_nodes=3, join_ticks=1, last_call_ticks=2),
    _cfg(nodes=3, min_nodes=3, max_nodes=3, max_rounds=1, closes=0, faults=Faults(crash=1)),
]


@pytest.mark.parametrize("cfg", EXACT_CASES)
def test_reduced_fingerprints_are_exactly_the_isomorphism_classes(cfg: ModelConfig) -> None:
    """Over every world of a small space, two worlds share a reduced fingerprint if and
    only if one is a renaming of the other (brute force, :func:`isomorphism_class`)."""
    worlds: list[World] = []
    explore(cfg, symmetry=False, visit=worlds.append, stop_on_violation=False)
    canon = Canon(cfg)
    class_of: dict[bytes, bytes] = {}
    fingerprint_of: dict[bytes, bytes] = {}
    for world in worlds:
        fp, cls = canon.fingerprint(world), isomorphism_class(world, cfg)
        assert class_of.setdefault(fp, cls) == cls, "non-isomorphic worlds merged"
        assert fingerprint_of.setdefault(cls, fp) == fp, "isomorphic worlds kept apart"
    assert len(class_of) < len(worlds)
    if cfg.variant.liveness_clock == spec.LOCAL:
        assert any(p.local.seen_beats for world in worlds for p in world.procs)


@pytest.mark.parametrize(
    ("cfg", "golden"),
    [
        (_cfg(nodes=2, min_nodes=1, max_nodes=2), 32),
        (_cfg(nodes=3, min_nodes=2, max_nodes=3), 79),
    ],
)
def test_golden_unique_counts_are_the_isomorphism_classes(cfg: ModelConfig, golden: int) -> None:
    """The first two golden counts (``--nodes 2``; ``--nodes 3 --min-nodes 2``), derived
    without the canonicaliser: the number of brute-force isomorphism classes among the
    worlds of the unreduced search, which the reduced search must equal."""
    worlds: list[World] = []
    explore(cfg, symmetry=False, visit=worlds.append, stop_on_violation=False)
    classes = {isomorphism_class(world, cfg) for world in worlds}
    assert len(classes) == explore(cfg).unique == golden
    assert len(classes) < len(worlds)


def _ring(successor: list[int], values: list[int]) -> World:
    """Processes that differ only in whose heartbeat each has seen: process i has seen
    process successor[i]'s heartbeat value values[i], since the same instant."""
    procs = []
    for i, (j, value) in enumerate(zip(successor, values, strict=True)):
        me = node_id(i)
        local = spec.Local(
            me,
            phase=spec.Phase.READING,
            op=spec.Op.JOIN,
            seen_beats=((node_id(j), value, -5000),) if j != i else (),
        )
        procs.append(Proc(me, Pc.RDZV, local, spec.Local(me)))
    return World(None, tuple(procs))


RING_CFG = _hardened(nodes=5, min_nodes=2, max_nodes=5)


def _ring_class(world: World) -> bytes:
    # Each process holds its own identity: sorting the slots by identity after a renaming
    # is the only slot order to try.
    ids = identities(world)
    best: bytes | None = None
    for image in itertools.permutations(ids):
        renamed = relabel(world, dict(zip(ids, image, strict=True)))
        procs = tuple(sorted(renamed.procs, key=lambda p: p.ident))
        fp = plain_fingerprint(dataclasses.replace(renamed, procs=procs), RING_CFG)
        best = fp if best is None or fp < best else best
    assert best is not None
    return best


def test_ties_that_are_no_symmetry_are_searched() -> None:
    # A 6-cycle and two 3-cycles of "has seen": colour refinement alone cannot tell the
    # processes (or the two worlds) apart, and no swap of two processes is a symmetry.
    canon = Canon(_hardened(nodes=6, min_nodes=2, max_nodes=6))
    six = _ring([1, 2, 3, 4, 5, 0], [7] * 6)
    three = _ring([1, 2, 0, 4, 5, 3], [7] * 6)
    assert canon.fingerprint(six) != canon.fingerprint(three)
    assert canon.permuted == 2
    ids = identities(six)
    for image in ([5, 3, 1, 0, 2, 4], [1, 0, 3, 2, 5, 4]):
        mapping = {n: ids[j] for n, j in zip(ids, image, strict=True)}
        assert canon.fingerprint(relabel(six, mapping)) == canon.fingerprint(six)
        assert canon.fingerprint(relabel(three, mapping)) == canon.fingerprint(three)


def test_a_search_cut_short_is_counted_and_still_tells_worlds_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(canon_module, "MAX_LEAVES", 1)
    canon = Canon(_hardened(nodes=6, min_nodes=2, max_nodes=6))
    six = _ring([1, 2, 3, 4, 5, 0], [7] * 6)
    three = _ring([1, 2, 0, 4, 5, 3], [7] * 6)
    assert canon.fingerprint(six) != canon.fingerprint(three)
    assert canon.fallbacks == 2


def test_a_cached_fingerprint_is_reused_and_still_tells_worlds_apart() -> None:
    cfg = _hardened(nodes=3, min_nodes=2, max_nodes=3)
    canon = Canon(cfg)
    world = _ring([1, 2, 0], [7] * 3)
    fp = canon.fingerprint(world)
    assert canon.fingerprint(world) == fp == canon.fingerprint(dataclasses.replace(world))
    assert canon.calls == 1  # searched once: the equal worlds hit the cache
    others = [
        dataclasses.replace(world, used=(1, 0, 0, 0, 0, 0)),
        dataclasses.replace(world, closes=1),
        _ring([1, 2, 0], [7, 7, 6]),
    ]
    fps = [canon.fingerprint(w) for w in others]
    assert len({fp, *fps}) == 4
    assert canon.calls == 4
    assert fps == [Canon(cfg).fingerprint(w) for w in others]


ring = st.tuples(
    st.lists(st.integers(min_value=0, max_value=4), min_size=5, max_size=5),
    st.lists(st.integers(min_value=0, max_value=1), min_size=5, max_size=5),
)


@settings(max_examples=60, deadline=None)
@given(a=ring, b=ring, image=st.permutations(range(5)))
def test_ring_fingerprints_are_exactly_the_isomorphism_classes(
    a: tuple[list[int], list[int]], b: tuple[list[int], list[int]], image: list[int]
) -> None:
    canon = Canon(RING_CFG)
    first, second = _ring(*a), _ring(*b)
    same = canon.fingerprint(first) == canon.fingerprint(second)
    assert same == (_ring_class(first) == _ring_class(second))
    # The same structure under other names, so the "same" side is exercised as well.
    mapping = {node_id(i): node_id(j) for i, j in enumerate(image)}
    assert canon.fingerprint(relabel(first, mapping)) == canon.fingerprint(first)


def test_symmetry_reduces_for_more_nodes() -> None:
    cfg = _cfg(nodes=4, min_nodes=3, max_nodes=4)
    assert explore(cfg).unique < explore(cfg, symmetry=False).unique


# -- random schedules ----------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    choices=st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=120),
    nodes=st.integers(min_value=2, max_value=5),
    crash=st.integers(min_value=0, max_value=1),
)
def test_random_schedules_keep_every_invariant(choices: list[int], nodes: int, crash: int) -> None:
    """Random interleavings (fault-free or with a crash and restarts, no clock skew) of
    upstream never violate a spec invariant on any stored state or write."""
    cfg = ModelConfig(
        nodes=nodes,
        min_nodes=max(1, nodes - 1),
        max_nodes=nodes,
        late_starts=True,
        faults=Faults(crash=crash, restart_new=crash, store_down=1, cas_unknown=1),
    )
    world = make_initial(cfg)
    for choice in choices:
        moves = enabled(world, cfg)
        if not moves:
            break
        out = apply(world, moves[choice % len(moves)], cfg)
        spec_names = {inv.name for inv in spec.STATE_INVARIANTS} | {
            inv.name for inv in spec.STEP_INVARIANTS
        }
        assert not [v for v in out.violations if v.name in spec_names], out.violations
        world = out.world
        if world.store is not None:
            assert spec.check_state(spec.decode(world.store), cfg.settings) == []


# -- the command line ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["--nodes", "0"],
        ["--nodes", "2000", "--mode", "random"],
        ["--protocol", "nope"],
        ["--min-nodes", "3", "--max-nodes", "2", "--nodes", "3"],
        ["--crash", "-1"],
        ["--bogus"],
        ["--workers", "2"],
    ],
)
def test_bad_usage_is_one_line_and_exit_2(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("model_check: error:")


def test_output_format(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*LIGHT_ARGS, "--nodes", "2", "--quiet"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith(
        "model_check checks protocol upstream (the default of --protocol: torch's own protocol"
    )
    assert lines[1].startswith("model_check protocol=upstream nodes=2 min_nodes=1 max_nodes=2")
    for knob in ("seed=", "tick=", "join=", "faults=", "max_rounds=", "symmetry=on"):
        assert knob in lines[1]
    assert re.fullmatch(r"states=\d+ unique=\d+ depth=\d+ sec=[\d.]+ result=holds", lines[-1])


def test_bound_is_reported_not_silent(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "--nodes",
            "3",
            "--min-nodes",
            "2",
            "--max-nodes",
            "3",
            "--late-starts",
            "--max-states",
            "50",
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert code == 3
    assert "BOUND REACHED" in out and "result=bounded" in out


def test_json_output(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    code = main(
        [
            "--nodes",
            "2",
            "--min-nodes",
            "2",
            "--max-nodes",
            "2",
            "--skew",
            "4",
            "--json",
            "--trace-out",
            str(trace),
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    assert doc["violation"]["name"] == "live_node_evicted"
    assert doc["replay"] == f"python -m model_check --replay {trace}"
    assert (
        main(
            [*LIGHT_ARGS, "--mode", "random", "--nodes", "8", "--steps", "50", "--json", "--quiet"]
        )
        == 0
    )
    walk = json.loads(capsys.readouterr().out)
    assert walk["violation"] is None and walk["states"] == 50


def test_replay_rejects_a_foreign_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "other"}')
    assert main(["--replay", str(bad)]) == 2
    assert "is not a" in capsys.readouterr().err


def test_prove_dispatches_lazily(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[list[str]] = []
    fake = types.ModuleType("model_check.prove")

    def fake_main(argv: list[str]) -> int:
        calls.append(argv)
        return 7

    fake.main = fake_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "model_check.prove", fake)
    assert main(["prove", "--x", "y"]) == 7
    assert calls == [["--x", "y"]]


def test_keep_going_lists_every_violated_property(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Clock skew also breaks agreement: the fast node prunes its peer locally and returns a
    # smaller world size than the peer got for the same round.
    args = ["--nodes", "2", "--min-nodes", "2", "--max-nodes", "2", "--skew", "4", "--quiet"]
    assert main([*LIGHT_ARGS, *args, "--keep-going", "--trace-out", str(tmp_path / "t.json")]) == 1
    out = capsys.readouterr().out
    assert "VIOLATION live_node_evicted" in out
    assert "also violated: world_size_agreement" in out
