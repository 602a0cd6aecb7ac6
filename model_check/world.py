"""The checker's values: the configuration, the world and its processes, moves and
outcomes, the property names, and the caches of decoded store states.

:mod:`model_check.model` makes worlds of these and moves between them (see its
docstring for the theory of operation); :mod:`model_check.canon` fingerprints them.
Everything here is plain data: immutable, hashable, no behaviour beyond helpers that
read or copy it.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Hashable
from dataclasses import dataclass, field, fields
from typing import Generic, TypeVar

import spec
from spec import (
    EMPTY_STATE,
    Announce,
    Beat,
    CompareAndSet,
    Config,
    Local,
    NodeId,
    Read,
    ReadAnnounced,
    ReadBeats,
    RendezvousState,
    Settings,
    Variant,
    Wait,
    Withdraw,
)
from spec.state import compared_values

BEAT_MODULUS = 4
"""Heartbeat-key values count modulo this in the model (see ``machine_config``)."""

STALE_SIGHTING = -(2**62)
"""The value and first-seen time of a forgotten heartbeat sighting (see
:func:`forget_stale_sightings`): no heartbeat value equals it and its expiry is long past,
so the next read starts that node's age afresh, as it would for the newer value."""

STALE_WATCH_VALUE = b"-"
"""The value of a forgotten watch record (see :func:`forget_stale_watch`): heartbeat keys
hold decimal digits, so no read returns it and the next read starts that node's age afresh,
as it would for the newer value in the key. Its first-seen time is :data:`STALE_SIGHTING`."""

StoreRequest = Read | CompareAndSet | Wait | Announce | ReadAnnounced | Withdraw | Beat | ReadBeats
"""A request a machine state waits on the store for (every request but Done and Fail)."""
STORE_REQUESTS = (Read, CompareAndSet, Wait, Announce, ReadAnnounced, Withdraw, Beat, ReadBeats)

NO_WAKE_UP_TIME = -1
"""The ``until`` of a wait as the checker serves it: it keeps no wake-up time (see
``_Run.pending``)."""

MAX_LOCAL_STEPS = 32
"""Bound on machine steps one node takes within a single move (fused reads, and ops that
chain into each other: exit, join, keep-alive, query); exceeding it raises."""


class Pc(enum.IntEnum):
    """Where a process's agent is in torch's elastic agent workload.

    The agent runs in one thread: it calls ``next_rendezvous`` and, once that returned and
    its workers run, polls ``num_nodes_waiting()``; it calls ``next_rendezvous`` again when
    the count is above 0 or its workers fail. Beside it the handler's keep-alive thread
    runs the keep-alive op once per interval on the process's main machine state (see
    :class:`Proc`), from the moment ``next_rendezvous`` returned until the next call or
    ``shutdown`` stops it (both wait for a keep-alive in flight to end first)."""

    NEW = 0
    """Not started yet (a late arrival may start at any time)."""
    RDZV = 1
    """Inside next_rendezvous (exit op, then join op), or about to enter it once the
    keep-alive in flight has ended."""
    MEMBER = 2
    """Returned from next_rendezvous; its workers run, it may poll at any moment."""
    POLL = 3
    """Running num_nodes_waiting (query op on the control machine state)."""
    CLOSING = 4
    """Running shutdown (close op on the control machine state), or about to once the
    keep-alive in flight has ended."""
    ENDED = 5
    """Finished: see ``outcome``."""
    CRASHED = 6
    """Stopped silently."""


LIVE_PCS = frozenset({Pc.RDZV, Pc.MEMBER, Pc.POLL})
"""Processes that keep their heartbeat fresh (and so must never be evicted)."""

HALTED_PCS = frozenset({Pc.NEW, Pc.ENDED, Pc.CRASHED})
"""Processes that run nothing: not started, ended or crashed."""

BEATING_PCS = frozenset({Pc.MEMBER, Pc.POLL})
"""Processes whose keep-alive timer runs (a tick starts their keep-alive op)."""


AGENT_WORKLOAD = "agent"
TICKS_WORKLOAD = "ticks"
MONITOR_WORKLOAD = "monitor"
WORKLOADS = (AGENT_WORKLOAD, TICKS_WORKLOAD, MONITOR_WORKLOAD)
"""The agent workloads the model offers (:attr:`ModelConfig.workload`)."""
POLLING_WORKLOADS = frozenset({AGENT_WORKLOAD, MONITOR_WORKLOAD})
"""The workloads whose members poll at any moment (a ``poll`` move)."""


