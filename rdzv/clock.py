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

import threading
import time
from datetime import timedelta
from typing import Protocol, runtime_checkable

from spec.machine import Now
from spec.settings import seconds_to_millis
from spec.state import Millis

FAKE_CANCEL_POLL = 0.005
"""Seconds (real) between two checks of a cancel flag while sleeping on a FakeClock.

A ``threading.Event`` cannot notify the fake clock's condition when it is set, so a
sleeper re-checks its cancel flag this often; fake time itself wakes sleepers at once."""
FAKE_SLEEP_REAL_LIMIT_S = 60.0
"""Real seconds a sleep on a FakeClock *without* a cancel flag may last before it raises
:class:`FakeClockStalled`: such a sleeper (a writer backing off after a lost
compare-and-set, say) can only be woken by :meth:`FakeClock.advance`, so a test that never
advances the clock would otherwise hang for good. Sleeps with a cancel flag (heartbeat
timers) are ended by their flag and have no such limit."""


class FakeClockStalled(RuntimeError):
    """A sleep on a :class:`FakeClock` waited longer in real time than its limit because
    nobody advanced the clock."""


def to_millis(seconds: float | timedelta) -> Millis:
    """Seconds (or a timedelta) as spec's integer milliseconds, rounded to nearest."""
    value = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
    return seconds_to_millis(value)


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


class SteadyWallClock:
    """``clock`` with a wall clock that cannot jump: its :meth:`time` is ``clock``'s
    wall time read once, when this is made, plus the monotonic time elapsed since.

    For protocol variants that never compare two machines' wall clocks (a local
    liveness clock, see :mod:`spec.variants`): there the wall time only marks changes and
    times a node's own heartbeats, and a step of the system clock (an NTP correction, an
    administrator's ``date -s``) must not stop a node's heartbeats or let it write a
    marker it wrote before. The rate is the monotonic clock's; the offset from the true
    wall time stays what it was at the start, up to the rate drift between the two."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._offset = clock.time() - clock.monotonic()

    @property
    def inner(self) -> Clock:
        """The clock this one reads."""
        return self._clock

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def time(self) -> float:
        return self._clock.monotonic() + self._offset

    def sleep(self, seconds: float, cancel: threading.Event | None = None) -> bool:
        return self._clock.sleep(seconds, cancel)

    def max_real_wait(self, seconds: float) -> float:
        return self._clock.max_real_wait(seconds)


class FakeClock:
    """A clock that moves only when told to; thread-safe.

    ``wall`` starts at ``wall_start`` (seconds since the epoch) and ``monotonic`` at
    ``mono_start``; :meth:`advance` moves both. :meth:`skew_wall` moves only the wall
    clock (to model a clock that disagrees with its peers).

    Threads sleeping on a FakeClock (heartbeat timers, a writer backing off after a
    lost compare-and-set) stay asleep until a test advances it.
    """

    def __init__(
        self,
        mono_start: float = 1000.0,
        wall_start: float = 1_700_000_000.0,
        *,
        real_sleep_limit: float = FAKE_SLEEP_REAL_LIMIT_S,
    ) -> None:
        if not real_sleep_limit >= 0:
            raise ValueError(
                f"real_sleep_limit is {real_sleep_limit!r}; pass a number of real seconds >= 0 "
                f"(default {FAKE_SLEEP_REAL_LIMIT_S:g})"
            )
        self._cond = threading.Condition()
        self._mono = float(mono_start)
        self._wall = float(wall_start)
        self._sleepers = 0
        self._real_sleep_limit = float(real_sleep_limit)

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
        """Sleep until the fake time reaches ``now + seconds``; see :class:`Clock`.

        Without ``cancel``, raises :class:`FakeClockStalled` once the sleep has lasted
        ``real_sleep_limit`` real seconds (:data:`FAKE_SLEEP_REAL_LIMIT_S`) without the
        fake time reaching its end."""
        with self._cond:
            until = self._mono + max(0.0, seconds)
            real_end = time.monotonic() + self._real_sleep_limit
            self._sleepers += 1
            self._cond.notify_all()
            try:
                while self._mono < until:
                    if cancel is not None and cancel.is_set():
                        return True
                    if cancel is None and time.monotonic() >= real_end:
                        raise FakeClockStalled(
                            f"a sleep of {seconds:g} s on a FakeClock (now {self._mono:g}, "
                            f"until {until:g}) waited {self._real_sleep_limit:g} real seconds "
                            f"and nobody advanced this FakeClock; call clock.advance() from "
                            f"the test (e.g. after clock.wait_for_sleepers(n)) or use a "
                            f"SystemClock"
                        )
                    # Fake time wakes us through notify_all; the timeout only bounds how
                    # late we notice ``cancel`` or the real-time limit.
                    self._cond.wait(FAKE_CANCEL_POLL)
            finally:
                self._sleepers -= 1
                self._cond.notify_all()
        return cancel is not None and cancel.is_set()

    def max_real_wait(self, seconds: float) -> float:
        # Fake time does not pass while we block on the store: look at it again soon.
        return min(max(0.0, seconds), FAKE_CANCEL_POLL)
