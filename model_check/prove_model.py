"""The symbolic model of ``spec`` that :mod:`model_check.prove` proves things about.

Nodes as an uninterpreted sort, states and settings as z3 terms, the tables' atoms, every
effect of ``spec/effects.py``, sanitize, and the state and step invariants of
``spec/invariants.py``, each written next to its Python definition's meaning (see
``docs/proofs.md``, *How the model works*); ``tests/test_prove.py`` checks each against
``spec`` on concrete states, so the model cannot drift from the code. The obligations,
the search for counterexamples and the command line are in :mod:`model_check.prove`;
the answer proofs in :mod:`model_check.prove_answers`. The verdicts and the shape of an
obligation (``Outcome``, ``Setup``, ``Symbols``) and the list of protocols known to break
the answer properties (``UNSAFE_ANSWERS``) are here too, so both of those modules build on
this one and neither imports the other at run time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from spec import effects as E
from spec.settings import Settings
from spec.state import NodeId, RendezvousState
from spec.tables import Atom, Context, Table

Z = Any
"""A z3 expression (z3 ships no type stubs)."""


def load_z3() -> Any:
    """Import z3, or explain how to install it."""
    try:
        import z3
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit(
            "the proofs need z3: install it with `python3 -m pip install -e '.[prove]'` "
            f"(or `python3 -m pip install z3-solver`) ({exc})"
        ) from None
    return z3


# ---------------------------------------------------------------------------------------
# The symbolic world: nodes, their order, cardinalities
# ---------------------------------------------------------------------------------------
class World:
    """The node sort and the helpers effects need.

    Proof mode (``nodes is None``): nodes are an uninterpreted sort, quantifiers range
    over all of it. Finite mode (``nodes`` given): exactly those nodes exist, in that
    (sorted) order; quantifiers expand to conjunctions and cardinalities are exact sums.
    Finite mode is how the tests compare the model with the Python code.

    Effects add the facts they rely on to :attr:`side` (fresh choices with their
    defining constraints); obligations assume them.
    """

    def __init__(self, z3: Any, nodes: Sequence[NodeId] | None = None) -> None:
        self.z3 = z3
        self.Node = z3.DeclareSort("Node")
        self.lt = z3.Function("lt", self.Node, self.Node, z3.BoolSort())
        self.side: list[Z] = []
        self.axioms: list[Z] = []
        self._fresh = 0
        self.finite = nodes is not None
        self.ids: tuple[NodeId, ...] = tuple(nodes or ())
        self.consts: tuple[Z, ...] = tuple(
            z3.Const(f"node{i}", self.Node) for i in range(len(self.ids))
        )
        if self.finite:
            if list(self.ids) != sorted(set(self.ids)):
                raise ValueError("finite-mode nodes must be sorted and distinct")
            if len(self.consts) > 1:
                self.axioms.append(z3.Distinct(*self.consts))
            for (i, a), (j, b) in itertools.product(enumerate(self.consts), repeat=2):
                self.axioms.append(self.lt(a, b) == z3.BoolVal(i < j))
        else:
            self.axioms.append(self.forall(lambda x: z3.Not(self.lt(x, x))))
            self.axioms.append(
                self.forall3(
                    lambda x, y, w: z3.Implies(z3.And(self.lt(x, y), self.lt(y, w)), self.lt(x, w))
                )
            )
            self.axioms.append(
                self.forall2(lambda x, y: z3.Or(x == y, self.lt(x, y), self.lt(y, x)))
            )

    # -- naming and quantifiers ------------------------------------------------------
    def fresh(self, name: str, sort: Z) -> Z:
        self._fresh += 1
        return self.z3.Const(f"{name}!{self._fresh}", sort)

    def node_array(self, name: str, value_sort: Z) -> Z:
        return self.fresh(name, self.z3.ArraySort(self.Node, value_sort))

    def forall(self, body: Callable[[Z], Z]) -> Z:
        if self.finite:
            return self.z3.And(*[body(c) for c in self.consts]) if self.consts else True
        x = self.fresh("x", self.Node)
        return self.z3.ForAll([x], body(x))

    def forall2(self, body: Callable[[Z, Z], Z]) -> Z:
        if self.finite:
            terms = [body(a, b) for a, b in itertools.product(self.consts, repeat=2)]
            return self.z3.And(*terms) if terms else True
        x, y = self.fresh("x", self.Node), self.fresh("y", self.Node)
        return self.z3.ForAll([x, y], body(x, y))

    def forall3(self, body: Callable[[Z, Z, Z], Z]) -> Z:
        if self.finite:
            terms = [body(a, b, c) for a, b, c in itertools.product(self.consts, repeat=3)]
            return self.z3.And(*terms) if terms else True
        x, y, w = (self.fresh(n, self.Node) for n in "xyw")
        return self.z3.ForAll([x, y, w], body(x, y, w))

    def set_of(self, body: Callable[[Z], Z]) -> Z:
        """The set ``{x | body(x)}`` as an array."""
        return self.array_of(body)

    def array_of(self, body: Callable[[Z], Z]) -> Z:
        """The array ``x -> body(x)`` over nodes."""
        x = self.fresh("x", self.Node)
        return self.z3.Lambda([x], body(x))

    # -- cardinality -----------------------------------------------------------------
    def card_facts(self, members: Z, n: Z) -> list[Z]:
        """Facts every finite set and its size obey (``n == len(members)``)."""
        z3 = self.z3
        if self.finite:
            return [n == self._sum(members)]
        witness = self.fresh("member", self.Node)
        return [
            n >= 0,
            self.forall(lambda x: z3.Implies(members[x], n >= 1)),
            z3.Implies(n >= 1, members[witness]),
            z3.Implies(
                n == 1,
                self.forall2(lambda x, y: z3.Implies(z3.And(members[x], members[y]), x == y)),
            ),
        ]

    def subset_size(self, subset: Z, superset: Z, n_superset: Z) -> Z:
        """``len(subset)`` for ``subset <= superset`` of size ``n_superset``."""
        z3 = self.z3
        if self.finite:
            return self._sum(subset)
        k = self.fresh("removed", z3.IntSort())
        outside = self.fresh("kept", self.Node)
        self.side += [
            k >= 0,
            k <= n_superset,
            self.forall(lambda x: z3.Implies(subset[x], k >= 1)),
            z3.Implies(k < n_superset, z3.And(superset[outside], z3.Not(subset[outside]))),
        ]
        self.side += self.card_facts(subset, k)
        return k

    def _sum(self, members: Z) -> Z:
        z3 = self.z3
        return z3.Sum(*[z3.If(members[c], 1, 0) for c in self.consts]) if self.consts else 0

    def positions(self, members: Z, n: Z) -> Z:
        """Each member's position in sorted order (0-based), as a fresh array."""
        z3 = self.z3
        pos = self.node_array("pos", z3.IntSort())
        self.side.append(
            self.forall(lambda x: z3.Implies(members[x], z3.And(pos[x] >= 0, pos[x] < n)))
        )
        self.side.append(
            self.forall2(
                lambda x, y: z3.Implies(
                    z3.And(members[x], members[y], self.lt(x, y)), pos[x] < pos[y]
                )
            )
        )
        return pos


