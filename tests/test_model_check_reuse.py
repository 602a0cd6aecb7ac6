"""The checker on a reused run id (issue 26, item 1): agents of the next job under the
same run id (``ModelConfig.next_job``, ``--next-job K``) call next_rendezvous once a
shutdown was called, while the closed job's agents shut down, train or rejoin.

``jobs_never_mix`` fails when a newcomer reopens the closed run while a member of the
closed job is still listed there, or when a node of one job returns a round of another.
``hardened`` holds; the two planted variants below each lose one of the rows that make it
hold, and the checker finds each (the real-process tests are tests/test_run_reuse.py and
the torchrun ones in tests/test_torchrun.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import spec
from model_check.__main__ import main
from model_check.explore import Result, explore
from model_check.model import enabled, initial_world
from model_check.planted import PLANTED
from model_check.world import JOBS_NEVER_MIX, ModelConfig


def _run(protocol: str, **extra: Any) -> Result:
    variant = PLANTED[protocol] if protocol.startswith("planted-") else spec.get_variant(protocol)
    cfg = ModelConfig(nodes=3, min_nodes=2, max_nodes=2, variant=variant, next_job=1)
    return explore(dataclasses.replace(cfg, **extra))


def test_reopening_under_a_training_member_is_found() -> None:
    r = _run("planted-reopen-under-members")
    assert r.violation is not None and r.violation.name == JOBS_NEVER_MIX
    assert "a member of the closed job still listed there" in r.violation.message
    kinds = [m.kind for m in r.path]
    assert "shutdown" in kinds and kinds.count("start") == 3
    assert len(kinds) <= 10


def test_a_node_of_the_closed_job_joining_the_new_one_is_found() -> None:
    # The shortest run: a member leaves its round, the other shuts the run down and
    # leaves it, the newcomer reopens it before the first one's join writes, and that
    # one (its compare-and-set lost) joins the new job's round.
    r = _run("planted-reopen-forgets-job", workload="ticks")
    assert r.violation is not None and r.violation.name == JOBS_NEVER_MIX
    assert "returned round" in r.violation.message
    assert "fail_worker" in [m.kind for m in r.path]


def test_hardened_keeps_the_jobs_apart() -> None:
    r = _run("hardened", workload="ticks")
    assert r.violation is None and not r.truncated
    assert r.unique > 1_000  # the next job's agent really ran: see the next test


def test_the_next_jobs_agents_start_only_after_a_shutdown() -> None:
    cfg = ModelConfig(nodes=3, min_nodes=2, max_nodes=2, variant=spec.HARDENED, next_job=1)
    world = initial_world(cfg)
    starts = [m.slot for m in enabled(world, cfg) if m.kind == "start"]
    assert starts == [0, 1]  # slot 2 waits for the first job's shutdown
    assert world.procs[2].next_job and world.procs[2].late


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--nodes", "2", "--next-job", "3"], "--next-job 3 must be in 0..--nodes 2"),
        (["--nodes", "2", "--next-job", "-1"], "--next-job -1 must be in 0..--nodes 2"),
        (["--nodes", "2", "--next-job", "1", "--closes", "0"], "--next-job needs --closes >= 1"),
    ],
)
def test_bad_next_job_flags_are_clear_errors(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--protocol", "hardened"]) == 2
    assert expected in capsys.readouterr().err
