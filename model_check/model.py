"""The simulated world: virtual nodes running spec's node machine against a CAS register.

Theory of operation. A :class:`World` is an immutable value: the store register (the
encoded bytes and an abstract token), one :class:`Proc` per process (its identity, its
agent-like workload position, its :class:`spec.Local` machine state, its clock offset and
what its last ``next_rendezvous`` returned) and the fault budget spent so far. A
:class:`Move` is data; :func:`apply` performs one move and returns the next world plus
what was observed on the way (the actions decided, writes, returns, violations).

The values themselves (:class:`World`, :class:`Proc`, :class:`ModelConfig`, :class:`Move`,
:class:`Outcome`, the property names) are defined in :mod:`model_check.world`; this
module makes and moves worlds.

Every protocol decision comes from :func:`spec.step` with the configured
:class:`spec.Variant`: this module only serves the machine's I/O requests, drives the
workload (which operation a node starts next) and checks properties.

Time abstraction (see docs/model_checker.md). One tick = the keep-alive interval. All
times in a world are *relative to now* (now is always 0 on the monotonic clock; a node's
wall clock reads ``skew * tick``). Time advances by one tick only when no node can make
progress without it (every live node waits on a timer or for the store to change); a tick
shifts every stored time by one interval, caps times that are already past every
threshold, wakes every waiting node (waking early is allowed by the machine's contract)
and fires the heartbeat timer of every idle member. Values that only become more expired
are capped, so the set of worlds is finite and exploration needs no horizon.

The store's semantics are spec's: every request is served by :func:`spec.serve` on the
world's store (:meth:`_Run.image`), the definition the real stores are held to by the
conformance suite. Store tokens are abstracted: the register's token is ``1`` once
written (``None`` while absent; :func:`~model_check.world.version_token`) and a node
holds ``1`` (current) or ``0`` (stale). A successful write turns every current token
stale, so equality with the register is exactly preserved (a version, where real
stores' tokens are the bytes: see docs/model_checker.md, "Store semantics").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import spec
from model_check.world import (
    BEAT_MODULUS,
    BEATING_PCS,
    CLOSED_JOB_REPORTED,
    COMPLETE_ROUND_NOT_EMPTY,
    COUNT_REFLECTS_ROUND,
    DEAD_MEMBER_UNREPORTED,
    FAULT_KINDS,
    HALTED_PCS,
    JOBS_NEVER_MIX,
    LIVE_NODE_EVICTED,
    LIVE_PCS,
    MAX_LOCAL_STEPS,
    MONITOR_WORKLOAD,
    NO_WAKE_UP_TIME,
    POLLING_WORKLOADS,
    QUORUM_NEVER_COMPLETES,
    RANK_IN_RANGE,
    RANKS_DISTINCT,
    REQUESTS_SERVED,
    RESTART_HAS_CAUSE,
    RETURN_IS_MEMBER,
    ROUND_END_REPORTED,
    STALE_SIGHTING,
    STALE_WATCH_VALUE,
    STORE_REQUESTS,
    TICKS_WORKLOAD,
    WORLD_SIZE_AGREEMENT,
    WORLD_SIZE_IN_RANGE,
    Completion,
    IdentityCache,
    Lane,
    ModelConfig,
    Move,
    Outcome,
    Pc,
    Proc,
    Returned,
    RowChoice,
    StoreRequest,
    Violation,
    World,
    Write,
    decode_cached,
    encode_cached,
    evolve_proc,
    image_of,
    store_image,
    store_state,
    version_token,
)
from spec import (
    EMPTY_STATE,
    Action,
    Announce,
    Beat,
    CasResult,
    CompareAndSet,
    Done,
    Fail,
    FailKind,
    IoFailed,
    Local,
    NodeId,
    Now,
    Op,
    Phase,
    Read,
    ReadAnnounced,
    ReadBeats,
    RendezvousState,
    Settings,
    StartOp,
    Wait,
    Withdraw,
    WokeUp,
)


# -- initial world ---------------------------------------------------------------------------
def node_id(index: int) -> NodeId:
    return NodeId("n", index, 0)


def initial_world(cfg: ModelConfig) -> World:
    procs = []
    for slot in range(cfg.nodes):
        ident = node_id(0 if (cfg.duplicate_identity and slot == 1) else slot)
        next_job = slot >= cfg.nodes - cfg.next_job
        late = cfg.late_starts or slot >= cfg.nodes - cfg.late or next_job
        procs.append(
            Proc(
                ident,
                Pc.NEW,
                Local(ident),
                Local(ident),
                cfg.skew_of(slot),
                late=late,
                next_job=next_job,
            )
        )
    return World(None, tuple(procs))


# -- enabled moves ---------------------------------------------------------------------------


_IO_PHASES = frozenset(
    {
        Phase.READING,
        Phase.WRITING,
        Phase.ANNOUNCING,
        Phase.READING_ANNOUNCED,
        Phase.WITHDRAWING,
        Phase.BEATING,
        Phase.WATCHING,
    }
)


def _lane_can_progress(world: World, local: Local) -> bool:
    phase = local.phase
    if phase in _IO_PHASES:
        return True
    return phase is Phase.WAITING and spec.wait_ends(store_image(world), local.token)


def _can_progress(world: World, p: Proc) -> bool:
    """Whether ``p``'s main machine state can move without time passing."""
    return p.pc not in HALTED_PCS and _lane_can_progress(world, p.local)


def _control_can_progress(world: World, p: Proc) -> bool:
    """Whether ``p``'s control machine state can move (it never waits on a timer)."""
    return p.pc not in HALTED_PCS and _lane_can_progress(world, p.control)


CONTROL_MOVES = {
    "io": "ctl_io",
    "cas_unknown_applied": "ctl_cas_unknown_applied",
    "cas_unknown_lost": "ctl_cas_unknown_lost",
    "store_down": "ctl_store_down",
}
"""The moves of the control machine state, by the name of the main one's."""
MAIN_MOVES = {ctl: main for main, ctl in CONTROL_MOVES.items()}


def enabled(world: World, cfg: ModelConfig) -> list[Move]:
    """Every move the scheduler may choose, in a fixed order."""
    moves: list[Move] = []
    blocked = True
    used = dict(zip(FAULT_KINDS, world.used, strict=True))
    budget = cfg.faults
    for slot, p in enumerate(world.procs):
        for local, names in ((p.local, None), (p.control, CONTROL_MOVES)):
            if p.pc in HALTED_PCS or not _lane_can_progress(world, local):
                continue
            blocked = False
            kinds = ["wake"] if local.phase is Phase.WAITING else ["io"]
            if local.phase is Phase.WRITING and used["cas_unknown"] < budget.cas_unknown:
                kinds += ["cas_unknown_applied", "cas_unknown_lost"]
            if (
                local.phase is not Phase.WAITING
                and used["store_down"] < budget.store_down
                and not cfg.store_outage
            ):
                kinds.append("store_down")
            moves.extend(Move(k if names is None else names[k], slot) for k in kinds)
        if p.pc is Pc.NEW and (world.closes > 0 or not p.next_job):
            moves.append(Move("start", slot))
        if p.pc is Pc.MEMBER:
            if cfg.workload in POLLING_WORKLOADS:
                moves.append(Move("poll", slot))
            if world.worker_failures < cfg.worker_failures:
                moves.append(Move("fail_worker", slot))
            if world.closes < cfg.closes:
                moves.append(Move("shutdown", slot))
        if p.pc not in HALTED_PCS and used["crash"] < budget.crash:
            moves.append(Move("crash", slot))
        if p.pc is Pc.CRASHED:
            if used["restart_new"] < budget.restart_new:
                moves.append(Move("restart_new", slot))
            if used["restart_same"] < budget.restart_same:
                moves.append(Move("restart_same", slot))
    if cfg.store_outage and used["store_down"] < budget.store_down and _outage_hits(world):
        moves.append(Move("store_outage"))
    launching = any(p.pc is Pc.NEW and not p.late for p in world.procs)
    if launching:
        blocked = False  # these agents are launched before time first advances
    if blocked and _time_matters(world) and not _poll_owed(world, cfg):
        moves.append(Move("tick"))
    elif (
        not blocked
        and not launching
        and used["pause"] < budget.pause
        and _time_matters(world)
        and not _poll_owed(world, cfg)
        and _in_flight(world)
    ):
        moves.append(Move("pause_tick"))
    return moves