# ---------------------------------------------------------------------------------------
# Symbolic states, settings and contexts
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SymState:
    """A :class:`~spec.state.RendezvousState` over symbolic sets."""

    round: Z
    complete: Z
    closed: Z
    has_deadline: Z
    deadline: Z
    participants: Z
    """Node -> Bool."""
    n_participants: Z
    """len(participants)."""
    ranks: Z
    """Node -> Int; meaningful on participants."""
    waiting: Z
    redundant: Z
    beating: Z
    """Node -> Bool: has a heartbeat."""
    beats: Z
    """Node -> Int: the heartbeat; meaningful where ``beating``."""
    epoch: Z
    """Which job under the run id (``RendezvousState.epoch``)."""

    def evolve(self, **changes: Z) -> SymState:
        return replace(self, **changes)


def fresh_state(w: World, name: str) -> SymState:
    z3 = w.z3
    return SymState(
        round=w.fresh(f"{name}.round", z3.IntSort()),
        complete=w.fresh(f"{name}.complete", z3.BoolSort()),
        closed=w.fresh(f"{name}.closed", z3.BoolSort()),
        has_deadline=w.fresh(f"{name}.has_deadline", z3.BoolSort()),
        deadline=w.fresh(f"{name}.deadline", z3.IntSort()),
        participants=w.node_array(f"{name}.participants", z3.BoolSort()),
        n_participants=w.fresh(f"{name}.n_participants", z3.IntSort()),
        ranks=w.node_array(f"{name}.ranks", z3.IntSort()),
        waiting=w.node_array(f"{name}.waiting", z3.BoolSort()),
        redundant=w.node_array(f"{name}.redundant", z3.BoolSort()),
        beating=w.node_array(f"{name}.beating", z3.BoolSort()),
        beats=w.node_array(f"{name}.beats", z3.IntSort()),
        epoch=w.fresh(f"{name}.epoch", z3.IntSort()),
    )


def state_facts(w: World, s: SymState) -> list[Z]:
    """What every state satisfies by construction (the count is the set's size, the
    epoch is not negative)."""
    return [*w.card_facts(s.participants, s.n_participants), s.epoch >= 0]


def empty_state(w: World) -> SymState:
    z3 = w.z3
    no = z3.K(w.Node, z3.BoolVal(False))
    zero = z3.K(w.Node, z3.IntVal(0))
    return SymState(
        z3.IntVal(0), z3.BoolVal(False), z3.BoolVal(False), z3.BoolVal(False), z3.IntVal(0),
        no, z3.IntVal(0), zero, no, no, no, zero, z3.IntVal(0),
    )  # fmt: skip


def concrete_state(w: World, state: RendezvousState) -> SymState:
    """A concrete state in a finite-mode world holding (at least) its nodes."""
    z3 = w.z3
    index = {node: c for node, c in zip(w.ids, w.consts, strict=True)}

    def bools(nodes: Sequence[NodeId]) -> Z:
        arr = z3.K(w.Node, z3.BoolVal(False))
        for n in nodes:
            arr = z3.Store(arr, index[n], True)
        return arr

    def ints(pairs: Sequence[tuple[NodeId, int]]) -> Z:
        arr = z3.K(w.Node, z3.IntVal(0))
        for n, v in pairs:
            arr = z3.Store(arr, index[n], v)
        return arr

    return SymState(
        round=z3.IntVal(state.round),
        complete=z3.BoolVal(state.complete),
        closed=z3.BoolVal(state.closed),
        has_deadline=z3.BoolVal(state.deadline is not None),
        deadline=z3.IntVal(state.deadline or 0),
        participants=bools(state.participant_nodes()),
        n_participants=z3.IntVal(state.num_participants),
        ranks=ints(state.participants),
        waiting=bools(state.wait_list),
        redundant=bools(state.redundancy_list),
        beating=bools([n for n, _ in state.last_heartbeats]),
        beats=ints(state.last_heartbeats),
        epoch=z3.IntVal(state.epoch),
    )


