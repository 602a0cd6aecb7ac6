"""Fingerprints and exact symmetry reduction.

A fingerprint is blake2b over ``repr`` of a canonical nested tuple of ints, strings,
booleans and None: stable across processes and independent of ``PYTHONHASHSEED`` (no
``hash()`` is involved in what gets hashed; dict and set iteration orders never reach
the encoding because every collection is sorted first).

Symmetry. Processes are interchangeable except for their identities, so a world is
canonicalised by relabelling every identity it mentions (process identities and every
node listed in the store or in a local view) to 0, 1, 2, ... in the order of an
identity-free key, and sorting whole process records:

1. ``role(n)``: how the store lists ``n`` (participant / waiting / redundant, heartbeat);
2. ``key0(n)``: role plus the records of the processes holding identity ``n``, with every
   identity inside them replaced by its role (``S`` for the process itself);
3. ``key1(n)``: key0 plus, for every other process whose view lists ``n``, that
   process's key0 and how its view lists ``n`` (one round of colour refinement).

Identities still tied after step 3 are permuted exhaustively (all orders of every tied
group, smallest encoding wins) when the product of the group factorials is at most
:data:`MAX_TIE_PERMUTATIONS`; tied identities that no other process's view mentions are
interchangeable and need no permutation. Beyond the cap the input order breaks the tie
and the fallback is counted (``Canon.fallbacks``): that can only keep two representatives
of one class (more states, never fewer), because the encoding itself is lossless.

Ranks. The protocol is symmetric except for rank *values* (ranks are positions in sorted
identity order). Decisions never read a rank, and every rank property checked (distinct,
0..W-1, agreement, sorted order) is checked on concrete transitions before reduction, so
the reduced fingerprint erases rank values. See docs/model_checker.md for the argument.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

from model_check.model import ModelConfig, Pc, Proc, World, decode_cached
from spec import NodeId, Phase, RendezvousState

MAX_TIE_PERMUTATIONS = 24
"""Largest number of tie-breaking orders tried exactly per canonicalisation."""

Label = Hashable


def _state_enc(
    state: RendezvousState, lab: Mapping[NodeId, Label], ranks: bool
) -> tuple[object, ...]:
    if ranks:
        parts: tuple[object, ...] = tuple(sorted((str(lab[n]), r) for n, r in state.participants))
    else:
        parts = tuple(sorted(str(lab[n]) for n, _ in state.participants))
    return (
        state.round,
        state.complete,
        state.closed,
        state.deadline,
        parts,
        tuple(sorted(str(lab[n]) for n in state.wait_list)),
        tuple(sorted(str(lab[n]) for n in state.redundancy_list)),
        tuple(sorted((str(lab[n]), b) for n, b in state.last_heartbeats)),
    )


def relevant_view(p: Proc, world: World, cfg: ModelConfig) -> bool:
    """Whether ``p``'s local view (and token, cache time) can still influence anything.

    The machine throws its view away on the next read or CAS result, so a view matters
    only while it can be written back (dirty, or a pending CAS that may still apply) or
    reused from the cache. Dropping irrelevant views from the encoding merges worlds with
    identical futures (an exact abstraction; see docs/model_checker.md).
    """
    local = p.local
    if p.pc in (Pc.CRASHED, Pc.ENDED):
        return False
    if local.phase is Phase.WAITING:
        return local.dirty
    if local.phase is Phase.WRITING:
        faults, used = cfg.faults, world.used
        return (
            local.token == (None if world.store is None else 1)
            or cfg.cas_ignores_token
            or used[3] < faults.cas_unknown
            or used[4] < faults.store_down
        )
    if local.phase is Phase.IDLE and p.pc is Pc.MEMBER:
        fresh = local.synced_at is not None and local.synced_at >= -cfg.settings.cache_duration
        return local.dirty or fresh
    return True


def _proc_enc(
    p: Proc,
    lab: Mapping[NodeId, Label],
    ranks: bool,
    keep_view: bool,
    state_enc: Callable[[RendezvousState], tuple[object, ...]] | None = None,
) -> tuple[object, ...]:
    local = p.local
    r = p.returned
    returned = None if r is None else (r.round, r.world_size, r.rank if ranks else None)
    head: tuple[object, ...] = (
        str(lab[p.ident]),
        int(p.pc),
        p.skew,
        returned,
        p.outcome,
        p.beating,
        p.late,
        p.stood_by,
    )
    if p.pc in (Pc.CRASHED, Pc.ENDED):
        return head
    if local.seen_beats or local.seen_last_call is not None:
        # The local liveness clock (hardened): what this node has seen and since when
        # outlives any one read, so it is part of the world whether or not the view is.
        seen = tuple(sorted((str(lab[n]), v, t) for n, v, t in local.seen_beats))
        head = (*head, seen, local.seen_last_call)
    if not keep_view:
        token = local.token if local.phase is Phase.WAITING else None
        return (
            *head,
            local.phase.value,
            local.op.value if local.op else None,
            token,
            local.dirty,
            local.deadline,
        )
    return (
        *head,
        local.phase.value,
        None if local.op is None else local.op.value,
        local.token,
        local.dirty,
        local.deadline,
        local.synced_at,
        _state_enc(local.view, lab, ranks) if state_enc is None else state_enc(local.view),
    )


def _digest(enc: object) -> bytes:
    return hashlib.blake2b(repr(enc).encode(), digest_size=12).digest()


def plain_fingerprint(world: World, cfg: ModelConfig) -> bytes:
    """Fingerprint without symmetry reduction: process slots and identities as they are."""
    return _digest(plain_encoding(world, cfg))


def plain_encoding(world: World, cfg: ModelConfig) -> tuple[object, ...]:
    lab = _Identity()
    store = None if world.store is None else _state_enc(decode_cached(world.store), lab, True)
    procs = tuple(_proc_enc(p, lab, True, relevant_view(p, world, cfg)) for p in world.procs)
    return (store, procs, world.used, world.closes)


class _Identity(dict[NodeId, Label]):
    """A labelling that maps every identity to itself."""

    def __missing__(self, key: NodeId) -> Label:
        return f"{key.addr}/{key.pid:06d}/{key.local_id}"


class _Relabel(dict[NodeId, Label]):
    """A labelling that maps the process's own identity to 'S' and others by ``base``."""

    def __init__(self, me: NodeId, base: Mapping[NodeId, Label]) -> None:
        super().__init__()
        self.me = me
        self.base = base

    def __missing__(self, key: NodeId) -> Label:
        return "S" if key == self.me else self.base[key]