def _lane_in_flight(p: Proc) -> bool:
    return p.local.phase in _IO_PHASES or p.control.phase in _IO_PHASES


def _in_flight(world: World) -> bool:
    """Whether some live process has a store request in flight (a pause may hold it)."""
    return any(p.pc not in HALTED_PCS and _lane_in_flight(p) for p in world.procs)


def _outage_hits(world: World) -> bool:
    """Whether a store-wide outage may strike now: it fails at least one pending store
    call, and it finds the keep-alive of every member pending, so that it silences all
    of them (one that gets through first would make it an outage of the others alone,
    after which their eviction is no error: that is the ``store_down`` fault)."""
    hits = False
    for p in world.procs:
        if p.pc in HALTED_PCS:
            continue
        if p.pc in BEATING_PCS and p.local.phase not in _IO_PHASES:
            return False
        hits = hits or _lane_in_flight(p)
    return hits


def _poll_owed(world: World, cfg: ModelConfig) -> bool:
    """Under the ``"monitor"`` workload, whether a member has not polled since the last
    tick: time waits for its poll (its monitor interval is shorter than a tick)."""
    if cfg.workload != MONITOR_WORKLOAD:
        return False
    return any(p.pc is Pc.MEMBER and not p.polled for p in world.procs)


def _time_matters(world: World) -> bool:
    """A tick is pointless once every process has ended or crashed."""
    return any(p.pc not in (Pc.ENDED, Pc.CRASHED) for p in world.procs)


# -- applying moves ----------------------------------------------------------------------------
def forget_stale_sightings(
    procs: tuple[Proc, ...],
    store: bytes | None,
    used: tuple[int, ...],
    cfg: ModelConfig,
    before: World | None = None,
) -> tuple[Proc, ...]:
    """Replace every heartbeat sighting that can no longer matter by the
    :data:`STALE_SIGHTING` marker (an exact abstraction; see docs/model_checker.md).

    A node's liveness clock entry (node, value, first seen) only matters at its next read,
    where the age carries over if the store still holds that value and restarts
    otherwise. An entry is dead once the stored value differs and can never equal it
    again: a node writes only its own heartbeat, always with its current wall clock (a
    constant in the model's frame, where stored times move down a tick at a time), so
    only a value equal to that clock can be written again (and a tick that caps both
    values at the floor turns the entry into the marker itself). Worlds that differ only
    in dead entries have the same futures; without the marker they would be told apart.

    An entry first seen now (at 0, the model's monotonic now) is dead too in a process
    that certainly reads before time advances (:func:`reads_before_tick`): at that read
    the age carries over from 0 or restarts at 0, the same. So is an entry not yet past
    the expiry whose node must replace its stored value before time advances
    (:func:`overwrites_before_tick`): until then every verdict on it is "not expired".

    ``before``: the world these processes come from, already without dead entries (every
    world a move makes is). Then only what can have changed is looked at: processes that
    are not the very objects of ``before``, and in the others only the entries of nodes
    whose stored heartbeat changed; O(N) instead of O(N^2) entries per move (a test
    checks both give the same worlds).
    """
    t = cfg.tick_ms
    current: dict[NodeId, int] = {} if store is None else dict(decode_cached(store).last_heartbeats)
    walls = {p.ident: p.skew * t for p in procs}
    changed: set[NodeId] | None = None
    """Nodes whose stored heartbeat differs from ``before``'s (None: look at everything)."""
    if (
        before is not None
        and before.used == used
        and len(before.procs) == len(procs)
        and walls == {p.ident: p.skew * t for p in before.procs}
    ):
        old = {} if before.store is None else dict(decode_cached(before.store).last_heartbeats)
        changed = {n for n in current.keys() | old.keys() if current.get(n) != old.get(n)}
    expiry = cfg.settings.heartbeat_expiry
    doomed = {
        q.ident
        for q in procs
        if overwrites_before_tick(q, used, cfg)
        and not any(
            n == q.ident and v == current.get(n) and at < -expiry for n, v, at in q.local.seen_beats
        )
    }
    """Nodes whose stored heartbeat is certainly replaced before time advances."""
    if changed is not None and before is not None and doomed:
        changed |= {
            q.ident
            for q, b in zip(procs, before.procs, strict=True)
            if q is not b and q.ident in doomed
        }

    def dead(node: NodeId, value: int, at: int) -> bool:
        if value == STALE_SIGHTING or value == walls.get(node):
            return False
        return current.get(node) != value or (node in doomed and at >= -expiry)

    def forgotten(now_dead: bool, node: NodeId, value: int, at: int) -> bool:
        return dead(node, value, at) or (now_dead and at == 0 and value != STALE_SIGHTING)

    def forget(
        seen: tuple[tuple[NodeId, int, int], ...], unchanged: bool, now_dead: bool
    ) -> tuple[tuple[NodeId, int, int], ...] | None:
        """The sightings without their dead entries, or None if none is dead."""
        if unchanged and changed is not None:
            # Unchanged, with the same faults left: only entries of changed nodes can
            # have died since ``before``.
            values = _SIGHTED.get(seen)
            if values is None:
                values = _SIGHTED.put(seen, {n: (v, at) for n, v, at in seen}, weight=len(seen))
            if not any(n in values and dead(n, *values[n]) for n in changed):
                return None
            now_dead = False
        if not any(forgotten(now_dead, n, v, at) for n, v, at in seen):
            return None
        return tuple(
            (n, STALE_SIGHTING, STALE_SIGHTING) if forgotten(now_dead, n, v, at) else (n, v, at)
            for n, v, at in seen
        )

    out = list(procs)
    for slot, p in enumerate(procs):
        if p.pc in (Pc.CRASHED, Pc.ENDED):
            continue
        unchanged = before is not None and p is before.procs[slot]
        lanes: dict[str, Local] = {}
        for name, lane in (("local", Lane.MAIN), ("control", Lane.CONTROL)):
            local = p.local if lane is Lane.MAIN else p.control
            if not local.seen_beats:
                continue
            kept = forget(local.seen_beats, unchanged, reads_before_tick(p, lane, used, cfg))
            if kept is not None:
                lanes[name] = spec.evolve(local, seen_beats=kept)
        if lanes:
            out[slot] = evolve_proc(p, **lanes)
    return tuple(out)


def reads_before_tick(p: Proc, lane: Lane, used: tuple[int, ...], cfg: ModelConfig) -> bool:
    """Whether the next look of ``p``'s machine state ``lane`` at its heartbeat sightings
    is a read (or compare-and-set answer) served before time next advances, in every
    future: its read or write is pending (time waits for it), and injected faults cannot
    make it fail into a later read instead. A failure ends a ``next_rendezvous`` or
    ``shutdown`` call and with it the process; one in a keep-alive or a poll leaves that
    machine state idle, to read again only at its next operation, perhaps after the tick,
    so those qualify only while no fault that hits a pending store call
    (``--cas-unknown``, ``--store-down``) is left."""
    local = p.local if lane is Lane.MAIN else p.control
    if local.phase not in (Phase.READING, Phase.WRITING):
        return False
    faults = cfg.faults
    if used[5] < faults.pause:
        return False  # time may pass before the read (a pause)
    if local.op in (Op.EXIT, Op.JOIN, Op.CLOSE):
        return True
    left = max(0, faults.cas_unknown - used[3]) + max(0, faults.store_down - used[4])
    return left == 0