@dataclass(frozen=True)
class SymSettings:
    min_nodes: Z
    max_nodes: Z
    join_timeout: Z
    last_call_timeout: Z
    keep_alive_interval: Z
    heartbeat_expiry: Z
    """``keep_alive_interval * keep_alive_max_attempt``: a free integer >= the interval in
    proofs (avoids non-linear arithmetic; only sanitize reads it)."""


def fresh_settings(w: World) -> tuple[SymSettings, list[Z]]:
    z3 = w.z3
    st = SymSettings(*(w.fresh(n, z3.IntSort()) for n in SymSettings.__dataclass_fields__))
    facts = [
        st.min_nodes >= 1,
        st.max_nodes >= st.min_nodes,
        st.join_timeout > 0,
        st.last_call_timeout > 0,
        st.keep_alive_interval > 0,
        st.heartbeat_expiry >= st.keep_alive_interval,
    ]
    return st, facts


def concrete_settings(w: World, settings: Settings) -> SymSettings:
    iv = w.z3.IntVal
    return SymSettings(
        iv(settings.min_nodes),
        iv(settings.max_nodes),
        iv(settings.join_timeout),
        iv(settings.last_call_timeout),
        iv(settings.keep_alive_interval),
        iv(settings.heartbeat_expiry),
    )


@dataclass(frozen=True)
class SymContext:
    """A :class:`~spec.tables.Context` over a symbolic state."""

    node: Z
    state: SymState
    settings: SymSettings
    mono_now: Z
    wall_now: Z
    op_deadline: Z
    rollback_window: Z
    last_call_age: Z | None = None
    """Local liveness clock only: how long this node has seen the last call."""
    announce_size: Z | None = None
    """Announcing variants only: the set size this node's announcement returned in the
    current round (0: it has not announced in this round)."""
    announce_age: Z | None = None
    """Announcing variants only: time since this node announced."""
    announce_before: Z | None = None
    """Announcing variants only: the size the announcement this one renewed returned (0:
    a first announcement)."""
    beat_age: Z | None = None
    """Heartbeats under keys: time since this node last beat (negative: never)."""
    watch_age: Z | None = None
    """Heartbeats under keys: time since this node last read its watched keys
    (negative: never)."""
    any_dead: Z | None = None
    """Heartbeats under keys: some watched node is dead by this node's clock."""
    job_offset: Z | None = None
    """``spec.tables.Context.job_offset`` (None: 0)."""


def _listed(c: SymContext) -> Z:
    s, me = c.state, c.node
    return s.participants[me] | s.waiting[me] | s.redundant[me]


def _beat_due(w: World, c: SymContext) -> Z:
    z3 = w.z3
    if c.beat_age is None:
        return _listed(c)
    return z3.And(_listed(c), z3.Or(c.beat_age < 0, c.beat_age >= c.settings.keep_alive_interval))


def _newcomer(w: World, c: SymContext) -> Z:
    return w.z3.BoolVal(False) if c.job_offset is None else c.job_offset < 0


def _later_job(w: World, c: SymContext) -> Z:
    return w.z3.BoolVal(False) if c.job_offset is None else c.job_offset > 0


def _vacant(w: World, c: SymContext) -> Z:
    z3, s = w.z3, c.state
    return w.forall(lambda x: z3.Not(z3.Or(s.participants[x], s.waiting[x], s.redundant[x])))


def _watch_due(w: World, c: SymContext) -> Z:
    z3 = w.z3
    member = z3.Or(
        z3.And(c.state.complete, _listed(c)),
        z3.And(c.state.closed, _newcomer(w, c), z3.Not(_listed(c))),
    )
    if c.watch_age is None:
        return member
    return z3.And(member, z3.Or(c.watch_age < 0, c.watch_age >= c.settings.keep_alive_interval))


def _age_or_none(num: Callable[[Z], int], age: Z | None) -> int | None:
    if age is None:
        return None
    value = num(age)
    return None if value < 0 else value


def _announced(w: World, c: SymContext) -> Z:
    if c.announce_size is None or c.announce_age is None:
        return w.z3.BoolVal(False)
    return w.z3.And(c.announce_size >= 1, c.announce_age <= c.settings.keep_alive_interval)


def _in_announcements(w: World, c: SymContext) -> Z:
    # Size 0 stands for "not announced" (the concrete context's None).
    if c.announce_size is None:
        return w.z3.BoolVal(False)
    return c.announce_size >= 1


