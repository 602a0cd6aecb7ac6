"""The model checker's node and the real handler's node take the same steps.

Each test replays model walks through real handlers in lockstep (tests/lockstep.py): one
``memory://`` store, a fake clock per process, every fault the checker injects. A
divergence names the move, the process, the machine state and what each side did.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from lockstep import Lockstep, LockstepDivergence, leaf_paths

import rdzv.driver
import rdzv.handler
import spec
from model_check.__main__ import _parser, build_config, load_trace, main
from model_check.model import _shift_state
from model_check.world import Faults, ModelConfig
from rdzv.backend import RendezvousBackend
from spec import RendezvousState

EVERY_FAULT = Faults(crash=1, restart_new=1, restart_same=1, cas_unknown=2, store_down=2)
SHAPES = ((1, 1, 1), (2, 1, 2), (2, 2, 2), (3, 2, 3), (3, 2, 2), (4, 2, 3))
"""(nodes, min_nodes, max_nodes) of the random walks."""
EXTRAS: tuple[dict[str, Any], ...] = (
    {},
    {"skew_ticks": 2},
    {"late": 1},
    {"late_starts": True},
    {"next_job": 1, "late": 1},
    {"closes": 2, "worker_failures": 2, "max_rounds": 3},
    {"store_outage": True},
    {"duplicate_identity": True},
)
"""What else varies between the random walks: skew, late and next-job processes, more
rounds, store-wide outages, a shared identity."""
WALK_MOVES = 150
SEEDS = 2


def _walk_all(variant: spec.Variant, workload: str) -> Counter[str]:
    rows: Counter[str] = Counter()
    for (n, lo, hi), extra, seed in itertools.product(SHAPES, EXTRAS, range(SEEDS)):
        if extra.get("late", 0) >= n or (extra.get("duplicate_identity") and n < 2):
            continue
        cfg = ModelConfig(
            nodes=n,
            min_nodes=lo,
            max_nodes=hi,
            variant=variant,
            workload=workload,
            faults=EVERY_FAULT,
            **extra,
        )
        walk = Lockstep(cfg)
        walk.random_walk(seed, WALK_MOVES)
        rows.update(walk.rows)
    return rows


@pytest.mark.parametrize("workload", ["agent", "monitor", "ticks"])
@pytest.mark.parametrize("variant", [spec.UPSTREAM, spec.TORCH_213, spec.HARDENED, spec.SCALE])
def test_random_walks_with_every_fault_take_the_same_steps(
    variant: spec.Variant, workload: str
) -> None:
    rows = _walk_all(variant, workload)
    # The walks reach the decisions that matter: a round completes and a node finishes.
    actions = {name.split(".")[0] for name in rows}
    assert {"exit", "join"} <= actions
    assert sum(rows.values()) > 1000


def _tables(variant: spec.Variant) -> set[str]:
    return {t.qualified(i) for t in variant.tables.values() for i in range(len(t.rows))}


def _space_rows(cfg: ModelConfig) -> tuple[int, set[str], set[str]]:
    """How many leaf paths the space has, the rows the checker's moves take in it, and
    the rows the real handlers took replaying the paths."""
    checker: set[str] = set()
    leaves = leaf_paths(cfg, limit=20_000, rows=checker)
    rows: Counter[str] = Counter()
    for path in leaves:
        walk = Lockstep(cfg)
        walk.walk(path)
        rows.update(walk.rows)
    return len(leaves), checker, set(rows)


SPACES = {
    "upstream": ModelConfig(nodes=2, min_nodes=1, max_nodes=2, variant=spec.UPSTREAM),
    "hardened": ModelConfig(nodes=2, min_nodes=1, max_nodes=2, variant=spec.HARDENED),
}
"""Spaces small enough to replay every world of on real handlers (the checker's default
bounds, torch's agent workload, N = 2)."""


@pytest.mark.parametrize("name", sorted(SPACES))
def test_every_world_of_a_small_space_is_reached_by_real_handlers(name: str) -> None:
    """Every world the checker reaches at N = 2 (default bounds, agent workload) lies on
    a replayed path, and the real handlers take every step of every such path."""
    leaves, checker, real = _space_rows(SPACES[name])
    assert leaves > 1000
    # Every row any move of the space takes (tree edge or not) was taken by the real
    # handlers too, and only rows of the variant's tables.
    assert real == checker
    assert real <= _tables(SPACES[name].variant)


def test_a_checker_counterexample_replays_on_real_handlers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.json"
    assert main(["--nodes", "3", "--quiet", "--trace-out", str(trace)]) == 1
    capsys.readouterr()
    argv, violation, moves = load_trace(trace)
    assert violation == "world_size_agreement"
    cfg, _ = build_config(_parser().parse_args(argv), replaying=True)
    walk = Lockstep(cfg)
    walk.walk(moves)
    # The real nodes returned what the model's did: two of them the same round with
    # different world sizes (torch's protocol's failure, on real handlers).
    assert walk.moves == len(moves)
    sizes: dict[int, set[int]] = {}
    for _, round_, _, world_size in walk.returns:
        sizes.setdefault(round_, set()).add(world_size)
    assert any(len(got) > 1 for got in sizes.values()), walk.returns


def test_a_tick_keeps_the_epoch_of_a_reopened_run() -> None:
    """Lockstep's first finding: the model's tick rebuilt the state and dropped its epoch,
    so a run reopened by a new job fell back to the closed job's epoch a tick later."""
    cfg = ModelConfig(nodes=2, variant=spec.HARDENED)
    state = RendezvousState(
        round=2, epoch=1, deadline=0, last_heartbeats=((spec.NodeId("n", 0, 0), 0),)
    )
    shifted = _shift_state(state, cfg, 0)
    assert shifted.epoch == 1
    assert shifted.deadline == -cfg.tick_ms


def _first_divergence(variant: spec.Variant, seeds: int = 40) -> str:
    for (n, lo, hi), seed in itertools.product(((2, 1, 2), (3, 2, 3)), range(seeds)):
        cfg = ModelConfig(nodes=n, min_nodes=lo, max_nodes=hi, variant=variant)
        try:
            Lockstep(cfg).random_walk(seed, WALK_MOVES)
        except LockstepDivergence as exc:
            return str(exc)
    return ""


def test_a_handler_that_beats_a_constant_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _first_divergence(spec.SCALE) == ""

    serve_on = rdzv.driver.serve_on

    def beat_zero(
        backend: RendezvousBackend,
        node: spec.NodeId,
        request: spec.ServedRequest,
        now: Callable[[], spec.Now],
    ) -> spec.ServedEvent:
        if isinstance(request, spec.Beat):
            request = spec.Beat(b"0")
        return serve_on(backend, node, request, now)

    monkeypatch.setattr(rdzv.driver, "serve_on", beat_zero)
    found = _first_divergence(spec.SCALE)
    assert "heartbeat key holds" in found
    assert "in the model but b'0' in the real store" in found


def test_a_handler_whose_queries_ignore_the_join_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planted handler bug of failure 3 (an operation of one machine state started
    without what the other one knows): the real node's control machine state decides
    otherwise than the model's."""
    assert _first_divergence(spec.HARDENED) == ""

    def stale(
        op: spec.Op, deadline: int, now: spec.Now, peer: spec.Local, control: bool
    ) -> spec.StartOp:
        return spec.start_event(op, deadline, now, peer, control, share_views=False)

    monkeypatch.setattr(rdzv.handler, "start_event", stale)
    found = _first_divergence(spec.HARDENED)
    assert found.startswith("move ")
    assert "control machine state" in found
    assert "the real node took row" in found
