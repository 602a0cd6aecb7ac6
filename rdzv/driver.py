"""The node driver: one machine state of one node, served on the store.

:class:`NodeDriver` feeds :func:`spec.machine.step` its inputs and performs the request
each step returns on the backend (reads, compare-and-sets with their token, waits in
bounded slices, the announcement and heartbeat sets of ``scale``), with the I/O policy
around it: backoff after a lost race, wait slices, error translation, the optional
invariant checks (:class:`InvariantChecker`), the transition events (:mod:`rdzv.events`)
and the INFO narration (:class:`Narrator`, on the ``rdzv.handler`` logger). The
handler's lifecycle (:mod:`rdzv.handler`) runs two drivers per node, ``main`` and
``control``; every name here is also importable from :mod:`rdzv.handler`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from rdzv import events
from rdzv.backend import RendezvousBackend
from rdzv.clock import Clock, now_of, to_seconds
from rdzv.errors import (
    RendezvousError,
    RendezvousStateError,
)
from spec.codec import check_protocol, decode_with_protocol
from spec.invariants import check_state, check_step
from spec.machine import (
    Announce,
    Announced,
    AnnouncedMembers,
    Beat,
    Beaten,
    BeatValues,
    CasResult,
    CompareAndSet,
    Config,
    Done,
    Event,
    Fail,
    IoFailed,
    Known,
    Local,
    Now,
    Read,
    ReadAnnounced,
    ReadBeats,
    ReadResult,
    Request,
    Sightings,
    StartOp,
    Step,
    Wait,
    Withdraw,
    Withdrawn,
    WokeUp,
    adopt_job,
    step,
)
from spec.state import EMPTY_STATE, Millis, NodeId, RendezvousState
from spec.storage import SERVED_REQUESTS, ServedEvent, ServedRequest
from spec.variants import LOCAL
from spec.vocabulary import FailKind, Op

__all__ = [
    "BACKOFF_BASE",
    "BACKOFF_CAP",
    "CHECK_INVARIANTS_ENV",
    "MAX_STEPS_PER_OP",
    "MAX_WAIT_SLICE",
    "InvariantChecker",
    "IoStats",
    "LastDecoded",
    "Narrator",
    "NodeDriver",
    "NodeJob",
    "OperationFailed",
    "invariant_checks_on",
    "max_slices",
    "serve_on",
    "wait_slice",
]

logger = logging.getLogger("rdzv.handler")
"""The handler's logger: the narration is part of the handler's output."""

MAX_WAIT_SLICE = 5.0
"""Seconds: the longest single blocking wait for a state change before the clock is
looked at again (a missed change notification costs at most this). The machine's own
timers (keep-alive due, last call, join deadline) end a wait by its ``until`` whatever the
slice, and the stores deliver every change while a wait is subscribed, so the slice only
bounds the rare missed notification and how often a member waiting for rank 0's bootstrap
info re-reads the state. Each slice's end costs a waiting node a wake-up, a machine step,
a read and a new subscription: 1 s slices made the 1,000 waiting nodes of a round of
1,024 on two cores do about 1,000 of those a second, enough to slow the round past 10 s
(docs/benchmarks.md, "The wait slice and a cheaper decode")."""


CHECK_INVARIANTS_ENV = "RDZV_CHECK_INVARIANTS"
"""Set to ``1`` to check :mod:`spec.invariants` on every state a node reads and every
state it is about to write (:class:`InvariantChecker`); the test suite runs with it on.
Off (unset or ``0``) by default: it decodes each state once more."""


def invariant_checks_on() -> bool:
    """Whether :data:`CHECK_INVARIANTS_ENV` turns the invariant checks on."""
    value = os.environ.get(CHECK_INVARIANTS_ENV, "")
    if value not in ("", "0", "1"):
        raise RendezvousError(
            f"{CHECK_INVARIANTS_ENV} is {value!r}; set it to 1 (check spec.invariants on "
            f"every state read or written) or 0 (do not), or unset it"
        )
    return value == "1"


class InvariantChecker:
    """Checks :mod:`spec.invariants` on what one node's driver reads and writes.

    Every state the node reads (a read's or a compare-and-set's answer) must satisfy the
    state invariants; every state it is about to write must satisfy them and, when it
    writes over the state it last saw (same token), the step invariants from that state.
    A violation raises :class:`RendezvousStateError` before the write is sent."""

    def __init__(self, node: NodeId, config: Config) -> None:
        self.node = node
        self.config = config
        self.seen: tuple[RendezvousState, Any] | None = None
        """The last state this node saw in the store, with its token."""

    def _decode(self, data: bytes) -> RendezvousState | None:
        try:
            return self.config.decode(data, self.config.variant.name)
        except Exception:  # a corrupt or foreign state: the machine itself reports it
            return None

    def _fail(self, what: str, problems: list[tuple[str, str]]) -> None:
        if problems:
            text = "; ".join(f"{name}: {why}" for name, why in problems)
            raise RendezvousStateError(
                f"node {self.node}: {what} breaks the protocol's invariants ({text}); "
                f"this is a bug in rdzv (or the store holds a state no rdzv node writes), "
                f"please report it with the state's key ({CHECK_INVARIANTS_ENV}=1 turned "
                f"this check on)"
            )

    def saw(self, event: Event) -> None:
        """Check a state the store answered with."""
        if not isinstance(event, ReadResult | CasResult):
            return
        if event.data is None:
            self.seen = (EMPTY_STATE, event.token)
            return
        state = self._decode(event.data)
        if state is None:
            self.seen = None
            return
        self.seen = (state, event.token)
        self._fail("the state it read", check_state(state, self.config.settings))

    def writes(self, request: CompareAndSet) -> None:
        """Check a state the node is about to write."""
        after = self._decode(request.data)
        if after is None:
            raise RendezvousStateError(
                f"node {self.node} is about to write a state it cannot decode itself; this "
                f"is a bug in rdzv, please report it"
            )
        if self.seen is not None and self.seen[1] == request.token:
            problems = check_step(self.seen[0], after, self.config.settings)
        else:
            problems = check_state(after, self.config.settings)
        self._fail("the state it is about to write", problems)


MAX_STEPS_PER_OP = 1_000_000
"""Safety net on machine steps in one operation; deadlines end operations long before."""


BACKOFF_BASE = 0.0005
"""Seconds: upper end of the random backoff after a writer's first lost race."""