def _fold_due(w: World, c: SymContext) -> Z:
    z3 = w.z3
    if c.announce_size is None or c.announce_age is None:
        return z3.BoolVal(False)
    size, st, n = c.announce_size, c.settings, c.state.n_participants
    before = z3.IntVal(0) if c.announce_before is None else c.announce_before
    first = before == 0
    return z3.And(
        _announced(w, c),
        z3.Or(
            z3.And(size >= st.max_nodes, z3.Or(first, before >= st.max_nodes)),
            z3.And(size >= st.min_nodes, n < st.min_nodes, z3.Or(first, before >= st.min_nodes)),
        ),
    )


def _last_call_over(w: World, c: SymContext) -> Z:
    if c.last_call_age is not None:
        return w.z3.And(c.state.has_deadline, c.last_call_age > c.settings.last_call_timeout)
    return w.z3.And(c.state.has_deadline, c.state.deadline < c.wall_now)


ATOM_FORMULAS: Mapping[Atom, Callable[[World, SymContext], Z]] = {
    Atom.CLOSED: lambda w, c: c.state.closed,
    Atom.COMPLETE: lambda w, c: c.state.complete,
    Atom.PARTICIPANT: lambda w, c: c.state.participants[c.node],
    Atom.WAITING: lambda w, c: c.state.waiting[c.node],
    Atom.REDUNDANT: lambda w, c: c.state.redundant[c.node],
    Atom.AT_MAX: lambda w, c: c.state.n_participants == c.settings.max_nodes,
    Atom.BELOW_MAX: lambda w, c: c.state.n_participants < c.settings.max_nodes,
    Atom.SIZE_IN_RANGE: lambda w, c: w.z3.And(
        c.settings.min_nodes <= c.state.n_participants,
        c.state.n_participants <= c.settings.max_nodes,
    ),
    Atom.LAST_CALL_OVER: _last_call_over,
    Atom.PAST_DEADLINE: lambda w, c: c.mono_now > c.op_deadline,
    Atom.IN_ROLLBACK_WINDOW: lambda w, c: c.mono_now <= c.op_deadline + c.rollback_window,
    Atom.HEARTBEAT_DUE: lambda w, c: w.z3.And(
        c.state.beating[c.node],
        c.state.beats[c.node] <= c.wall_now - c.settings.keep_alive_interval,
    ),
    Atom.ANNOUNCED: _announced,
    Atom.IN_ANNOUNCEMENTS: _in_announcements,
    Atom.FOLD_DUE: _fold_due,
    Atom.BEAT_DUE: _beat_due,
    Atom.WATCH_DUE: _watch_due,
    Atom.MONITORED_DEAD: lambda w, c: w.z3.BoolVal(False) if c.any_dead is None else c.any_dead,
    Atom.NEWCOMER: _newcomer,
    Atom.LATER_JOB: _later_job,
    Atom.VACANT: _vacant,
}
"""Each atom's definition (``spec.tables.ATOM_PREDICATES``) as a formula."""


def sym_atom(w: World, atom: Atom, c: SymContext) -> Z:
    try:
        formula = ATOM_FORMULAS[atom]
    except KeyError:
        raise ValueError(
            f"atom {atom.value} has no symbolic definition: add one to "
            "model_check.prove_model.ATOM_FORMULAS"
        ) from None
    return formula(w, c)


def guard(w: World, table: Table, index: int, c: SymContext) -> Z:
    lits = [
        sym_atom(w, lit.atom, c) if lit.positive else w.z3.Not(sym_atom(w, lit.atom, c))
        for lit in table.rows[index].when
    ]
    return w.z3.And(*lits) if lits else w.z3.BoolVal(True)


def selected(w: World, table: Table, index: int, c: SymContext) -> Z:
    """Row ``index`` is the first whose guard holds."""
    earlier = [w.z3.Not(guard(w, table, j, c)) for j in range(index)]
    return w.z3.And(guard(w, table, index, c), *earlier)


# ---------------------------------------------------------------------------------------
# Symbolic effects (mirroring spec/effects.py line by line)
# ---------------------------------------------------------------------------------------
SymEffect = Callable[[World, SymState, Z, SymSettings, Z], SymState]


def ite_state(w: World, cond: Z, then: SymState, other: SymState) -> SymState:
    z3 = w.z3
    return SymState(
        *(z3.If(cond, getattr(then, f), getattr(other, f)) for f in SymState.__dataclass_fields__)
    )


def s_epilogue(w: World, s: SymState, st: SymSettings) -> SymState:
    z3 = w.z3
    reopen = z3.And(s.complete, s.n_participants == 0)
    cancel = z3.And(z3.Not(s.complete), s.n_participants < st.min_nodes)
    return s.evolve(
        round=z3.If(reopen, s.round + 1, s.round),
        complete=z3.If(reopen, False, s.complete),
        has_deadline=z3.If(cancel, False, s.has_deadline),
    )


def s_keep_alive(w: World, s: SymState, me: Z, st: SymSettings, wall: Z) -> SymState:
    z3 = w.z3
    return s.evolve(beating=z3.Store(s.beating, me, True), beats=z3.Store(s.beats, me, wall))


def s_mark_complete(w: World, s: SymState, me: Z, st: SymSettings, wall: Z) -> SymState:
    ranks = w.positions(s.participants, s.n_participants)
    return s.evolve(complete=w.z3.BoolVal(True), has_deadline=w.z3.BoolVal(False), ranks=ranks)