def overwrites_before_tick(p: Proc, used: tuple[int, ...], cfg: ModelConfig) -> bool:
    """Whether ``p`` certainly writes its own heartbeat (its current wall clock) into the
    state before time next advances: it is in a keep-alive with its compare-and-set
    pending, and no fault is left that could stop it (a crash, or a failed store call).
    Until the write lands time cannot advance, and each lost compare-and-set re-reads
    and decides again: the keep-alive is not past its deadline (it started this tick),
    and a stored heartbeat older than this tick is due, so it writes again. (A heartbeat
    written this tick, or one pruned from the state, is not a value to replace.) The
    caller also requires that ``p`` does not find its own heartbeat expired: it would
    prune itself from its view, find no heartbeat due and write none."""
    faults = cfg.faults
    return (
        p.pc not in HALTED_PCS
        and p.local.op is Op.KEEP_ALIVE
        and p.local.phase is Phase.WRITING
        and used[0] >= faults.crash
        and used[3] >= faults.cas_unknown
        and used[4] >= faults.store_down
        and used[5] >= faults.pause
    )


SIGHTED_ENTRIES = 1_000_000
"""Most sightings :data:`_SIGHTED` holds in all (about 100 MB): at N = 256 one heartbeat
can make a sighting stale in every other process, and so renew all their tuples."""

_SIGHTED: IdentityCache[dict[NodeId, tuple[int, int]]] = IdentityCache(SIGHTED_ENTRIES)
"""Each ``seen_beats`` tuple as a mapping node -> (value seen, first seen): a process's
sightings outlive many moves unchanged."""


def forget_stale_watch(world: World, cfg: ModelConfig) -> World:
    """Forget what a watcher's records and timestamps can no longer tell (an exact
    abstraction; see docs/model_checker.md).

    A watch record (node, value, first seen) is consulted in two places only: a watcher
    that has read the watched keys within the last interval (a member's keep-alive, or
    the join operation of a node standing by, whose tables put the watch row before the
    prune row) asks whether a watched node's value stood still past the expiry
    (``spec.dead_watched``); and the watcher's next read
    keeps the record's first-seen time if the key still holds the value, or restarts it.
    Once the watch is due again (``watched_at`` at least an interval ago, or never) the
    first cannot happen before that read. If by then the key already holds another value,
    the record can never match again (a node's count only goes forward, and a key is never
    deleted), so the read restarts the age whatever the record said: the record becomes
    :data:`STALE_WATCH_VALUE` at :data:`STALE_SIGHTING`, which no read matches either.

    This also keeps the model's small :data:`BEAT_MODULUS` faithful: a record its key has
    moved past is forgotten within a tick, so no count wraps onto it. Without the rule a
    watcher that stopped reading kept its records while the node beat on, and after
    ``BEAT_MODULUS`` beats the key matched a record again, carrying an age over where
    real counts restart it.

    ``beat_at`` and ``watched_at`` only decide whether a beat or a watch is due, an age
    compared with the keep-alive interval (one tick in the model): any time at least an
    interval ago says "due" alike, so both are capped at one interval ago.
    """
    keys = dict(world.beats)
    cap = -cfg.settings.keep_alive_interval
    procs: list[Proc] = []
    for p in world.procs:
        local = p.local
        watched_at = local.watched_at
        due = watched_at is None or watched_at <= cap
        watch = local.watch
        if due and any(at != STALE_SIGHTING and keys.get(n) != v for n, v, at in watch):
            watch = tuple(
                (n, STALE_WATCH_VALUE, STALE_SIGHTING) if keys.get(n) != v else (n, v, at)
                for n, v, at in watch
            )
        beat_at = local.beat_at
        if beat_at is not None and beat_at < cap:
            beat_at = cap
        if watched_at is not None and watched_at < cap:
            watched_at = cap
        if watch is local.watch and beat_at == local.beat_at and watched_at == local.watched_at:
            procs.append(p)
            continue
        changed = spec.evolve(local, watch=watch, beat_at=beat_at, watched_at=watched_at)
        procs.append(evolve_proc(p, local=changed))
    if all(a is b for a, b in zip(procs, world.procs, strict=True)):
        return world
    return replace(world, procs=tuple(procs))


def forget_stale_announcement(world: World, cfg: ModelConfig) -> World:
    """Forget what a node's record of its latest announcement can no longer tell (an
    exact abstraction; see docs/model_checker.md).

    The record (round, set size returned, when, size before) is consulted only while the
    node's view is of that round: whether it is in the round's announcements at all (a
    record exists), whether the announcement is fresh (at most an interval old) and, only
    then, the sizes (``spec.tables`` atoms ``in_announcements``, ``announced``,
    ``fold_due``). Every later view of the node is read from the store, whose round never
    goes back, or made from its current view by effects, which never lower the round (a
    view with a new round that is not written yet can fall back to the store's): so a
    record of a round below both is dropped. A record older than an interval never
    becomes fresh again: its size before is never read again (set to 0), and its size
    only as the size before of the node's next renewal, compared with max_nodes and
    min_nodes (``fold_due``), so it is replaced by the least size of its class (at
    least max_nodes, at least min_nodes, fewer).
    """
    settings = cfg.settings
    stale_at = -settings.keep_alive_interval
    stored = 0 if world.store is None else decode_cached(world.store).round
    procs: list[Proc] = []
    for p in world.procs:
        record = p.local.announced
        if record is None:
            procs.append(p)
            continue
        if record[0] < min(p.local.view.round, stored):
            kept: tuple[int, int, int, int] | None = None
        elif record[2] < stale_at and (
            record[3] != 0 or record[1] != _size_class(record[1], settings)
        ):
            kept = (record[0], _size_class(record[1], settings), record[2], 0)
        else:
            procs.append(p)
            continue
        procs.append(evolve_proc(p, local=spec.evolve(p.local, announced=kept)))
    if all(a is b for a, b in zip(procs, world.procs, strict=True)):
        return world
    return replace(world, procs=tuple(procs))


def _size_class(size: int, settings: Settings) -> int:
    """The least announcement-set size that compares with max_nodes and min_nodes as
    ``size`` does (1 below both: a returned size counts the announcer)."""
    if size >= settings.max_nodes:
        return settings.max_nodes
    if size >= settings.min_nodes:
        return settings.min_nodes
    return 1


def rotate_beat_values(world: World, modulus: int = BEAT_MODULUS) -> World:
    """Count every node's heartbeat-key values from its own count (an exact abstraction;
    see docs/model_checker.md).

    Under heartbeats in keys, a node's values appear in its key, in its watchers'
    records and (as its write count) in its process; a write stores the count plus one,
    and watchers only compare values for equality. Shifting all of one node's values by
    the same amount (modulo ``modulus``, the model's :data:`BEAT_MODULUS`) therefore
    changes no future, so the world is shifted until the count of the node's process is
    0; for a node with no process left (restarted under a new identity), until its key,
    or else the first record of it, holds 0.
    """
    shift: dict[NodeId, int] = {}
    for p in world.procs:
        shift.setdefault(p.ident, p.local.beats)
    for n, key in world.beats:
        shift.setdefault(n, int(key))
    for p in world.procs:
        for n, seen, _ in p.local.watch:
            if seen is not None and seen != STALE_WATCH_VALUE:
                shift.setdefault(n, int(seen))
    shift = {n: k for n, k in shift.items() if k}
    if not shift:
        return world

    def moved(node: NodeId, value: bytes | None) -> bytes | None:
        k = shift.get(node)
        if value is None or value == STALE_WATCH_VALUE or k is None:
            return value
        return str((int(value) - k) % modulus).encode("ascii")

    procs = []
    for p in world.procs:
        local = p.local
        k = shift.get(p.ident)
        watch = tuple((n, moved(n, v), at) for n, v, at in local.watch)
        if k is None and watch == local.watch:
            procs.append(p)
            continue
        beats = local.beats if k is None else (local.beats - k) % modulus
        procs.append(evolve_proc(p, local=spec.evolve(local, beats=beats, watch=watch)))
    keys = tuple(
        (n, v if n not in shift else str((int(v) - shift[n]) % modulus).encode("ascii"))
        for n, v in world.beats
    )
    return replace(world, procs=tuple(procs), beats=keys)


StepObserver = Callable[[int, "Lane", spec.Event, spec.Step], None]
"""Told of each machine step a move takes: process slot, machine state, event, step."""


