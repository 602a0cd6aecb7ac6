"""The handler's invariant checks (``RDZV_CHECK_INVARIANTS=1``, on in every test run).

With the flag on, a node checks :mod:`spec.invariants` on every state it reads and on
every state it is about to write, and raises :class:`RendezvousStateError` before a bad
write reaches the store. Here a store holds a state that breaks an invariant, and a
machine bug (planted in ``spec.machine``'s encoder) makes a node about to write one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import spec.machine
from rdzv import DynamicRendezvousHandler, RendezvousStateError
from rdzv.backend import StoreRendezvousBackend
from rdzv.clock import FakeClock
from rdzv.handler import CHECK_INVARIANTS_ENV, invariant_checks_on
from rdzv.stores import MemoryStore
from spec.codec import encode
from spec.state import NodeId, RendezvousState

KEY = "rdzv/job/state"


@contextmanager
def _handler(
    store: MemoryStore, protocol: str, min_nodes: int = 1, max_nodes: int = 2
) -> Iterator[DynamicRendezvousHandler]:
    handler = DynamicRendezvousHandler.from_backend(
        "job",
        store,
        StoreRendezvousBackend(store, "job"),
        min_nodes,
        max_nodes,
        clock=FakeClock(),
        cache_duration=0,
        protocol=protocol,
    )
    try:
        yield handler
    finally:
        handler._heartbeats.shut()


def test_the_test_suite_runs_with_the_checks_on() -> None:
    assert invariant_checks_on()


def test_a_bad_setting_of_the_flag_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CHECK_INVARIANTS_ENV, "yes")
    with pytest.raises(Exception, match="RDZV_CHECK_INVARIANTS is 'yes'; set it to 1"):
        invariant_checks_on()
    monkeypatch.setenv(CHECK_INVARIANTS_ENV, "0")
    assert not invariant_checks_on()


@pytest.mark.parametrize("protocol", ["hardened", "scale"])
def test_a_state_read_that_breaks_an_invariant_is_refused(protocol: str) -> None:
    other = NodeId("10.0.0.9", 7)
    bad = RendezvousState.build(
        participants={other: 0}, wait_list=[other], last_heartbeats={other: 0}
    )
    data = encode(bad, protocol)
    store = MemoryStore()
    store.set(KEY, data)
    with _handler(store, protocol) as handler, pytest.raises(RendezvousStateError) as info:
        handler.next_rendezvous()
    message = str(info.value)
    assert "the state it read" in message and "lists_disjoint" in message
    got = StoreRendezvousBackend(store, "job").get_state()
    assert got is not None and got[0] == data  # left alone


@pytest.mark.parametrize("protocol", ["hardened", "scale"])
def test_a_bad_write_is_refused_before_it_reaches_the_store(
    monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    planted_node = NodeId("10.0.0.8", 3)

    def crowded(state: RendezvousState, name: str) -> bytes:
        """Planted: every write also lists a stranger in the wait list as a participant."""
        members = dict(state.participants)
        members[planted_node] = 0
        beats = {**dict(state.last_heartbeats), planted_node: 0}
        waiting = [*state.wait_list, planted_node]
        return encode(
            state.evolve(participants=members, wait_list=waiting, last_heartbeats=beats), name
        )

    monkeypatch.setattr(spec.machine, "encode", crowded)
    store = MemoryStore()
    with _handler(store, protocol) as handler, pytest.raises(RendezvousStateError) as info:
        handler.next_rendezvous()
    message = str(info.value)
    assert "the state it is about to write" in message and "lists_disjoint" in message
    assert StoreRendezvousBackend(store, "job").get_state() is None  # never written