BACKOFF_CAP = 0.032
"""Seconds: the backoff window doubles per consecutive lost race up to this."""


@dataclass
class IoStats:
    """Counters of the store traffic of one node (for benchmarks and tests)."""

    reads: int = 0
    cas_attempts: int = 0
    cas_conflicts: int = 0
    waits: int = 0
    steps: int = 0
    announces: int = 0
    """Additions to an announcement set (announcing variants)."""
    announced_reads: int = 0
    """Reads of an announcement set (folds)."""
    withdrawals: int = 0
    """Announcements taken back (a join deadline passed before a fold admitted this node)."""
    beats: int = 0
    """Writes of this node's heartbeat key (heartbeats under keys)."""
    beat_reads: int = 0
    """Reads of watched heartbeat keys (heartbeats under keys)."""

    def copy(self) -> IoStats:
        return replace(self)

    def __add__(self, other: IoStats) -> IoStats:
        return IoStats(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )


@dataclass(frozen=True)
class _Conflict:
    """A lost compare-and-set, waiting out its backoff before the re-read."""

    until: float
    """Clock seconds (monotonic) at which the backoff ends."""


class OperationFailed(Exception):
    """Internal: carries a machine ``Fail`` and the I/O exception behind it, if any."""

    def __init__(self, fail: Fail, cause: BaseException | None) -> None:
        super().__init__(fail.message)
        self.fail = fail
        self.cause = cause


