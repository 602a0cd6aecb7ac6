"""Bounds and helpers shared by the conformance properties and their runner
(:mod:`rdzv.testing`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from rdzv.errors import StoreTimeoutError
from rdzv.store import Store

SHORT_TIMEOUT = timedelta(milliseconds=50)
"""The store timeout used where the suite expects a wait to run out."""
WRITE_DELAY_S = 0.02
"""A writer thread waits this long before writing, so the waiter is usually blocked by
then (the checks hold either way: an early write is seen at once)."""
MAX_CAS_ATTEMPTS = 1_000
"""Bound on compare_set attempts for one increment under contention."""
THREADS_START_S = 30.0
"""Bound on the kit's threads all reaching their starting barrier (thread start-up on a
loaded machine, unrelated to how fast the store wakes waiters)."""
WRITER_S = 30.0
"""Bound on a writer thread finishing its one delayed write (a correct store needs
milliseconds). How fast the waiter saw the write is checked separately, against
``wake_within``; this bound only keeps a stalled writer from outliving the kit."""
CONCURRENT_WORK_S = 60.0
"""Bound on the concurrent add/CAS phase of threads (a correct store needs well under 1 s)."""
PROCESS_STOP_S = 5.0
"""After a failure, how long a child process gets to exit after terminate() before kill()."""
LIVENESS_CHECK_S = 0.5
"""While waiting for children to start, how often the kit checks that none has died."""

StoreFactory = Callable[[], Store]


@dataclass(frozen=True)
class Config:
    threads: int
    increments: int
    wake_within: timedelta

    @property
    def wake_s(self) -> float:
        return self.wake_within.total_seconds()


class Broken(AssertionError):
    """A property failed; the runner adds the property's name and the store."""


def expect(ok: bool, message: str) -> None:
    # Explicit raise rather than ``assert``: the kit must work under ``python -O``.
    if not ok:
        raise Broken(message)


def expect_eq(actual: object, expected: object, what: str) -> None:
    expect(actual == expected, f"{what}: expected {expected!r}, got {actual!r}")


def expect_timeout(call: Callable[[], object], what: str) -> None:
    try:
        result = call()
    except StoreTimeoutError:
        return
    raise Broken(f"{what} must raise StoreTimeoutError, but returned {result!r}")


def close_store(store: object) -> None:
    close = getattr(store, "close", None)
    if callable(close):
        close()


# -- threads -------------------------------------------------------------------------


class Worker:
    """A daemon thread whose exception is kept for the kit to re-raise."""

    def __init__(self, name: str, target: Callable[[], None], delay: float = 0.0) -> None:
        self.error: BaseException | None = None
        self._target = target
        self._delay = delay
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            if self._delay:
                time.sleep(self._delay)
            self._target()
        except BaseException as exc:
            self.error = exc

    def start(self) -> Worker:
        self.thread.start()
        return self


def join_all(workers: Sequence[Worker], within: float, what: str) -> None:
    """Join every worker (bounded by ``within`` in total); re-raise the first error."""
    deadline = time.monotonic() + within
    for worker in workers:
        worker.thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [w.thread.name for w in workers if w.thread.is_alive()]
    expect(not stuck, f"{what}: thread(s) {stuck} did not finish within {within:.3g} s")
    for worker in workers:
        if worker.error is not None:
            if isinstance(worker.error, AssertionError):
                raise Broken(f"{what}: in thread {worker.thread.name}: {worker.error}")
            raise Broken(
                f"{what}: thread {worker.thread.name} raised "
                f"{type(worker.error).__name__}: {worker.error}"
            ) from worker.error


def after_delay(name: str, action: Callable[[], None]) -> Worker:
    return Worker(name, action, delay=WRITE_DELAY_S).start()


def timed(call: Callable[[], object]) -> tuple[object, float]:
    start = time.monotonic()
    result = call()
    return result, time.monotonic() - start
