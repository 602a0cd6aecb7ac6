"""The checker serves exactly the store requests the machine emits.

Each case plants a bug in the node machine's own code (``spec.machine``), not in a table:
the node then asks the store for something its state does not imply. The checker must
report it as ``requests_served_as_sent`` with a replayable counterexample, rather than
serve the request it would have expected and stay green (issue 23: a machine whose every
heartbeat carries ``b"0"`` once left ``python -m model_check --protocol scale`` passing,
while a real handler with that bug evicts live nodes).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import spec
import spec.machine
from model_check.explore import explore, replay
from model_check.world import REQUESTS_SERVED, ModelConfig
from spec import NodeId, RendezvousState

LIGHT: dict[str, object] = {"workload": "ticks", "worker_failures": 0}


def _beat_zero(local: spec.Local, config: spec.Config) -> int:
    """Planted: every heartbeat value is 0 (peers see it never change)."""
    return 0


def _watch_nobody(view: RendezvousState, node: NodeId) -> tuple[NodeId, ...]:
    """Planted: a node reads no peer's heartbeat key."""
    return ()


def _encode_next_round(state: RendezvousState, protocol: str) -> bytes:
    """Planted: the bytes a compare-and-set carries are of the next round, not the view."""
    return spec.encode(state.evolve(round=state.round + 1), protocol)


def _announce_as_other(node: NodeId) -> bytes:
    """Planted: a node announces (and withdraws) itself under another name."""
    return spec.encode_node(NodeId(node.addr, node.pid + 1000, node.local_id))


CASES: list[tuple[str, Callable[..., object], spec.Variant]] = [
    ("next_beat", _beat_zero, spec.SCALE),
    ("watched", _watch_nobody, spec.SCALE),
    ("encode", _encode_next_round, spec.HARDENED),
    ("encode_node", _announce_as_other, spec.SCALE),
]


def _config(variant: spec.Variant) -> ModelConfig:
    return ModelConfig(nodes=2, min_nodes=2, max_nodes=2, variant=variant, **LIGHT)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "planted", "variant"), CASES, ids=[c[0] for c in CASES])
def test_a_request_the_machine_did_not_mean_is_caught(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    planted: Callable[..., object],
    variant: spec.Variant,
) -> None:
    cfg = _config(variant)
    monkeypatch.setattr(spec.machine, name, planted)
    result = explore(cfg)
    assert result.violation is not None
    assert result.violation.name == REQUESTS_SERVED, result.violation
    steps, _ = replay(cfg, result.path)
    assert REQUESTS_SERVED in {v.name for v in steps[-1][1].violations}


@pytest.mark.parametrize("variant", [spec.SCALE, spec.HARDENED], ids=["scale", "hardened"])
def test_the_unplanted_machine_sends_what_the_checker_serves(variant: spec.Variant) -> None:
    """The same configurations without a planted bug hold: the check is not a false alarm."""
    result = explore(_config(variant))
    assert result.violation is None
    assert not result.truncated