def wait_slice(clock: Clock, remaining: float) -> float:
    """Real seconds of the next slice of a wait with ``remaining`` seconds of ``clock``
    left: at most :data:`MAX_WAIT_SLICE`, and at most what ``clock`` allows to block
    before it is looked at again (:meth:`~rdzv.clock.Clock.max_real_wait`)."""
    return clock.max_real_wait(min(remaining, MAX_WAIT_SLICE))


def max_slices(clock: Clock, budget: float) -> int:
    """How many slices (:func:`wait_slice`) a wait of ``budget`` seconds takes at most:
    ``ceil(budget / slice) + 1`` with the longest slice ``clock`` allows. On a real clock
    the deadline ends the wait first; on a clock that does not move by itself (a
    ``FakeClock`` nobody advances) this bound ends it, after ``budget`` real seconds."""
    longest = wait_slice(clock, MAX_WAIT_SLICE)
    if longest <= 0:
        return 1
    return math.ceil(max(budget, 0.0) / longest) + 1


_NOT_THE_STORE = ("the handler failed", "bounding the operation failed")
"""How :meth:`NodeDriver._io_failed` reasons start when no store call failed."""


NARRATED_PRUNES = 1024
"""How many pruned nodes a handler remembers having reported (so that each is reported
once, however many of its reads still list the node); past it the memory starts over."""


def _newcomer_at(local: Local) -> bool:
    """Whether ``local`` is a node of a new job waiting at a run its previous job closed."""
    return local.view.closed and local.job is not None and local.job > local.view.epoch


def _reopening(local: Local) -> bool:
    """Whether ``local`` holds the write by which a new job reopens a closed run."""
    view = local.view
    return local.dirty and view.epoch > 0 and view == RendezvousState(view.round, epoch=view.epoch)


