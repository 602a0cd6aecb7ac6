"""The node machine: the operation executor loop as a sans-IO state machine.

A node runs one operation at a time. The machine never performs I/O: it is fed
*events* (an operation was started, a read or compare-and-set completed, a wait ended,
an I/O call failed) and answers each with exactly one *request* (read, compare-and-set,
wait, done, fail) that the interpreter (the real handler, or the model checker) must carry
out and answer with the matching event. Every event carries the node's clocks, so the
machine never reads one.

The loop it encodes, for one operation::

    sync:    if dirty -> CompareAndSet(encode(view, protocol), token)  (answer: CasResult)
             elif the view was read less than cache_duration ago -> decide
             else -> Read                                          (answer: ReadResult)
    absorb:  decode the returned bytes into the view (a state another protocol wrote
             fails the operation: protocol_mismatch), remember the token, sanitize
    decide:  first matching row of the operation's table ->
             mutating action: apply its effect to the view, mark dirty, sync
             SYNC:   Wait(until the next timer, or a change)      (answer: WokeUp)
             FINISH: Done;  errors: Fail

Announcing variants (``scale``) add three requests outside the register: ANNOUNCE asks
for :class:`Announce` (add this node to the round's announcement set; answer
:class:`Announced` with the set's size), a fold first asks for :class:`ReadAnnounced`
(answer :class:`AnnouncedMembers`), then applies the fold to the view and syncs like any
mutating action, and WITHDRAW asks for :class:`Withdraw` (take this node's announcement
back; answer :class:`Withdrawn`), then reads the state again before deciding.

Local state (:class:`Local`) is a plain immutable value: the model checker hashes and
compares it, the handler keeps one per node.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

from spec.codec import CorruptState, ProtocolMismatch, decode, decode_node, encode, encode_node
from spec.effects import expired_by_wall
from spec.settings import Settings
from spec.state import EMPTY_STATE, Millis, NodeId, RendezvousState, compared_values
from spec.tables import Context
from spec.variants import KEY_BEATS, LOCAL, UPSTREAM, Variant
from spec.vocabulary import ACTION_FAILURES, Action, FailKind, Op

Token = int | str | bytes
"""An opaque fencing token handed out by the store with every read."""

Sightings = tuple[tuple[NodeId, Millis, Millis], ...]
"""A local liveness clock: (node, heartbeat value, monotonic time first seen), sorted."""

STATE_KEY = "state"
"""The key of the shared state register (relative to the run's namespace)."""


# -- clocks -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Now:
    """A node's two clocks at the moment of an event, in milliseconds."""

    mono: Millis
    """Monotonic clock: op deadlines, cache age. Only ever compared with itself."""
    wall: Millis
    """Wall clock: heartbeats and the last-call deadline written into the shared state."""


# -- events (inputs) ----------------------------------------------------------------------
@dataclass(frozen=True)
class Known:
    """A state a node knows: a view it read or wrote (and sanitized), with its token and
    the monotonic time of that read or write (see :func:`known_of`)."""

    view: RendezvousState
    token: Token | None
    synced_at: Millis
    job: int | None = None
    """The other machine state's :attr:`Local.job`: a node belongs to one job, fixed by
    the first state either of its machine states saw."""


@dataclass(frozen=True)
class StartOp:
    """The node's owner starts an operation that must end by ``deadline`` (monotonic).

    ``sightings``: when the node runs two machine states (the handler keeps one for exit,
    join and keep-alive, and one for queries and closes, so that neither waits for the
    other), the node's one local liveness clock is the first one's ``seen_beats``; an
    operation on the second starts from it (a copy), so both judge heartbeats by the
    same first-seen times and the node keeps one clock, not two.

    ``known``: what the node's other machine state knows (see below)."""

    op: Op
    deadline: Millis
    now: Now
    sightings: Sightings | None = None
    known: Known | None = None
    """What the node's other machine state knows: the operation starts from that view
    instead of its own when it is newer (:func:`newer`), so that, say, a
    ``num_nodes_waiting()`` right after ``next_rendezvous`` returned counts the round
    that call joined, not a cached view of the round before (the correctness issue's
    failure 3)."""


@dataclass(frozen=True)
class ReadResult:
    """Answer to :class:`Read`: the bytes stored (``None`` if the key is absent)."""

    data: bytes | None
    token: Token | None
    now: Now


@dataclass(frozen=True)
class CasResult:
    """Answer to :class:`CompareAndSet`: the bytes now stored and whether ours were set."""

    data: bytes | None
    token: Token | None
    has_set: bool
    now: Now


@dataclass(frozen=True)
class WokeUp:
    """Answer to :class:`Wait`: the time came or the stored state changed."""

    now: Now


@dataclass(frozen=True)
class IoFailed:
    """The pending read, write or wait could not be carried out (store unreachable, or a
    write whose outcome is unknown). The operation fails; the local view is kept. Under
    the local liveness clock the heartbeat sightings (``seen_beats``, ``watch``) are
    forgotten: while this node cannot reach the store, neither may its peers, so their
    silence is no evidence; the next read starts every age afresh."""

    reason: str
    now: Now


@dataclass(frozen=True)
class Announced:
    """Answer to :class:`Announce`: the announcement set's size after the addition."""

    size: int
    now: Now


@dataclass(frozen=True)
class AnnouncedMembers:
    """Answer to :class:`ReadAnnounced`: the members of the round's announcement set."""

    members: tuple[bytes, ...]
    now: Now


@dataclass(frozen=True)
class Withdrawn:
    """Answer to :class:`Withdraw`: the announcement is out of the set."""

    now: Now


@dataclass(frozen=True)
class Beaten:
    """Answer to :class:`Beat`: the heartbeat key was written."""

    now: Now


@dataclass(frozen=True)
class BeatValues:
    """Answer to :class:`ReadBeats`: each node's heartbeat value (None when absent)."""

    values: tuple[bytes | None, ...]
    now: Now


Event = (
    StartOp
    | ReadResult
    | CasResult
    | WokeUp
    | IoFailed
    | Announced
    | AnnouncedMembers
    | Withdrawn
    | Beaten
    | BeatValues
)


# -- requests (outputs) -------------------------------------------------------------------
@dataclass(frozen=True)
class Read:
    """Read ``key`` atomically; answer with :class:`ReadResult` (data and token)."""

    key: str


@dataclass(frozen=True)
class CompareAndSet:
    """Atomically: if ``key``'s current token equals ``token`` (or ``token`` is None and
    the key is absent), store ``data``. Either way answer with :class:`CasResult` holding
    the bytes and token stored *afterwards* and whether this write happened. If the
    outcome cannot be known, answer with :class:`IoFailed`; never retry the write blindly.
    """

    key: str
    data: bytes
    token: Token | None


@dataclass(frozen=True)
class Wait:
    """Sleep until the monotonic clock reaches ``until`` or ``key`` no longer has
    ``token``, whichever comes first; then answer with :class:`WokeUp`. Waking early
    is always allowed (the machine re-reads and decides again); waking late is not."""

    key: str
    token: Token | None
    until: Millis


@dataclass(frozen=True)
class Done:
    """The operation finished; the outcome is in the machine's view."""

    op: Op


@dataclass(frozen=True)
class Fail:
    """The operation ended with an error of ``kind``; raise the matching exception."""

    op: Op
    kind: FailKind
    message: str


@dataclass(frozen=True)
class Announce:
    """Atomically add ``member`` (this node, :func:`spec.codec.encode_node`) to the
    announcement set of round ``round`` and answer :class:`Announced` with the set's size
    afterwards. Adding it again is harmless (the size is unchanged), so a retry after an
    unknown outcome is safe."""

    round: int
    member: bytes


@dataclass(frozen=True)
class ReadAnnounced:
    """Read the announcement set of round ``round``; answer :class:`AnnouncedMembers`."""

    round: int


@dataclass(frozen=True)
class Withdraw:
    """Atomically take ``member`` (this node) out of the announcement set of round
    ``round`` and answer :class:`Withdrawn`. Taking out a member that is not there is
    harmless, so a retry after an unknown outcome is safe."""

    round: int
    member: bytes


@dataclass(frozen=True)
class Beat:
    """Write ``value`` under this node's heartbeat key (heartbeats under keys); answer
    :class:`Beaten`. A plain write: never a compare-and-set."""

    value: bytes


@dataclass(frozen=True)
class ReadBeats:
    """Read the heartbeat keys of ``nodes``; answer :class:`BeatValues` in that order."""

    nodes: tuple[NodeId, ...]


Request = (
    Read
    | CompareAndSet
    | Wait
    | Done
    | Fail
    | Announce
    | ReadAnnounced
    | Withdraw
    | Beat
    | ReadBeats
)


# -- local state --------------------------------------------------------------------------
class Phase(enum.Enum):
    """What the machine waits for."""

    IDLE = "idle"
    """No operation runs; accepts StartOp."""
    READING = "reading"
    """A Read is outstanding."""
    WRITING = "writing"
    """A CompareAndSet is outstanding."""
    WAITING = "waiting"
    """A Wait is outstanding."""
    ANNOUNCING = "announcing"
    """An Announce is outstanding."""
    READING_ANNOUNCED = "reading_announced"
    """A ReadAnnounced is outstanding (a fold waits for it)."""
    WITHDRAWING = "withdrawing"
    """A Withdraw is outstanding."""
    BEATING = "beating"
    """A Beat is outstanding."""
    WATCHING = "watching"
    """A ReadBeats is outstanding."""


@dataclass(frozen=True)
class Local:
    """One node's machine state."""

    node: NodeId
    view: RendezvousState = EMPTY_STATE
    token: Token | None = None
    dirty: bool = False
    synced_at: Millis | None = None
    """Monotonic time of the last completed read or write; None: the view is not fresh."""
    phase: Phase = Phase.IDLE
    op: Op | None = None
    deadline: Millis = 0
    seen_beats: tuple[tuple[NodeId, Millis, Millis], ...] = ()
    """Local liveness clock only: (node, heartbeat value, monotonic time this node first
    saw that value), sorted by node. Empty under the wall clock."""
    seen_last_call: tuple[Millis, Millis] | None = None
    """Local liveness clock only: (last-call deadline value, monotonic time first seen)."""
    announced: tuple[int, int, Millis, int] | None = None
    """Announcing variants only: (round, set size returned, monotonic time, size returned
    by this node's announcement before it in the same round, 0 if none) of this node's
    latest announcement."""
    folding: Action | None = None
    """The fold waiting for its :class:`ReadAnnounced` answer."""
    beats: int = 0
    """Heartbeats under keys: how many this node wrote (modulo ``Config.beat_modulus``)."""
    beat_at: Millis | None = None
    """Heartbeats under keys: monotonic time of this node's last heartbeat write."""
    watched_at: Millis | None = None
    """Heartbeats under keys: monotonic time of this node's last read of watched keys."""
    watch: tuple[tuple[NodeId, bytes | None, Millis], ...] = ()
    """Heartbeats under keys: (watched node, heartbeat value, monotonic time this node
    first saw that value), in the order of :func:`watched`."""
    job: int | None = None
    """The epoch of the job this node belongs to (``RendezvousState.epoch``), fixed by
    the first state it sees (:func:`job_after`); None before that, and always under a
    variant that never reopens a closed run (:attr:`Variant.reopens`)."""

    def __eq__(self, other: object) -> bool:
        # Not left to @dataclass: see spec.state.compared_values.
        return other.__class__ is self.__class__ and _local_values(self) == _local_values(other)

    def __hash__(self) -> int:
        # A Local never changes, so its hash is computed once (the model checker hashes
        # the same machine states many times); :func:`evolve` starts the copy without it.
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(_local_values(self))
            object.__setattr__(self, "_hash", cached)
        return cached


_LOCAL_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Local))
_local_values = compared_values(Local)
_LOCAL_FIELD_SET = frozenset(_LOCAL_FIELDS)


