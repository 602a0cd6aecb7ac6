"""The ``monitor`` workload: torch's agent polls at every monitor interval.

torch's agent polls ``num_nodes_waiting()`` once per ``monitor_interval`` (0.1 s by
default) while its workers run, far more often than the keep-alive interval a tick stands
for. The ``agent`` workload lets a member go any number of ticks without polling while its
heartbeat thread keeps it alive, which no real agent does; ``monitor`` keeps every
interleaving of polls but holds time back until every member has polled since the last
tick.
"""

from __future__ import annotations

import pytest

import spec
from model_check.explore import explore
from model_check.model import enabled
from model_check.world import AGENT_WORKLOAD, MONITOR_WORKLOAD, ModelConfig, Move, Pc, World

SMALL = {"nodes": 2, "min_nodes": 2, "max_nodes": 2, "closes": 0, "max_rounds": 2}


def _ticks_owing_a_poll(workload: str) -> tuple[int, int]:
    """Over every world of a small space: how many enable a tick while a member has not
    polled since the last tick, and how many worlds have such a member at all."""
    cfg = ModelConfig(variant=spec.SCALE, workload=workload, **SMALL)  # type: ignore[arg-type]
    owing_tick = owing = 0

    def visit(world: World) -> None:
        nonlocal owing_tick, owing
        if any(p.pc is Pc.MEMBER and not p.polled for p in world.procs):
            owing += 1
            if Move("tick") in enabled(world, cfg):
                owing_tick += 1

    result = explore(cfg, visit=visit)
    assert result.violation is None and not result.truncated
    return owing_tick, owing


def test_time_waits_for_every_member_to_poll() -> None:
    owing_tick, owing = _ticks_owing_a_poll(MONITOR_WORKLOAD)
    assert owing > 0  # members do owe polls in this space
    assert owing_tick == 0


def test_the_agent_workload_lets_a_member_skip_polls_across_ticks() -> None:
    """The contrast: under ``agent``, time advances past members that never polled."""
    owing_tick, _ = _ticks_owing_a_poll(AGENT_WORKLOAD)
    assert owing_tick > 0


@pytest.mark.parametrize("variant", [spec.HARDENED, spec.SCALE], ids=["hardened", "scale"])
def test_the_protocols_hold_under_the_monitor_workload(variant: spec.Variant) -> None:
    cfg = ModelConfig(variant=variant, workload=MONITOR_WORKLOAD, **SMALL)  # type: ignore[arg-type]
    result = explore(cfg)
    assert result.violation is None and not result.truncated