class Lane(enum.IntEnum):
    """A process's two machine states, as the real handler keeps them."""

    MAIN = 0
    """exit, join and keep-alive (``Proc.local``)."""
    CONTROL = 1
    """queries and closes (``Proc.control``), which never wait for the main one."""


@dataclass(frozen=True)
class Faults:
    """Fault budgets (how many of each fault a run may inject)."""

    crash: int = 0
    restart_new: int = 0
    restart_same: int = 0
    cas_unknown: int = 0
    store_down: int = 0
    pause: int = 0
    """Ticks that may pass while store requests are in flight (``pause_tick``): every
    process with a read, write, wait or set request pending is paused across the tick,
    as SIGSTOP, a GC or a VM stall would hold it between a read and the write it decided
    on it. Without this fault, time passes only when no process can move."""

    def describe(self) -> str:
        text = (
            f"crash={self.crash} restart_new={self.restart_new} "
            f"restart_same={self.restart_same} cas_unknown={self.cas_unknown} "
            f"store_down={self.store_down}"
        )
        return f"{text} pause={self.pause}" if self.pause else text


FAULT_KINDS = ("crash", "restart_new", "restart_same", "cas_unknown", "store_down", "pause")


@dataclass(frozen=True)
class ModelConfig:
    """Everything that defines the explored system. Durations are in ticks."""

    nodes: int = 3
    min_nodes: int = 2
    max_nodes: int = 3
    variant: Variant = spec.UPSTREAM
    tick_ms: int = 5000
    join_ticks: int = 4
    last_call_ticks: int = 1
    close_ticks: int = 2
    heartbeat_ticks: int = 1
    keep_alive_max_attempt: int = 3
    max_rounds: int = 2
    closes: int = 1
    worker_failures: int = 1
    """How many times, in all, a member's workers may fail (the agent then calls
    next_rendezvous again at once, whatever the count of waiting nodes)."""
    workload: str = "agent"
    """``"agent"``: torch's agent, which polls num_nodes_waiting() at any moment while its
    workers run (every interleaving of a poll with everything else). ``"ticks"``: each
    member polls once per tick, right after its keep-alive: far fewer interleavings (an
    under-approximation: it finds fewer counterexamples, but every one is real), for
    large N and for the checker's own tests. ``"monitor"``: torch's agent with its monitor
    loop, which polls every ``monitor_interval`` (0.1 s by default, far below a tick):
    polls at any moment as in ``"agent"``, but every member polls at least once between
    two ticks, so no agent sits through a whole join timeout without polling (``"agent"``
    allows that, and its liveness counterexamples may rest on it)."""
    share_views: bool = True
    """An operation starts from the view of the process's other machine state when that
    one is newer (``StartOp.known``), as the handler does. Off: the planted handler bug
    of rdzv before that fix (a query counted from a cache older than the round its
    process had just joined)."""
    faults: Faults = field(default_factory=Faults)
    skew_ticks: int = 0
    """Wall-clock offset of process 0 (it runs this many ticks ahead of the others)."""
    cache_ms: int = 1000
    """The state cache (reuse a read this recent); 1 s like torch, always below a tick."""
    fuse_reads: bool = True
    """Macro-steps: serve a read in the same move as the local work that issued it."""
    late_starts: bool = False
    """Every process may call next_rendezvous after time advanced (else see ``late``)."""
    late: int = 0
    """How many processes (the last slots) may start after time advanced; the others are
    launched before time first advances."""
    next_job: int = 0
    """How many processes (the last slots, late starters) belong to the next job under
    the same run id: each may call next_rendezvous once a shutdown has been called (a
    requeued job starting where the first one closed the run)."""
    duplicate_identity: bool = False
    """Process 1 gets process 0's identity (two live processes, one NodeId)."""
    cas_ignores_token: bool = False
    """Planted store bug: compare-and-set writes whatever token it is given."""
    store_outage: bool = False
    """The ``store_down`` budget counts instants of a store-wide outage instead of single
    failed calls: one ``store_outage`` move fails every pending store call of every
    process at once (issue 26). Several of them on consecutive ticks keep every heartbeat
    out of the store for longer than the expiry. Unlike a failed call of one node, an
    outage that silences everybody does not excuse evicting a live node
    (``live_node_evicted`` still applies): nobody's silence is its own."""
    forget_stale: bool = True
    """Apply :func:`forget_stale_sightings` where it is exact (off only to test it)."""
    rotate_beats: bool = True
    """Apply :func:`rotate_beat_values` where it is exact (off only to test it)."""
    forget_watch: bool = True
    """Apply :func:`forget_stale_watch` where it is exact (off only to test it)."""
    forget_announce: bool = True
    """Apply :func:`forget_stale_announcement` (off only to test it)."""
    beat_modulus: int = BEAT_MODULUS
    """Heartbeat-key values count modulo this (larger only to test that the default
    loses nothing)."""

    @functools.cached_property
    def settings(self) -> Settings:
        t = self.tick_ms
        return Settings(
            min_nodes=self.min_nodes,
            max_nodes=self.max_nodes,
            join_timeout=self.join_ticks * t,
            last_call_timeout=self.last_call_ticks * t,
            close_timeout=self.close_ticks * t,
            heartbeat_timeout=self.heartbeat_ticks * t,
            keep_alive_interval=t,
            keep_alive_max_attempt=self.keep_alive_max_attempt,
            cache_duration=min(self.cache_ms, t - 1),
        )

    @functools.cached_property
    def machine_config(self) -> Config:
        # Heartbeat values only need to differ from the last one an observer saw; a small
        # modulus keeps the state space finite. A node beats at most once per tick and
        # forget_stale_watch forgets a record within a tick of its key moving on, so no
        # count wraps onto a record (without that rule one could; see its docstring).
        return Config(
            self.settings, self.variant, beat_modulus=self.beat_modulus, decode=decode_cached
        )

    def skew_of(self, slot: int) -> int:
        return self.skew_ticks if slot == 0 else 0

    @functools.cached_property
    def rotates_beat_values(self) -> bool:
        """Whether :func:`rotate_beat_values` applies: heartbeats under keys, where a
        node's values are only ever compared for equality and each write adds one to its
        own count. Not with a restart under the same identity (the new incarnation counts
        from zero again, an absolute origin) nor with two processes sharing an identity."""
        return (
            self.rotate_beats
            and self.variant.heartbeats == spec.KEY_BEATS
            and self.faults.restart_same == 0
            and self.faults.pause == 0
            and not self.duplicate_identity
        )

    @functools.cached_property
    def forgets_stale_watch(self) -> bool:
        """Whether :func:`forget_stale_watch` applies: heartbeats under keys, where each
        key is written only by its node's one process, whose count only goes forward (a
        value replaced in a key never comes back). Not with a restart under the same
        identity (the new incarnation counts from zero again) nor with two processes
        sharing an identity. None of the three exact abstractions applies under
        ``pause`` (their arguments rest on time passing only when nobody can move)."""
        return (
            self.forget_watch
            and self.variant.heartbeats == spec.KEY_BEATS
            and self.faults.restart_same == 0
            and self.faults.pause == 0
            and not self.duplicate_identity
        )

    @functools.cached_property
    def forgets_stale_sightings(self) -> bool:
        """Whether :func:`forget_stale_sightings` applies: the local liveness clock over
        heartbeats in the state, where only a node itself (any incarnation, one clock)
        writes its heartbeat value, so a value it has replaced never comes back. Not with
        two processes sharing an identity, nor with a store that ignores the token (a
        stale view written back restores old values), nor when a fold writes heartbeats
        for others."""
        v = self.variant
        return (
            self.forget_stale
            and v.liveness_clock == spec.LOCAL
            and v.heartbeats == spec.STATE_BEATS
            and not v.folds
            and not self.duplicate_identity
            and not self.cas_ignores_token
            and self.faults.pause == 0
        )


