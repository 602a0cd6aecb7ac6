"""Fingerprints and exact symmetry reduction.

A fingerprint is blake2b over ``repr`` of a canonical nested tuple of ints, strings,
booleans and None: stable across processes and independent of ``PYTHONHASHSEED`` (no
``hash()`` is involved in what gets hashed; dict and set iteration orders never reach
the encoding because every collection is sorted first).

Records. A world is taken apart into *records*: the store's state, the announcement sets
(announcing variants) and one record per process. A record is an identity-free skeleton
(every field that names no node) plus, for every identity it mentions, that identity's
*role* in it: for a process, whether it is the process's own identity, how its local view
lists it (participant, waiting, redundant, heartbeat) and the local liveness clock's entry
for it (heartbeat value and when first seen); for the store, how the state lists it; for
the announcement sets, the rounds it announced itself in. Skeleton and roles together are
the whole record (:data:`ENCODED_FIELDS`), so encoding a world as (store and announcement
records, sorted process records, faults used, shutdowns) with every identity replaced by a
label loses nothing but the labels and the process slots.

Symmetry. Processes are interchangeable except for their identities, so the reduced
fingerprint is the encoding under a labelling of the identities (0, 1, 2, ...) that does
not depend on which identities the world happens to use: a canonical labelling, found by
individualisation and refinement (the method of graph canonisation tools such as nauty):

1. refinement: colour identities and records alternately, an identity by its colour and
   the (record colour, role) pairs of the records that mention it, a record by its
   colour and the (role, identity colour) pairs of the identities it mentions, starting
   from the skeletons, until the colouring is stable;
2. individualisation: while some colour class holds several identities, try each of
   them in turn as the first of its class, refine again and recurse;
3. every leaf (each identity its own colour) labels identities by their colour order;
   the smallest encoding over all leaves is the canonical one.

Every step depends only on the skeletons, roles and colours, never on an identity's
value, so relabelling the world's identities leaves the set of leaf encodings, and so its
minimum, unchanged; and the encoding is lossless, so two worlds get the same fingerprint
only if one is a relabelling of the other. Pruning keeps the search small: identities
whose swap maps the world onto itself (twins, tested once per world) can be put in any
order without changing the leaf encodings, so a group of twins in a class is
individualised all at once, in one order, and is one branch, not one per member and
order. Identical idle processes are twins; ties that are not symmetries are rare. The
search is bounded by :data:`MAX_LEAVES`; past it the smallest encoding seen so far is used
and counted (``Canon.fallbacks``): still a lossless encoding, so two distinct classes
never merge, but one class may then keep two representatives.

Ranks. The protocol is symmetric except for rank *values* (ranks are positions in sorted
identity order). Decisions never read a rank, and every rank property checked (distinct,
0..W-1, agreement, sorted order) is checked on concrete transitions before reduction, so
the reduced fingerprint erases rank values. See docs/model_checker.md for the argument.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from functools import partial

import spec
from model_check.world import (
    BEATING_PCS,
    CACHE_LIMIT,
    Completion,
    IdentityCache,
    Lane,
    ModelConfig,
    Pc,
    Proc,
    World,
    decode_cached,
    store_image,
)
from spec import Local, NodeId, Phase, RendezvousState

MAX_LEAVES = 40_320
"""Most leaves (complete labellings) the canonical search visits for one world: 8!, every
order of eight tied identities even without any pruning."""

Label = Hashable

ENCODED_FIELDS: dict[str, frozenset[str]] = {
    "World": frozenset(
        {
            *("store", "procs", "used", "closes", "announced", "beats"),
            *("worker_failures", "completion"),
        }
    ),
    "Proc": frozenset(
        {
            *("ident", "pc", "local", "control", "skew", "returned", "outcome", "beating"),
            *("late", "stood_by", "next_job", "polled"),
        }
    ),
    "Completion": frozenset({"round", "world_size", "waiting"}),
    "Returned": frozenset({"round", "rank", "world_size"}),
    "RendezvousState": frozenset(
        {
            *("round", "complete", "closed", "deadline", "participants", "wait_list"),
            *("redundancy_list", "last_heartbeats", "epoch"),
        }
    ),
    "Local": frozenset(
        {
            *("node", "view", "token", "dirty", "synced_at", "phase", "op", "deadline"),
            *("seen_beats", "seen_last_call", "announced", "folding"),
            *("beats", "beat_at", "watched_at", "watch", "job"),
        }
    ),
}
"""The fields of the world's types that the records carry (a test checks these are all the
compared fields: one left out would merge worlds that differ in it, identities included)."""


@dataclass(frozen=True, slots=True)
class _Record:
    """A store state, the announcement sets or a process: an identity-free skeleton and
    each identity's role in it."""

    skeleton: str
    roles: tuple[tuple[NodeId, str], ...]