def s_mark_complete_clearing_wait_list(
    w: World, s: SymState, me: Z, st: SymSettings, wall: Z
) -> SymState:
    """``spec.effects.mark_complete_clearing_wait_list``: complete, and drop the waiting
    nodes with their heartbeats."""
    z3 = w.z3
    done = s_mark_complete(w, s, me, st, wall)
    return done.evolve(
        waiting=w.set_of(lambda x: z3.BoolVal(False)),
        beating=w.set_of(lambda x: z3.And(done.beating[x], z3.Not(done.waiting[x]))),
    )


def _add(w: World, members: Z, n: Z, me: Z) -> tuple[Z, Z]:
    return w.z3.Store(members, me, True), w.z3.If(members[me], n, n + 1)


def _remove(w: World, members: Z, n: Z, me: Z) -> tuple[Z, Z]:
    return w.z3.Store(members, me, False), w.z3.If(members[me], n - 1, n)


def s_add_to_participants(w: World, s: SymState, me: Z, st: SymSettings, wall: Z) -> SymState:
    return _s_admit(w, s, me, st, wall, s_mark_complete)


def s_add_to_participants_clearing_wait_list(
    w: World, s: SymState, me: Z, st: SymSettings, wall: Z
) -> SymState:
    return _s_admit(w, s, me, st, wall, s_mark_complete_clearing_wait_list)


def _s_admit(
    w: World, s: SymState, me: Z, st: SymSettings, wall: Z, complete: SymEffect
) -> SymState:
    """``spec.effects._admit`` with the completion ``complete``."""
    z3 = w.z3
    members, n = _add(w, s.participants, s.n_participants, me)
    new = s.evolve(
        participants=members,
        n_participants=n,
        ranks=z3.Store(s.ranks, me, 0),
        waiting=z3.Store(s.waiting, me, False),
    )
    new = s_keep_alive(w, new, me, st, wall)
    at_min = new.n_participants == st.min_nodes
    new = new.evolve(
        has_deadline=z3.If(at_min, True, new.has_deadline),
        deadline=z3.If(at_min, wall + st.last_call_timeout, new.deadline),
    )
    return ite_state(w, new.n_participants == st.max_nodes, complete(w, new, me, st, wall), new)


def s_add_to_wait_list(w: World, s: SymState, me: Z, st: SymSettings, wall: Z) -> SymState:
    z3 = w.z3
    new = s.evolve(
        redundant=z3.Store(s.redundant, me, False), waiting=z3.Store(s.waiting, me, True)
    )
    return s_keep_alive(w, new, me, st, wall)


def s_add_to_redundancy_list(w: World, s: SymState, me: Z, st: SymSettings, wall: Z) -> SymState:
    new = s.evolve(redundant=w.z3.Store(s.redundant, me, True))
    return s_keep_alive(w, new, me, st, wall)


def _forget_heartbeat(w: World, s: SymState, me: Z) -> SymState:
    return s.evolve(beating=w.z3.Store(s.beating, me, False))


def s_remove_from_participants(w: World, s: SymState, me: Z, st: SymSettings, wall: Z) -> SymState:
    members, n = _remove(w, s.participants, s.n_participants, me)
    new = _forget_heartbeat(w, s.evolve(participants=members, n_participants=n), me)
    return s_epilogue(w, new, st)


def s_end_round(w: World, s: SymState) -> SymState:
    """``spec.effects.end_round``: the next round opens with the survivors waiting."""
    z3 = w.z3
    return s.evolve(
        round=s.round + 1,
        complete=z3.BoolVal(False),
        has_deadline=z3.BoolVal(False),
        participants=w.set_of(lambda x: z3.BoolVal(False)),
        n_participants=z3.IntVal(0),
        waiting=w.set_of(lambda x: z3.Or(s.waiting[x], s.participants[x])),
    )


def s_leave_ending_round(w: World, s: SymState, me: Z, st: SymSettings, wall: Z) -> SymState:
    """``spec.effects.leave_ending_round``: leave; a complete round left with members ends."""
    z3 = w.z3
    new = s_remove_from_participants(w, s, me, st, wall)
    ends = z3.And(s.complete, s.participants[me], new.complete)
    return ite_state(w, ends, s_end_round(w, new), new)


def s_remove_from_wait_list(w: World, s: SymState, me: Z, st: SymSettings, wall: Z) -> SymState:
    return _forget_heartbeat(w, s.evolve(waiting=w.z3.Store(s.waiting, me, False)), me)


def s_remove_from_redundancy_list(
    w: World, s: SymState, me: Z, st: SymSettings, wall: Z
) -> SymState:
    return _forget_heartbeat(w, s.evolve(redundant=w.z3.Store(s.redundant, me, False)), me)


def s_mark_closed(w: World, s: SymState, me: Z, st: SymSettings, wall: Z) -> SymState:
    return s.evolve(closed=w.z3.BoolVal(True))


def s_reopen(w: World, s: SymState, me: Z, st: SymSettings, wall: Z) -> SymState:
    """``spec.effects.reopen``: the next round, empty and not closed."""
    return empty_state(w).evolve(round=s.round + 1, epoch=s.epoch + 1)


SymFold = Callable[[World, SymState, Z, Z, SymSettings, Z], SymState]


def s_fold_announced(
    w: World, s: SymState, me: Z, announced: Z, st: SymSettings, wall: Z
) -> SymState:
    """``spec.effects.fold_announced``: admit the announced nodes that are neither
    participants nor redundant, in sorted order, while there is room below max."""
    return _s_fold(w, s, me, announced, st, wall, s_mark_complete)