class Narrator:
    """Turns one node's machine steps into log lines on the ``rdzv.handler`` logger, one
    per real event (the JSON events of :mod:`rdzv.events` record every step, at DEBUG):

    - INFO: waiting for the last call of a round (and when it ends), a node pruned (and
      how long it was silent), the store reachable again, the rendezvous closed;
    - WARNING: the store unreachable (once per outage, until a store call succeeds).

    Joining a round is told by :meth:`DynamicRendezvousHandler.next_rendezvous`. Shared
    by a handler's two machine states (thread-safe), so an event both see is told once."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._lock = threading.Lock()
        self._last_call: tuple[int, Millis] | None = None
        """The (round, deadline) of the last call already told."""
        self._pruned: dict[NodeId, None] = {}
        """Nodes whose pruning was told (insertion-ordered, at most NARRATED_PRUNES)."""
        self._closed = False
        self._closed_job = False
        self._unreachable = False

    def tell(self, driver: NodeDriver, before: Local, event: Event, result: Step) -> None:
        """Log what ``event`` turning ``before`` into ``result`` means, if anything."""
        if not logger.isEnabledFor(logging.INFO):
            if isinstance(event, IoFailed) and logger.isEnabledFor(logging.WARNING):
                self._io_failed(driver, before, event)
            return
        if isinstance(event, IoFailed):
            self._io_failed(driver, before, event)
        elif isinstance(event, ReadResult | CasResult) and self._unreachable:
            with self._lock:
                back, self._unreachable = self._unreachable, False
            if back:
                logger.info("node %s reaches the store of run %r again", before.node, self.run_id)
        if result.pruned:
            self._pruned_nodes(driver, before, event, result)
        request = result.request
        local = result.local
        if isinstance(event, CasResult) and event.has_set and _reopening(before):
            logger.info(
                "node %s started a new job under run %r (epoch %d, round %d): the job before "
                "it closed the run and nobody of it is listed any more",
                local.node,
                self.run_id,
                before.view.epoch,
                before.view.round,
            )
        if isinstance(request, Wait) and _newcomer_at(local):
            self._waiting_for_closed_job(local)
        elif isinstance(request, Wait):
            self._waiting(driver, local, event.now)
        elif isinstance(request, Fail) and request.kind in (
            FailKind.CLOSED,
            FailKind.GRACEFUL_EXIT,
        ):
            self._closed_once(
                "node %s found the rendezvous of run %r closed (round %d): it stops rendezvousing",
                local,
            )
        elif isinstance(request, Done) and request.op is Op.CLOSE:
            self._closed_once("node %s closed the rendezvous of run %r (round %d)", local)

    def _io_failed(self, driver: NodeDriver, before: Local, event: IoFailed) -> None:
        if event.reason.startswith(_NOT_THE_STORE):
            return  # the operation ended for a reason of the handler's, told by its error
        with self._lock:
            first, self._unreachable = not self._unreachable, True
        if not first:
            return
        op = before.op
        if op is Op.KEEP_ALIVE:
            then = (
                f"its keep-alive is retried every "
                f"{to_seconds(driver.config.settings.keep_alive_interval):g} s"
            )
        elif op is Op.QUERY:
            then = "its queries answer from the last view for now"
        else:
            then = f"its {'operation' if op is None else op.value + ' operation'} fails"
        logger.warning(
            "node %s cannot reach the store of run %r (%s); %s, and the next success is logged",
            before.node,
            self.run_id,
            event.reason,
            then,
        )

    def _pruned_nodes(self, driver: NodeDriver, before: Local, event: Event, result: Step) -> None:
        with self._lock:
            fresh = [n for n in result.pruned if n not in self._pruned]
            if len(self._pruned) + len(fresh) > NARRATED_PRUNES:
                self._pruned.clear()
            self._pruned.update(dict.fromkeys(fresh))
        if not fresh:
            return
        settings = driver.config.settings
        now = event.now
        seen = {n: at for n, _, at in (*before.seen_beats, *before.watch)}
        read: RendezvousState | None = None
        data = event.data if isinstance(event, ReadResult | CasResult) else None
        if data is not None and not seen:
            with contextlib.suppress(Exception):  # decoded already: this only looks
                read = driver.config.decode(data, driver.config.variant.name)
        for node in fresh:
            silent: Millis | None = None
            if node in seen:
                silent = now.mono - seen[node]
            elif read is not None and (beat := read.heartbeat_of(node)) is not None:
                silent = now.wall - beat
            how_long = (
                f"more than the heartbeat expiry, {to_seconds(settings.heartbeat_expiry):g} s"
                if silent is None
                else f"{to_seconds(silent):.1f} s; the heartbeat expiry is "
                f"{to_seconds(settings.heartbeat_expiry):g} s"
            )
            logger.info(
                "node %s pruned node %s from run %r (round %d): it was silent for %s",
                before.node,
                node,
                self.run_id,
                result.local.view.round,
                how_long,
            )

    def _waiting(self, driver: NodeDriver, local: Local, now: Now) -> None:
        view = local.view
        if local.op is not Op.JOIN or view.complete or view.deadline is None:
            return
        if not view.is_participant(local.node):
            return
        key = (view.round, view.deadline)
        with self._lock:
            if self._last_call == key:
                return
            self._last_call = key
        settings = driver.config.settings
        if driver.config.variant.liveness_clock == LOCAL:  # measured from when first seen
            seen = local.seen_last_call
            first = seen[1] if seen is not None and seen[0] == view.deadline else now.mono
            ends = first + settings.last_call_timeout - now.mono
        else:
            ends = view.deadline - now.wall
        logger.info(
            "node %s waits for the last call of round %d of run %r (%d of at most %d nodes "
            "joined): it ends in %.1f s",
            local.node,
            view.round,
            self.run_id,
            view.num_participants,
            settings.max_nodes,
            max(0.0, to_seconds(ends)),
        )

    def _waiting_for_closed_job(self, local: Local) -> None:
        view = local.view
        listed = view.listed_nodes()
        with self._lock:
            told, self._closed_job = self._closed_job, True
        if not told:
            logger.info(
                "node %s waits to start a new job under run %r: the job before it closed the "
                "run and %d of its nodes are still listed (%s); they leave at shutdown, or are "
                "pruned once their heartbeats expire",
                local.node,
                self.run_id,
                len(listed),
                ", ".join(map(str, listed)),
            )

    def _closed_once(self, message: str, local: Local) -> None:
        with self._lock:
            told, self._closed = self._closed, True
        if not told:
            logger.info(message, local.node, self.run_id, local.view.round)


class NodeJob:
    """The job a node belongs to (:attr:`spec.machine.Local.job`), shared by the
    handler's two drivers: the first state either machine state sees fixes it for both
    (:func:`spec.machine.adopt_job`), also while the other is inside an operation. So a
    join whose first read returns the run its own handler's ``shutdown`` closed meanwhile
    fails closed, as its job's run did, instead of reopening it as the next job."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._job: int | None = None

    @property
    def job(self) -> int | None:
        return self._job

    def fixed(self, job: int | None) -> None:
        """Record ``job`` unless one is recorded already (a node never changes job)."""
        if job is None or self._job is not None:
            return
        with self._lock:
            if self._job is None:
                self._job = job