def _listing(state: RendezvousState, n: NodeId, ranks: bool) -> tuple[object, ...]:
    return (
        state.is_participant(n),
        state.rank_of(n) if ranks else None,
        state.is_waiting(n),
        state.is_redundant(n),
        state.heartbeat_of(n),
    )


def _members(state: RendezvousState) -> set[NodeId]:
    out = {n for n, _ in state.participants}
    out.update(state.wait_list)
    out.update(state.redundancy_list)
    out.update(n for n, _ in state.last_heartbeats)
    return out


def _state_skeleton(state: RendezvousState) -> tuple[object, ...]:
    head = (state.round, state.complete, state.closed, state.deadline)
    # the epoch only once a run was reopened, so runs without --next-job keep their keys
    return (*head, state.epoch) if state.epoch else head


def _store_record(state: RendezvousState, ranks: bool) -> _Record:
    roles = tuple((n, repr(_listing(state, n, ranks))) for n in sorted(_members(state)))
    return _Record(repr(("store", *_state_skeleton(state))), roles)


def relevant_view(p: Proc, world: World, cfg: ModelConfig, lane: Lane = Lane.MAIN) -> bool:
    """Whether the local view (and token, cache time) of ``p``'s machine state ``lane``
    can still influence anything.

    The machine throws its view away on the next read or CAS result, so a view matters
    only while it can be written back (dirty, or a pending CAS that may still apply) or
    reused from the cache (by the next operation of that machine state, or handed to the
    other one as what the node knows). Dropping irrelevant views from the encoding merges
    worlds with identical futures (an exact abstraction; see docs/model_checker.md).
    """
    local = p.local if lane is Lane.MAIN else p.control
    if p.pc in (Pc.CRASHED, Pc.ENDED):
        return False
    # A dirty view is written back with its token before anything else reads it; with a
    # stale token that compare-and-set fails (a fault only fails it sooner), and the
    # answer, or the next read, replaces the view.
    written = local.dirty and (spec.lands(store_image(world), local.token) or cfg.cas_ignores_token)
    if local.phase in (Phase.WAITING, Phase.WRITING):
        return written
    # Between calls (a member, or one whose shutdown runs on the control machine state)
    # a view is reused only from the cache, by this machine state or the other one.
    idle_between_calls = p.pc in BEATING_PCS or p.pc is Pc.CLOSING or lane is Lane.CONTROL
    if local.phase is Phase.IDLE and idle_between_calls:
        fresh = local.synced_at is not None and local.synced_at >= -cfg.settings.cache_duration
        return written or (fresh and not local.dirty)
    return True


def _lane_skeleton(local: Local, keep_view: bool, lane: Lane) -> tuple[object, ...]:
    """The identity-free fields of one machine state. An idle control machine state's
    last-call sighting is left out: queries and closes never ask whether the last call
    is over (no atom of theirs looks at it)."""
    if keep_view:
        rest: tuple[object, ...] = (local.token, local.synced_at, _state_skeleton(local.view))
    else:
        rest = (local.token if local.phase is Phase.WAITING else None,)
    return (
        local.seen_last_call if lane is Lane.MAIN or local.op is not None else None,
        local.phase.value,
        None if local.op is None else local.op.value,
        local.dirty,
        # An operation's deadline means nothing once it ended: the next one sets its own.
        None if local.op is None else local.deadline,
        local.announced,
        None if local.folding is None else local.folding.value,
        local.beats,
        local.job,
        local.beat_at,
        local.watched_at,
        keep_view,
        *rest,
    )