def s_fold_announced_clearing_wait_list(
    w: World, s: SymState, me: Z, announced: Z, st: SymSettings, wall: Z
) -> SymState:
    """``spec.effects.fold_announced_clearing_wait_list``."""
    return _s_fold(w, s, me, announced, st, wall, s_mark_complete_clearing_wait_list)


def _s_fold(
    w: World,
    s: SymState,
    me: Z,
    announced: Z,
    st: SymSettings,
    wall: Z,
    complete: SymEffect,
) -> SymState:
    z3 = w.z3
    candidates = w.set_of(
        lambda x: z3.And(announced[x], z3.Not(s.participants[x]), z3.Not(s.redundant[x]))
    )
    m = w.fresh("candidates", z3.IntSort())
    w.side.extend(w.card_facts(candidates, m))
    order = w.positions(candidates, m)
    room = st.max_nodes - s.n_participants
    admitted = w.set_of(lambda x: z3.And(candidates[x], order[x] < room))
    k = z3.If(room <= 0, 0, z3.If(m < room, m, room))
    n = s.n_participants + k
    crossed = z3.And(s.n_participants < st.min_nodes, n >= st.min_nodes)
    new = s.evolve(
        participants=w.set_of(lambda x: z3.Or(s.participants[x], admitted[x])),
        n_participants=n,
        ranks=w.array_of(lambda x: z3.If(admitted[x], 0, s.ranks[x])),
        waiting=w.set_of(lambda x: z3.And(s.waiting[x], z3.Not(admitted[x]))),
        beating=w.set_of(lambda x: z3.Or(s.beating[x], admitted[x])),
        beats=w.array_of(lambda x: z3.If(admitted[x], wall, s.beats[x])),
        has_deadline=z3.If(crossed, True, s.has_deadline),
        deadline=z3.If(crossed, wall + st.last_call_timeout, s.deadline),
    )
    full = ite_state(w, n == st.max_nodes, complete(w, new, me, st, wall), new)
    return ite_state(w, z3.Or(s.complete, k == 0), s, full)


def s_fold_and_complete(
    w: World, s: SymState, me: Z, announced: Z, st: SymSettings, wall: Z
) -> SymState:
    """``spec.effects.fold_and_complete``: fold, then complete a viable open round."""
    return _s_fold_then_complete(w, s, me, announced, st, wall, s_mark_complete)


def s_fold_and_complete_clearing_wait_list(
    w: World, s: SymState, me: Z, announced: Z, st: SymSettings, wall: Z
) -> SymState:
    """``spec.effects.fold_and_complete_clearing_wait_list``."""
    return _s_fold_then_complete(w, s, me, announced, st, wall, s_mark_complete_clearing_wait_list)


def _s_fold_then_complete(
    w: World,
    s: SymState,
    me: Z,
    announced: Z,
    st: SymSettings,
    wall: Z,
    complete: SymEffect,
) -> SymState:
    z3 = w.z3
    new = _s_fold(w, s, me, announced, st, wall, complete)
    viable = z3.And(
        z3.Not(new.complete),
        st.min_nodes <= new.n_participants,
        new.n_participants <= st.max_nodes,
    )
    return ite_state(w, viable, complete(w, new, me, st, wall), new)


def dead_by_wall(w: World, s: SymState, st: SymSettings, wall: Z) -> Z:
    """``spec.effects.expired_by_wall``: heartbeats older than the expiry at ``wall``."""
    z3 = w.z3
    limit = wall - st.heartbeat_expiry
    return w.set_of(lambda x: z3.And(s.beating[x], s.beats[x] < limit))


def s_prune(w: World, s: SymState, dead: Z, st: SymSettings) -> SymState:
    """``spec.effects.prune``: remove the ``dead`` nodes that have a heartbeat; run the
    epilogue if a participant was among them."""
    z3 = w.z3
    gone = w.set_of(lambda x: z3.And(s.beating[x], dead[x]))
    dead_members = w.set_of(lambda x: z3.And(s.participants[x], gone[x]))
    removed = w.subset_size(dead_members, s.participants, s.n_participants)

    def keep(arr: Z) -> Z:
        return w.set_of(lambda x: z3.And(arr[x], z3.Not(gone[x])))

    new = s.evolve(
        participants=keep(s.participants),
        n_participants=s.n_participants - removed,
        waiting=keep(s.waiting),
        redundant=keep(s.redundant),
        beating=keep(s.beating),
    )
    return ite_state(w, removed > 0, s_epilogue(w, new, st), new)


def s_sanitize(w: World, s: SymState, st: SymSettings, wall: Z) -> SymState:
    """``spec.effects.sanitize``: prune the nodes expired by the wall clock."""
    return s_prune(w, s, dead_by_wall(w, s, st, wall), st)


def s_prune_ending_broken_rounds(w: World, s: SymState, dead: Z, st: SymSettings) -> SymState:
    """``spec.effects.prune_ending_broken_rounds``: prune; if a complete round lost a
    participant and still has survivors, move them to the wait list of the next round."""
    z3 = w.z3
    after = s_prune(w, s, dead, st)
    dead_members = w.set_of(lambda x: z3.And(s.participants[x], s.beating[x], dead[x]))
    lost = w.subset_size(dead_members, s.participants, s.n_participants)
    broken = z3.And(lost > 0, s.complete, after.complete, after.n_participants > 0)
    return ite_state(w, broken, s_end_round(w, after), after)