@dataclass(frozen=True, slots=True)
class Returned:
    """What one next_rendezvous call returned."""

    round: int
    rank: int
    world_size: int


@dataclass(frozen=True, slots=True)
class Proc:
    """One process (one handler instance) and its workload position."""

    ident: NodeId
    pc: Pc
    local: Local
    """The main machine state: exit, join and keep-alive."""
    control: Local
    """The control machine state: queries and closes (the handler keeps one of its own, so
    that they never wait for a join)."""
    skew: int = 0
    returned: Returned | None = None
    outcome: str = ""
    beating: bool = False
    """This incarnation has written a state that holds its own heartbeat."""
    late: bool = False
    """May start after time advanced (does not hold time back while unstarted)."""
    stood_by: bool = False
    """Its current join withdrew from the wait list at the deadline: it waited as a late
    node for a round that stayed complete (and full of others) until then."""
    next_job: bool = False
    """An agent of the next job under the same run id: it calls next_rendezvous only
    once some agent of the first job has called shutdown (``ModelConfig.next_job``)."""
    polled: bool = False
    """Has started a poll since the last tick (the ``"monitor"`` workload only: a tick
    waits for every member to have polled; always False otherwise)."""
    _hash: int | None = field(default=None, init=False, repr=False, compare=False, hash=False)

    def __eq__(self, other: object) -> bool:
        # Not left to @dataclass: see spec.state.compared_values.
        return other.__class__ is self.__class__ and _proc_values(self) == _proc_values(other)

    def __hash__(self) -> int:
        # Computed once per value: explorations hash the same processes many times.
        cached = self._hash
        if cached is None:
            cached = hash(_proc_values(self))
            object.__setattr__(self, "_hash", cached)
        return cached