def _listing(state: RendezvousState, n: NodeId) -> tuple[object, ...]:
    return (
        state.is_participant(n),
        state.is_waiting(n),
        state.is_redundant(n),
        state.heartbeat_of(n),
    )


@dataclass
class Canon:
    """Canonicaliser with counters (one per search)."""

    cfg: ModelConfig
    calls: int = 0
    fallbacks: int = 0
    permuted: int = 0

    def fingerprint(self, world: World) -> bytes:
        return _digest(self.encoding(world))

    def encoding(self, world: World) -> tuple[object, ...]:
        self.calls += 1
        store = None if world.store is None else decode_cached(world.store)
        ids: set[NodeId] = set()
        keep = [relevant_view(p, world, self.cfg) for p in world.procs]
        for p, k in zip(world.procs, keep, strict=True):
            ids.add(p.ident)
            if k:
                _collect(p.local.view, ids)
            ids.update(n for n, _, _ in p.local.seen_beats)
        if store is not None:
            _collect(store, ids)
        empty = RendezvousState()
        base = store if store is not None else empty
        role: dict[NodeId, Label] = {n: repr(_listing(base, n)) for n in ids}
        by_ident: dict[NodeId, list[tuple[Proc, bool]]] = {}
        for p, k in zip(world.procs, keep, strict=True):
            by_ident.setdefault(p.ident, []).append((p, k))
        key0: dict[NodeId, str] = {}
        for n in ids:
            recs = sorted(
                repr(_proc_enc(p, _Relabel(n, role), False, k)) for p, k in by_ident.get(n, [])
            )
            key0[n] = repr((role[n], recs))
        # One round of refinement: who else lists n, and how.
        seen_by: dict[NodeId, list[str]] = {n: [] for n in ids}
        for p, k in zip(world.procs, keep, strict=True):
            if not k:
                continue
            view = p.local.view
            for m in _members(view):
                if m != p.ident:
                    seen_by[m].append(repr((key0[p.ident], _listing(view, m))))
        key1 = {n: repr((key0[n], sorted(seen_by[n]))) for n in ids}
        order = sorted(ids, key=lambda n: (key1[n], n))
        groups: list[list[NodeId]] = []
        for _, grp in itertools.groupby(order, key=lambda n: key1[n]):
            groups.append(list(grp))
        # Ties among identities other processes mention must be broken exactly.
        mentioned = {n for n in ids if seen_by[n]}
        tied = [g for g in groups if len(g) > 1 and any(n in mentioned for n in g)]
        if not tied:
            return _encode(world, store, order, keep)
        # A tied group whose swap and rotation leave the encoding unchanged is a group of
        # automorphisms (the swap and the rotation generate every order), so any order of
        # it gives the same encoding; only the other tied groups need the exhaustive step.
        base_enc = _encode(world, store, order, keep)
        base_text = repr(base_enc)
        position = {n: i for i, n in enumerate(order)}
        hard: list[list[NodeId]] = []
        for g in tied:
            gens = [[g[1], g[0], *g[2:]]]
            if len(g) > 2:
                gens.append([*g[1:], g[0]])
            for perm in gens:
                candidate = list(order)
                for n, m in zip(g, perm, strict=True):
                    candidate[position[n]] = m
                if repr(_encode(world, store, candidate, keep)) != base_text:
                    hard.append(g)
                    break
        if not hard:
            return base_enc
        count = math.prod(math.factorial(len(g)) for g in hard)
        if count > MAX_TIE_PERMUTATIONS:
            self.fallbacks += 1
            return base_enc
        self.permuted += 1
        best, best_text = base_enc, base_text
        for choice in itertools.product(*(itertools.permutations(g) for g in hard)):
            candidate = list(order)
            for g, order_g in zip(hard, choice, strict=True):
                for n, m in zip(g, order_g, strict=True):
                    candidate[position[n]] = m
            enc = _encode(world, store, candidate, keep)
            text = repr(enc)
            if text < best_text:
                best, best_text = enc, text
        return best


def _members(state: RendezvousState) -> set[NodeId]:
    out = {n for n, _ in state.participants}
    out.update(state.wait_list)
    out.update(state.redundancy_list)
    out.update(n for n, _ in state.last_heartbeats)
    return out


def _collect(state: RendezvousState, into: set[NodeId]) -> None:
    into.update(_members(state))


def _encode(
    world: World, store: RendezvousState | None, order: list[NodeId], keep: list[bool]
) -> tuple[object, ...]:
    lab: dict[NodeId, Label] = {n: f"{i:04d}" for i, n in enumerate(order)}
    memo: dict[int, tuple[object, ...]] = {}

    def state_enc(state: RendezvousState) -> tuple[object, ...]:
        got = memo.get(id(state))
        if got is None:
            got = _state_enc(state, lab, False)
            memo[id(state)] = got
        return got

    store_enc = None if store is None else state_enc(store)
    encs = (_proc_enc(p, lab, False, k, state_enc) for p, k in zip(world.procs, keep, strict=True))
    procs = tuple(sorted(encs, key=repr))
    return (store_enc, procs, world.used, world.closes)
