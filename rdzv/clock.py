"""Clocks for the handler, and the one place where seconds become milliseconds.

The node machine in :mod:`spec.machine` never reads a clock: every event carries
:class:`spec.machine.Now`, the node's monotonic and wall clocks in integer milliseconds.
The handler reads both from a :class:`Clock` and converts with :func:`to_millis` /
:func:`to_seconds`; no other module of ``rdzv`` converts units.

- :class:`SystemClock` is the real thing (``time.monotonic`` and ``time.time``).
- :class:`FakeClock` only moves when a test calls :meth:`FakeClock.advance`. Sleepers
  wake exactly when the fake time reaches their deadline, so a test that waits for a
  heartbeat or a timeout never sleeps for real; :meth:`FakeClock.wait_for_sleepers`
  lets a test wait until background threads are parked before it advances time.
"""

from __future__ import annotations

import math
import threading
import time
from datetime import timedelta
from typing import Protocol, runtime_checkable

from spec.machine import Now
from spec.state import Millis

FAKE_CANCEL_POLL = 0.005
"""Seconds (real) between two checks of a cancel flag while sleeping on a FakeClock.

A ``threading.Event`` cannot notify the fake clock's condition when it is set, so a
sleeper re-checks its cancel flag this often; fake time itself wakes sleepers at once."""


def to_millis(seconds: float | timedelta) -> Millis:
    """Seconds (or a timedelta) as spec's integer milliseconds, rounded to nearest."""
    value = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"a duration must be a finite number of seconds, got {seconds!r}")
    return round(value * 1000)


def to_seconds(millis: Millis) -> float:
    """spec's integer milliseconds as float seconds."""
    return millis / 1000.0


@runtime_checkable
class Clock(Protocol):
    """What the handler needs from time: two clocks and an interruptible sleep."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (deadlines, waits)."""
        ...

    def time(self) -> float:
        """Seconds since the epoch (heartbeats and the last call, shared with peers)."""
        ...

    def sleep(self, seconds: float, cancel: threading.Event | None = None) -> bool:
        """Sleep ``seconds`` of this clock; return True early as soon as ``cancel`` is set.

        Returns False when the time passed without ``cancel`` being set."""
        ...

    def max_real_wait(self, seconds: float) -> float:
        """How long, in real seconds, a blocking I/O wait for ``seconds`` of this clock
        may last before the caller looks at this clock again."""
        ...


def now_of(clock: Clock) -> Now:
    """Both clocks of ``clock`` as the machine's :class:`~spec.machine.Now`."""
    return Now(mono=to_millis(clock.monotonic()), wall=to_millis(clock.time()))


class SystemClock:
    """The process's real clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float, cancel: threading.Event | None = None) -> bool:
        seconds = max(0.0, seconds)
        if cancel is None:
            time.sleep(seconds)
            return False
        return cancel.wait(seconds)

    def max_real_wait(self, seconds: float) -> float:
        return max(0.0, seconds)


class FakeClock:
    """A clock that moves only when told to; thread-safe.

    ``wall`` starts at ``wall_start`` (seconds since the epoch) and ``monotonic`` at
    ``mono_start``; :meth:`advance` moves both. :meth:`skew_wall` moves only the wall
    clock (to model a clock that disagrees with its peers).

    Threads sleeping on a FakeClock (heartbeat timers, a writer backing off after a
    lost compare-and-set) stay asleep until a test advances it.
    """

    def __init__(self, mono_start: float = 1000.0, wall_start: float = 1_700_000_000.0) -> None:
        self._cond = threading.Condition()
        self._mono = float(mono_start)
        self._wall = float(wall_start)
        self._sleepers = 0

    def monotonic(self) -> float:
        with self._cond:
            return self._mono

    def time(self) -> float:
        with self._cond:
            return self._wall

    def advance(self, seconds: float) -> None:
        """Move both clocks forward and wake every sleeper whose time has come."""
        if not seconds >= 0:
            raise ValueError(f"a FakeClock only moves forward; got advance({seconds!r})")
        with self._cond:
            self._mono += seconds
            self._wall += seconds
            self._cond.notify_all()

    def skew_wall(self, seconds: float) -> None:
        """Move only the wall clock (either direction)."""
        with self._cond:
            self._wall += seconds
            self._cond.notify_all()

    @property
    def sleepers(self) -> int:
        """How many threads are in :meth:`sleep` right now."""
        with self._cond:
            return self._sleepers

    def wait_for_sleepers(self, count: int, timeout: float = 10.0) -> bool:
        """Block (real time, at most ``timeout`` s) until ``count`` threads sleep here."""
        with self._cond:
            return self._cond.wait_for(lambda: self._sleepers >= count, timeout)

    def sleep(self, seconds: float, cancel: threading.Event | None = None) -> bool:
        with self._cond:
            until = self._mono + max(0.0, seconds)
            self._sleepers += 1
            self._cond.notify_all()
            try:
                while self._mono < until:
                    if cancel is not None and cancel.is_set():
                        return True
                    # Fake time wakes us through notify_all; the timeout only bounds how
                    # late we notice ``cancel``.
                    self._cond.wait(FAKE_CANCEL_POLL)
            finally:
                self._sleepers -= 1
                self._cond.notify_all()
        return cancel is not None and cancel.is_set()

    def max_real_wait(self, seconds: float) -> float:
        # Fake time does not pass while we block on the store: look at it again soon.
        return min(max(0.0, seconds), FAKE_CANCEL_POLL)