def evolve(local: Local, **changes: object) -> Local:
    """``local`` with ``changes`` (what :func:`dataclasses.replace` does, ten times
    faster: a Local has no ``__post_init__`` to run). Names must be fields of Local."""
    assert changes.keys() <= _LOCAL_FIELD_SET, sorted(changes.keys() - _LOCAL_FIELD_SET)
    new = object.__new__(Local)
    state = new.__dict__
    state.update(local.__dict__)
    state.pop("_hash", None)
    state.update(changes)
    return new


@dataclass(frozen=True)
class Config:
    """What is fixed for a node: the settings and the protocol variant."""

    settings: Settings
    variant: Variant = UPSTREAM
    key: str = STATE_KEY
    beat_modulus: int = 2**31
    """Heartbeat values (heartbeats under keys) count modulo this; an observer only
    compares them for change. The model checker uses a small modulus to stay finite."""
    decode: Callable[[bytes, str], RendezvousState] = decode
    """How read bytes become a state for a node of the protocol named by the second
    argument: :func:`spec.decode` or an equivalent that may remember earlier answers
    (the model checker reads the same few states many times); it must raise
    :class:`CorruptState` and :class:`ProtocolMismatch` exactly when ``spec.decode``
    does."""


@dataclass(frozen=True)
class Step:
    """The outcome of feeding one event: the new local state and the request to serve.

    ``action`` is the action decided during this step (None if the step only issued
    I/O), ``row`` the stable name of the table row that chose it (``<op>.<name>``, e.g.
    ``join.join_open_round``: :meth:`spec.tables.Table.qualified`), and ``pruned`` the nodes
    sanitize removed from the view. Interpreters log these; they carry no obligations.
    """

    local: Local
    request: Request
    action: Action | None = None
    row: str | None = None
    pruned: tuple[NodeId, ...] = ()