def _proc_record(p: Proc, ranks: bool, keep_view: bool, keep_control: bool) -> _Record:
    """``p`` as a record. Its own identity has role ``self``; a node one of its (relevant)
    views lists, or one of its local liveness clocks has an entry for, has the listings
    and the entries."""
    local, control = p.local, p.control
    r = p.returned
    returned = None if r is None else (r.round, r.world_size, r.rank if ranks else None)
    head = (
        *(int(p.pc), p.skew, returned, p.outcome, p.beating, p.late, p.stood_by, p.next_job),
        p.polled,
    )
    if p.pc in (Pc.CRASHED, Pc.ENDED):
        return _Record(repr(("proc", *head)), ((p.ident, "self"),))
    listed = _members(local.view) if keep_view else set()
    listed_control = _members(control.view) if keep_control else set()
    # The local liveness clock (hardened): what this node has seen and since when outlives
    # any one read, so it is part of the world whether or not the view is.
    seen = {n: (v, t) for n, v, t in local.seen_beats}
    # The control machine state's own sightings matter only during an operation: each
    # one starts from a copy of the main machine state's (StartOp.sightings).
    seen_control = {n: (v, t) for n, v, t in control.seen_beats} if control.op else {}
    # Heartbeats under keys: the watched nodes' values and when first seen, likewise.
    watch = {n: (v, t) for n, v, t in local.watch}
    everyone = listed.union(listed_control, seen, seen_control, watch)
    roles = tuple(
        (
            n,
            repr(
                (
                    n == p.ident,
                    n == local.node,
                    _listing(local.view, n, ranks) if n in listed else None,
                    seen.get(n),
                    watch.get(n),
                    _listing(control.view, n, ranks) if n in listed_control else None,
                    seen_control.get(n),
                )
            ),
        )
        for n in sorted(everyone.union((p.ident, local.node)))
    )
    skeleton = (
        "proc",
        *head,
        *_lane_skeleton(local, keep_view, Lane.MAIN),
        *_lane_skeleton(control, keep_control, Lane.CONTROL),
    )
    return _Record(repr(skeleton), roles)


def _completion_record(done: Completion) -> _Record:
    """The ghost of the latest completion: its round and size; the nodes still waiting
    then have role ``waiting``."""
    return _Record(
        repr(("completion", done.round, done.world_size)),
        tuple((n, "waiting") for n in sorted(done.waiting)),
    )


def _announcements_record(announced: tuple[tuple[int, NodeId], ...]) -> _Record:
    """The announcement sets (announcing variants): each node's role is the rounds it
    announced itself in."""
    rounds: dict[NodeId, list[int]] = {}
    for r, n in announced:
        rounds.setdefault(n, []).append(r)
    return _Record("('announced',)", tuple((n, repr(sorted(rounds[n]))) for n in sorted(rounds)))


_RECORDS: dict[tuple[object, bool, object], _Record] = {}
"""Records already built (processes and stores recur in many worlds); cleared when it
holds :data:`CACHE_LIMIT` entries."""


_BY_OBJECT: IdentityCache[_Record] = IdentityCache(CACHE_LIMIT)
"""The same records found by the process or store bytes they were built from: a move
changes one process, and the others are the very objects of the world before."""

_PLAIN: IdentityCache[bytes] = IdentityCache(CACHE_LIMIT)
"""Each record's digest under the identities as they are (:func:`plain_fingerprint`)."""


def _cached(
    key: tuple[object, bool, object], build: Callable[[], _Record], by_object: bool
) -> _Record:
    obj, ranks, keep = key
    if by_object:
        hit = _BY_OBJECT.get(obj, (ranks, keep))
        if hit is not None:
            return hit
    rec = _RECORDS.get(key)
    if rec is None:
        if len(_RECORDS) >= CACHE_LIMIT:
            _RECORDS.clear()
        rec = build()
        _RECORDS[key] = rec
    if by_object:
        _BY_OBJECT.put(obj, rec, (ranks, keep))
    return rec


def _records(
    world: World, cfg: ModelConfig, ranks: bool, by_object: bool = False
) -> tuple[list[_Record | None], list[_Record]]:
    """The world's records: those with a fixed place (the store, the announcement sets,
    the heartbeat keys; None if absent) and one per process (interchangeable, except for
    what they hold). ``by_object``: look records up by object identity first (walks, where
    each world is the last one with one process changed; a breadth-first search jumps
    between worlds, so there it costs more than it saves)."""
    data = world.store
    store = (
        None
        if data is None
        else _cached(
            (data, ranks, True), lambda: _store_record(decode_cached(data), ranks), by_object
        )
    )
    announced = _announcements_record(world.announced) if world.announced else None
    beats = (
        _Record("('beats',)", tuple((n, repr(v)) for n, v in sorted(world.beats)))
        if world.beats
        else None
    )
    completion = None if world.completion is None else _completion_record(world.completion)
    procs = []
    for p in world.procs:
        keep = (relevant_view(p, world, cfg), relevant_view(p, world, cfg, Lane.CONTROL))
        build = partial(_proc_record, p, ranks, *keep)
        procs.append(_cached((p, ranks, keep), build, by_object))
    return [store, announced, beats, completion], procs


def _labelled(rec: _Record, lab: Callable[[NodeId], Label]) -> tuple[object, ...]:
    return (rec.skeleton, tuple(sorted((lab(n), role) for n, role in rec.roles)))


def _digest(enc: object) -> bytes:
    return hashlib.blake2b(repr(enc).encode(), digest_size=12).digest()


