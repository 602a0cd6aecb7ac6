"""A pause with a store request in flight (``--pause``): time passes between a node's
read and the write it decided on it, as SIGSTOP, a GC or a VM stall would make it.

Without the fault a tick is enabled only when no process can move, so no time ever
passes with a request pending; with it, ``pause_tick`` lets one tick pass over every
request in flight, and the paused write may still land afterwards with the decision made
before the tick (docs/model_checker.md, "Store semantics")."""

from __future__ import annotations

import dataclasses
from collections import deque

import pytest

import spec
from model_check.__main__ import main
from model_check.explore import FAULT_MOVES, explore
from model_check.model import _lane_in_flight, apply, enabled, initial_world
from model_check.world import Faults, ModelConfig, Move, World


def _cfg(protocol: str = "hardened", pause: int = 1) -> ModelConfig:
    return ModelConfig(
        nodes=2,
        min_nodes=1,
        max_nodes=2,
        variant=spec.get_variant(protocol),
        faults=Faults(pause=pause),
        workload="ticks",
        worker_failures=0,
        closes=0,
    )


def _in_flight(world: World) -> bool:
    return any(_lane_in_flight(p) for p in world.procs)


@pytest.mark.parametrize("protocol", ["hardened", "scale"])
def test_without_the_fault_no_time_passes_with_a_request_in_flight(protocol: str) -> None:
    cfg = _cfg(protocol, pause=0)
    seen = {"in_flight": 0}

    def visit(world: World) -> None:
        if _in_flight(world):
            seen["in_flight"] += 1
            kinds = {m.kind for m in enabled(world, cfg)}
            assert not kinds & {"tick", "pause_tick"}, kinds

    assert explore(cfg, visit=visit).violation is None
    assert seen["in_flight"] > 0


def _path_to_a_write_after_a_pause(cfg: ModelConfig, depth: int) -> list[Move] | None:
    """A shortest run in which a compare-and-set that was in flight across a
    ``pause_tick`` lands afterwards."""
    queue: deque[tuple[World, list[Move], frozenset[int]]] = deque(
        [(initial_world(cfg), [], frozenset())]
    )
    for _ in range(200_000):  # breadth first, bounded
        if not queue:
            break
        world, path, paused = queue.popleft()
        if len(path) >= depth:
            continue
        for move in enabled(world, cfg):
            out = apply(world, move, cfg)
            held = paused
            if move.kind == "pause_tick":
                held = frozenset(
                    slot
                    for slot, p in enumerate(world.procs)
                    if p.local.phase is spec.Phase.WRITING
                )
            elif move.kind == "io" and move.slot in paused:
                if any(note.startswith("store <-") for note in out.notes):
                    return [*path, move]
                held = paused - {move.slot}
            queue.append((out.world, [*path, move], held))
    return None


def test_a_paused_write_lands_after_the_tick_with_the_decision_made_before_it() -> None:
    cfg = _cfg("hardened")
    path = _path_to_a_write_after_a_pause(cfg, depth=6)
    assert path is not None
    kinds = [m.kind for m in path]
    assert "pause_tick" in kinds and "tick" not in kinds
    world = initial_world(cfg)
    for move in path:
        world = apply(world, move, cfg).world
    assert world.used[5] == 1  # the budget is spent
    assert "pause_tick" not in {m.kind for m in enabled(world, cfg)}


def test_the_fault_is_a_fault_and_turns_off_the_abstractions_that_assume_urgency() -> None:
    assert "pause_tick" in FAULT_MOVES
    cfg = _cfg("hardened")
    assert not cfg.forgets_stale_sightings
    assert _cfg("hardened", pause=0).forgets_stale_sightings
    assert not _cfg("scale").forgets_stale_watch and not _cfg("scale").rotates_beat_values
    # It adds worlds: runs the urgent scheduler cannot take.
    assert explore(cfg).unique > explore(_cfg("hardened", pause=0)).unique


def test_the_cli_names_the_fault_and_refuses_a_bad_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--nodes", "2", "--protocol", "hardened", "--workload", "ticks", "--pause", "1"]
    code = main([*argv, "--worker-failures", "0", "--closes", "0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "faults: pause 1" in out.splitlines()[0]
    assert "pause=1" in out
    assert main(["--nodes", "2", "--pause", "-1"]) == 2
    assert "--pause" in capsys.readouterr().err


def test_a_paused_node_is_no_live_node_wrongly_evicted() -> None:
    """Paused across ticks, a member's keep-alive can time out and its heartbeat expire:
    its eviction is then right, not ``live_node_evicted`` (as after a failed store call).
    Two pauses of both members' keep-alives outlast the expiry here (3 ticks)."""
    cfg = dataclasses.replace(_cfg("hardened", pause=2), min_nodes=2, max_nodes=2)
    result = explore(cfg)
    assert result.violation is None, result.violation
    queue: deque[World] = deque([initial_world(cfg)])
    checked = 0
    for _ in range(50_000):  # breadth first, bounded
        if not queue or checked:
            break
        world = queue.popleft()
        for move in enabled(world, cfg):
            after = apply(world, move, cfg).world
            if move.kind == "pause_tick" and any(p.beating for p in world.procs):
                for before, now in zip(world.procs, after.procs, strict=True):
                    if _lane_in_flight(before):
                        assert not now.beating
                checked += 1
            queue.append(after)
    assert checked