class InvalidTransition(Exception):
    """An event arrived that the machine's phase does not accept (an interpreter bug)."""

    def __init__(self, local: Local, event: Event) -> None:
        super().__init__(
            f"node {local.node} in phase {local.phase.value} cannot accept "
            f"{type(event).__name__}: {event!r}"
        )
        self.local = local
        self.event = event


# -- the machine ---------------------------------------------------------------------------
def step(local: Local, event: Event, config: Config) -> Step:
    """Feed one event; get the next local state and the request to carry out."""
    if isinstance(event, StartOp):
        if local.phase is not Phase.IDLE:
            raise InvalidTransition(local, event)
        started = evolve(local, op=event.op, deadline=event.deadline)
        if event.sightings is not None:
            started = evolve(started, seen_beats=event.sightings)
        known = event.known
        if known is not None and started.job is None and known.job is not None:
            started = evolve(started, job=known.job)
        if known is not None and not local.dirty and newer(known.view, local.view):
            started = evolve(
                started,
                view=known.view,
                token=known.token,
                synced_at=known.synced_at,
                job=_job(started, known.view, config),
            )
        return _sync(started, event.now, config)
    if isinstance(event, ReadResult):
        if local.phase is not Phase.READING:
            raise InvalidTransition(local, event)
        return _absorb(local, event.data, event.token, event.now, config)
    if isinstance(event, CasResult):
        if local.phase is not Phase.WRITING:
            raise InvalidTransition(local, event)
        return _absorb(local, event.data, event.token, event.now, config)
    if isinstance(event, WokeUp):
        if local.phase is not Phase.WAITING:
            raise InvalidTransition(local, event)
        # We waited because nothing could progress: the cached view is not good enough.
        return _sync(evolve(local, synced_at=None), event.now, config)
    if isinstance(event, Announced):
        if local.phase is not Phase.ANNOUNCING:
            raise InvalidTransition(local, event)
        round_ = local.view.round
        prev = local.announced
        before = prev[1] if prev is not None and prev[0] == round_ else 0
        announced = (round_, event.size, event.now.mono, before)
        return _decide(evolve(local, announced=announced), event.now, config)
    if isinstance(event, AnnouncedMembers):
        if local.phase is not Phase.READING_ANNOUNCED or local.folding is None:
            raise InvalidTransition(local, event)
        return _fold(local, event, config)
    if isinstance(event, Withdrawn):
        if local.phase is not Phase.WITHDRAWING:
            raise InvalidTransition(local, event)
        # A fold may have admitted this node before the announcement left the set: decide
        # on a fresh read, where it then finds itself a participant (and withdraws from
        # the state) or not.
        return _sync(evolve(local, announced=None, synced_at=None), event.now, config)
    if isinstance(event, Beaten):
        if local.phase is not Phase.BEATING:
            raise InvalidTransition(local, event)
        beaten = evolve(local, beats=next_beat(local, config), beat_at=event.now.mono)
        return _decide(beaten, event.now, config)
    if isinstance(event, BeatValues):
        if local.phase is not Phase.WATCHING:
            raise InvalidTransition(local, event)
        return _decide(_watched(local, event, config), event.now, config)
    if isinstance(event, IoFailed):
        if local.phase is Phase.IDLE:
            raise InvalidTransition(local, event)
        failed = evolve(local, folding=None)
        if config.variant.liveness_clock == LOCAL and (local.seen_beats or local.watch):
            # Silence while the store is away never counts: nobody could write a
            # heartbeat, so the next read starts every sighting's age afresh (issue 26).
            failed = evolve(failed, seen_beats=(), watch=())
        return _fail(failed, FailKind.CONNECTION, event.reason)
    raise InvalidTransition(local, event)