_PROC_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Proc) if f.init)
_proc_values = compared_values(Proc)


def evolve_proc(p: Proc, **changes: object) -> Proc:
    """``p`` with ``changes`` (:func:`dataclasses.replace`, several times faster)."""
    assert changes.keys() <= set(_PROC_FIELDS), sorted(changes.keys() - set(_PROC_FIELDS))
    new = object.__new__(Proc)
    for name in _PROC_FIELDS:
        object.__setattr__(new, name, changes[name] if name in changes else getattr(p, name))
    object.__setattr__(new, "_hash", None)
    return new


def version_token(data: bytes) -> int:
    """The checker's token of a newly written state: ``1``. A node holds ``1`` (current)
    or ``0`` (stale): every successful write turns every token held elsewhere stale, so
    equality with the register is exactly preserved. Real stores' tokens are the bytes
    (:func:`spec.value_token`); docs/model_checker.md ("Store semantics") compares the
    two."""
    return 1


def store_token(store: bytes | None) -> int | None:
    """The token of the checker's register holding ``store`` (None while absent)."""
    return None if store is None else version_token(store)


@dataclass(frozen=True, slots=True)
class World:
    store: bytes | None
    procs: tuple[Proc, ...]
    used: tuple[int, ...] = (0, 0, 0, 0, 0, 0)
    """Faults spent, in the order of :data:`FAULT_KINDS`."""
    closes: int = 0
    """Shutdown calls made so far."""
    announced: tuple[tuple[int, NodeId], ...] = ()
    """The announcement sets (announcing variants): sorted (round, node) pairs."""
    beats: tuple[tuple[NodeId, bytes], ...] = ()
    """The heartbeat keys (heartbeats under keys): sorted (node, value) pairs."""
    worker_failures: int = 0
    """Worker failures so far (members that called next_rendezvous again at once)."""
    completion: Completion | None = None
    """Ghost (checks only): the latest round completed in the store."""

    @property
    def faults_used(self) -> int:
        return sum(self.used)


@dataclass(frozen=True, slots=True)
class Completion:
    """Ghost record of the latest completion written to the store (for the checks only):
    the round, its world size, and who was still on its wait list."""

    round: int
    world_size: int
    waiting: tuple[NodeId, ...]


@dataclass(frozen=True, slots=True)
class Move:
    """A scheduler choice: ``kind`` applied to process ``slot`` (-1 for tick)."""

    kind: str
    slot: int = -1

    def __str__(self) -> str:
        return self.kind if self.slot < 0 else f"{self.kind}({self.slot})"


# Properties the checker itself reports (besides the spec's invariants, which keep their
# own names): every violate()/Violation() names one of these constants.
COMPLETE_ROUND_NOT_EMPTY = "complete_round_not_empty"
RETURN_IS_MEMBER = "return_is_member"
WORLD_SIZE_IN_RANGE = "world_size_in_range"
RANK_IN_RANGE = "rank_in_range"
WORLD_SIZE_AGREEMENT = "world_size_agreement"
RANKS_DISTINCT = "ranks_distinct"
LIVE_NODE_EVICTED = "live_node_evicted"
QUORUM_NEVER_COMPLETES = "quorum_never_completes"
DEAD_MEMBER_UNREPORTED = "dead_member_unreported"
CALLS_END = "calls_end_as_specified"
LIVELOCK = "livelock"
COUNT_REFLECTS_ROUND = "count_reflects_round"
ROUND_END_REPORTED = "round_end_reported"
RESTART_HAS_CAUSE = "restart_has_cause"
JOBS_NEVER_MIX = "jobs_never_mix"
CLOSED_JOB_REPORTED = "closed_job_reported"
REQUESTS_SERVED = "requests_served_as_sent"
MODEL_PROPERTIES = (
    REQUESTS_SERVED,
    COMPLETE_ROUND_NOT_EMPTY,
    COUNT_REFLECTS_ROUND,
    RESTART_HAS_CAUSE,
    ROUND_END_REPORTED,
    JOBS_NEVER_MIX,
    CLOSED_JOB_REPORTED,
    RETURN_IS_MEMBER,
    WORLD_SIZE_IN_RANGE,
    RANK_IN_RANGE,
    WORLD_SIZE_AGREEMENT,
    RANKS_DISTINCT,
    LIVE_NODE_EVICTED,
    QUORUM_NEVER_COMPLETES,
    DEAD_MEMBER_UNREPORTED,
    CALLS_END,
    LIVELOCK,
)
"""Every property the checker itself reports, the one list a trace's violation name is
checked against (with the spec's invariants)."""


