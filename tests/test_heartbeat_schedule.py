"""The keep-alive timer runs at a fixed rate (issue 23: the timer used to sleep an
interval after each keep-alive ended, so every slow keep-alive pushed the later ones back).

The timer thread runs against a clock that records each sleep it is asked for; the test
advances that clock to exactly the end of each sleep, and a stand-in for the handler takes
a fixed time per keep-alive (by advancing the clock itself), so the schedule is exact.
"""

from __future__ import annotations

import threading

import pytest

import spec
from rdzv.backend import StoreRendezvousBackend
from rdzv.clock import FakeClock
from rdzv.handler import DynamicRendezvousHandler
from rdzv.heartbeats import Heartbeat, next_keep_alive
from rdzv.stores import open_store

INTERVAL = 5.0
WAIT_S = 10.0
"""Real seconds the test waits for the timer thread to reach its next sleep."""


class RecordingClock(FakeClock):
    """A FakeClock that remembers when each sleep asked to end."""

    def __init__(self) -> None:
        super().__init__(mono_start=0.0)
        self.ends: list[float] = []
        self.asked = threading.Condition()

    def sleep(self, seconds: float, cancel: threading.Event | None = None) -> bool:
        with self.asked:
            self.ends.append(self.monotonic() + max(0.0, seconds))
            self.asked.notify_all()
        return super().sleep(seconds, cancel)

    def sleep_end(self, index: int) -> float:
        """When sleep number ``index`` (from 0) asked to end, once the timer asked for it."""
        with self.asked:
            assert self.asked.wait_for(lambda: len(self.ends) > index, WAIT_S)
            return self.ends[index]


class SlowHandler:
    """Stands in for the handler: each keep-alive takes ``duration`` of the clock."""

    def __init__(self, clock: RecordingClock, duration: float) -> None:
        self.clock = clock
        self.duration = duration
        self.starts: list[float] = []

    def _keep_alive(self, stopping: threading.Event) -> None:
        self.starts.append(self.clock.monotonic())
        self.clock.advance(self.duration)


def _keep_alive_starts(duration: float, count: int) -> list[float]:
    clock = RecordingClock()
    handler = SlowHandler(clock, duration)
    first = clock.monotonic() + INTERVAL
    timer = Heartbeat(handler, INTERVAL, clock, WAIT_S, name="test-keep-alive", first_due=first)  # type: ignore[arg-type]
    timer.start()
    try:
        for i in range(count):  # bounded: one keep-alive per pass
            clock.advance(max(0.0, clock.sleep_end(i) - clock.monotonic()))
        clock.sleep_end(count)
    finally:
        assert timer.stop()
    # A keep-alive longer than the interval leaves the next one due at once: the thread
    # then runs on without waiting for the test, until it is stopped.
    return handler.starts[:count]


@pytest.mark.parametrize(
    ("duration", "expected"),
    [
        (0.0, [5.0, 10.0, 15.0, 20.0]),
        # A keep-alive of 3 s: the next still starts 5 s after the previous one did.
        (3.0, [5.0, 10.0, 15.0, 20.0]),
        # Longer than the interval: the next starts as soon as the previous one ended.
        (7.0, [5.0, 12.0, 19.0, 26.0]),
    ],
)
def test_keep_alives_start_at_a_fixed_rate(duration: float, expected: list[float]) -> None:
    assert _keep_alive_starts(duration, len(expected)) == expected


def test_a_late_keep_alive_moves_the_schedule_instead_of_bursting() -> None:
    # Due at 10, started at 13 (a pause): the next is due at 18, not at 15 then at once.
    assert next_keep_alive(10.0, 13.0, INTERVAL) == 18.0
    # On time or early: one interval after the due time.
    assert next_keep_alive(10.0, 10.0, INTERVAL) == 15.0
    assert next_keep_alive(10.0, 9.5, INTERVAL) == 15.0


def _local_with_beat(variant: spec.Variant, now: spec.Now, age: int) -> spec.Local:
    node = spec.NodeId("a", 1, 0)
    local = spec.Local(node)
    if variant.heartbeats == spec.KEY_BEATS:
        return spec.evolve(local, beat_at=now.mono - age)
    view = spec.RendezvousState(round=0, last_heartbeats=((node, now.wall - age),))
    return spec.evolve(local, view=view)


@pytest.mark.parametrize("variant", [spec.UPSTREAM, spec.HARDENED, spec.SCALE])
def test_the_first_keep_alive_is_due_an_interval_after_the_last_heartbeat(
    variant: spec.Variant,
) -> None:
    settings = spec.Settings(min_nodes=1, max_nodes=2, keep_alive_interval=5000)
    config = spec.Config(settings, variant)
    now = spec.Now(mono=100_000, wall=7_000_000)
    # Written 3 s before the join returned: due 2 s after the return, not 5 s.
    assert spec.keep_alive_due(_local_with_beat(variant, now, 3000), now, config) == 102_000
    # Written longer than an interval ago: due at once.
    assert spec.keep_alive_due(_local_with_beat(variant, now, 9000), now, config) == 100_000
    # A write that seems to lie ahead (a wall clock stepped back): an interval from now.
    assert spec.keep_alive_due(_local_with_beat(variant, now, -60_000), now, config) == 105_000
    # No write known: an interval from now.
    assert spec.keep_alive_due(spec.Local(spec.NodeId("a", 1, 0)), now, config) == 105_000


@pytest.mark.parametrize("protocol", ["upstream", "hardened", "scale"])
def test_the_handler_counts_its_first_keep_alive_from_its_last_heartbeat(protocol: str) -> None:
    """A node whose keep-alive timer starts 3 s after its join's heartbeat write owes the
    first keep-alive 2 s later, not a whole interval later (which would leave its
    heartbeat 8 s old, where the model checker assumes at most one interval)."""
    clock = FakeClock()
    store = open_store(f"memory://first-keep-alive-{protocol}")
    handler = DynamicRendezvousHandler.from_backend(
        "job", store, StoreRendezvousBackend(store, "job"), 1, 1,
        keep_alive_interval=INTERVAL, clock=clock, cache_duration=0, protocol=protocol,
    )  # fmt: skip
    try:
        handler.next_rendezvous()
        joined = clock.monotonic()
        handler._stop_heartbeats()
        clock.advance(3.0)
        assert handler._start_heartbeats()
        current = handler._heartbeats.current
        assert current is not None
        if protocol == "scale":
            # A lone node's scale join completes without writing its heartbeat key (its
            # first beat is the first keep-alive): an interval from now, as before.
            assert handler.driver.local.beat_at is None
            assert current._first_due == pytest.approx(joined + 3.0 + INTERVAL)
        else:
            assert current._first_due == pytest.approx(joined + INTERVAL)
    finally:
        handler.shutdown()