def nodes_waiting(view: RendezvousState, node: NodeId, joined: int | None, variant: Variant) -> int:
    """What ``num_nodes_waiting()`` answers from ``view`` for ``node``, whose last
    ``next_rendezvous`` returned round ``joined`` (None: it returned none, or is in one
    now): the nodes on the wait list, and, under a variant that
    ``counts_dropped_member``, the node itself once that round no longer holds it (the
    round ended or dropped it), so that its agent, which learns of it only from a count
    above 0, joins the next round."""
    count = len(view.wait_list)
    if not variant.counts_dropped_member or joined is None or view.is_waiting(node):
        return count
    holds = view.round == joined and view.complete and view.is_participant(node)
    return count if holds else count + 1


def closed_for(local: Local) -> bool:
    """What ``is_closed()`` answers from ``local`` (a node's machine state after a
    query): its view is closed, or it is of a later epoch than the node's job. The second
    case is a node of a closed job that a new job under the run id has reopened since:
    the run is open, but not for this node, whose next ``next_rendezvous`` fails closed
    (join row ``later_job``). A newcomer waiting at the closed run it is about to reopen
    (its job is one epoch up) is told the run is closed, as torch would tell it."""
    view = local.view
    return view.closed or (local.job is not None and view.epoch > local.job)