_SERVED: dict[type, tuple[str, str]] = {
    Read: ("reads", "reading the state"),
    CompareAndSet: ("cas_attempts", "writing the state"),
    Announce: ("announces", "announcing this node"),
    ReadAnnounced: ("announced_reads", "reading the announcement set"),
    Withdraw: ("withdrawals", "taking this node's announcement back"),
    Beat: ("beats", "writing this node's heartbeat key"),
    ReadBeats: ("beat_reads", "reading watched heartbeat keys"),
}
"""Per request :func:`serve_on` carries out: its :class:`IoStats` counter, and what a
failure message says was being done."""


def serve_on(
    backend: RendezvousBackend, node: NodeId, request: ServedRequest, now: Callable[[], Now]
) -> ServedEvent:
    """Carry out ``request`` of ``node`` on a real store (through ``backend``) and return
    the event answering it, its clocks read by ``now`` once the store answered.

    This is the one adapter between the machine's requests and real stores: what it
    must answer is :func:`spec.storage.serve`'s definition, the one the model checker
    serves its simulated nodes by, and the store conformance suite
    (:func:`rdzv.testing.check_store`) drives this function beside that one on every
    store. Errors propagate (the caller answers them with ``IoFailed``); a lost
    compare-and-set is answered with the state the store holds instead."""
    if isinstance(request, Read):
        current = backend.get_state()
        data, token = (None, None) if current is None else current
        return ReadResult(data, token, now())
    if isinstance(request, CompareAndSet):
        result = backend.set_state(request.data, request.token)
        if result is None:
            return CasResult(None, None, False, now())
        stored, stored_token, has_set = result
        return CasResult(stored, stored_token, has_set, now())
    if isinstance(request, Announce):
        return Announced(backend.announce(request.round, request.member), now())
    if isinstance(request, ReadAnnounced):
        return AnnouncedMembers(tuple(backend.announced(request.round)), now())
    if isinstance(request, Withdraw):
        backend.withdraw(request.round, request.member)
        return Withdrawn(now())
    if isinstance(request, Beat):
        backend.beat(str(node), request.value)
        return Beaten(now())
    if isinstance(request, ReadBeats):
        return BeatValues(tuple(backend.beats([str(n) for n in request.nodes])), now())
    raise TypeError(f"{request!r} is not a store request")