def plain_fingerprint(world: World, cfg: ModelConfig) -> bytes:
    """Fingerprint without symmetry reduction: process slots and identities as they are.

    The digest of the records (each labelled with its identities as they are and digested
    on its own, cached per record, so a move that changes one process re-encodes one
    record), the faults used and the shutdowns: lossless, like the reduced encoding."""
    fixed, procs = _records(world, cfg, True, by_object=True)
    return _digest(
        (
            tuple(None if rec is None else _plain_digest(rec) for rec in fixed),
            tuple(_plain_digest(rec) for rec in procs),
            world.used,
            world.closes,
            world.worker_failures,
        )
    )


def _plain_digest(rec: _Record) -> bytes:
    digest = _PLAIN.get(rec)
    if digest is None:
        digest = _PLAIN.put(rec, _digest(_labelled(rec, _identity)))
    return digest


def _identity(n: NodeId) -> Label:
    return (n.addr, n.pid, n.local_id)


# -- canonical labelling ---------------------------------------------------------------------
_Enc = tuple[int, tuple[tuple[int, int], ...]]
"""A record as small ints: skeleton, and (label, role) pairs (valid within one world)."""
_Leaf = tuple[tuple[tuple[_Enc, ...], ...], tuple[_Enc, ...]]
"""A world as small ints: the records with a fixed place (each as a tuple of none or
one record) and the sorted process records."""


def _compress(signatures: list[tuple[int, tuple[tuple[int, int], ...]]]) -> tuple[list[int], int]:
    """Replace each signature by its position among the distinct ones (sorted): an order
    that depends on the signatures only. Returns the colours and how many there are."""
    distinct = sorted(set(signatures))
    index = {s: i for i, s in enumerate(distinct)}
    return [index[s] for s in signatures], len(distinct)


def _cells(colours: list[int]) -> dict[int, list[int]]:
    cells: dict[int, list[int]] = {}
    for i, c in enumerate(colours):
        cells.setdefault(c, []).append(i)
    return cells


