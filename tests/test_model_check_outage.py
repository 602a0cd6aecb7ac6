"""A store-wide outage longer than the heartbeat expiry, in the model checker (issue 26).

``--store-outage`` turns the ``--store-down`` budget into instants of an outage of the
whole store: each fails every pending store call at once, and strikes only when every
member's keep-alive is pending, so that consecutive ones (a tick apart) keep every
heartbeat out of the store for longer than the expiry (3 ticks here). Since nobody's
silence is its own, ``live_node_evicted`` is not excused as it is for one node's failed
call. The rule of spec's node machine that a failed call forgets the heartbeat sightings
(``docs/protocol.md``, "Failures forget the sightings") is what makes it hold; with the
rule undone (the machine as before issue 26) the checker finds the eviction.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import spec
from model_check.__main__ import main
from model_check.explore import Result, explore
from model_check.world import LIVE_NODE_EVICTED, Faults, ModelConfig
from spec.machine import evolve


def _run(protocol: str, workload: str = "ticks", **extra: Any) -> Result:
    cfg = ModelConfig(
        nodes=2,
        min_nodes=2,
        max_nodes=2,
        variant=spec.get_variant(protocol),
        faults=Faults(store_down=4),
        store_outage=True,
        closes=0,
        worker_failures=0,
        workload=workload,
    )
    # Under scale who watches whom follows the order of the identities: no symmetry
    # reduction (as the CLI decides).
    return explore(dataclasses.replace(cfg, **extra), symmetry=protocol != "scale")


@pytest.fixture
def without_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node machine as before issue 26: a failed call keeps the sightings."""
    real = spec.step

    def step(local: spec.Local, event: spec.Event, config: spec.Config) -> spec.Step:
        result = real(local, event, config)
        if isinstance(event, spec.IoFailed):
            kept = evolve(result.local, seen_beats=local.seen_beats, watch=local.watch)
            result = dataclasses.replace(result, local=kept)
        return result

    monkeypatch.setattr(spec, "step", step)


@pytest.mark.parametrize(("protocol", "unique"), [("hardened", 235), ("scale", 1093)])
def test_no_live_member_is_evicted_after_an_outage_longer_than_the_expiry(
    protocol: str, unique: int
) -> None:
    r = _run(protocol)
    assert r.violation is None and not r.truncated
    assert r.unique == unique


@pytest.mark.parametrize("protocol", ["hardened", "scale"])
@pytest.mark.usefixtures("without_the_rule")
def test_without_the_rule_the_first_read_after_the_outage_evicts_a_live_member(
    protocol: str,
) -> None:
    r = _run(protocol)
    assert r.violation is not None and r.violation.name == LIVE_NODE_EVICTED
    kinds = [m.kind for m in r.path]
    # Three outages on consecutive ticks: every heartbeat stays out for 3 ticks, the
    # expiry; after the next tick the first keep-alive to read prunes its peer.
    assert kinds.count("store_outage") == 3
    assert kinds[-1] != "store_outage"


@pytest.mark.usefixtures("without_the_rule")
def test_without_the_rule_torchs_agent_workload_finds_it_too() -> None:
    r = _run("hardened", workload="agent")
    assert r.violation is not None and r.violation.name == LIVE_NODE_EVICTED


def test_upstream_judges_heartbeats_by_the_wall_clock_and_still_evicts() -> None:
    # Documented in docs/handler.md: the rule is one of the local liveness clock.
    r = _run("upstream")
    assert r.violation is not None and r.violation.name == LIVE_NODE_EVICTED


def test_the_cli_runs_it_and_names_it_in_the_first_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = "--protocol hardened --nodes 2 --min-nodes 2 --max-nodes 2 --store-down 4"
    argv += " --store-outage --workload ticks --worker-failures 0 --closes 0"
    assert main(argv.split()) == 0
    out = capsys.readouterr().out
    assert "store_outage=yes" in out and "result=holds" in out
    assert "store-down as instants of a store-wide outage" in out