SYMBOLIC_FOLDS: Mapping[E.Fold, SymFold] = {
    E.fold_announced: s_fold_announced,
    E.fold_and_complete: s_fold_and_complete,
    E.fold_announced_clearing_wait_list: s_fold_announced_clearing_wait_list,
    E.fold_and_complete_clearing_wait_list: s_fold_and_complete_clearing_wait_list,
}
"""The symbolic model of each Python fold, keyed by the Python function."""

SymPruner = Callable[[World, SymState, Z, SymSettings], SymState]

SYMBOLIC_PRUNERS: Mapping[Callable[..., E.Sanitized], SymPruner] = {
    E.prune: s_prune,
    E.prune_ending_broken_rounds: s_prune_ending_broken_rounds,
}
"""The symbolic model of each variant's prune, keyed by the Python function."""


SYMBOLIC_EFFECTS: Mapping[E.Effect, SymEffect] = {
    E.keep_alive: s_keep_alive,
    E.add_to_participants: s_add_to_participants,
    E.add_to_wait_list: s_add_to_wait_list,
    E.add_to_redundancy_list: s_add_to_redundancy_list,
    E.remove_from_participants: s_remove_from_participants,
    E.remove_from_wait_list: s_remove_from_wait_list,
    E.remove_from_redundancy_list: s_remove_from_redundancy_list,
    E.mark_complete: s_mark_complete,
    E.mark_closed: s_mark_closed,
    E.reopen: s_reopen,
    E.leave_ending_round: s_leave_ending_round,
    E.mark_complete_clearing_wait_list: s_mark_complete_clearing_wait_list,
    E.add_to_participants_clearing_wait_list: s_add_to_participants_clearing_wait_list,
}
"""The symbolic model of each Python effect, keyed by the Python function."""


# ---------------------------------------------------------------------------------------
# Symbolic invariants (mirroring spec/invariants.py)
# ---------------------------------------------------------------------------------------
SymStateInv = Callable[[World, SymState, SymSettings], Z]
SymStepInv = Callable[[World, SymState, SymState, SymSettings], Z]


def _ranks_distinct_sorted(w: World, s: SymState) -> Z:
    z3 = w.z3
    p, r = s.participants, s.ranks
    return w.forall2(
        lambda x, y: z3.Implies(
            z3.And(p[x], p[y], x != y),
            z3.And(r[x] != r[y], z3.Implies(w.lt(x, y), r[x] < r[y])),
        )
    )


def inv_lists_disjoint(w: World, s: SymState, st: SymSettings) -> Z:
    z3 = w.z3
    p, q, r = s.participants, s.waiting, s.redundant
    return w.forall(
        lambda x: z3.Not(z3.Or(z3.And(p[x], q[x]), z3.And(p[x], r[x]), z3.And(q[x], r[x])))
    )


def inv_participants_within_max(w: World, s: SymState, st: SymSettings) -> Z:
    return s.n_participants <= st.max_nodes


def inv_complete_ranks_distinct(w: World, s: SymState, st: SymSettings) -> Z:
    return w.z3.Implies(s.complete, _ranks_distinct_sorted(w, s))


def inv_listed_nodes_have_heartbeats(w: World, s: SymState, st: SymSettings) -> Z:
    z3 = w.z3
    return w.forall(
        lambda x: z3.Implies(z3.Or(s.participants[x], s.waiting[x], s.redundant[x]), s.beating[x])
    )


def inv_open_round_has_no_ranks(w: World, s: SymState, st: SymSettings) -> Z:
    z3 = w.z3
    return z3.Implies(
        z3.Not(s.complete),
        w.forall(lambda x: z3.Implies(s.participants[x], s.ranks[x] == 0)),
    )


def inv_open_round_below_max(w: World, s: SymState, st: SymSettings) -> Z:
    return w.z3.Implies(w.z3.Not(s.complete), s.n_participants < st.max_nodes)


def step_closed_reopens_empty(w: World, b: SymState, a: SymState, st: SymSettings) -> Z:
    z3 = w.z3
    nobody = w.forall(
        lambda x: z3.Not(z3.Or(a.participants[x], a.waiting[x], a.redundant[x], a.beating[x]))
    )
    fresh = z3.And(
        a.round > b.round,
        z3.Not(a.complete),
        z3.Not(a.has_deadline),
        a.n_participants == 0,
        nobody,
    )
    reopened = z3.And(b.closed, z3.Not(a.closed))
    return z3.And(
        z3.Implies(reopened, z3.And(fresh, a.epoch == b.epoch + 1)),
        z3.Implies(z3.Not(reopened), a.epoch == b.epoch),
    )


def step_round_never_decreases(w: World, b: SymState, a: SymState, st: SymSettings) -> Z:
    return a.round >= b.round


def step_completion_assigns_ranks(w: World, b: SymState, a: SymState, st: SymSettings) -> Z:
    z3 = w.z3
    completed = z3.And(a.complete, z3.Or(z3.Not(b.complete), a.round != b.round))
    n = a.n_participants
    in_range = w.forall(
        lambda x: z3.Implies(a.participants[x], z3.And(a.ranks[x] >= 0, a.ranks[x] < n))
    )
    # Distinct ranks in [0, n) for n members are exactly 0..n-1.
    return z3.Implies(
        completed,
        z3.And(
            in_range,
            _ranks_distinct_sorted(w, a),
            st.min_nodes <= n,
            n <= st.max_nodes,
        ),
    )


