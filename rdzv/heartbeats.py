"""A node's keep-alive timer: the thread that runs the handler's keep-alive at a fixed
rate (:class:`Heartbeat`), and the slot that holds the current one so that no timer
outlives a shutdown (:class:`HeartbeatSlot`). The keep-alive itself is the handler's
(one operation of its machine, :class:`rdzv.handler.DynamicRendezvousHandler`); this
module only says when it runs."""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from rdzv.clock import Clock
from rdzv.errors import RendezvousConnectionError, RendezvousError

if TYPE_CHECKING:
    from rdzv.handler import DynamicRendezvousHandler

logger = logging.getLogger("rdzv.handler")
"""The handler's logger: a keep-alive's messages read as the handler's."""


def next_keep_alive(due: float, now: float, interval: float) -> float:
    """When the keep-alive after the one due at ``due`` (started at ``now``) is due.

    The timer runs at a fixed rate: one ``interval`` after the previous keep-alive was
    due, whatever that one's own duration (up to ``heartbeat_timeout``), so a slow store
    call does not push every later heartbeat back; one that started more than an interval
    late (a paused process) moves the schedule to ``now`` instead of firing a burst to
    catch up. Two keep-alive writes of a live node are then at most one interval plus one
    keep-alive's duration apart; sleeping an interval after each keep-alive ended (as
    before) added the duration of the previous one as well."""
    return max(due, now) + interval


class Heartbeat:
    """The keep-alive timer: a daemon thread holding the handler only weakly.

    A keep-alive that fails is tried again at the next interval: the thread never dies
    of a store error, and ends only when told to stop (or when the handler is gone). An
    unreachable store is logged once per run of failures (and the next success at INFO);
    any other failure every time."""

    def __init__(
        self,
        handler: DynamicRendezvousHandler,
        interval: float,
        clock: Clock,
        join_timeout: float,
        name: str,
        first_due: float,
    ) -> None:
        """``first_due``: when the first keep-alive is due, on ``clock``'s monotonic clock
        (:func:`spec.machine.keep_alive_due`)."""
        self._ref = weakref.ref(handler)
        self._first_due = first_due
        self._interval = interval
        self._clock = clock
        self._join_timeout = join_timeout
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _loop(self) -> None:
        # Bounded by ``stopping``: set on shutdown, on the next rendezvous, and when the
        # handler is garbage-collected (then ``self._ref()`` is None as well).
        failing = False
        due = self._first_due
        while not self.stopping.is_set():
            if self._clock.sleep(due - self._clock.monotonic(), self.stopping):
                return
            handler = self._ref()
            if handler is None:
                return
            try:
                due = next_keep_alive(due, self._clock.monotonic(), self._interval)
                handler._keep_alive(self.stopping)
                if failing:
                    logger.info("keep-alive of node %s succeeds again", handler.node)
                failing = False
            except RendezvousError as exc:
                # An unreachable store is told once per run of failures (the next success
                # is logged); anything else (a corrupt state, say) every time.
                outage = isinstance(exc, RendezvousConnectionError)
                if not (failing and outage):
                    logger.warning(
                        "keep-alive of node %s failed: %s; retried every %g s",
                        handler.node,
                        exc,
                        self._interval,
                    )
                failing = outage
            except Exception:
                logger.exception("keep-alive of node %s crashed", handler.node)
                failing = True
            finally:
                del handler

    def stop(self) -> bool:
        """Stop the thread and join it (bounded); True if it is gone."""
        self.stopping.set()
        if self.thread is threading.current_thread():
            return True  # the GC finalizer ran on this thread: it ends after this pass
        if self.thread.is_alive():
            self.thread.join(self._join_timeout)
        return not self.thread.is_alive()


class HeartbeatSlot:
    """Holds the current heartbeat; reachable from the GC finalizer without the handler.

    Thread-safe: ``next_rendezvous`` starts heartbeats while ``shutdown`` may run in
    another thread; once :meth:`shut` ran, :meth:`start` refuses, so no keep-alive
    thread outlives a shutdown."""

    def __init__(self) -> None:
        self.current: Heartbeat | None = None
        self._stragglers: list[Heartbeat] = []
        """Heartbeats told to stop whose thread did not end within its join bound."""
        self._shut = False
        self._lock = threading.Lock()

    @property
    def is_shut(self) -> bool:
        with self._lock:
            return self._shut

    def start(self, make: Callable[[], Heartbeat]) -> bool:
        """Start ``make()`` as the current heartbeat (stopping any previous one);
        False, starting nothing, once shut."""
        with self._lock:
            if self._shut:
                return False
            old, self.current = self.current, make()
            self.current.start()
        if old is not None:
            old.stop()  # not expected: callers stop the previous heartbeat first
        return True

    def stop(self) -> bool:
        """Stop the current heartbeat, and join it and any earlier one that did not end in
        time (each bounded); True if all of them are gone."""
        with self._lock:
            heartbeat, self.current = self.current, None
            pending = [*self._stragglers, *([] if heartbeat is None else [heartbeat])]
            self._stragglers = []
        left = [h for h in pending if not h.stop()]
        with self._lock:
            self._stragglers.extend(left)
        return not left

    def shut(self) -> bool:
        """Stop the current heartbeat and refuse every later start."""
        with self._lock:
            self._shut = True
        return self.stop()