class _Run:
    """Mutable scratch for one move: the procs being rewritten and the observations."""

    def __init__(self, world: World, cfg: ModelConfig, observe: StepObserver | None = None) -> None:
        self.cfg = cfg
        self.observe = observe
        self.mcfg = cfg.machine_config
        self.before = world
        self.store = world.store
        self.procs = list(world.procs)
        self.used = list(world.used)
        self.closes = world.closes
        self.announced = world.announced
        self.beats = world.beats
        self.worker_failures = world.worker_failures
        self.completion = world.completion
        self.faults_before = world.faults_used
        self.fuse_reads = cfg.fuse_reads
        self.notes: list[str] = []
        self.violations: list[Violation] = []
        self.rows: list[RowChoice] = []
        self.writes: list[Write] = []

    def world(self) -> World:
        procs = tuple(self.procs)
        if self.cfg.forgets_stale_sightings:
            procs = forget_stale_sightings(
                procs, self.store, tuple(self.used), self.cfg, self.before
            )
        world = World(
            self.store,
            procs,
            tuple(self.used),
            self.closes,
            self.announced,
            self.beats,
            self.worker_failures,
            self.completion,
        )
        if self.cfg.forgets_stale_watch:
            world = forget_stale_watch(world, self.cfg)
        if self.cfg.forget_announce and self.cfg.variant.announces and not self.cfg.faults.pause:
            world = forget_stale_announcement(world, self.cfg)
        if not self.cfg.rotates_beat_values:
            return world
        return rotate_beat_values(world, self.cfg.beat_modulus)

    def now(self, p: Proc) -> Now:
        return Now(0, p.skew * self.cfg.tick_ms)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def violate(self, name: str, message: str) -> None:
        self.violations.append(Violation(name, message))

    def lane(self, slot: int, lane: Lane) -> Local:
        p = self.procs[slot]
        return p.local if lane is Lane.MAIN else p.control

    def set_lane(self, slot: int, lane: Lane, local: Local) -> None:
        p = self.procs[slot]
        if lane is Lane.MAIN:
            self.procs[slot] = evolve_proc(p, local=local)
        else:
            self.procs[slot] = evolve_proc(p, control=local)

    # -- store ------------------------------------------------------------------------
    def pending(self, slot: int, lane: Lane = Lane.MAIN) -> StoreRequest:
        """The store request machine state ``lane`` of process ``slot`` waits on: the one
        its phase and state imply, which is what :meth:`serve_io` serves. :meth:`feed`
        requires every request the machine emits to equal it (:data:`REQUESTS_SERVED`), so
        the checker serves exactly what the machine asked for. Only the token of a pending
        compare-and-set or wait may change before it is served: a write by another machine
        state makes it stale (:meth:`write`), as a real store's version would. A wait's
        ``until`` is the machine's own: the checker keeps none (:data:`NO_WAKE_UP_TIME`), as
        it wakes a waiting node at every tick and on every store change, no later than any
        wake-up time (waking early is allowed); a wait is compared by key and token."""
        p = self.procs[slot]
        local = self.lane(slot, lane)
        phase = local.phase
        if phase is Phase.READING:
            return Read(self.mcfg.key)
        if phase is Phase.WRITING:
            data = encode_cached(local.view, self.mcfg.variant.name)
            return CompareAndSet(self.mcfg.key, data, local.token)
        if phase is Phase.WAITING:
            return Wait(self.mcfg.key, local.token, NO_WAKE_UP_TIME)
        if phase is Phase.ANNOUNCING:
            return Announce(local.view.round, spec.encode_node(p.ident))
        if phase is Phase.WITHDRAWING:
            return Withdraw(local.view.round, spec.encode_node(p.ident))
        if phase is Phase.READING_ANNOUNCED:
            return ReadAnnounced(local.view.round)
        if phase is Phase.BEATING:
            return Beat(str(spec.next_beat(local, self.mcfg)).encode("ascii"))
        if phase is Phase.WATCHING:
            return ReadBeats(spec.watched(local.view, p.ident))
        raise RuntimeError(f"process {slot} has no store request pending in phase {phase}")

    def check_request(self, slot: int, lane: Lane, request: StoreRequest) -> None:
        """Report (:data:`REQUESTS_SERVED`) a request the machine emitted that differs
        from the one the checker will serve for it."""
        served = self.pending(slot, lane)
        if isinstance(request, Wait) and isinstance(served, Wait):
            # The checker keeps no wake-up time: compare what it serves the wait by.
            same = (request.key, request.token) == (served.key, served.token)
        else:
            same = request == served
        if not same:
            self.violate(
                REQUESTS_SERVED,
                f"{self.procs[slot].ident} asked the store for {request!r} but its state "
                f"implies {served!r}: the checker would serve a request the node never sent",
            )

    def image(self) -> spec.StoreImage:
        """The simulated store as spec's definition sees it (:mod:`spec.storage`)."""
        return image_of(self.store, self.announced, self.beats)

    def serve(
        self, slot: int, request: spec.ServedRequest, lane: Lane = Lane.MAIN
    ) -> spec.ServedEvent:
        """Serve ``request`` of process ``slot`` by :func:`spec.serve`, the one
        definition of the store's semantics, and record what changed (a landed write goes
        through :meth:`write`, which checks it); returns the answering event."""
        p = self.procs[slot]
        if isinstance(request, CompareAndSet) and self.cfg.cas_ignores_token:
            # A planted store bug: the write lands whatever its token.
            request = replace(request, token=self.image().token)
        after, event = spec.serve(self.image(), p.ident, request, self.now(p), version_token)
        if isinstance(request, CompareAndSet):
            assert isinstance(event, CasResult)
            if event.has_set:
                self.write(slot, request.data, lane)
            return event
        if after.announced != self.announced:
            gone = set(self.announced) - set(after.announced)
            for round_, node in sorted(set(after.announced) ^ set(self.announced)):
                if (round_, node) in gone:
                    self.note(f"announcements -> {node} out of round {round_}")
                    self.writes.append((f"announcements/{round_}", "remove", str(node)))
                else:
                    self.note(f"announcements <- {node} in round {round_}")
                    self.writes.append((f"announcements/{round_}", "add", str(node)))
            self.announced = after.announced
        if isinstance(request, Beat):
            self.beats = after.beats
            self.writes.append((f"heartbeat/{p.ident}", "set", request.value.decode("ascii")))
            if not p.beating:
                self.procs[slot] = evolve_proc(p, beating=True)
        return event

    def serve_io(self, slot: int, lane: Lane = Lane.MAIN) -> None:
        request = self.pending(slot, lane)
        assert not isinstance(request, Wait), f"a wait is served by ticks: {request!r}"
        self.feed(slot, self.serve(slot, request, lane), lane)

    def write(self, slot: int, data: bytes, lane: Lane = Lane.MAIN) -> None:
        before = EMPTY_STATE if self.store is None else decode_cached(self.store)
        after = decode_cached(data)
        for name, message in spec.check_step(before, after, self.cfg.settings):
            self.violate(name, message)
        if after.complete and not after.closed and after.num_participants == 0:
            self.violate(
                COMPLETE_ROUND_NOT_EMPTY,
                f"round {after.round} is complete with no participants: no node can finish, "
                "join or advance it (the round epilogue did not run)",
            )
        if before.closed and not after.closed:
            self.on_reopen(slot, before)
        if after.complete and (not before.complete or before.round != after.round):
            self.completion = Completion(after.round, after.num_participants, after.wait_list)
        self.store = data
        # "Keeping its heartbeat" means the writer's own heartbeat reached the store fresh
        # (a write that merely carries an old value does not count).
        me = self.procs[slot].ident
        mine = after.heartbeat_of(me)
        if mine is not None and mine != before.heartbeat_of(me) and not self.procs[slot].beating:
            self.procs[slot] = evolve_proc(self.procs[slot], beating=True)
        # Every token other machine states hold is now stale (the writer gets its CasResult).
        for i, q in enumerate(self.procs):
            if q.local.token != 0 and not (i == slot and lane is Lane.MAIN):
                q = evolve_proc(q, local=spec.evolve(q.local, token=0))
            if q.control.token != 0 and not (i == slot and lane is Lane.CONTROL):
                q = evolve_proc(q, control=spec.evolve(q.control, token=0))
            self.procs[i] = q
        text = _describe(after)
        self.note(f"store <- {text}")
        self.writes.append(("state", "set", text))

    # -- the machine --------------------------------------------------------------------
    def feed(self, slot: int, event: spec.Event, lane: Lane = Lane.MAIN) -> None:
        """Feed one event to one machine state of a process, then keep the process going
        until it needs the store or a timer (an operation that ends may start another,
        on either machine state)."""
        for _ in range(MAX_LOCAL_STEPS):
            p = self.procs[slot]
            local = self.lane(slot, lane)
            op = event.op if isinstance(event, StartOp) else local.op
            result = spec.step(local, event, self.mcfg)
            if self.observe is not None:
                self.observe(slot, lane, event, result)
            self.set_lane(slot, lane, result.local)
            p = self.procs[slot]
            if result.pruned:
                self.on_pruned(slot, result.pruned)
            if result.action is not None:
                table = op.value if op else "?"
                where = "" if lane is Lane.MAIN else " (control)"
                name = result.row if result.row is not None else f"{table}.?"
                self.note(f"{p.ident}: {name} -> {result.action.value}{where}")
                self.rows.append((str(p.ident), table, name, result.action.value))
                self.on_action(slot, result.action, op)
            request = result.request
            if isinstance(request, STORE_REQUESTS):
                self.check_request(slot, lane, request)
            if isinstance(request, Read) and self.fuse_reads:
                # Macro-step: a read is fused with the local work that issued it.
                event = self.serve(slot, request, lane)
                continue
            if isinstance(request, STORE_REQUESTS):
                return
            nxt = self.after_op(slot, lane, request)
            if nxt is None:
                return
            lane, event = nxt
        raise RuntimeError(f"process {slot} took more than {MAX_LOCAL_STEPS} steps in one move")

    def start_op(
        self, slot: int, lane: Lane, op: Op, ticks: int = 0, deadline: int | None = None
    ) -> StartOp:
        """The event that starts ``op`` on machine state ``lane`` of process ``slot``, to
        end ``ticks`` from now (or at ``deadline``), as the handler builds it: the control
        machine state borrows the main one's liveness clock, and either starts from the
        other's view when it is newer (unless ``share_views`` is off)."""
        p = self.procs[slot]
        now = self.now(p)
        if deadline is None:
            deadline = now.mono + ticks * self.cfg.tick_ms
        control = lane is Lane.CONTROL
        peer = p.local if control else p.control
        return spec.start_event(op, deadline, now, peer, control, self.cfg.share_views)

    def start_poll(self, slot: int) -> tuple[Lane, StartOp]:
        """The agent calls num_nodes_waiting() (a query on the control machine state)."""
        if self.cfg.workload == MONITOR_WORKLOAD:
            self.set(slot, pc=Pc.POLL, polled=True)
        else:
            self.set(slot, pc=Pc.POLL)
        self.note(f"{self.procs[slot].ident}: calls num_nodes_waiting")
        return Lane.CONTROL, self.start_op(slot, Lane.CONTROL, Op.QUERY, self.cfg.close_ticks)

    def start_rdzv(self, slot: int) -> tuple[Lane, StartOp] | None:
        """The agent calls next_rendezvous: the handler first stops the keep-alive timer
        (waiting for a keep-alive in flight to end), then runs the exit op."""
        p = self.procs[slot]
        self.set(slot, pc=Pc.RDZV, stood_by=False)
        if p.local.op is not None:
            return None  # the keep-alive in flight ends first (after_op starts the exit)
        return Lane.MAIN, self.start_op(slot, Lane.MAIN, Op.EXIT, self.cfg.join_ticks)

    def start_close(self, slot: int) -> tuple[Lane, StartOp] | None:
        """The agent calls shutdown: heartbeats stop for good (a keep-alive in flight ends
        first), then the close op runs on the control machine state."""
        p = self.procs[slot]
        self.set(slot, pc=Pc.CLOSING)
        if p.local.op is not None:
            return None  # the keep-alive in flight ends first (after_op starts the close)
        return Lane.CONTROL, self.start_op(slot, Lane.CONTROL, Op.CLOSE, self.cfg.close_ticks)

    def after_op(self, slot: int, lane: Lane, request: Done | Fail) -> tuple[Lane, StartOp] | None:
        """The workload: what the process does once an operation ends."""
        p = self.procs[slot]
        failed = isinstance(request, Fail)
        kind = request.kind.value if isinstance(request, Fail) else ""
        if failed:
            self.note(f"{p.ident}: {request.op.value} failed: {kind}")
        if request.op is Op.KEEP_ALIVE:
            # A failed heartbeat is logged and ignored (the timer fires again); a
            # next_rendezvous or shutdown that waited for this keep-alive goes on now.
            if p.pc is Pc.RDZV:
                return self.start_rdzv(slot)
            if p.pc is Pc.CLOSING:
                return self.start_close(slot)
            if p.pc is Pc.MEMBER and self.cfg.workload == TICKS_WORKLOAD:
                return self.start_poll(slot)
            return None
        if p.pc is Pc.RDZV:
            if failed:
                outcome = f"next_rendezvous raised {kind}"
                view = p.local.view
                if isinstance(request, Fail) and request.kind is FailKind.TIMEOUT:
                    if p.stood_by or (view.complete and not view.is_participant(p.ident)):
                        # It timed out standing by for a complete round (after
                        # withdrawing from the wait list): it waited as a late node.
                        outcome = LATE_TIMEOUT
                    elif self.available(slot) < self.cfg.min_nodes:
                        outcome = FEW_TIMEOUT
                self.set(slot, pc=Pc.ENDED, outcome=outcome)
                return None
            if request.op is Op.EXIT:
                # The join op shares next_rendezvous's deadline, kept in local.deadline.
                return Lane.MAIN, self.start_op(slot, Lane.MAIN, Op.JOIN, deadline=p.local.deadline)
            self.on_return(slot)
            self.set(slot, pc=Pc.MEMBER)
            return None
        if p.pc is Pc.POLL:
            if failed:
                self.set(slot, pc=Pc.MEMBER)
                return None
            view = p.control.view
            count = self.count(p)
            closed = spec.closed_for(p.control)
            self.on_poll(slot, count, closed)
            if closed:
                self.set(slot, pc=Pc.ENDED, outcome="saw the rendezvous closed")
                return None
            if count and view.round + 1 < self.cfg.max_rounds:
                self.note(f"{p.ident}: num_nodes_waiting={count}: re-rendezvous")
                return self.start_rdzv(slot)
            self.set(slot, pc=Pc.MEMBER)
            return None
        if p.pc is Pc.CLOSING:
            if request.op is Op.CLOSE and not failed and self.cfg.variant.reopens:
                # Then it leaves the run (the wait or redundancy list, or its round), so
                # that the next job under the run id finds it vacant and reopens it.
                return Lane.MAIN, self.start_op(slot, Lane.MAIN, Op.EXIT, self.cfg.close_ticks)
            outcome = "shutdown raised " + kind if failed else "shut down"
            self.set(slot, pc=Pc.ENDED, outcome=outcome)
            return None
        raise AssertionError(f"op ended in workload position {p.pc.name}")

    def available(self, slot: int) -> int:
        """How many processes (``slot`` included) were calling next_rendezvous before
        ``slot``'s call passed its deadline and still are.

        A call started ``join_ticks`` before its deadline (kept in ``local.deadline``,
        relative to now like every time in a world); another call counts if it started
        no later than this call's deadline.
        """
        p = self.procs[slot]
        span = self.cfg.join_ticks * self.cfg.tick_ms
        return 1 + sum(
            1
            for i, q in enumerate(self.procs)
            if i != slot and q.pc is Pc.RDZV and q.local.deadline - span <= p.local.deadline
        )

    def set(self, slot: int, **changes: object) -> None:
        self.procs[slot] = evolve_proc(self.procs[slot], **changes)

    # -- checks ---------------------------------------------------------------------------
    def on_pruned(self, slot: int, pruned: tuple[NodeId, ...]) -> None:
        p = self.procs[slot]
        self.note(f"{p.ident}: pruned {', '.join(map(str, pruned))} as dead")
        for other in self.procs:
            if other.ident in pruned and other.pc in LIVE_PCS and other.beating:
                self.violate(
                    LIVE_NODE_EVICTED,
                    f"{p.ident} pruned {other.ident} as dead, but it is alive "
                    f"({other.pc.name.lower()}) and keeping its heartbeat",
                )
                return

    def on_reopen(self, slot: int, closed: RendezvousState) -> None:
        """A new job reopens the closed run: no live node of the closed job may still be
        listed in it (a participant, waiter or standby the closed state still counts).

        A live node of the closed job that is no longer listed holds a round that has
        already ended: its round was superseded and the round after it filled without
        it (it was dropped from the wait list then). It trains with nobody, and it mixes
        with nobody: the new job's rounds carry later round numbers, so new bootstrap
        keys, and its next poll or join reads the new epoch (``later_job``). A node of
        the closed job that does return into the new job is caught at its return (the
        second clause, in ``on_return``). A listed live node cannot be in a vacant run,
        unless it was pruned as dead while alive (``live_node_evicted``) or the reopen
        row ignores the list (``planted-reopen-under-members``)."""
        p = self.procs[slot]
        self.note(f"{p.ident}: reopens the run for a new job (epoch {closed.epoch + 1})")
        for other in self.procs:
            if (
                other.pc in BEATING_PCS
                and other.local.job == closed.epoch
                and closed.is_listed(other.ident)
            ):
                self.violate(
                    JOBS_NEVER_MIX,
                    f"{p.ident} reopened the closed run for a new job while {other.ident}, a "
                    f"member of the closed job still listed there, is still "
                    f"{other.pc.name.lower()}",
                )
                return

    def on_action(self, slot: int, action: Action, op: Op | None) -> None:
        """Weakness 3 (bounded liveness): a node that joined while the last call was
        already running times out before that last call ends, with a quorum present."""
        p = self.procs[slot]
        if action is Action.REMOVE_FROM_WAIT_LIST and op is Op.JOIN and not p.stood_by:
            self.procs[slot] = p = evolve_proc(p, stood_by=True)
        if action is not Action.REMOVE_FROM_PARTICIPANTS or op is not Op.JOIN:
            return
        if self.faults_before:
            return
        # The decision followed a read or CAS in this very move: the store is its basis.
        stored = store_state(self.world())
        t = self.cfg.tick_ms
        wall = p.skew * t
        if (
            not stored.complete
            and stored.deadline is not None
            and stored.deadline >= wall
            and stored.num_participants >= self.cfg.min_nodes
            and stored.is_participant(p.ident)
            and p.local.deadline - self.cfg.join_ticks * t
            >= stored.deadline - self.cfg.last_call_ticks * t
        ):
            self.violate(
                QUORUM_NEVER_COMPLETES,
                f"{p.ident} joined round {stored.round} during its last call and hit its "
                f"join deadline before the last call ended, with "
                f"{stored.num_participants} >= min_nodes ({self.cfg.min_nodes}) "
                "participants and no faults: the round cannot complete",
            )

    def on_return(self, slot: int) -> None:
        p = self.procs[slot]
        view = p.local.view
        rank = view.rank_of(p.ident)
        w = view.num_participants
        rnd = view.round
        self.note(f"{p.ident}: next_rendezvous returned round={rnd} rank={rank} world_size={w}")
        if rank is None or not view.complete:
            self.violate(
                RETURN_IS_MEMBER,
                f"{p.ident} returned for round {rnd} without being a member of a complete round",
            )
            return
        if p.local.job is not None and view.epoch != p.local.job:
            self.violate(
                JOBS_NEVER_MIX,
                f"{p.ident} of the job of epoch {p.local.job} returned round {rnd} of the "
                f"job of epoch {view.epoch}, which reopened the run after its own closed",
            )
        got = Returned(rnd, rank, w)
        self.procs[slot] = evolve_proc(p, returned=got)
        settings = self.cfg.settings
        if not settings.min_nodes <= w <= settings.max_nodes:
            self.violate(
                WORLD_SIZE_IN_RANGE,
                f"{p.ident} returned world_size={w} outside "
                f"[{settings.min_nodes}, {settings.max_nodes}]",
            )
        if not 0 <= rank < w:
            self.violate(RANK_IN_RANGE, f"{p.ident} returned rank {rank} not in 0..{w - 1}")
        stored = store_state(self.world())
        if stored.round == rnd and stored.complete and not stored.is_participant(p.ident):
            self.violate(
                RETURN_IS_MEMBER,
                f"{p.ident} returned for round {rnd} but the store does not list it",
            )
        done = self.completion
        if done is not None and done.round == rnd and done.world_size != w:
            self.violate(
                WORLD_SIZE_AGREEMENT,
                f"round {rnd}: {p.ident} got world_size={w} but the round completed with "
                f"{done.world_size} participants (what its other members got)",
            )
        for i, q in enumerate(self.procs):
            if i == slot or q.returned is None or q.returned.round != rnd:
                continue
            if q.returned.world_size != w:
                self.violate(
                    WORLD_SIZE_AGREEMENT,
                    f"round {rnd}: {p.ident} got world_size={w} but {q.ident} got "
                    f"{q.returned.world_size}",
                )
            if q.returned.rank == rank:
                self.violate(
                    RANKS_DISTINCT,
                    f"round {rnd}: {p.ident} and {q.ident} (process {i}) both got rank {rank}",
                )

    def count(self, p: Proc, view: RendezvousState | None = None) -> int:
        """What ``p``'s num_nodes_waiting() answers from ``view`` (its control view)."""
        joined = None if p.returned is None else p.returned.round
        view = p.control.view if view is None else view
        return spec.nodes_waiting(view, p.ident, joined, self.cfg.variant)

    def on_poll(self, slot: int, count: int, closed: bool) -> None:
        p = self.procs[slot]
        view = p.control.view
        mine = p.returned
        job = p.local.job
        if not closed and job is not None and view.epoch > job:
            self.violate(
                CLOSED_JOB_REPORTED,
                f"{p.ident}, a node of job {job}, polls a view of job {view.epoch} (its own "
                f"job closed the run and a new job reopened it: {_describe(view)}), yet "
                "is_closed() answers False, although its next next_rendezvous fails closed",
            )
        if (
            mine is not None
            and not count
            and not view.closed
            and not (view.round == mine.round and view.complete and view.is_participant(p.ident))
        ):
            self.violate(
                ROUND_END_REPORTED,
                f"{p.ident} returned round {mine.round}, which no longer holds it ("
                f"{_describe(view)}), yet num_nodes_waiting() answers 0: its agent keeps "
                "its workers running in a round that is over",
            )
        if mine is not None and (
            view.round < mine.round or (view.round == mine.round and not view.complete)
        ):
            state = "complete" if view.complete else "open"
            self.violate(
                COUNT_REFLECTS_ROUND,
                f"{p.ident} returned round {mine.round}, then num_nodes_waiting() answered "
                f"{count} from a view of round {view.round} ({state}), from before the round "
                "it joined had completed: a stale count, which may restart the job for nothing "
                "or miss a real change",
            )
        done = self.completion
        if (
            mine is not None
            and count
            and done is not None
            and view.complete
            and view.round == mine.round == done.round
        ):
            old = [n for n in view.wait_list if n in done.waiting]
            if old:
                self.violate(
                    RESTART_HAS_CAUSE,
                    f"{p.ident}, a member of round {mine.round}, is told num_nodes_waiting()="
                    f"{count} and restarts its workers, but {', '.join(map(str, old))} was "
                    f"already waiting when round {mine.round} completed without it (it is "
                    "surplus, dead or slow): every member restarts at once after forming "
                    "each round",
                )
        if mine is None or view.round != mine.round or not view.complete or view.wait_list:
            return
        for q in self.procs:
            if (
                q.pc is Pc.CRASHED
                and q.returned is not None
                and q.returned.round == mine.round
                and not view.is_participant(q.ident)
                and not any(r.ident == q.ident and r.pc is not Pc.CRASHED for r in self.procs)
            ):
                self.violate(
                    DEAD_MEMBER_UNREPORTED,
                    f"member {q.ident} of round {mine.round} crashed and was dropped, yet "
                    f"{p.ident} polls num_nodes_waiting=0: the survivors keep a "
                    f"{view.num_participants}-node round of world_size {mine.world_size} "
                    "and nothing tells them",
                )
                return