class _Search:
    """The canonical labelling search for one world.

    Identities are numbered 0..k-1 and records 0..R-1 in input order; skeletons and roles
    by their sorted text. Nothing the search decides depends on the identity numbers,
    except the order within a group of twins, which does not change the result.
    """

    def __init__(self, fixed: list[_Record | None], procs: list[_Record]) -> None:
        self.fixed = [rec is not None for rec in fixed]
        records = [rec for rec in fixed if rec is not None] + procs
        node_index: dict[NodeId, int] = {}
        for rec in records:
            for n, _ in rec.roles:
                node_index.setdefault(n, len(node_index))
        self.k = len(node_index)
        self.skeletons = sorted({rec.skeleton for rec in records})
        self.roles = sorted({role for rec in records for _, role in rec.roles})
        skel_id = {s: i for i, s in enumerate(self.skeletons)}
        role_id = {s: i for i, s in enumerate(self.roles)}
        self.rec_skel = [skel_id[rec.skeleton] for rec in records]
        self.rec_roles = [
            tuple((node_index[n], role_id[role]) for n, role in rec.roles) for rec in records
        ]
        self.incidence: list[list[tuple[int, int]]] = [[] for _ in range(self.k)]
        for r, pairs in enumerate(self.rec_roles):
            for i, role in pairs:
                self.incidence[i].append((r, role))
        self.twin_of = list(range(self.k))
        self.leaves = 0
        self.best: _Leaf | None = None

    def refine(self, node_col: list[int], rec_col: list[int]) -> tuple[list[int], list[int]]:
        """Refine to a stable colouring. Bounded: every round but the last splits a class
        of identities or records, and there are at most k + R classes."""
        n_node, n_rec = len(set(node_col)), len(set(rec_col))
        for _ in range(self.k + len(rec_col) + 1):
            rec_sig = [
                (rec_col[r], tuple(sorted((role, node_col[i]) for i, role in pairs)))
                for r, pairs in enumerate(self.rec_roles)
            ]
            rec_col, new_n_rec = _compress(rec_sig)
            node_sig = [
                (node_col[i], tuple(sorted((rec_col[r], role) for r, role in inc)))
                for i, inc in enumerate(self.incidence)
            ]
            node_col, new_n_node = _compress(node_sig)
            if new_n_node == n_node and new_n_rec == n_rec:
                break
            n_node, n_rec = new_n_node, new_n_rec
        return node_col, rec_col

    def encode(self, labels: list[int]) -> _Leaf:
        encs: list[_Enc] = [
            (skel, tuple(sorted((labels[i], role) for i, role in pairs)))
            for skel, pairs in zip(self.rec_skel, self.rec_roles, strict=True)
        ]
        fixed: list[tuple[_Enc, ...]] = []
        for present in self.fixed:
            fixed.append((encs.pop(0),) if present else ())
        return (tuple(fixed), tuple(sorted(encs)))

    def twins(self, a: int, b: int) -> bool:
        """Whether swapping identities ``a`` and ``b`` maps the world onto itself. Only
        the records that mention either can change (a fixed record's skeleton is unlike
        any other's, so it can only map onto itself)."""
        touched = sorted({r for r, _ in self.incidence[a]} | {r for r, _ in self.incidence[b]})
        swap = {a: b, b: a}
        before = sorted((self.rec_skel[r], tuple(sorted(self.rec_roles[r]))) for r in touched)
        after = sorted(
            (
                self.rec_skel[r],
                tuple(sorted((swap.get(i, i), role) for i, role in self.rec_roles[r])),
            )
            for r in touched
        )
        return before == after

    def run(self) -> tuple[object, ...]:
        """The smallest leaf encoding, with skeletons and roles spelled out (the small
        ints only compare within one world)."""
        node_col, rec_col = self.refine([0] * self.k, list(self.rec_skel))
        for members in _cells(node_col).values():
            heads: list[int] = []
            for i in members:
                head = next((h for h in heads if self.twins(h, i)), None)
                if head is None:
                    heads.append(i)
                else:
                    self.twin_of[i] = head
        self._search(node_col, rec_col)
        assert self.best is not None, "the search visits at least one leaf"
        fixed, procs = self.best

        def spell(enc: _Enc) -> tuple[object, ...]:
            skel, pairs = enc
            return (self.skeletons[skel], tuple((lab, self.roles[role]) for lab, role in pairs))

        return (
            tuple(spell(rec[0]) if rec else None for rec in fixed),
            tuple(spell(p) for p in procs),
        )

    def _search(self, node_col: list[int], rec_col: list[int]) -> None:
        cells = _cells(node_col)
        if len(cells) == self.k:
            self.leaves += 1
            enc = self.encode(node_col)
            if self.best is None or enc < self.best:
                self.best = enc
            return
        target = min(c for c, members in cells.items() if len(members) > 1)
        groups: dict[int, list[int]] = {}
        for v in cells[target]:
            groups.setdefault(self.twin_of[v], []).append(v)
        # Every order of a group of twins maps the world onto itself and keeps the
        # colouring, so one order of the group stands for all of them: the group goes
        # first in its class, its members in index order, and the search tries each group.
        k = self.k
        for group in groups.values():
            if self.leaves >= MAX_LEAVES:
                return
            first = {v: j for j, v in enumerate(group)}
            split = [
                (2 * c + 1) * k + first[i] if i in first else (2 * c + 2) * k
                for i, c in enumerate(node_col)
            ]
            self._search(*self.refine(split, rec_col))


@dataclass
class Canon:
    """Canonicaliser with counters (one per search)."""

    cfg: ModelConfig
    calls: int = 0
    fallbacks: int = 0
    """Searches that stopped at :data:`MAX_LEAVES` (encoding perhaps not minimal; a world
    whose fingerprint is cached is not searched again)."""
    permuted: int = 0
    """Worlds whose search compared more than one leaf."""
    cache: dict[tuple[object, ...], bytes] = field(default_factory=dict, repr=False)
    """Fingerprints by the world's records as they are, faults used and shutdowns (what
    the encoding is computed from): breadth-first search reaches the same world along many
    interleavings, and a hit skips the labelling search. Cleared when it holds
    :data:`CACHE_LIMIT` entries."""

    def fingerprint(self, world: World) -> bytes:
        fixed, procs = _records(world, self.cfg, False)
        key = (*fixed, *procs, world.used, world.closes, world.worker_failures)
        fp = self.cache.get(key)
        if fp is None:
            if len(self.cache) >= CACHE_LIMIT:
                self.cache.clear()
            fp = self.cache[key] = _digest(self._encode(fixed, procs, world))
        return fp

    def encoding(self, world: World) -> tuple[object, ...]:
        return self._encode(*_records(world, self.cfg, False), world)

    def _encode(
        self, fixed: list[_Record | None], procs: list[_Record], world: World
    ) -> tuple[object, ...]:
        self.calls += 1
        search = _Search(fixed, procs)
        canon_fixed, canon_procs = search.run()
        if search.leaves > 1:
            self.permuted += 1
        if search.leaves >= MAX_LEAVES:
            self.fallbacks += 1
        return (canon_fixed, canon_procs, world.used, world.closes, world.worker_failures)
