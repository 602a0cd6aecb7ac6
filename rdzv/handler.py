"""The dynamic rendezvous handler: an interpreter of spec's node machine.

Every protocol decision is made by :func:`spec.machine.step` over the tables of the
chosen variant. This module only carries out the machine's requests:

- ``Read``          -> ``backend.get_state()``, answered with ``ReadResult``;
- ``CompareAndSet`` -> ``backend.set_state(data, token)``, answered with ``CasResult``;
  a lost race first backs off for a bounded random delay, then re-reads, so that
  conflicting writers spread out instead of colliding again;
- ``Wait``          -> sleep until the clock reaches ``until`` or the stored state changes
  (``backend.wait_for_change``), in slices of at most :data:`MAX_WAIT_SLICE` seconds so
  a missed notification costs little; answered with ``WokeUp``;
- ``Done`` / ``Fail`` -> return, or raise the torch-named error of the failure kind.

Any exception of the store during I/O is fed to the machine as ``IoFailed`` and surfaces
as :class:`~rdzv.errors.RendezvousConnectionError`.

:class:`NodeDriver` is that interpreter for one node, usable step by step (tests and
tools drive several nodes in one thread with a fake clock) or blocking (the handler).
"""

from __future__ import annotations

import difflib
import itertools
import logging
import os
import random
import re
import secrets
import socket
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any, TypeVar

from rdzv import events
from rdzv.api import (
    DEFAULT_CACHE_DURATION,
    DEFAULT_KEEP_ALIVE_INTERVAL,
    DEFAULT_KEEP_ALIVE_MAX_ATTEMPT,
    DEFAULT_PROTOCOL,
    FALLBACK_PROTOCOL,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousSettings,
    RendezvousStoreInfo,
    RendezvousTimeout,
    as_duration,
    check_local_addr,
    check_node_bounds,
    parameters_of,
    timeout_of,
    torch_worded,
)
from rdzv.backend import RendezvousBackend, StoreRendezvousBackend
from rdzv.clock import Clock, SteadyWallClock, SystemClock, now_of, to_millis, to_seconds
from rdzv.driver import (
    BACKOFF_BASE,
    BACKOFF_CAP,
    CHECK_INVARIANTS_ENV,
    MAX_STEPS_PER_OP,
    MAX_WAIT_SLICE,
    InvariantChecker,
    IoStats,
    LastDecoded,
    Narrator,
    NodeDriver,
    NodeJob,
    OperationFailed,
    invariant_checks_on,
    max_slices,
    wait_slice,
)
from rdzv.errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from rdzv.heartbeats import Heartbeat, HeartbeatSlot
from rdzv.outage import QueryOutage
from rdzv.store import PrefixStore, Store
from rdzv.torch_compat import (
    as_rdzv_backend,
    as_rdzv_store,
    is_torch_backend,
    release_torch_store,
    round_store,
    store_timeouts,
)
from spec.machine import (
    CORRUPT_ANNOUNCEMENTS,
    Config,
    Fail,
    closed_for,
    keep_alive_due,
    nodes_waiting,
    start_event,
)
from spec.settings import Settings
from spec.state import Millis, NodeId, RendezvousState
from spec.variants import KEY_BEATS, LOCAL, Variant, get_variant
from spec.vocabulary import FailKind, Op