class NodeDriver:
    """Carries out one node's machine requests on a backend with a clock.

    Not thread-safe: the handler runs each of its drivers under a lock of its own.
    """

    def __init__(
        self,
        node: NodeId,
        config: Config,
        backend: RendezvousBackend,
        clock: Clock,
        rng: random.Random,
        run_id: str,
        narrator: Narrator | None = None,
        job: NodeJob | None = None,
        machine: str = "main",
    ) -> None:
        """``narrator`` tells the node's real events in the log (:class:`Narrator`; the
        handler shares one between its two drivers); None: a narrator of its own.
        ``job``: the node's job, shared likewise (:class:`NodeJob`); None: its own.
        ``machine`` names this machine state in the transition events (``main`` or
        ``control``)."""
        self.machine = machine
        self.narrator = Narrator(run_id) if narrator is None else narrator
        self.job = NodeJob() if job is None else job
        self.config = config
        self.backend = backend
        self.clock = clock
        self.rng = rng
        self.run_id = run_id
        self.local = Local(node)
        self.request: Request | None = None
        self.last_step: Step | None = None
        """The machine's latest step (its row, action and request), for tests that hold
        the driver to the model checker's node (tests/lockstep.py)."""
        self.stats = IoStats()
        self._conflict: _Conflict | None = None
        self._conflicts = 0
        self._io_error: BaseException | None = None
        self._checker = InvariantChecker(node, config) if invariant_checks_on() else None

    # -- feeding the machine ------------------------------------------------------------
    def _feed(self, event: Event) -> None:
        op = event.op if isinstance(event, StartOp) else self.local.op
        job = self.job.job
        before = adopt_job(self.local, job)
        result = step(before, event, self.config)
        self.job.fixed(result.local.job)
        self.stats.steps += 1
        if events.enabled():
            replay = events.Replay(before, self.machine, self.config, job)
            events.emit(
                events.transition(
                    self.run_id, event, result, None if op is None else op.value, replay
                )
            )
        self.narrator.tell(self, before, event, result)
        self.local = result.local
        self.request = result.request
        self.last_step = result
        if self._checker is not None:
            self._checker.saw(event)
            if isinstance(result.request, CompareAndSet):
                self._checker.writes(result.request)

    def start(
        self,
        op: Op,
        deadline: Millis,
        sightings: Sightings | None = None,
        known: Known | None = None,
    ) -> None:
        """Start ``op``, to end by the monotonic instant ``deadline`` (milliseconds);
        ``sightings`` and ``known`` as in :class:`~spec.machine.StartOp`."""
        self.start_with(StartOp(op, deadline, now_of(self.clock), sightings, known))

    def start_with(self, event: StartOp) -> None:
        """Start the operation ``event`` describes (its ``now`` read from this driver's
        clock)."""
        self._conflict = None
        self._conflicts = 0
        self._io_error = None
        self._feed(event)

    def wake(self) -> None:
        """End the pending wait now, as a change of the state or its wake-up time would
        (waking early is allowed: the machine reads and decides again)."""
        assert isinstance(self.request, Wait), f"no wait pending: {self.request!r}"
        self._feed(WokeUp(now_of(self.clock)))

    def deadline_after(self, timeout: Millis) -> Millis:
        return now_of(self.clock).mono + timeout

    @property
    def finished(self) -> bool:
        return isinstance(self.request, Done | Fail)

    # -- carrying out requests ------------------------------------------------------------
    def poll(self) -> bool:
        """Carry out the pending request without blocking; False if it must wait longer."""
        return self._perform(block=False)

    def run(self) -> Done:
        """Carry out requests until the operation ends; raise on failure."""
        for _ in range(MAX_STEPS_PER_OP):
            if isinstance(self.request, Done):
                return self.request
            if isinstance(self.request, Fail):
                raise OperationFailed(self.request, self._io_error)
            try:
                self._perform(block=True)
            except BaseException as exc:
                # Whatever went wrong, the machine must end the operation (and so accept
                # the next one): I/O errors were fed already; feed anything else.
                if not self.finished:
                    self._io_failed(exc, "the handler")
                raise
        bound = RendezvousError(
            f"node {self.local.node} took more than {MAX_STEPS_PER_OP} steps in one "
            f"operation without reaching its deadline; this is a bug in rdzv, please report it"
        )
        self._io_failed(bound, "bounding the operation")
        assert isinstance(self.request, Fail)
        raise OperationFailed(self.request, bound)

    def _perform(self, block: bool) -> bool:
        request = self.request
        if self._conflict is not None:
            return self._after_conflict(block)
        if isinstance(request, Read | CompareAndSet | Wait):
            self._check_key(request.key)
        if isinstance(request, Wait):
            return self._wait(request, block)
        if not isinstance(request, SERVED_REQUESTS):
            return False
        counter, what = _SERVED[type(request)]
        setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        try:
            event = serve_on(self.backend, self.local.node, request, lambda: now_of(self.clock))
        except BaseException as exc:
            self._io_failed(exc, what)
            if not isinstance(exc, Exception):
                raise
            return True
        if isinstance(event, CasResult):
            if not event.has_set:
                # Lost a race: wait a random, bounded while, then decide on a fresh read.
                self.stats.cas_conflicts += 1
                self._conflicts += 1
                window = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** min(self._conflicts - 1, 16))
                self._conflict = _Conflict(self.clock.monotonic() + self.rng.uniform(0.0, window))
                return True
            self._conflicts = 0
        self._feed(event)
        return True

    def _check_key(self, key: str) -> None:
        if key != self.config.key:
            raise RendezvousError(
                f"the protocol variant asked for key {key!r}, but this handler serves only "
                f"{self.config.key!r}; use a variant this rdzv version supports"
            )

    def _io_failed(self, exc: BaseException, what: str) -> None:
        self._io_error = exc
        reason = f"{what} failed: {type(exc).__name__}: {exc}"
        self._feed(IoFailed(reason, now_of(self.clock)))

    def _after_conflict(self, block: bool) -> bool:
        assert self._conflict is not None
        remaining = self._conflict.until - self.clock.monotonic()
        if remaining > 0:
            if not block:
                return False
            self.clock.sleep(remaining)
        self._conflict = None
        self.stats.reads += 1
        try:
            read = serve_on(
                self.backend, self.local.node, Read(self.config.key), lambda: now_of(self.clock)
            )
        except BaseException as exc:
            self._io_failed(exc, "reading the state after a lost write")
            if not isinstance(exc, Exception):
                raise
            return True
        assert isinstance(read, ReadResult)
        self._feed(CasResult(read.data, read.token, False, read.now))
        return True

    def _wait(self, request: Wait, block: bool) -> bool:
        self.stats.waits += 1
        until = to_seconds(request.until)
        try:
            if not block:
                ready = self.clock.monotonic() >= until or self.backend.wait_for_change(
                    request.token, 0.0
                )
                if not ready:
                    self.stats.waits -= 1
                    return False
            else:
                remaining = until - self.clock.monotonic()
                if remaining > 0:
                    # One slice; waking early is allowed (the machine reads and decides
                    # again), so a long wait is a sequence of bounded slices.
                    self.backend.wait_for_change(request.token, wait_slice(self.clock, remaining))
        except BaseException as exc:
            self._io_failed(exc, "waiting for a state change")
            if not isinstance(exc, Exception):
                raise
            return True
        self._feed(WokeUp(now_of(self.clock)))
        return True


class LastDecoded:
    """One node's state decoder that remembers its latest answer: the same bytes read
    again (an unchanged state confirmed by the store, a keep-alive re-read) give the same
    state without decoding them again. Per node (each handler has its own), so no node
    ever sees another's work. Bytes that fail to decode are not remembered, so they raise
    :class:`~spec.codec.CorruptState` every time, exactly as :func:`spec.codec.decode`."""

    def __init__(self) -> None:
        self._data: bytes | None = None
        self._state: RendezvousState | None = None
        self._protocol: str | None = None
        self.decoded = 0
        """How many times bytes were really decoded (for tests and benchmarks)."""

    def __call__(self, data: bytes, protocol: str | None = None) -> RendezvousState:
        if self._state is not None and data == self._data:
            state, stored = self._state, self._protocol
        else:
            self.decoded += 1
            state, stored = decode_with_protocol(data)
            self._data, self._state, self._protocol = bytes(data), state, stored
        if protocol is not None:
            check_protocol(stored, protocol)  # every time, as spec.decode does
        return state