def known_of(local: Local) -> Known | None:
    """What ``local`` knows of the stored state, to hand to the node's other machine
    state (:attr:`StartOp.known`): its view, unless it holds changes not yet written
    (dirty) or it has never read one."""
    if local.dirty or local.synced_at is None:
        return None
    return Known(local.view, local.token, local.synced_at, local.job)


def start_event(
    op: Op, deadline: Millis, now: Now, peer: Local, control: bool, share_views: bool = True
) -> StartOp:
    """The event that starts ``op`` on one of a node's two machine states, given the
    other one (``peer``): the control machine state (``control``: queries and closes)
    borrows the main one's liveness clock (its ``seen_beats``), and either starts from
    the other's view when it is newer (:func:`known_of`). The handler and the model
    checker both start every operation through this. ``share_views=False`` is the planted
    handler bug of an early rdzv (a query counted from its own cache, older than the
    round its node had just joined)."""
    sightings = peer.seen_beats if control else None
    known = known_of(peer) if share_views else None
    return StartOp(op, deadline, now, sightings, known)


def adopt_job(local: Local, job: int | None) -> Local:
    """``local`` with ``job``, the job the node's other machine state has fixed, if
    ``local`` has none yet (it has seen no state); unchanged otherwise. A node belongs to
    one job, fixed by the first state *either* of its machine states saw (:class:`Known`):
    without this, a join whose first read returns the closed state of its own handler's
    close would take the node for a newcomer of the next job and reopen the run."""
    if job is None or local.job is not None:
        return local
    return evolve(local, job=job)


def job_after(job: int | None, view: RendezvousState) -> int:
    """The epoch of the job a node belongs to (:attr:`Local.job`) once it has seen
    ``view``: fixed by the first state it sees. A node whose first state is open belongs
    to that state's job; one whose first state is closed is a newcomer, of the next job
    under the run id (which reopens the run, one epoch up, once nobody is listed in it).
    A node never changes job: a state of a later epoch means its own job was closed and
    a new one took the run id (it fails closed); one of an earlier epoch is the closed
    run its own job has not reopened yet."""
    if job is not None:
        return job
    return view.epoch + 1 if view.closed else view.epoch


def newer(a: RendezvousState, b: RendezvousState) -> bool:
    """Whether state ``a`` certainly comes after state ``b`` in the store's history.

    The protocol moves every state forward in one order: the round never goes back, a
    round, once complete, only ever opens again as the next round, and a closed round
    never changes its number (a new job reopens the run as a later round). So a higher
    round comes after a lower one, a closed round after the same round open, and a
    complete round after the same round open; a later epoch (a new job reopened the
    run) after an earlier one. States that tie on (epoch, round, closed, complete) are
    not ordered: then neither is newer."""
    return (a.epoch, a.round, a.closed, a.complete) > (b.epoch, b.round, b.closed, b.complete)


def next_beat(local: Local, config: Config) -> int:
    """The count this node's next heartbeat write carries (its value is its digits)."""
    return (local.beats + 1) % config.beat_modulus


def watched(view: RendezvousState, node: NodeId) -> tuple[NodeId, ...]:
    """The nodes whose heartbeat keys ``node`` watches (heartbeats under keys): in a
    complete round, the first participant in sorted order watches every other node
    listed (the other participants, then the nodes standing by on the wait list and the
    redundancy list) and each of those watches it; otherwise nobody. So every listed
    node of a complete round is watched by someone, a node standing by finds out when
    the round it waits for has lost its first participant (its own prune then ends that
    round), and each node reads one key per interval except the first, which reads one
    per other listed node: the traffic per interval is linear in the number of nodes."""
    if view.closed and not view.is_listed(node):
        # A newcomer at a closed run waits until nobody is listed: it watches everybody
        # still listed, and prunes the dead (its join table decides when).
        return view.listed_nodes()
    if not view.complete:
        return ()
    members = view.participant_nodes()
    if not members:
        return ()
    if node == members[0]:
        standing = sorted({*view.wait_list, *view.redundancy_list} - {node})
        return (*members[1:], *standing)
    return (members[0],) if view.is_listed(node) else ()


def _watched(local: Local, event: BeatValues, config: Config) -> Local:
    nodes = watched(local.view, local.node)
    before = {n: (value, seen) for n, value, seen in local.watch}
    entries = []
    for n, value in zip(nodes, event.values, strict=False):
        old = before.get(n)
        seen = old[1] if old is not None and old[0] == value else event.now.mono
        entries.append((n, value, seen))
    return evolve(local, watch=tuple(entries), watched_at=event.now.mono)


def dead_watched(local: Local, mono: Millis, settings: Settings) -> tuple[NodeId, ...]:
    """Watched nodes, still listed in the view, whose heartbeat value this node has
    seen stand still for longer than the expiry (on its monotonic clock)."""
    watching = set(watched(local.view, local.node))
    return tuple(
        n for n, _, seen in local.watch if n in watching and mono - seen > settings.heartbeat_expiry
    )