def step_complete_membership_frozen(w: World, b: SymState, a: SymState, st: SymSettings) -> Z:
    z3 = w.z3
    same_round = z3.And(b.complete, a.complete, a.round == b.round)
    only_leave = w.forall(
        lambda x: z3.Implies(a.participants[x], z3.And(b.participants[x], a.ranks[x] == b.ranks[x]))
    )
    return z3.Implies(same_round, only_leave)


def step_complete_round_intact(w: World, b: SymState, a: SymState, st: SymSettings) -> Z:
    """The auxiliary step lemma :data:`AUX_STEP`, which the answer proofs rest on: a
    complete round keeps every member and rank until its round number changes or the run
    closes (a member that leaves or dies ends the round); nobody returns from a closed run."""
    z3 = w.z3
    same = w.forall(
        lambda x: z3.And(
            a.participants[x] == b.participants[x],
            z3.Implies(b.participants[x], a.ranks[x] == b.ranks[x]),
        )
    )
    kept = z3.And(a.complete, a.n_participants == b.n_participants, same)
    return z3.Implies(z3.And(b.complete, a.round == b.round, z3.Not(a.closed)), kept)


def intact_holds(before: RendezvousState, after: RendezvousState) -> bool:
    """:data:`AUX_STEP` on concrete states (for replays)."""
    if not before.complete or after.round != before.round or after.closed:
        return True
    return after.complete and after.participants == before.participants


SYMBOLIC_STATE_INVARIANTS: Mapping[str, SymStateInv] = {
    "lists_disjoint": inv_lists_disjoint,
    "participants_within_max": inv_participants_within_max,
    "complete_ranks_distinct": inv_complete_ranks_distinct,
    "listed_nodes_have_heartbeats": inv_listed_nodes_have_heartbeats,
    "open_round_has_no_ranks": inv_open_round_has_no_ranks,
}
"""Each state invariant of spec/invariants.py, by name."""

SYMBOLIC_STEP_INVARIANTS: Mapping[str, SymStepInv] = {
    "closed_reopens_empty": step_closed_reopens_empty,
    "round_never_decreases": step_round_never_decreases,
    "completion_assigns_ranks": step_completion_assigns_ranks,
    "complete_membership_frozen": step_complete_membership_frozen,
}
"""Each step invariant of spec/invariants.py, by name."""


# ---------------------------------------------------------------------------------------
# The shape of obligations and their verdicts (shared by the table and answer proofs)
# ---------------------------------------------------------------------------------------
UNSAFE_ANSWERS: Mapping[str, str] = {
    "upstream": (
        "documented in docs/findings.md (finding 6, issue 22's failure 1): a member that "
        "leaves a complete round "
        "(or is pruned from it) leaves it complete with fewer members, so a paused member "
        "returns the same round with a smaller world size"
    ),
    "torch-2.13": (
        "as upstream (docs/findings.md, finding 6): a complete round loses members without "
        "ending, so two members of one round can return different world sizes"
    ),
}
"""Variants known not to guarantee what next_rendezvous returns, and why. Their failing
answer obligations (and ``complete_round_intact``) are reported as ``refuted``, with the
counterexample; they do not fail the run, but a listed variant whose answer obligations
all hold does (the list is then out of date)."""


@dataclass
class Outcome:
    """One obligation's verdict."""

    name: str
    verdict: str
    """``holds``, ``FAILS`` or ``UNKNOWN``."""
    seconds: float
    detail: list[str] = field(default_factory=list)
    """Counterexample or explanation lines (empty when it holds)."""

    @property
    def holds(self) -> bool:
        return self.verdict == "holds"

    @property
    def failed(self) -> bool:
        """Fails the run: ``FAILS`` or ``UNKNOWN`` (not a documented ``refuted``)."""
        return self.verdict in ("FAILS", "UNKNOWN")


@dataclass(frozen=True)
class Symbols:
    """Every symbolic value of one obligation, for printing a counterexample."""

    before: SymState
    after: SymState | None
    settings: SymSettings
    me: Z | None = None
    clocks: Mapping[str, Z] = field(default_factory=dict)
    atoms: Mapping[str, Z] = field(default_factory=dict)
    views: Mapping[str, SymState] = field(default_factory=dict)
    """More states to print, by label (the answer proofs: views, completion records)."""
    values: Mapping[str, Z] = field(default_factory=dict)
    """More values to print, by label (the answer proofs: the answers)."""


@dataclass(frozen=True)
class Concrete:
    """A finite-mode model read back as spec values."""

    before: RendezvousState
    settings: Settings
    node: NodeId | None
    context: Context | None
    wall_now: int


Replay = Callable[[Concrete], list[str]]
"""Runs the Python spec on a concrete counterexample and says what it does."""


@dataclass(frozen=True)
class Setup:
    """Hypotheses and goals of a group of obligations, built in one world."""

    world: World
    hypotheses: list[Z]
    goals: dict[str, Z]
    symbols: Symbols
    replay: Replay | None = None