def _describe(state: RendezvousState) -> str:
    return state.describe()


# -- the general liveness property ---------------------------------------------------------
LATE_TIMEOUT = "next_rendezvous raised timeout while waiting as a late node"
"""The outcome of a call that stood by for a complete round until its deadline."""

FEW_TIMEOUT = "next_rendezvous raised timeout with fewer than min_nodes available"
"""The outcome of a call that timed out while fewer than min_nodes processes (itself
included) were inside next_rendezvous having started no later than its deadline
(:meth:`_Run.available`)."""

CLOSED_OUTCOMES = frozenset(
    {
        "shut down",
        "saw the rendezvous closed",
        f"next_rendezvous raised {FailKind.CLOSED.value}",
        f"next_rendezvous raised {FailKind.GRACEFUL_EXIT.value}",
    }
)
"""How a process may end once the rendezvous is closed."""

FAULT_ERRORS = (f"raised {FailKind.CONNECTION.value}", f"raised {FailKind.CORRUPT_STATE.value}")
"""How an operation ends when an injected fault hits it (acceptable once a fault happened)."""

DEAD_LISTED = "dead and listed: "
"""How a problem of :func:`unfinished_calls` starts when an identity that runs nothing is
still listed in a complete round while other processes run."""

ENDED_WRONGLY = "ended wrongly: "
"""Prefix of a problem that no later move can undo (an ended process stays ended)."""