CORRUPT_ANNOUNCEMENTS = "the announcement set of round"
"""How a fold's failure message starts when a member of the set it read is not a node
identity (then the round number and the member): interpreters use it to name the set."""


def _fold(local: Local, event: AnnouncedMembers, config: Config) -> Step:
    action = local.folding
    assert action is not None
    try:
        members = tuple(decode_node(m) for m in event.members)
    except CorruptState as exc:
        failed = evolve(local, folding=None)
        message = f"{CORRUPT_ANNOUNCEMENTS} {local.view.round} holds {exc}"
        return _fail(failed, FailKind.CORRUPT_STATE, message)
    fold = config.variant.folds[action]
    view = fold(local.view, local.node, members, config.settings, event.now.wall)
    if view == local.view:
        # Nothing to admit (the set held nobody new): decide again on a fresh read.
        fresh = evolve(local, folding=None, synced_at=None)
        return replace(_sync(fresh, event.now, config), action=action)
    changed = evolve(local, view=view, dirty=True, folding=None)
    return replace(_sync(changed, event.now, config), action=action)


def _job(local: Local, view: RendezvousState, config: Config) -> int | None:
    return job_after(local.job, view) if config.variant.reopens else local.job


def _op(local: Local) -> Op:
    assert local.op is not None, "an operation must be running"
    return local.op


def _sync(local: Local, now: Now, config: Config) -> Step:
    if local.dirty:
        request = CompareAndSet(config.key, encode(local.view, config.variant.name), local.token)
        return Step(evolve(local, phase=Phase.WRITING), request)
    cache = config.settings.cache_duration
    if cache and local.synced_at is not None and local.synced_at >= now.mono - cache:
        return _decide(local, now, config)
    return Step(evolve(local, phase=Phase.READING), Read(config.key))


def _absorb(
    local: Local, data: bytes | None, token: Token | None, now: Now, config: Config
) -> Step:
    try:
        view = EMPTY_STATE if data is None else config.decode(data, config.variant.name)
    except ProtocolMismatch as exc:
        # Another protocol's state: its tables disagree with ours on what it means, so
        # going on would hang or complete rounds neither protocol would (issue 26).
        return _fail(local, FailKind.PROTOCOL_MISMATCH, str(exc))
    except CorruptState as exc:
        return _fail(local, FailKind.CORRUPT_STATE, str(exc))
    variant, settings = config.variant, config.settings
    beats: tuple[tuple[NodeId, Millis, Millis], ...] = ()
    if variant.heartbeats == KEY_BEATS:
        # The state's heartbeat entries are admission stamps: liveness is watched on
        # the heartbeat keys (keep-alive op), so nothing is pruned here.
        _, last_call = observe(local, view, now.mono)
        cleaned = variant.prune(view, (), settings)
        if cleaned.state.deadline is None:
            last_call = None
    elif variant.liveness_clock == LOCAL:
        beats, last_call = observe(local, view, now.mono)
        cleaned = variant.prune(view, expired_by_age(beats, now.mono, settings), settings)
        gone = set(cleaned.dead)
        beats = tuple(entry for entry in beats if entry[0] not in gone)
        if cleaned.state.deadline is None:
            last_call = None
    else:
        last_call = None
        cleaned = variant.prune(view, expired_by_wall(view, settings, now.wall), settings)
    dirty = cleaned.removed_participant and variant.prune_marks_dirty
    fresh = evolve(
        local,
        view=cleaned.state,
        token=token,
        dirty=dirty,
        synced_at=now.mono,
        seen_beats=beats,
        seen_last_call=last_call,
        job=_job(local, cleaned.state, config),
    )
    decided = _decide(fresh, now, config)
    return replace(decided, pruned=cleaned.dead) if cleaned.dead else decided


def observe(
    local: Local, view: RendezvousState, mono: Millis
) -> tuple[tuple[tuple[NodeId, Millis, Millis], ...], tuple[Millis, Millis] | None]:
    """Update the local liveness clock with a freshly read ``view`` at monotonic ``mono``:
    a heartbeat value or last-call deadline seen for the first time starts its age at 0."""
    before = {node: (value, seen) for node, value, seen in local.seen_beats}
    beats = []
    for node, value in view.last_heartbeats:
        old = before.get(node)
        seen = old[1] if old is not None and old[0] == value else mono
        beats.append((node, value, seen))
    last_call = None
    if view.deadline is not None:
        old_call = local.seen_last_call
        kept = old_call is not None and old_call[0] == view.deadline
        last_call = (view.deadline, old_call[1] if old_call is not None and kept else mono)
    return tuple(beats), last_call