__all__ = [
    "BACKOFF_BASE",
    "BACKOFF_CAP",
    "C10D_BACKEND_CONFIG_KEYS",
    "CHECK_INVARIANTS_ENV",
    "HANDLER_CONFIG_KEYS",
    "MAX_STEPS_PER_OP",
    "MAX_WAIT_SLICE",
    "TORCHRUN_CONFIG_KEYS",
    "DynamicRendezvousHandler",
    "InvariantChecker",
    "IoStats",
    "LastDecoded",
    "Narrator",
    "NodeDriver",
    "NodeJob",
    "OperationFailed",
    "check_config_keys",
    "config_join_timeout",
    "create_handler",
    "default_variant",
    "invariant_checks_on",
    "max_slices",
    "new_node_id",
    "wait_slice",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")


HEARTBEAT_JOIN_SLACK = 1.0
"""Seconds added to the heartbeat timeout when joining the heartbeat thread.

The heartbeat timeout is checked between store calls, so one keep-alive can overrun it by
the length of one store call (the store's own bound: on Redis up to its retries times
``socket_timeout + socket_connect_timeout`` plus backoff, on SQLite ``busy_timeout_ms``
per statement). A stop that gives up after this slack logs a warning and leaves the daemon
thread to end after that call (it checks its stop flag before doing anything else)."""
MIN_BOOTSTRAP_WAIT = 1.0
"""Seconds: non-zero ranks wait at least this long for rank 0's bootstrap info. Between
two slices (:func:`wait_slice`) of that wait the member reads the state again to check
that its round still stands (a round whose rank 0 died is ended by the survivors'
keep-alives; waiting on would hang until the join deadline)."""
MAX_ROUND_ATTEMPTS = 64
"""How many rounds one ``next_rendezvous`` joins at most: a round that ends before its
rank 0 published the bootstrap info is left and the next one joined, within the same join
deadline (which ends the attempts long before this bound)."""
SHUTDOWN_DRAIN_TIMEOUT = 3.0
"""Real seconds ``shutdown`` waits for a ``next_rendezvous`` (and, separately, a query or
close) running in another thread to end before it closes the store the handler opened
itself; if one is still running then, the store is left open (see ``shutdown``)."""

HANDLER_CONFIG_KEYS: tuple[str, ...] = (
    "cache_duration",
    "close_timeout",
    "heartbeat_timeout",
    "join_timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
    "last_call_timeout",
    "protocol",
    "timeout",
)
"""The config keys :func:`create_handler` reads, under torchrun and without it (the torchrun
plug-in accepts these and :data:`TORCHRUN_CONFIG_KEYS`). ``timeout`` is what torch's launcher
always puts into the config (900 s unless told otherwise): the join timeout, unless
``join_timeout`` is given too, which then wins (:func:`config_join_timeout`)."""
TORCHRUN_CONFIG_KEYS: tuple[str, ...] = ("exit_when_redundant", "use_agent_store")
C10D_BACKEND_CONFIG_KEYS: tuple[str, ...] = ("is_host", "read_timeout", "store_type")
"""The config keys torch's ``c10d_rendezvous_backend.create_backend`` reads: accepted (and
left to that backend) by :func:`create_handler` when the backend it is given is torch's,
since torch users pass one set of parameters to both."""
"""The config keys only the torchrun plug-in (:mod:`rdzv.torch_plugin`) reads;
:func:`create_handler` refuses them with a pointer there."""
STORE_METHODS_USED = ("multi_get", "multi_set", "wait")
"""The methods the handler calls on the ``store`` it is given (to publish and read the
bootstrap info); every other use of the store goes through the backend."""

_FAILURE_ERRORS: dict[FailKind, type[RendezvousError]] = {
    FailKind.CLOSED: RendezvousClosedError,
    FailKind.TIMEOUT: RendezvousTimeoutError,
    FailKind.GRACEFUL_EXIT: RendezvousGracefulExitError,
    FailKind.CORRUPT_STATE: RendezvousStateError,
    FailKind.PROTOCOL_MISMATCH: RendezvousStateError,
    FailKind.CONNECTION: RendezvousConnectionError,
}

_local_ids = itertools.count()
_local_ids_lock = threading.Lock()


NODE_NONCE_BITS = 40
"""Random low bits of every local id: processes that share a host name and a pid (two
containers, each running its agent as pid 1, say) still get distinct identities."""


def new_node_id(local_addr: str | None = None) -> NodeId:
    """A node id: address, pid, and a local id made of a per-process counter (high bits,
    so handlers of one process sort in creation order) and a random nonce (low bits).

    torch uses the counter alone; two processes with the same address and pid then share
    an identity and receive the same rank (the model checker's finding 4). Logs still
    show host and pid: ``str(node)`` is ``addr_pid_localid``.
    """
    with _local_ids_lock:
        counter = next(_local_ids) % (1 << (62 - NODE_NONCE_BITS))
    local_id = (counter << NODE_NONCE_BITS) | secrets.randbits(NODE_NONCE_BITS)
    return NodeId(local_addr or socket.gethostname(), os.getpid(), local_id)


def _failure_error(
    fail: Fail,
    cause: BaseException | None,
    node: NodeId,
    run_id: str,
    key: str,
    announcement_set: Callable[[int], str],
) -> RendezvousError:
    kind = fail.kind
    message = fail.message
    in_set = re.match(rf"{CORRUPT_ANNOUNCEMENTS} (\d+) ", message)
    if kind is FailKind.CORRUPT_STATE and in_set is not None:
        message = (
            f"{message}. In run {run_id!r}, {announcement_set(int(in_set.group(1)))} holds a "
            f"member that is not an rdzv node identity (another program or rdzv version "
            f"added it); give this job a run id of its own, or take the member out of the "
            f"set (the store's remove_member) once no node of the run is alive"
        )
    elif kind is FailKind.PROTOCOL_MISMATCH:
        message = (
            f"node {node} of run {run_id!r} stopped at once: {message}. The protocol is "
            f"the 'protocol' option (--rdzv-conf protocol=NAME under torchrun, or "
            f"protocol= of create_handler / from_backend)"
        )
    elif kind is FailKind.CORRUPT_STATE:
        message = (
            f"{message}. The store key {key!r} of run {run_id!r} holds bytes that are not an "
            f"rdzv state (another program or rdzv version wrote them); give this job a "
            f"run id of its own, or delete the key once no node of the run is alive"
        )
    elif kind is FailKind.CONNECTION and isinstance(cause, RendezvousStateError):
        # The store was reached and found data it cannot use (e.g. a foreign Redis type at
        # one of the run's keys): its message says which key and how to recover.
        error: RendezvousError = RendezvousStateError(
            f"the {fail.op.value} operation of node {node} found foreign data in the store "
            f"of run {run_id!r}: {cause}"
        )
        error.__cause__ = cause
        return error
    elif kind is FailKind.CONNECTION:
        message = (
            f"the {fail.op.value} operation of node {node} could not use the store: "
            f"{message}; check that the store is running and reachable"
        )
    elif kind is FailKind.CLOSED:
        message = f"{message} (run {run_id!r}, state key {key!r})"
    elif kind is FailKind.TIMEOUT and fail.op is Op.JOIN:
        message = (
            f"{message}: no round with enough nodes completed in time; start more nodes, "
            f"lower min_nodes or raise join_timeout, and check that every node of run "
            f"{run_id!r} uses the same min_nodes, max_nodes and protocol (nodes that "
            f"disagree on them may never complete a round together)"
        )
    error = _FAILURE_ERRORS[kind](message)
    error.__cause__ = cause
    return error


def _check_state_expiry(
    expiry: float | None, settings: RendezvousSettings, variant: Variant
) -> None:
    """Refuse a store whose keys expire (``expiry`` seconds after their last write, e.g.
    Redis's ``ttl``) when the state could expire while nodes still use it: under a
    variant with heartbeats under keys (``scale``) the state is written only when the
    membership changes, so a steady job would lose it; otherwise every live node
    rewrites it at each heartbeat, so the expiry must be at least the time after which
    silent nodes count as dead (``keep_alive_interval`` x ``keep_alive_max_attempt``)."""
    if expiry is None:
        return
    if variant.heartbeats == KEY_BEATS:
        raise ValueError(
            f"protocol {variant.name!r} writes the rendezvous state only when the "
            f"membership changes, so a store whose keys expire {expiry:g} s after their "
            f"last write (Redis's ttl) would lose it while the job runs; drop ttl from the "
            f"store URL (and delete the run's keys when the job is over), or use "
            f"protocol=hardened, which rewrites the state at every heartbeat"
        )
    window = settings.keep_alive_interval.total_seconds() * settings.keep_alive_max_attempt
    if expiry < window:
        raise ValueError(
            f"the store's keys expire {expiry:g} s after their last write (Redis's ttl), "
            f"sooner than a silent node counts as dead (keep_alive_interval x "
            f"keep_alive_max_attempt = {window:g} s), so the rendezvous state could expire "
            f"between two heartbeats; raise ttl to at least {window:g} s (ttl only bounds "
            f"how long the keys of an abandoned job stay, so an hour or a day is fine)"
        )


def default_variant(backend: RendezvousBackend) -> Variant:
    """The protocol a handler over ``backend`` runs when none is named: :data:`DEFAULT_PROTOCOL`
    (``scale``), unless ``backend`` cannot carry it, then :data:`FALLBACK_PROTOCOL`
    (``hardened``, the same guarantees with everything inside the one state). ``scale``
    needs announcement sets and heartbeat keys (every rdzv store has them; torch's
    ``C10dRendezvousBackend`` and a bare torch ``Store`` do not), and a state that never
    expires: it writes the state only when the membership changes, so a store whose keys
    expire (Redis's ``ttl``) would lose it. Naming ``protocol=scale`` over such a backend
    is refused as before, with the reason."""
    variant = get_variant(DEFAULT_PROTOCOL)
    needs_keys = variant.announces or variant.heartbeats == KEY_BEATS
    if needs_keys and (not backend.keeps_sets_and_beats or backend.state_expiry is not None):
        return get_variant(FALLBACK_PROTOCOL)
    return variant


def _spec_settings(settings: RendezvousSettings, cache_duration: float) -> Settings:
    """The one place where a handler's settings become spec's integer milliseconds."""
    return Settings(
        min_nodes=settings.min_nodes,
        max_nodes=settings.max_nodes,
        join_timeout=to_millis(settings.timeout.join),
        last_call_timeout=to_millis(settings.timeout.last_call),
        close_timeout=to_millis(settings.timeout.close),
        heartbeat_timeout=to_millis(settings.timeout.heartbeat),
        keep_alive_interval=to_millis(settings.keep_alive_interval),
        keep_alive_max_attempt=settings.keep_alive_max_attempt,
        cache_duration=to_millis(cache_duration),
    )


def _as_interval(
    value: timedelta | float, what: str = "keep_alive_interval", shown: str | None = None
) -> timedelta:
    """The keep-alive interval as a timedelta: the one check of it, for
    :meth:`DynamicRendezvousHandler.from_backend` and :func:`create_handler` alike
    (``what`` and ``shown`` as in :func:`rdzv.api.as_duration`)."""
    if isinstance(value, timedelta):
        sign = (value > timedelta(0)) - (value < timedelta(0))
    elif isinstance(value, int | float) and not isinstance(value, bool):
        sign = (value > 0) - (value < 0)  # 0 for NaN too: as_duration names NaN below
    else:
        sign = 1  # not a duration: as_duration says what is wrong
    if sign <= 0 and value == value:
        if shown is None:
            shown = f"{value.total_seconds() if isinstance(value, timedelta) else value!r} s"
        raise ValueError(
            f"{what} is {shown}, which is {'negative' if sign < 0 else 'zero'}; pass the "
            f"seconds between two keep-alives, above zero (default "
            f"{DEFAULT_KEEP_ALIVE_INTERVAL:g})"
        )
    return as_duration(value, what, shown=shown)


def _got(value: object) -> str:
    """A wrong argument for a TypeError: its type, and a short repr."""
    if value is None:
        return "None"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _check_parts(store: object, backend: object, clock: object = None, rng: object = None) -> None:
    """TypeError unless ``store``, ``backend``, ``clock`` and ``rng`` are what a handler
    needs (before any of them is used, so no error comes from deep inside)."""
    lacking = [m for m in STORE_METHODS_USED if not callable(getattr(store, m, None))]
    if lacking:
        raise TypeError(
            f"store must be a store with the rdzv.store.Store methods, got {_got(store)}, "
            f"which lacks {', '.join(lacking)}; pass the store the backend uses, e.g. "
            f"rdzv.open_store('sqlite:///tmp/job.db')"
        )
    if not isinstance(backend, RendezvousBackend):
        raise TypeError(
            f"backend must be an rdzv.RendezvousBackend, got {_got(backend)}; pass e.g. "
            f"StoreRendezvousBackend(store, run_id), or call create_handler(params) to "
            f"open the store params.endpoint names"
        )
    if clock is not None and not isinstance(clock, Clock):
        raise TypeError(
            f"clock must be an rdzv.Clock (monotonic, time, sleep, max_real_wait), got "
            f"{_got(clock)}; pass SystemClock(), FakeClock() or None"
        )
    if rng is not None and not isinstance(rng, random.Random):
        raise TypeError(
            f"rng must be a random.Random or None, got {_got(rng)}; pass e.g. "
            f"random.Random(7), or leave it out for a fresh one"
        )


class DynamicRendezvousHandler(RendezvousHandler):
    """torch's dynamic rendezvous handler, driven by spec's node machine.

    Build it with :meth:`from_backend` or :func:`create_handler`. The node has two
    machine states, each with a lock of its own: one for exit, join and keep-alive (the
    heartbeat thread takes its lock, so a keep-alive never overlaps a join), one for
    queries and closes, which therefore never wait for a join in progress. They meet only
    in the store, through compare-and-set.
    """

    @classmethod
    def from_backend(
        cls,
        run_id: str,
        store: Store | Any,
        backend: RendezvousBackend | Any,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None = None,
        timeout: RendezvousTimeout | Any | None = None,
        keep_alive_interval: timedelta | float = DEFAULT_KEEP_ALIVE_INTERVAL,
        keep_alive_max_attempt: int = DEFAULT_KEEP_ALIVE_MAX_ATTEMPT,
        *,
        protocol: str | Variant | None = None,
        cache_duration: float = DEFAULT_CACHE_DURATION,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> DynamicRendezvousHandler:
        """A handler for run ``run_id`` whose state lives in ``backend``; round
        namespaces and bootstrap info go into ``store``.

        ``protocol`` names a variant of :mod:`spec.variants` (None: :func:`default_variant`,
        ``scale`` over an rdzv store, else ``hardened``); ``cache_duration`` is how
        long (seconds) a node reuses its last read; ``clock`` and ``rng`` default to the
        system clock and a fresh ``random.Random``.

        torch's objects are taken as they are: a ``torch.distributed.Store`` as ``store``
        (used through :class:`rdzv.torch_compat.TorchStoreView`; ``RendezvousInfo.store``
        is then a ``torch.distributed.PrefixStore`` over it, as in torch), a torch
        ``RendezvousBackend`` such as ``C10dRendezvousBackend`` as ``backend``
        (:class:`rdzv.torch_compat.TorchBackend`) and torch's ``RendezvousTimeout``.

        Arguments of the wrong type raise ``TypeError`` naming the argument, what it got
        and what it takes; bad values raise ``ValueError`` (with torch's message where
        torch refuses the same value, and rdzv's explanation as its note).
        """
        given_store = store
        store = as_rdzv_store(store)
        backend = as_rdzv_backend(backend)
        timeout = timeout_of(timeout)
        _check_parts(store, backend, clock, rng)
        check_node_bounds(min_nodes, max_nodes, "nodes")
        if local_addr is not None and not isinstance(local_addr, str):
            raise TypeError(
                f"local_addr must be a string or None, got {_got(local_addr)}; pass this "
                f"host's address or leave it out to use the host name"
            )
        if local_addr is not None:
            check_local_addr(local_addr)
        if protocol is not None and not isinstance(protocol, str | Variant):
            raise TypeError(
                f"protocol must be a variant name, a spec.variants.Variant or None, got "
                f"{_got(protocol)}; pass e.g. 'hardened' or 'upstream'"
            )
        settings = RendezvousSettings(
            run_id=run_id,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            timeout=timeout if timeout is not None else RendezvousTimeout(),
            keep_alive_interval=_as_interval(keep_alive_interval),
            keep_alive_max_attempt=keep_alive_max_attempt,
        )
        if protocol is None:
            variant = default_variant(backend)
        else:
            variant = get_variant(protocol) if isinstance(protocol, str) else protocol
        return cls(
            node=new_node_id(local_addr),
            settings=settings,
            backend_name=backend.name,
            store=store,
            backend=backend,
            variant=variant,
            cache_duration=as_duration(
                cache_duration, "cache_duration", allow_zero=True
            ).total_seconds(),
            clock=clock if clock is not None else SystemClock(),
            rng=rng if rng is not None else random.Random(),
            given_store=given_store,
        )

    def __init__(
        self,
        node: NodeId,
        settings: RendezvousSettings,
        backend_name: str,
        store: Store,
        backend: RendezvousBackend,
        *,
        variant: Variant,
        cache_duration: float,
        clock: Clock,
        rng: random.Random,
        given_store: object = None,
    ) -> None:
        _check_parts(store, backend, clock, rng)
        events.record_from_env()
        if not isinstance(settings.run_id, str) or not settings.run_id:
            raise torch_worded(
                "The run id must be a non-empty string.",
                f"run_id must be a non-empty string, got {settings.run_id!r}; pass the job's id",
            )
        if not isinstance(settings.timeout, RendezvousTimeout):
            raise ValueError(
                f"timeout must be a RendezvousTimeout, got {type(settings.timeout).__name__}; "
                f"pass e.g. RendezvousTimeout(join=timedelta(seconds=600))"
            )
        self._spec_settings = _spec_settings(settings, cache_duration)
        _check_state_expiry(backend.state_expiry, settings, variant)
        self._settings = settings
        self._node = node
        self._backend_name = backend_name
        self._store = store
        self._given_store = store if given_store is None else given_store
        """The store as the caller passed it (a torch store, where ``_store`` is its view):
        ``RendezvousInfo.store`` is made over it."""
        self._backend = backend
        self._variant = variant
        self._clock = clock
        # A variant that compares no wall clocks across machines gets a wall clock that
        # cannot jump (SteadyWallClock): then only clock *rates* need to agree.
        machine_clock = SteadyWallClock(clock) if variant.liveness_clock == LOCAL else clock
        self._config = Config(settings=self._spec_settings, variant=variant, decode=LastDecoded())
        narrator = Narrator(settings.run_id)
        job = NodeJob()
        self._driver = NodeDriver(
            node, self._config, backend, machine_clock, rng, settings.run_id, narrator, job
        )
        # Queries and closes run on a machine state of their own (own reads, tokens and
        # decoder: LastDecoded is not thread-safe), so that they never wait for a join and
        # never touch the join's view. Both write through compare-and-set: a write of one
        # makes the other's token stale, and a stale token only loses a race and re-reads.
        self._control = NodeDriver(
            node,
            replace(self._config, decode=LastDecoded()),
            backend,
            machine_clock,
            rng,
            settings.run_id,
            narrator,
            job,
            machine="control",
        )
        self._lock = threading.Lock()
        """Serializes the operations of ``_driver``: exit, join, keep-alive, and the
        state checks of the bootstrap wait."""
        self._control_lock = threading.Lock()
        """Serializes the operations of ``_control`` (query, close); never held while
        waiting for ``_lock``."""
        self._rendezvous_lock = threading.Lock()
        """Held for a whole ``next_rendezvous``: ``shutdown`` waits on it (bounded)
        before it closes a store the handler opened itself."""
        self._shutdown_lock = threading.Lock()
        """Taken only by ``shutdown``, for its whole run: guards the fields below, so
        that a repeated ``shutdown`` waits for no query and no join."""
        self._heartbeats = HeartbeatSlot()
        self._owned_store: Store | None = None
        """The store :func:`create_handler` opened for this handler, until closed."""
        self._store_closer: weakref.finalize[[Store], DynamicRendezvousHandler] | None = None
        """Closes ``_owned_store`` when the handler is garbage-collected, once a shutdown
        had to leave it open."""
        self._shutdown_result: bool | None = None
        self._outage = QueryOutage(
            self._node,
            settings.run_id,
            to_seconds(max(self._spec_settings.heartbeat_expiry, self._spec_settings.join_timeout)),
        )
        """Whether queries answer from the last view because the store is unreachable."""
        self._joined: tuple[int, NodeId | None] | None = None
        """The round the last ``next_rendezvous`` returned, and its rank 0."""
        """What the first complete ``shutdown`` returned; None before."""
        # Stop (and join) the heartbeat thread when this handler is garbage-collected.
        self._finalizer = weakref.finalize(self, self._heartbeats.stop)

    # -- torch's API ------------------------------------------------------------------------
    @property
    def settings(self) -> RendezvousSettings:
        return self._settings

    def get_backend(self) -> str:
        return self._backend_name

    @property
    def use_agent_store(self) -> bool:
        # No TCPStore server runs inside this handler: the agent starts its own at the
        # bootstrap address.
        return False

    def get_run_id(self) -> str:
        return self._settings.run_id

    def next_rendezvous(self) -> RendezvousInfo:
        """Leave the current round, join the next, and return this node's place in it.

        A round that ends before its rank 0 published the bootstrap info (rank 0 died, or
        the rendezvous was closed) is left and the next one joined, all within one join
        deadline (at most :data:`MAX_ROUND_ATTEMPTS` rounds). If the call fails after
        the node joined a round (the bootstrap info could not be read or published),
        the node stops its heartbeats, so that the round's other members find it gone
        (as if it had crashed) instead of waiting on a member that never started."""
        return self.next_rendezvous_until(None)

    def next_rendezvous_until(self, deadline: float | None) -> RendezvousInfo:
        """:meth:`next_rendezvous` with its join deadline given: ``deadline`` in seconds
        of :attr:`clock`'s monotonic time (None: the join timeout from now). For callers
        that call it again after a round failed them and must stay within the deadline
        of their own first call (the torchrun plug-in)."""
        with self._rendezvous_lock:
            if self._heartbeats.is_shut:
                raise self._shut_down_error("was shut down")
            self._stop_heartbeats()
            self._joined = None  # in no round until this call returns one
            if deadline is None:
                deadline = self._driver.deadline_after(self._spec_settings.join_timeout)
            else:
                deadline = to_millis(deadline)
            for _ in range(MAX_ROUND_ATTEMPTS):
                with self._lock:
                    self._run(Op.EXIT, deadline)
                    self._run(Op.JOIN, deadline)
                    view = self._driver.local.view
                rank = view.rank_of(self._node)
                if not view.complete or rank is None:
                    raise RendezvousError(
                        f"the join operation of node {self._node} finished in a state where "
                        f"it is not a member of a complete round ({view.describe()}); this "
                        f"is a bug in the protocol variant {self._variant.name!r}"
                    )
                round_ = view.round
                leader = next((n for n, r in view.participants if r == 0), None)
                if not self._start_heartbeats():
                    raise self._shut_down_error(f"was shut down while it joined round {round_}")
                prefix = f"rdzv/{self._settings.run_id}/{round_}"
                store = PrefixStore(prefix, self._store)
                try:
                    bootstrap = self._bootstrap(rank, store, deadline, round_, leader)
                except BaseException:
                    self._stop_heartbeats()  # not a working member: let the others see it
                    raise
                if bootstrap is not None:
                    self._joined = (round_, leader)
                    logger.info(
                        "node %s joined round %d of run %r as rank %d of %d (rank 0: %s, at %s:%d)",
                        self._node,
                        round_,
                        self._settings.run_id,
                        rank,
                        view.num_participants,
                        leader,
                        bootstrap.master_addr,
                        bootstrap.master_port,
                    )
                    return RendezvousInfo(
                        round_store(prefix, self._store, self._given_store),
                        rank,
                        view.num_participants,
                        bootstrap,
                        round=round_,
                        participants=view.participant_nodes(),
                        wait_list=view.wait_list,
                        rdzv_store=store,
                    )
                logger.warning(
                    "round %d of run %r ended before its rank 0 (%s) published the bootstrap "
                    "info; node %s leaves it and joins the next round",
                    round_,
                    self._settings.run_id,
                    leader,
                    self._node,
                )
                self._stop_heartbeats()
            raise RendezvousTimeoutError(
                f"node {self._node} joined {MAX_ROUND_ATTEMPTS} rounds of run "
                f"{self._settings.run_id!r} in one next_rendezvous and each ended before its "
                f"rank 0 published the bootstrap info; check why the nodes of this run die "
                f"right after forming a round, then call next_rendezvous again"
            )

    def abandon_round(self) -> None:
        """Stop the heartbeats of the round the last :meth:`next_rendezvous` returned,
        without closing the rendezvous: the round's other members then find this node
        gone, as if it had crashed. For callers whose own work after
        ``next_rendezvous`` failed (the torchrun plug-in's agent store); the next
        ``next_rendezvous`` leaves the round and joins another as usual."""
        with self._rendezvous_lock:
            self._stop_heartbeats()

    def is_closed(self) -> bool:
        """Whether this node's rendezvous is closed: the state is, or a new job under the
        run id has reopened it since this node's job closed it
        (:func:`spec.machine.closed_for`): its next ``next_rendezvous`` fails closed."""
        self._control_op(Op.QUERY)
        return closed_for(self._control.local)

    def set_closed(self) -> None:
        self._control_op(Op.CLOSE)

    def num_nodes_waiting(self) -> int:
        """The nodes waiting for the next round; under ``hardened`` and ``scale`` this node
        too, once the round its last ``next_rendezvous`` returned no longer holds it
        (:func:`spec.machine.nodes_waiting`)."""
        view = self._control_op(Op.QUERY)
        joined = None if self._joined is None else self._joined[0]
        return nodes_waiting(view, self._node, joined, self._variant)

    def shutdown(self) -> bool:
        """Stop the heartbeats for good, close the rendezvous, leave it (under a protocol
        that reopens a closed run, ``hardened`` and ``scale``: so that the next job under
        the run id finds nobody listed and starts at once), and close the store the
        handler opened itself (:func:`create_handler` with params only); False if closing
        the rendezvous failed.

        A ``next_rendezvous`` running in another thread sees the close and raises
        :class:`~rdzv.errors.RendezvousClosedError`. ``shutdown`` does not wait for it,
        except to close a store the handler opened: then it waits up to
        :data:`SHUTDOWN_DRAIN_TIMEOUT` for that call, and for a query or close running
        in another thread, to end. If one of them, or the keep-alive thread, is still
        running after its bound, the store is left open (a warning says so) rather than
        closed under it: a later ``shutdown`` that finds everything stopped closes it,
        or else it is closed when the handler is garbage-collected.

        Calling it again writes nothing: it returns the first call's answer (and closes
        a store left open, if it now can)."""
        with self._shutdown_lock:
            if self._shutdown_result is None:
                stopped = self._heartbeats.shut()
                closed = False
                try:
                    self._control_op(Op.CLOSE)
                    closed = True
                except RendezvousError as exc:
                    logger.warning(
                        "shutdown of node %s could not close the rendezvous: %s", self._node, exc
                    )
                if closed and self._variant.reopens:
                    self._leave_closed_run()
                self._shutdown_result = closed
            else:
                stopped = self._heartbeats.stop()  # a straggler of the first call, if any
            if not stopped:
                logger.warning("the keep-alive thread of node %s did not stop in time", self._node)
            self._release_store(stopped)
            return self._shutdown_result

    def _leave_closed_run(self) -> None:
        """Leave the closed run (its wait or redundancy list, or its round), as the exit
        table says, so that the next job under the run id finds nobody listed and reopens
        it at once instead of waiting for this node's heartbeat to expire. Bounded: a
        ``next_rendezvous`` still running in another thread holds the main machine state
        for at most the close timeout, then this node is left for expiry to remove."""
        timeout = self._spec_settings.close_timeout / 1000
        if not self._lock.acquire(timeout=timeout):
            logger.warning(
                "shutdown of node %s did not leave the closed run %r: a next_rendezvous in "
                "another thread still runs; the next job under this run id reopens it once "
                "this node's heartbeat has expired",
                self._node,
                self._settings.run_id,
            )
            return
        try:
            self._run(Op.EXIT, self._driver.deadline_after(self._spec_settings.close_timeout))
        except RendezvousError as exc:
            logger.warning(
                "shutdown of node %s could not leave the closed run %r (%s); the next job "
                "under this run id reopens it once this node's heartbeat has expired",
                self._node,
                self._settings.run_id,
                exc,
            )
        finally:
            self._lock.release()

    # -- extras ------------------------------------------------------------------------------
    @property
    def node(self) -> NodeId:
        """This handler's node id."""
        return self._node

    @property
    def variant(self) -> Variant:
        return self._variant

    @property
    def clock(self) -> Clock:
        """The clock this handler measures its timeouts on."""
        return self._clock

    @property
    def driver(self) -> NodeDriver:
        """The interpreter of this node's machine for exit, join and keep-alive (for tests
        and tools; not thread-safe). Queries and closes run on a second one of their own."""
        return self._driver

    @property
    def control_driver(self) -> NodeDriver:
        """The machine state that runs queries and closes (:attr:`driver` runs exits,
        joins and keep-alives)."""
        return self._control

    def start_on(self, driver: NodeDriver, op: Op, deadline: Millis) -> None:
        """Start ``op`` on ``driver`` (:attr:`driver` or :attr:`control_driver`) as the
        handler itself does, without running it: for tests that step a node by hand."""
        self._start(op, deadline, driver)

    @property
    def heartbeat_thread(self) -> threading.Thread | None:
        """The running keep-alive thread, if any."""
        current = self._heartbeats.current
        return None if current is None else current.thread

    def io_stats(self) -> IoStats:
        """This node's store traffic counters, of all its operations (not synchronized: a
        snapshot taken while an operation runs may be mid-update)."""
        return self._driver.stats.copy() + self._control.stats.copy()

    # -- internals ---------------------------------------------------------------------------
    def _run(self, op: Op, deadline: Millis, driver: NodeDriver | None = None) -> None:
        driver = self._driver if driver is None else driver
        # The other machine state is read without its lock: a Local is an immutable value,
        # so this is one consistent snapshot. Queries and closes judge heartbeats by the
        # main one's liveness clock; either starts from the other's view when it is newer.
        self._start(op, deadline, driver)
        try:
            driver.run()
        except OperationFailed as failed:
            raise _failure_error(
                failed.fail,
                failed.cause,
                self._node,
                self._settings.run_id,
                self._state_key(),
                self._backend.announcement_set_name,
            ) from failed.cause

    def _start(self, op: Op, deadline: Millis, driver: NodeDriver) -> None:
        """Start ``op`` on ``driver`` (one of this handler's two), from what the other one
        knows (:func:`spec.machine.start_event`)."""
        control = driver is self._control
        peer = self._driver if control else self._control
        driver.start_with(start_event(op, deadline, now_of(driver.clock), peer.local, control))

    def _control_op(self, op: Op) -> RendezvousState:
        """Run a query or a close on the control machine (never waits for a join) and
        return its view.

        A query that cannot reach the store answers from the last view instead, for at
        most the longer of the heartbeat expiry and the join timeout after the first
        failure (:class:`QueryOutage`); a close must write, so it fails at once."""
        with self._control_lock:
            driver = self._control
            outage = self._outage
            if op is Op.QUERY and outage.answer_from_view(self._clock.monotonic()):
                return driver.local.view  # tried less than OUTAGE_RETRY_INTERVAL ago
            try:
                self._run(op, driver.deadline_after(self._spec_settings.close_timeout), driver)
            except RendezvousConnectionError as exc:
                if op is not Op.QUERY or isinstance(exc, RendezvousStateError):
                    raise
                outage.failed(self._clock, exc, driver.local.synced_at)  # raises past the bound
                return driver.local.view
            outage.reached(self._clock)
            return driver.local.view

    def _state_key(self) -> str:
        if isinstance(self._backend, StoreRendezvousBackend):
            return self._backend.key
        return self._config.key

    def _shut_down_error(self, what: str) -> RendezvousClosedError:
        return RendezvousClosedError(
            f"the handler of node {self._node} (run {self._settings.run_id!r}) {what}: "
            f"shutdown() closed the rendezvous; build a new handler to rendezvous again"
        )

    def _release_store(self, heartbeats_stopped: bool) -> None:
        """Close the store this handler opened itself, once nothing of the handler uses
        it any more; else leave it open and say so. Called under ``_shutdown_lock``."""
        store = self._owned_store
        if store is None:
            return
        if not heartbeats_stopped:
            self._leave_store_open(store, "its keep-alive thread is still running")
            return
        # A next_rendezvous in another thread sees the close within one wait slice and
        # ends, a query or close within its close timeout; let them end before their
        # store goes away (bounded).
        if not self._rendezvous_lock.acquire(timeout=SHUTDOWN_DRAIN_TIMEOUT):
            self._leave_store_open(store, "a next_rendezvous in another thread still runs")
            return
        try:
            if not self._control_lock.acquire(timeout=SHUTDOWN_DRAIN_TIMEOUT):
                self._leave_store_open(store, "a query or close in another thread still runs")
                return
            try:
                self._owned_store = None
                if self._store_closer is not None:
                    self._store_closer()  # closes the store (finalizers run once)
                else:
                    _close_store(store)
                release_torch_store(store)  # nothing can use its torch view any more
            finally:
                self._control_lock.release()
        finally:
            self._rendezvous_lock.release()

    def _leave_store_open(self, store: Store, why: str) -> None:
        logger.warning(
            "shutdown of node %s leaves the store %r open because %s; call shutdown() "
            "again once it ended, else the store is closed when the handler is "
            "garbage-collected",
            self._node,
            store,
            why,
        )
        if self._store_closer is None:
            self._store_closer = weakref.finalize(self, _close_store, store)

    def _keep_alive(self, stopping: threading.Event) -> None:
        with self._lock:
            if stopping.is_set():
                return
            deadline = self._driver.deadline_after(self._spec_settings.heartbeat_timeout)
            self._run(Op.KEEP_ALIVE, deadline)

    def _start_heartbeats(self) -> bool:
        """Start the keep-alive thread; False (and no thread) once the handler is shut down.
        The first keep-alive is due an interval after the node's last heartbeat write
        (:func:`spec.machine.keep_alive_due`), not an interval after now."""
        driver = self._driver
        due = keep_alive_due(driver.local, now_of(driver.clock), self._config)
        return self._heartbeats.start(
            lambda: Heartbeat(
                self,
                self._settings.keep_alive_interval.total_seconds(),
                self._clock,
                self._settings.timeout.heartbeat.total_seconds() + HEARTBEAT_JOIN_SLACK,
                name=f"rdzv-keep-alive-{self._node}",
                first_due=to_seconds(due),
            )
        )

    def _stop_heartbeats(self) -> None:
        if not self._heartbeats.stop():
            logger.warning("the keep-alive thread of node %s did not stop in time", self._node)

    def _round_stands(self, round_: int, leader: NodeId | None) -> bool:
        """Whether round ``round_`` is still the complete round this node joined, with
        its rank 0 ``leader`` in it (a fresh read unless the cache is younger)."""
        with self._lock:
            self._run(Op.QUERY, self._driver.deadline_after(self._spec_settings.close_timeout))
            view = self._driver.local.view
        return (
            view.round == round_
            and view.complete
            and not view.closed
            and view.is_participant(self._node)
            and (leader is None or view.is_participant(leader))
        )

    def _bootstrap(
        self, rank: int, store: Store, deadline: Millis, round_: int, leader: NodeId | None
    ) -> RendezvousStoreInfo | None:
        """Rank 0 publishes the bootstrap info, the others read it; None if the round
        ended before rank 0 published it (the caller joins the next round).

        Non-zero ranks wait in slices (:func:`wait_slice`) and read the state between
        slices; they wait at most the rest of the join deadline, and at least
        :data:`MIN_BOOTSTRAP_WAIT`, in at most :func:`max_slices` slices."""
        budget = max(to_seconds(deadline - now_of(self._clock).mono), MIN_BOOTSTRAP_WAIT)
        if rank != 0:
            return self._wait_in_round(
                lambda wait: self._exchange(rank, store, round_, wait),
                budget,
                round_,
                leader,
                "the bootstrap info",
            )
        info = self._exchange(rank, store, round_, budget)
        if info is None:  # not expected: rank 0 writes and does not wait
            raise RendezvousTimeoutError(
                f"rank 0 ({leader}) of round {round_} could not publish the bootstrap info "
                f"within {budget:g} s; call next_rendezvous again to form a new round"
            )
        return info

    def wait_for_rank_0(
        self, attempt: Callable[[float], T | None], deadline: float, what: str
    ) -> T | None:
        """Wait for something rank 0 of the round the last ``next_rendezvous`` returned
        publishes after it (the torchrun plug-in's agent store), the way members wait for
        the bootstrap info: ``attempt(seconds)`` waits up to that many real seconds and
        returns None if it is not there yet; between attempts the state is read to check
        that the round still stands.

        Waits until ``deadline`` (seconds of :attr:`clock`), at least
        :data:`MIN_BOOTSTRAP_WAIT`. Returns ``attempt``'s value, or None if the round
        ended first (call ``next_rendezvous`` again); :class:`RendezvousTimeoutError`
        naming ``what`` once the time is up."""
        if self._joined is None:
            raise RendezvousError(
                f"node {self._node} waits for rank 0's {what} but has not joined a round; "
                f"call next_rendezvous first"
            )
        round_, leader = self._joined
        budget = max(deadline - self._clock.monotonic(), MIN_BOOTSTRAP_WAIT)
        return self._wait_in_round(attempt, budget, round_, leader, what)

    def _wait_in_round(
        self,
        attempt: Callable[[float], T | None],
        budget: float,
        round_: int,
        leader: NodeId | None,
        what: str,
    ) -> T | None:
        """``attempt`` in slices (:func:`wait_slice`) for ``budget`` seconds, at most
        :func:`max_slices` of them, reading the state between slices; None as soon as
        round ``round_`` (rank 0 ``leader``) no longer stands."""
        until = self._clock.monotonic() + budget
        for _ in range(max_slices(self._clock, budget)):
            left = until - self._clock.monotonic()
            if left <= 0:
                break
            value = attempt(wait_slice(self._clock, left))
            if value is not None or not self._round_stands(round_, leader):
                return value
        raise RendezvousTimeoutError(
            f"rank 0 ({leader}) of round {round_} did not publish {what} within "
            f"{budget:g} s; it may have died: call next_rendezvous again to form a new round"
        )

    def _exchange(
        self, rank: int, store: Store, round_: int, wait: float
    ) -> RendezvousStoreInfo | None:
        """One attempt of the bootstrap exchange waiting ``wait`` real seconds; None if
        rank 0's keys did not appear in that time: the store's timeout means "not yet",
        also a torch store's ``DistStoreError`` (:func:`rdzv.torch_compat.store_timeouts`),
        as torch waits on it."""
        try:
            return RendezvousStoreInfo.build(
                rank, store, self._node.addr, timeout=timedelta(seconds=wait)
            )
        except store_timeouts():
            return None
        except RendezvousError:
            raise
        except Exception as exc:
            raise RendezvousConnectionError(
                f"node {self._node} could not exchange the bootstrap info of round {round_} "
                f"through the store: {type(exc).__name__}: {exc}; check that the store is "
                f"running and reachable"
            ) from exc


def _close_store(store: Store) -> None:
    """Close a store the handler opened; a failure is logged, never raised (shutdown)."""
    close = getattr(store, "close", None)
    if not callable(close):
        return
    try:
        close()
    except Exception as exc:
        logger.warning("closing the store %r failed: %s: %s", store, type(exc).__name__, exc)


def check_config_keys(
    config: Mapping[str, object],
    known: Sequence[str],
    *,
    source: str = "config",
    owner: str = "the rdzv handler",
    note: str = "",
) -> None:
    """``ValueError`` if ``config`` has a key that is not in ``known``: the message lists
    the unknown keys, the closest known key of each (a typo, usually) and every known key.

    ``source`` names where the keys came from, ``owner`` what reads them, and ``note``
    is added to the advice to remove them.
    """
    unknown = sorted(str(key) for key in config if key not in known)
    if not unknown:
        return
    guesses = [
        f"{close[0]!r} for {key!r}"
        for key in unknown
        if (close := difflib.get_close_matches(key, known, n=1))
    ]
    hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
    raise ValueError(
        f"{source} key(s) {unknown} are not options of {owner}{hint}; remove them{note} "
        f"or use one of {sorted(known)}"
    )


_TIMEOUT_FIX = (
    " ('timeout' is the join timeout unless join_timeout is given; torchrun passes 900 "
    "unless told otherwise)"
)


def _config_duration(
    params: RendezvousParameters, key: str, *, allow_zero: bool = False, fix: str = ""
) -> timedelta | None:
    """Config option ``key`` as a timedelta (None if absent), with messages that name the
    key and the value as the user wrote it."""
    seconds = params.get_as_float(key)  # a clear error unless a finite number
    if seconds is None:
        return None
    return as_duration(
        seconds,
        f"config option {key!r}",
        shown=repr(params.get(key)),
        allow_zero=allow_zero,
        fix=fix,
    )


def config_join_timeout(params: RendezvousParameters) -> timedelta | None:
    """The join timeout ``params`` asks for, or None for the default.

    ``join_timeout`` if given, else ``timeout``: torch's launcher puts ``timeout`` into
    every config (900 s unless ``--rdzv-conf timeout=`` or ``rdzv_timeout`` says
    otherwise), so a ``join_timeout`` given as well must win rather than conflict. Both
    are checked when both are given.
    """
    timeout = _config_duration(params, "timeout", fix=_TIMEOUT_FIX)
    join = _config_duration(params, "join_timeout")
    return join if join is not None else timeout


def create_handler(
    store: Any = None,
    backend: Any = None,
    params: Any = None,
    *,
    clock: Clock | None = None,
    rng: random.Random | None = None,
) -> DynamicRendezvousHandler:
    """``create_handler(params)`` opens the store ``params.endpoint`` names;
    ``create_handler(store, backend, params)`` uses the given ones (torch's form, also
    with keywords: ``create_handler(store=..., backend=..., params=...)``).

    Config keys (:data:`HANDLER_CONFIG_KEYS`; strings are parsed; durations in seconds,
    fractions allowed): ``join_timeout`` (600), ``timeout`` (the join timeout unless
    ``join_timeout`` is given; torchrun's), ``last_call_timeout`` (30), ``close_timeout``
    (30), ``heartbeat_timeout`` (5), ``keep_alive_interval`` (5),
    ``keep_alive_max_attempt`` (3), ``cache_duration`` (1), ``protocol`` (``scale``
    over an rdzv store; ``hardened`` over a torch store or backend, or a store whose keys
    expire: :func:`default_variant`).
    Any other key is a ``ValueError`` listing these.
    """
    if params is None and backend is None:
        store, params = None, store  # the one-argument form
    elif params is None and isinstance(backend, RendezvousParameters):
        raise TypeError(
            "create_handler takes (params) or (store, backend, params), got (store, params); "
            "pass a backend too, e.g. StoreRendezvousBackend(store, params.run_id)"
        )
    elif (store is None) != (backend is None):
        given, missing = ("store", "backend") if backend is None else ("backend", "store")
        raise TypeError(
            f"create_handler got a {given} but no {missing}; pass both with the params "
            f"(torch's form) or only the params, and the store is opened from params.endpoint"
        )
    if not isinstance(params, RendezvousParameters):
        if not all(hasattr(params, name) for name in ("run_id", "min_nodes", "config")):
            raise TypeError(
                f"create_handler needs RendezvousParameters, got {type(params).__name__}; "
                f"build them with rdzv.RendezvousParameters(backend, endpoint, run_id, min, "
                f"max)"
            )
        params = parameters_of(params)  # torch's: the same fields, checked as ours
    plugin_keys = [key for key in TORCHRUN_CONFIG_KEYS if key in params.config]
    known = HANDLER_CONFIG_KEYS
    if is_torch_backend(backend):  # torch's create_backend read these of the same params
        known = (*HANDLER_CONFIG_KEYS, *C10D_BACKEND_CONFIG_KEYS)
    check_config_keys(
        params.config,
        known,
        note=(
            f" ({', '.join(map(repr, plugin_keys))} only mean something under torchrun: "
            f"they are options of its plug-in, rdzv.torch_plugin)"
            if plugin_keys
            else ""
        ),
    )
    timeout = RendezvousTimeout(
        join=config_join_timeout(params),
        last_call=_config_duration(params, "last_call_timeout"),
        close=_config_duration(params, "close_timeout"),
        heartbeat=_config_duration(params, "heartbeat_timeout"),
    )
    seconds = params.get_as_float("keep_alive_interval")  # a clear error unless a number
    interval = (
        None
        if seconds is None
        else _as_interval(
            seconds, "config option 'keep_alive_interval'", repr(params.get("keep_alive_interval"))
        )
    )
    attempts = params.get_as_int("keep_alive_max_attempt", DEFAULT_KEEP_ALIVE_MAX_ATTEMPT)
    cache = _config_duration(params, "cache_duration", allow_zero=True)
    protocol = params.get("protocol")
    assert attempts is not None
    if protocol is not None and not isinstance(protocol, str):
        raise ValueError(
            f"rendezvous config option 'protocol': got {protocol!r}; pass a variant name "
            f"such as 'upstream'"
        )
    variant = None if protocol is None else get_variant(protocol)

    def build(store: Any, backend: Any) -> DynamicRendezvousHandler:
        return DynamicRendezvousHandler.from_backend(
            params.run_id,
            store,
            backend,
            params.min_nodes,
            params.max_nodes,
            params.local_addr,
            timeout,
            interval if interval is not None else DEFAULT_KEEP_ALIVE_INTERVAL,
            attempts,
            protocol=variant,
            cache_duration=DEFAULT_CACHE_DURATION if cache is None else cache.total_seconds(),
            clock=clock,
            rng=rng,
        )

    if store is not None and backend is not None:
        return build(store, backend)
    from rdzv.stores import open_store

    # The handler owns the store it opens: closed if building the handler fails (a bad
    # setting found only now), else on its shutdown().
    owned = open_store(params.endpoint)
    try:
        handler = build(owned, StoreRendezvousBackend(owned, params.run_id))
    except BaseException:
        _close_store(owned)
        raise
    handler._owned_store = owned
    return handler