def unfinished_calls(world: World, cfg: ModelConfig) -> list[str]:
    """Why ``world`` is not an acceptable end of a run (empty if it is).

    Acceptable: every process's ``next_rendezvous`` call returned (it is a member), is
    legitimately standing by (listed on the wait or redundancy list of a complete round
    that still has a live participant, one that has neither crashed nor ended, who can
    let it in), or ended as the spec prescribes: closed / graceful exit / shut down once
    the rendezvous is closed, a timeout while waiting as a late node
    (:data:`LATE_TIMEOUT`), or a timeout while fewer than min_nodes processes were
    available (:data:`FEW_TIMEOUT`). Once the rendezvous is closed, no process may still
    be running (every call must have ended with the closed outcome). While some process
    is still running, no identity that runs nothing (crashed, replaced by a restart, or
    ended) may stay listed in a complete round: dead nodes must be pruned
    (:data:`DEAD_LISTED`). In an open round they may stay: ``scale`` finds them once the
    round completes, and the workload's round bound (``max_rounds``) may stop the members
    from forming that round. For the same reason they may stay in a complete round when
    a member would restart at its next poll (it counts a waiting node) but the round
    bound stops it: the round it would form is where they would be pruned.
    Not started and crashed processes are not judged, and once a fault was injected an
    operation may also have ended with the fault's error (:data:`FAULT_ERRORS`).
    """
    stored = store_state(world)
    problems: list[str] = []
    running = {p.ident for p in world.procs if p.pc not in HALTED_PCS}
    live_member = any(n in running for n in stored.participant_nodes())
    at_bound = stored.round + 1 >= cfg.max_rounds and any(
        p.pc in BEATING_PCS
        and spec.nodes_waiting(
            stored, p.ident, None if p.returned is None else p.returned.round, cfg.variant
        )
        for p in world.procs
    )
    if running and stored.complete and not stored.closed and not at_bound:
        for where, nodes in (
            ("a participant", stored.participant_nodes()),
            ("on the wait list", stored.wait_list),
            ("on the redundancy list", stored.redundancy_list),
        ):
            for n in nodes:
                if n not in running:
                    problems.append(f"{DEAD_LISTED}{n} is still listed as {where}")
    for p in world.procs:
        if p.pc is Pc.ENDED:
            if p.outcome in CLOSED_OUTCOMES:
                continue
            if p.outcome in (LATE_TIMEOUT, FEW_TIMEOUT):
                continue
            if world.faults_used and p.outcome.endswith(FAULT_ERRORS):
                continue  # the error of an injected fault (the store was down, ...)
            problems.append(f"{ENDED_WRONGLY}{p.ident} [{p.outcome}]")
        elif p.pc in (Pc.NEW, Pc.CRASHED):
            continue
        elif stored.closed:
            problems.append(
                f"{p.ident} is still {p.pc.name.lower()} although the rendezvous is closed"
            )
        elif (
            p.pc in BEATING_PCS
            and stored.round + 1 < cfg.max_rounds
            and (
                waiting := spec.nodes_waiting(
                    stored, p.ident, None if p.returned is None else p.returned.round, cfg.variant
                )
            )
        ):
            problems.append(
                f"{p.ident} restarts at its next poll: num_nodes_waiting() is {waiting} "
                f"(round {stored.round})"
            )
        elif p.pc is Pc.RDZV:
            standing_by = stored.complete and (
                p.ident in stored.wait_list or p.ident in stored.redundancy_list
            )
            if standing_by and not live_member:
                problems.append(
                    f"{p.ident} stands by for round {stored.round}, whose participants have "
                    "all crashed or ended"
                )
            elif not standing_by:
                problems.append(
                    f"{p.ident}'s next_rendezvous is pending (round {stored.round}, "
                    f"{'complete' if stored.complete else 'open'}) without standing by as "
                    "a late node"
                )
    return problems