def expired_by_age(
    beats: tuple[tuple[NodeId, Millis, Millis], ...], mono: Millis, settings: Settings
) -> tuple[NodeId, ...]:
    """Nodes whose heartbeat value this node has seen unchanged for longer than the expiry
    (on its own monotonic clock). The age a node measures is never more than the time
    since the value was written, so a live node that beats within the expiry is never
    evicted, whatever the offsets between the machines' wall clocks."""
    return tuple(node for node, _, seen in beats if mono - seen > settings.heartbeat_expiry)


def context(local: Local, now: Now, config: Config) -> Context:
    """The guard context a node in ``local`` sees at ``now``."""
    last_call_age = None
    if config.variant.liveness_clock == LOCAL and local.view.deadline is not None:
        seen = local.seen_last_call
        first = seen[1] if seen is not None and seen[0] == local.view.deadline else now.mono
        last_call_age = now.mono - first
    beat_age = watch_age = None
    dead: tuple[NodeId, ...] = ()
    if config.variant.heartbeats == KEY_BEATS:
        beat_age = None if local.beat_at is None else now.mono - local.beat_at
        watch_age = None if local.watched_at is None else now.mono - local.watched_at
        dead = dead_watched(local, now.mono, config.settings)
    announce_size = announce_age = announce_before = None
    if local.announced is not None and local.announced[0] == local.view.round:
        announce_size = local.announced[1]
        announce_age = now.mono - local.announced[2]
        announce_before = local.announced[3] or None
    return Context(
        node=local.node,
        state=local.view,
        settings=config.settings,
        mono_now=now.mono,
        wall_now=now.wall,
        op_deadline=local.deadline,
        rollback_window=config.variant.rollback_window,
        last_call_age=last_call_age,
        announce_size=announce_size,
        announce_age=announce_age,
        announce_before=announce_before,
        beat_age=beat_age,
        watch_age=watch_age,
        job_offset=0 if local.job is None else local.view.epoch - local.job,
        dead=dead,
    )


def _decide(local: Local, now: Now, config: Config) -> Step:
    op = _op(local)
    table = config.variant.table(op)
    ctx = context(local, now, config)
    index = table.select(ctx)
    action = table.rows[index].then
    name = table.qualified(index)
    if action is Action.FINISH:
        return Step(evolve(local, phase=Phase.IDLE, op=None), Done(op), action, name)
    if action in ACTION_FAILURES:
        kind = ACTION_FAILURES[action]
        failed = _fail(local, kind, _failure_message(op, kind, local))
        return replace(failed, action=action, row=name)
    if action is Action.SYNC:
        until = next_timer(ctx, config, local)
        wait = Wait(config.key, local.token, until)
        return Step(evolve(local, phase=Phase.WAITING), wait, action, name)
    if action is Action.ANNOUNCE:
        request = Announce(local.view.round, encode_node(local.node))
        return Step(evolve(local, phase=Phase.ANNOUNCING), request, action, name)
    if action is Action.WITHDRAW:
        withdraw = Withdraw(local.view.round, encode_node(local.node))
        return Step(evolve(local, phase=Phase.WITHDRAWING), withdraw, action, name)
    if action.folds:
        busy = evolve(local, phase=Phase.READING_ANNOUNCED, folding=action)
        return Step(busy, ReadAnnounced(local.view.round), action, name)
    if action is Action.BEAT:
        value = str(next_beat(local, config)).encode("ascii")
        return Step(evolve(local, phase=Phase.BEATING), Beat(value), action, name)
    if action is Action.WATCH:
        nodes = watched(local.view, local.node)
        return Step(evolve(local, phase=Phase.WATCHING), ReadBeats(nodes), action, name)
    if action is Action.PRUNE_DEAD:
        cleaned = config.variant.prune(local.view, ctx.dead, config.settings)
        gone = set(cleaned.dead)
        watch = tuple(entry for entry in local.watch if entry[0] not in gone)
        changed = evolve(local, view=cleaned.state, dirty=True, watch=watch)
        synced = _sync(changed, now, config)
        return replace(synced, action=action, row=name, pruned=cleaned.dead)
    effect = config.variant.effects[action]
    view = effect(local.view, local.node, config.settings, now.wall)
    deadline = local.deadline
    if action is Action.REMOVE_FROM_REDUNDANCY_LIST:
        # The node gets a whole new join window once it leaves the redundancy list.
        deadline = now.mono + config.settings.join_timeout
    changed = evolve(local, view=view, dirty=True, deadline=deadline)
    synced = _sync(changed, now, config)
    return replace(synced, action=action, row=name)


def _fail(local: Local, kind: FailKind, message: str) -> Step:
    op = _op(local)
    return Step(evolve(local, phase=Phase.IDLE, op=None), Fail(op, kind, message))