@dataclass(frozen=True)
class Violation:
    name: str
    message: str


RowChoice = tuple[str, str, str, str]
"""A table row a node's machine chose during a move: (node, table, row, action), the row
by its stable name (``join.join_open_round``: :meth:`spec.tables.Table.qualified`)."""
Write = tuple[str, str, str]
"""A store write made during a move: (key, op, value), e.g. ``("state", "set", <the state
as text>)``, ``("announcements/0", "add", "n_0_0")`` or ``("heartbeat/n_0_0", "set", "1")``."""


@dataclass
class Outcome:
    """What happened during one move (for traces and checks).

    ``notes`` is the readable account, in order; ``rows`` and ``writes`` repeat its table
    choices and store writes as data (for ``--json``), and ``writes`` also lists the
    heartbeat-key writes, which the notes leave out."""

    world: World
    notes: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    rows: list[RowChoice] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)


# -- decoding / encoding caches ------------------------------------------------------------
_DECODED: dict[bytes, tuple[RendezvousState, str | None]] = {}
_ENCODED: dict[tuple[RendezvousState, str], bytes] = {}
CACHE_LIMIT = 200_000
"""Entries kept in each codec cache before it is cleared (bounds memory)."""


def decode_cached(data: bytes, protocol: str | None = None) -> RendezvousState:
    """:func:`spec.decode`, remembered; with ``protocol`` the stored protocol is checked
    on every call (as ``spec.decode`` does), cached or not."""
    entry = _DECODED.get(data)
    if entry is None:
        if len(_DECODED) >= CACHE_LIMIT:
            _DECODED.clear()
        entry = spec.decode_with_protocol(data)
        _DECODED[data] = entry
    if protocol is not None:
        spec.check_protocol(entry[1], protocol)
    return entry[0]


def encode_cached(state: RendezvousState, protocol: str) -> bytes:
    key = (state, protocol)
    data = _ENCODED.get(key)
    if data is None:
        if len(_ENCODED) >= CACHE_LIMIT:
            _ENCODED.clear()
        data = spec.encode(state, protocol)
        _ENCODED[key] = data
    return data


V = TypeVar("V")


class IdentityCache(Generic[V]):
    """Values derived from objects, found by the object's identity (``id``) and a tag,
    without hashing the object's contents: worlds share most of their parts with the world
    they came from, so looking parts up this way is cheap. Each entry keeps its object
    alive, so an ``id`` cannot be reused while its entry stands. Cleared whenever the
    entries' summed weights would pass ``budget`` (bounds memory)."""

    def __init__(self, budget: int) -> None:
        self._entries: dict[tuple[int, Hashable], tuple[object, V]] = {}
        self._budget = budget
        self._used = 0

    def get(self, obj: object, tag: Hashable = None) -> V | None:
        hit = self._entries.get((id(obj), tag))
        return hit[1] if hit is not None and hit[0] is obj else None

    def put(self, obj: object, value: V, tag: Hashable = None, weight: int = 1) -> V:
        if self._used + weight > self._budget:
            self._entries.clear()
            self._used = 0
        self._entries[(id(obj), tag)] = (obj, value)
        self._used += weight
        return value


def store_state(world: World) -> RendezvousState:
    return EMPTY_STATE if world.store is None else decode_cached(world.store)


def image_of(
    store: bytes | None,
    announced: tuple[tuple[int, NodeId], ...],
    beats: tuple[tuple[NodeId, bytes], ...],
) -> spec.StoreImage:
    """The checker's simulated store as spec's definition of stores sees it
    (:mod:`spec.storage`)."""
    return spec.StoreImage(store, store_token(store), announced, beats)


def store_image(world: World) -> spec.StoreImage:
    """``world``'s simulated store (:func:`image_of`)."""
    return image_of(world.store, world.announced, world.beats)