# -- time -----------------------------------------------------------------------------------
def _shift_state(state: RendezvousState, cfg: ModelConfig, lo_wall: int) -> RendezvousState:
    t = cfg.tick_ms
    floor_beat = lo_wall - cfg.settings.heartbeat_expiry - t
    beats = tuple((n, max(b - t, floor_beat)) for n, b in state.last_heartbeats)
    deadline = state.deadline
    if deadline is not None:
        deadline = max(deadline - t, lo_wall - t)
    if beats == state.last_heartbeats and deadline == state.deadline:
        return state
    # Every other field as it was (an earlier version rebuilt the state field by field and
    # lost the epoch at every tick: found by tests/test_lockstep.py).
    return replace(state, deadline=deadline, last_heartbeats=beats)


def _tick(run: _Run) -> None:
    cfg = run.cfg
    t = cfg.tick_ms
    lo_wall = min(0, cfg.skew_ticks) * t
    cache: dict[RendezvousState, RendezvousState] = {}

    def shift(state: RendezvousState) -> RendezvousState:
        got = cache.get(state)
        if got is None:
            got = _shift_state(state, cfg, lo_wall)
            cache[state] = got
        return got

    stored_before: dict[NodeId, int] = {}
    stored_after: dict[NodeId, int] = {}
    if run.store is not None:
        state = decode_cached(run.store)
        stored_before = dict(state.last_heartbeats)
        shifted = shift(state)
        stored_after = dict(shifted.last_heartbeats)
        run.store = encode_cached(shifted, cfg.variant.name)
    for slot, p in enumerate(run.procs):
        run.procs[slot] = evolve_proc(
            p,
            local=_shift_local(p.local, cfg, lo_wall, shift, stored_before, stored_after),
            control=_shift_local(p.control, cfg, lo_wall, shift, stored_before, stored_after),
            polled=False,
        )
    for slot, p in enumerate(run.procs):
        now = run.now(p)
        if p.pc in HALTED_PCS:
            continue
        if p.local.phase is Phase.WAITING:
            run.feed(slot, WokeUp(now))
        elif p.pc in BEATING_PCS and p.local.op is None:
            run.feed(slot, run.start_op(slot, Lane.MAIN, Op.KEEP_ALIVE, cfg.heartbeat_ticks))