def _failure_message(op: Op, kind: FailKind, local: Local) -> str:
    if kind is FailKind.CLOSED and local.job is not None and local.job > local.view.epoch:
        view = local.view
        still = view.listed_nodes()
        return (
            f"the rendezvous was closed by an earlier job under this run id (round "
            f"{view.round}) and {len(still)} of its nodes are still listed "
            f"({', '.join(map(str, still))}): a new job reopens it once they have left "
            "(at shutdown) or their heartbeats have expired; wait for that job to end, "
            "or use another run id"
        )
    if kind is FailKind.CLOSED and local.job is not None and local.job < local.view.epoch:
        return (
            f"the rendezvous this node's job used was closed, and a new job under the same "
            f"run id has reopened it since (round {local.view.round}); this node does not "
            "belong to that job: start it again with the new job"
        )
    if kind is FailKind.CLOSED:
        return f"the rendezvous is closed (round {local.view.round}); no new rounds can start"
    if kind is FailKind.GRACEFUL_EXIT:
        return f"node {local.node} was redundant when the rendezvous closed; it can exit cleanly"
    return f"the {op.value} operation of node {local.node} did not finish before its deadline"


def keep_alive_due(local: Local, now: Now, config: Config) -> Millis:
    """The monotonic instant at which a node that has just returned from a join (``local``
    is its machine state) owes its first keep-alive: one ``keep_alive_interval`` after
    its own last heartbeat write, as ``local`` knows it (``beat_at`` under heartbeat keys;
    its heartbeat in its view otherwise, a time on its own wall clock, converted with the
    current offset between its clocks), and now if that is past. A node that knows of no
    write of its own owes one an interval from now. Counting from the last write rather
    than from the return keeps the gap between two heartbeat writes within an interval
    (plus a keep-alive's own duration), as the model checker's tick assumes, however long
    the join waited after its last beat."""
    interval = config.settings.keep_alive_interval
    if config.variant.heartbeats == KEY_BEATS:
        last = local.beat_at
    else:
        own = local.view.heartbeat_of(local.node)
        last = None if own is None else now.mono - (now.wall - own)
    if last is None:
        return now.mono + interval
    # A write that seems to lie ahead (the wall clock stepped back since) counts as now:
    # the first keep-alive is never more than an interval away.
    return max(now.mono, min(last, now.mono) + interval)


def next_timer(ctx: Context, config: Config, local: Local | None = None) -> Millis:
    """The earliest monotonic instant after now at which some guard or sanitize may
    change its verdict without any write to the store.

    Candidates: the op deadline and the end of the rollback window (monotonic); this
    node's heartbeat becoming due (its own wall clock, converted with its current offset
    between its clocks); the last call ending and any listed node's heartbeat expiring,
    on the wall clock or, under the local liveness clock, on the monotonic clock from
    when this node first saw the value (taken from ``local``); an announcer's fold
    falling due. The op deadline plus the rollback window bounds every wait, so no wait
    is endless.
    """
    mono, wall = ctx.mono_now, ctx.wall_now
    settings = ctx.settings
    candidates = [ctx.op_deadline + 1, ctx.op_deadline + ctx.rollback_window + 1]
    walls: list[Millis] = []
    own = ctx.state.heartbeat_of(ctx.node)
    keys = config.variant.heartbeats == KEY_BEATS
    if own is not None and not keys:
        walls.append(own + settings.keep_alive_interval)
    if keys and ctx.beat_age is not None:
        candidates.append(mono - ctx.beat_age + settings.keep_alive_interval)
    if keys and ctx.watch_age is not None:
        candidates.append(mono - ctx.watch_age + settings.keep_alive_interval)
    if keys and local is not None:
        candidates.extend(seen + settings.heartbeat_expiry + 1 for _, _, seen in local.watch)
    if ctx.announce_age is not None:
        # An announcer folds itself once it has waited a keep-alive interval in vain.
        candidates.append(mono - ctx.announce_age + settings.keep_alive_interval + 1)
    if config.variant.liveness_clock == LOCAL:
        if ctx.last_call_age is not None:
            candidates.append(mono - ctx.last_call_age + settings.last_call_timeout + 1)
        seen_beats = () if local is None else local.seen_beats
        candidates.extend(seen + settings.heartbeat_expiry + 1 for _, _, seen in seen_beats)
    else:
        if ctx.state.deadline is not None:
            walls.append(ctx.state.deadline + 1)
        walls.extend(beat + settings.heartbeat_expiry + 1 for _, beat in ctx.state.last_heartbeats)
    candidates.extend(w - wall + mono for w in walls)
    future = [c for c in candidates if c > mono]
    return min(future) if future else mono + 1