def _shift_local(
    local: Local,
    cfg: ModelConfig,
    lo_wall: int,
    shift: Callable[[RendezvousState], RendezvousState],
    stored_before: dict[NodeId, int],
    stored_after: dict[NodeId, int],
) -> Local:
    """``local`` one tick later: every time moves down a tick, capped once past the
    threshold it is compared with."""
    t = cfg.tick_ms
    settings = cfg.settings
    floor_beat = lo_wall - settings.heartbeat_expiry - t
    deadline = max(local.deadline - t, -cfg.variant.rollback_window - t)
    # A read older than one tick is never fresh again (a tick outlasts the cache).
    synced = local.synced_at
    if synced is not None and synced - t < -settings.cache_duration:
        synced = None
    # The local liveness clock: shift the seen values exactly as the stored ones (so
    # equality with the store is preserved) and the first-seen times like every monotonic
    # time, capped once past the threshold they are compared with. Real heartbeat values
    # that differ never become equal as time passes: where capping both at the floor would
    # make a seen value equal to a different stored one, the sighting becomes the stale
    # marker (its age restarts at the next read).
    seen_beats = tuple(
        (n, v, at)
        if v == STALE_SIGHTING
        else (n, STALE_SIGHTING, STALE_SIGHTING)
        if v != stored_before.get(n) and max(v - t, floor_beat) == stored_after.get(n)
        else (n, max(v - t, floor_beat), max(at - t, -settings.heartbeat_expiry - t))
        for n, v, at in local.seen_beats
    )
    beat_at = local.beat_at
    if beat_at is not None:
        beat_at = max(beat_at - t, -settings.keep_alive_interval - t)
    watched_at = local.watched_at
    if watched_at is not None:
        watched_at = max(watched_at - t, -settings.keep_alive_interval - t)
    watch = tuple((n, v, max(at - t, -settings.heartbeat_expiry - t)) for n, v, at in local.watch)
    announced = local.announced
    if announced is not None:
        at = max(announced[2] - t, -settings.keep_alive_interval - t)
        announced = (announced[0], announced[1], at, announced[3])
    seen_call = local.seen_last_call
    if seen_call is not None:
        seen_call = (
            max(seen_call[0] - t, lo_wall - t),
            max(seen_call[1] - t, -settings.last_call_timeout - t),
        )
    return replace(
        local,
        view=shift(local.view),
        deadline=deadline,
        synced_at=synced,
        seen_beats=seen_beats,
        seen_last_call=seen_call,
        announced=announced,
        beat_at=beat_at,
        watched_at=watched_at,
        watch=watch,
    )


# -- the move function -------------------------------------------------------------------
def apply(
    world: World, move: Move, cfg: ModelConfig, observe: StepObserver | None = None
) -> Outcome:
    """Perform ``move`` (which must be enabled) and return the next world. ``observe``
    is told every machine step the move takes, in order (slot, machine state, event,
    step): tests/lockstep.py holds the real handler's drivers to them."""
    run = _Run(world, cfg, observe)
    kind, slot = move.kind, move.slot
    t = cfg.tick_ms
    lane = Lane.CONTROL if kind in MAIN_MOVES else Lane.MAIN
    kind = MAIN_MOVES.get(kind, kind)
    if kind == "tick":
        run.note(f"time advances by one tick ({t} ms)")
        _tick(run)
    elif kind == "pause_tick":
        run.used[5] += 1
        run.note(
            f"time advances by one tick ({t} ms) while every store request in flight waits "
            "(its process is paused)"
        )
        for i, p in enumerate(run.procs):
            if p.pc not in HALTED_PCS and _lane_in_flight(p):
                # As for a lost write: a paused node's heartbeat may go stale through an
                # injected fault, so its expiry is no longer a live node wrongly evicted
                # (until its own heartbeat reaches the store fresh again).
                run.procs[i] = evolve_proc(p, beating=False)
        _tick(run)
    elif kind in ("io", "wake"):
        p = run.procs[slot]
        if kind == "wake":
            run.feed(slot, WokeUp(run.now(p)))
        else:
            run.serve_io(slot, lane)
    elif kind == "start":
        p = run.procs[slot]
        run.set(slot, pc=Pc.RDZV, stood_by=False)
        run.note(f"{p.ident}: calls next_rendezvous")
        run.feed(slot, run.start_op(slot, Lane.MAIN, Op.EXIT, cfg.join_ticks))
    elif kind == "poll":
        _continue(run, slot, run.start_poll(slot))
    elif kind == "fail_worker":
        p = run.procs[slot]
        run.worker_failures += 1
        run.note(f"{p.ident}: its workers fail; it calls next_rendezvous again")
        _continue(run, slot, run.start_rdzv(slot))
    elif kind == "shutdown":
        p = run.procs[slot]
        run.closes += 1
        run.note(f"{p.ident}: calls shutdown")
        _continue(run, slot, run.start_close(slot))
    elif kind == "crash":
        run.used[0] += 1
        run.set(slot, pc=Pc.CRASHED, outcome="crashed")
        run.note(f"{run.procs[slot].ident}: crashes")
    elif kind in ("restart_new", "restart_same"):
        old = run.procs[slot]
        if kind == "restart_new":
            run.used[1] += 1
            ident = node_id(1 + max(_all_pids(run.world())))
        else:
            run.used[2] += 1
            ident = old.ident
        run.procs[slot] = Proc(
            ident, Pc.NEW, Local(ident), Local(ident), old.skew, late=True, next_job=old.next_job
        )
        run.note(f"process {slot} restarts as {ident}")
    elif kind in ("cas_unknown_applied", "cas_unknown_lost"):
        run.used[3] += 1
        p = run.procs[slot]
        if kind == "cas_unknown_applied":
            # The write lands as spec.storage says it would; its answer is lost.
            request = run.pending(slot, lane)
            assert isinstance(request, CompareAndSet), request
            run.serve(slot, request, lane)
        else:
            # The write was lost: this node's heartbeat may now go stale through an injected
            # fault, so its expiry is no longer a live node wrongly evicted.
            run.procs[slot] = evolve_proc(p, beating=False)
        run.note(f"{p.ident}: compare-and-set outcome unknown ({kind.rsplit('_', 1)[1]})")
        run.feed(slot, IoFailed("compare-and-set outcome unknown", run.now(p)), lane)
    elif kind == "store_outage":
        run.used[4] += 1
        run.note("the store is unreachable for everybody: every pending store call fails")
        for i in range(len(run.procs)):
            for lane_ in (Lane.MAIN, Lane.CONTROL):
                p = run.procs[i]
                if p.pc not in HALTED_PCS and run.lane(i, lane_).phase in _IO_PHASES:
                    run.feed(i, IoFailed("store unreachable", run.now(p)), lane_)
    elif kind == "store_down":
        run.used[4] += 1
        p = evolve_proc(run.procs[slot], beating=False)  # as for a lost write, above
        run.procs[slot] = p
        run.note(f"{p.ident}: the store is unreachable")
        run.feed(slot, IoFailed("store unreachable", run.now(p)), lane)
    else:
        raise ValueError(f"unknown move kind {kind!r}")
    return Outcome(run.world(), run.notes, run.violations, run.rows, run.writes)


def _continue(run: _Run, slot: int, start: tuple[Lane, StartOp] | None) -> None:
    if start is not None:
        lane, event = start
        run.feed(slot, event, lane)


def _all_pids(world: World) -> Iterator[int]:
    yield -1
    for p in world.procs:
        yield p.ident.pid
        yield from _state_pids(p.local.view)
        yield from _state_pids(p.control.view)
    if world.store is not None:
        yield from _state_pids(decode_cached(world.store))


def _state_pids(state: RendezvousState) -> Iterator[int]:
    for n, _ in state.last_heartbeats:
        yield n.pid
    for n, _ in state.participants:
        yield n.pid


def successors(world: World, cfg: ModelConfig) -> Iterator[tuple[Move, Outcome]]:
    for move in enabled(world, cfg):
        yield move, apply(world, move, cfg)


def describe_proc(p: Proc) -> str:
    local = p.local
    parts = [f"{p.ident} {p.pc.name.lower()}"]
    if local.op is not None:
        parts.append(f"op={local.op.value}/{local.phase.value}")
    if p.control.op is not None:
        parts.append(f"control={p.control.op.value}/{p.control.phase.value}")
    if p.skew:
        parts.append(f"skew=+{p.skew}t")
    if p.returned is not None:
        r = p.returned
        parts.append(f"returned(round={r.round} rank={r.rank} W={r.world_size})")
    if p.outcome:
        parts.append(f"[{p.outcome}]")
    return " ".join(parts)
