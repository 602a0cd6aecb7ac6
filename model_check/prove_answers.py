"""What ``next_rendezvous`` returns, proven with z3 for any number of nodes.

The obligations of :mod:`model_check.prove` are about the shared state alone. A training
job depends on the nodes' *answers*: everyone who returns for a round gets the same world
size and a distinct rank in ``0..W-1``, and only members return. This module proves that
for the whole system, with nodes an uninterpreted sort (no bound on their number):

- the **store** holds one state ``S``;
- each node has a **view**: the state its decisions read. Either it is *derived* (the
  variant's prune of a state the store held: a read, or the reply to its own successful
  compare-and-set), or it is not (the node applied an effect it has not written yet, lost
  a reply, crashed, restarted, or its store was down);
- each node has a **ghost answer**: the round, rank and world size its last
  ``next_rendezvous`` returned;
- a **ghost completion record**: for each round number that ever completed, the members,
  ranks and world size it completed with (arrays indexed by the round).

Every fault of the model checker is a transition here: a crash or a restart with a new
identity (the node's record starts afresh), a lost reply or a store outage (the view is
no longer derived; a write may or may not have landed), pauses and clock skew (no
obligation depends on time: the prune takes any set of expired nodes for local-clock
variants and any wall clock otherwise).

The invariant is a conjunction of a global part (store and record) and one part per node
(its view and answer). A transition changes the store and *one* node's record, so it is
enough to prove it for an acting node ``k`` and one arbitrary other node ``n``
(a bystander): every other node is in ``n``'s position. The answer properties then follow
for any two nodes. A write is abstracted by what the table obligations of
:mod:`model_check.prove` established for every row of the variant (assume-guarantee):
the state invariants of the state written, and the step invariants from the writer's
pruned read to it, including the auxiliary lemma
:data:`~model_check.prove.AUX_STEP` (``complete_round_intact``). A lemma some row broke is
not assumed, so the answer obligations of such a variant fail where it really fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from model_check import prove_model
from model_check.prove_model import (
    Outcome,
    Setup,
    Symbols,
    SymSettings,
    SymState,
    World,
    Z,
    empty_state,
    fresh_state,
    selected,
    state_facts,
)
from model_check.world import (
    RANK_IN_RANGE,
    RANKS_DISTINCT,
    RETURN_IS_MEMBER,
    WORLD_SIZE_AGREEMENT,
    WORLD_SIZE_IN_RANGE,
)
from spec.vocabulary import Action, Op

if TYPE_CHECKING:
    from model_check.prove import Prover

__all__ = [
    "ANSWER_PROPERTIES",
    "RANKS_DISTINCT",
    "RANK_IN_RANGE",
    "RETURN_IS_MEMBER",
    "TRANSITIONS",
    "WORLD_SIZE_AGREEMENT",
    "WORLD_SIZE_IN_RANGE",
    "AnswerProofs",
    "Completions",
    "NodeRecord",
    "answer_obligations",
    "fresh_completions",
    "fresh_record",
    "global_invariants",
    "no_completions",
    "node_invariants",
    "record",
]

ANSWER_PROPERTIES = (
    RETURN_IS_MEMBER,
    WORLD_SIZE_IN_RANGE,
    RANK_IN_RANGE,
    WORLD_SIZE_AGREEMENT,
    RANKS_DISTINCT,
)
"""The answer properties, named as the model checker reports them."""

TRANSITIONS = ("read", "write", "finish", "adopt", "lose_view", "restart")
"""Every move a node makes, in the order the obligations are printed."""


@dataclass(frozen=True)
class Completions:
    """The ghost completion record: for each round number (an integer index), whether it
    completed and with which members, ranks and world size."""

    defined: Z
    """Int -> Bool."""
    members: Z
    """Int -> (Node -> Bool)."""
    size: Z
    """Int -> Int."""
    ranks: Z
    """Int -> (Node -> Int)."""


def fresh_completions(w: World, name: str) -> Completions:
    z3 = w.z3
    i, b = z3.IntSort(), z3.BoolSort()
    return Completions(
        w.fresh(f"{name}.defined", z3.ArraySort(i, b)),
        w.fresh(f"{name}.members", z3.ArraySort(i, z3.ArraySort(w.Node, b))),
        w.fresh(f"{name}.size", z3.ArraySort(i, i)),
        w.fresh(f"{name}.ranks", z3.ArraySort(i, z3.ArraySort(w.Node, i))),
    )


def no_completions(w: World) -> Completions:
    z3 = w.z3
    i = z3.IntSort()
    return Completions(
        z3.K(i, z3.BoolVal(False)),
        z3.K(i, z3.K(w.Node, z3.BoolVal(False))),
        z3.K(i, z3.IntVal(0)),
        z3.K(i, z3.K(w.Node, z3.IntVal(0))),
    )


def record(w: World, c: Completions, s: SymState) -> Completions:
    """``c`` after the store took ``s``: a complete state of an open run, of a round not
    yet recorded, is that round's completion. (Written pointwise, as lambdas, so that z3
    instantiates the quantified record invariants at the rounds they are asked about.)"""
    z3 = w.z3
    new = z3.And(s.complete, z3.Not(s.closed), z3.Not(c.defined[s.round]))
    r = w.fresh("r", z3.IntSort())
    here = z3.And(new, r == s.round)
    return Completions(
        z3.Lambda([r], z3.Or(c.defined[r], here)),
        z3.Lambda([r], z3.If(here, s.participants, c.members[r])),
        z3.Lambda([r], z3.If(here, s.n_participants, c.size[r])),
        z3.Lambda([r], z3.If(here, s.ranks, c.ranks[r])),
    )


def completion_state(w: World, c: Completions, r: Z) -> SymState:
    """Round ``r``'s completion as a state, for printing."""
    z3 = w.z3
    no, zero = z3.K(w.Node, z3.BoolVal(False)), z3.K(w.Node, z3.IntVal(0))
    return SymState(
        r, c.defined[r], z3.BoolVal(False), z3.BoolVal(False), z3.IntVal(0),
        c.members[r], c.size[r], c.ranks[r], no, no, no, zero, z3.IntVal(0),
    )  # fmt: skip


def matches(w: World, s: SymState, c: Completions, r: Z) -> Z:
    """Round ``r`` completed, and ``s`` has exactly its members, ranks and size."""
    z3 = w.z3
    same = w.forall(
        lambda x: z3.And(
            s.participants[x] == c.members[r][x],
            z3.Implies(s.participants[x], s.ranks[x] == c.ranks[r][x]),
        )
    )
    return z3.And(c.defined[r], s.n_participants == c.size[r], same)


@dataclass(frozen=True)
class NodeRecord:
    """One node's part of the system: its view and its ghost answer."""

    node: Z
    derived: Z
    """Bool: the view is the variant's prune of a state the store held."""
    view: SymState
    answered: Z
    """Bool: next_rendezvous returned (round, rank, world_size) below."""
    round: Z
    rank: Z
    world_size: Z

    def evolve(self, **changes: Z | SymState) -> NodeRecord:
        return replace(self, **changes)


def fresh_record(w: World, label: str, node: Z | None = None) -> NodeRecord:
    z3 = w.z3
    return NodeRecord(
        node=w.fresh(label, w.Node) if node is None else node,
        derived=w.fresh(f"{label}.derived", z3.BoolSort()),
        view=fresh_state(w, f"{label}.view"),
        answered=w.fresh(f"{label}.answered", z3.BoolSort()),
        round=w.fresh(f"{label}.round", z3.IntSort()),
        rank=w.fresh(f"{label}.rank", z3.IntSort()),
        world_size=w.fresh(f"{label}.world_size", z3.IntSort()),
    )


# ---------------------------------------------------------------------------------------
# The invariant: a global part and one part per node
# ---------------------------------------------------------------------------------------
def global_invariants(w: World, s: SymState, c: Completions, st: SymSettings) -> dict[str, Z]:
    z3 = w.z3
    d, m, k = c.defined, c.members, c.ranks

    def every_round(body: Callable[[Z], Z]) -> Z:
        r = w.fresh("r", z3.IntSort())
        return z3.ForAll([r], z3.Implies(d[r], body(r)))

    def sorted_ranks(r: Z) -> Z:
        return w.forall2(
            lambda x, y: z3.Implies(
                z3.And(m[r][x], m[r][y], x != y),
                z3.And(k[r][x] != k[r][y], z3.Implies(w.lt(x, y), k[r][x] < k[r][y])),
            )
        )

    def in_range(r: Z) -> Z:
        ranks = w.forall(lambda x: z3.Implies(m[r][x], z3.And(k[r][x] >= 0, k[r][x] < c.size[r])))
        return z3.And(st.min_nodes <= c.size[r], c.size[r] <= st.max_nodes, ranks)

    return {
        "store_matches_its_completion": z3.Implies(
            z3.And(s.complete, z3.Not(s.closed)), matches(w, s, c, s.round)
        ),
        "no_completion_ahead_of_store": every_round(lambda r: r <= s.round),
        "current_completion_is_complete": z3.Implies(
            z3.And(d[s.round], z3.Not(s.closed)), s.complete
        ),
        "completions_in_range": every_round(in_range),
        "completions_rank_in_sorted_order": every_round(sorted_ranks),
    }


def node_invariants(w: World, p: NodeRecord, c: Completions, label: str) -> dict[str, Z]:
    z3 = w.z3
    view = p.view
    r = p.round
    answer = z3.And(
        c.defined[r],
        c.members[r][p.node],
        p.world_size == c.size[r],
        p.rank == c.ranks[r][p.node],
    )
    return {
        f"{label}'s view_matches_its_completion": z3.Implies(
            z3.And(p.derived, view.complete, z3.Not(view.closed)),
            matches(w, view, c, view.round),
        ),
        f"{label}'s answer_matches_its_completion": z3.Implies(p.answered, answer),
    }


@dataclass(frozen=True)
class System:
    """The symbolic values of one answer obligation."""

    settings: SymSettings
    store: SymState
    completions: Completions
    actor: NodeRecord
    other: NodeRecord
    hypotheses: list[Z]


class AnswerProofs:
    """Builds the answer obligations of one variant over a :class:`Prover`."""

    def __init__(self, prover: Prover) -> None:
        self.prover = prover
        self.variant = prover.variant

    # -- what the table obligations established -------------------------------------------
    def state_invariants(self, w: World, s: SymState, st: SymSettings) -> list[Z]:
        return [
            f
            for name, f in self.prover.invariants(w, s, st).items()
            if name not in self.prover.broken
        ]

    def step_lemmas(self, w: World, b: SymState, a: SymState, st: SymSettings) -> list[Z]:
        lemmas = self.prover.step_invariants(w, b, a, st)
        return [f for name, f in lemmas.items() if name not in self.prover.broken]

    # -- the system before a move ---------------------------------------------------------
    def system(self, w: World) -> System:
        z3 = w.z3
        st, facts = self.prover._settings(w)
        s = fresh_state(w, "store")
        c = fresh_completions(w, "completed")
        k, n = fresh_record(w, "k"), fresh_record(w, "n")
        hypotheses = [
            *facts,
            *state_facts(w, s),
            *state_facts(w, k.view),
            *state_facts(w, n.view),
            k.node != n.node,
            *self.state_invariants(w, s, st),
            *global_invariants(w, s, c, st).values(),
            *node_invariants(w, k, c, "k").values(),
            *node_invariants(w, n, c, "n").values(),
        ]
        if w.finite:
            hypotheses += [z3.Or(*[p.node == e for e in w.consts]) for p in (k, n)]
        return System(st, s, c, k, n, hypotheses)

    def _setup(
        self,
        w: World,
        sys_: System,
        *,
        store: SymState,
        completions: Completions,
        actor: NodeRecord,
        extra: list[Z],
        goals: Mapping[str, Z] | None = None,
    ) -> Setup:
        """Hypotheses: the invariant before and ``extra``; goals: the invariant after."""
        st = sys_.settings
        if goals is None:
            goals = {
                **global_invariants(w, store, completions, st),
                **node_invariants(w, actor, completions, "k"),
                **node_invariants(w, sys_.other, completions, "n"),
            }
        symbols = Symbols(
            before=sys_.store,
            after=None if store is sys_.store else store,
            settings=st,
            me=sys_.actor.node,
            views={
                "k's view before": sys_.actor.view,
                "k's view after": actor.view,
                "n's view": sys_.other.view,
                "round of the store, as recorded": completion_state(
                    w, sys_.completions, sys_.store.round
                ),
                "round of k's view, as recorded": completion_state(
                    w, sys_.completions, sys_.actor.view.round
                ),
            },
            values={
                "k.derived": sys_.actor.derived,
                "k.answered": actor.answered,
                "k.round": actor.round,
                "k.rank": actor.rank,
                "k.world_size": actor.world_size,
                "n.derived": sys_.other.derived,
                "n.answered": sys_.other.answered,
                "n.round": sys_.other.round,
                "n.rank": sys_.other.rank,
                "n.world_size": sys_.other.world_size,
            },
        )
        return Setup(w, [*sys_.hypotheses, *extra, *w.side], dict(goals), symbols)

    # -- the moves ------------------------------------------------------------------------
    def setup_base(self, w: World) -> Setup:
        """Nobody has read or answered, the store is empty, nothing completed."""
        z3 = w.z3
        st, facts = self.prover._settings(w)
        s, c = empty_state(w), no_completions(w)
        goals: dict[str, Z] = dict(global_invariants(w, s, c, st))
        for label in ("k", "n"):
            p = fresh_record(w, label).evolve(derived=z3.BoolVal(False), answered=z3.BoolVal(False))
            goals.update(node_invariants(w, p, c, label))
        return Setup(w, facts, goals, Symbols(before=s, after=None, settings=st))

    def setup_move(self, w: World, move: str) -> Setup:
        z3 = w.z3
        sys_ = self.system(w)
        st, s, c, k = sys_.settings, sys_.store, sys_.completions, sys_.actor
        wall = w.fresh("wall_now", z3.IntSort())
        if move == "read":
            # k reads the store (or is served its own write back) and prunes what it
            # finds expired: its view is derived.
            view = self.prover.sanitized(w, s, st, wall)
            actor = k.evolve(derived=z3.BoolVal(True), view=view)
            extra = state_facts(w, view)
            return self._setup(w, sys_, store=s, completions=c, actor=actor, extra=extra)
        if move == "write":
            # k's compare-and-set lands: the token of its read is still the store's, so
            # it writes one row's action over its pruned read of S. What the table
            # obligations proved of every such write is all that is assumed of it.
            pruned = self.prover.sanitized(w, s, st, wall)
            written = fresh_state(w, "written")
            view = self.prover.sanitized(w, written, st, wall)
            after = record(w, c, written)
            extra = [
                *state_facts(w, pruned),
                *state_facts(w, written),
                *state_facts(w, view),
                *self.state_invariants(w, pruned, st),
                *self.state_invariants(w, written, st),
                *self.step_lemmas(w, s, pruned, st),
                *self.step_lemmas(w, pruned, written, st),
            ]
            actor = k.evolve(derived=z3.BoolVal(True), view=view)
            return self._setup(w, sys_, store=written, completions=after, actor=actor, extra=extra)
        if move == "finish":
            # A FINISH row of the join table: k's view is derived, complete, not closed,
            # and lists k (the finish obligations prove the rows require exactly that).
            v = k.view
            extra = [k.derived, v.complete, z3.Not(v.closed), v.participants[k.node]]
            actor = k.evolve(
                answered=z3.BoolVal(True),
                round=v.round,
                rank=v.ranks[k.node],
                world_size=v.n_participants,
            )
            return self._setup(w, sys_, store=s, completions=c, actor=actor, extra=extra)
        if move == "adopt":
            # A new operation starts from the newer view of the node's other machine (its
            # num_nodes_waiting() machine), which obeys the same invariant.
            j = fresh_record(w, "k2", k.node)
            extra = [*state_facts(w, j.view), *node_invariants(w, j, c, "k2").values()]
            actor = k.evolve(derived=j.derived, view=j.view)
            return self._setup(w, sys_, store=s, completions=c, actor=actor, extra=extra)
        if move == "lose_view":
            # An effect applied but not yet written, a lost compare-and-set reply, a
            # store outage, a timeout or a crash: the view is anything, not derived.
            actor = k.evolve(derived=z3.BoolVal(False), view=fresh_state(w, "k.lost"))
            return self._setup(w, sys_, store=s, completions=c, actor=actor, extra=[])
        if move == "restart":
            # A restart (with a new identity or not): the node starts with nothing.
            actor = k.evolve(derived=z3.BoolVal(False), answered=z3.BoolVal(False))
            return self._setup(w, sys_, store=s, completions=c, actor=actor, extra=[])
        raise ValueError(f"unknown move {move!r}")

    def setup_consequences(self, w: World) -> Setup:
        """The answer properties of any two nodes, from the invariant."""
        z3 = w.z3
        sys_ = self.system(w)
        s, n, m = sys_.store, sys_.actor, sys_.other
        st = sys_.settings
        same = z3.And(n.answered, m.answered, n.round == m.round)
        goals = {
            RETURN_IS_MEMBER: z3.Implies(
                n.answered,
                z3.And(
                    sys_.completions.members[n.round][n.node],
                    z3.Implies(
                        z3.And(s.complete, z3.Not(s.closed), s.round == n.round),
                        s.participants[n.node],
                    ),
                ),
            ),
            WORLD_SIZE_IN_RANGE: z3.Implies(
                n.answered, z3.And(st.min_nodes <= n.world_size, n.world_size <= st.max_nodes)
            ),
            RANK_IN_RANGE: z3.Implies(n.answered, z3.And(n.rank >= 0, n.rank < n.world_size)),
            WORLD_SIZE_AGREEMENT: z3.Implies(same, n.world_size == m.world_size),
            RANKS_DISTINCT: z3.Implies(same, n.rank != m.rank),
        }
        return self._setup(
            w, sys_, store=s, completions=sys_.completions, actor=n, extra=[], goals=goals
        )

    def setup_finish_row(self, w: World, index: int) -> Setup:
        table = self.variant.table(Op.JOIN)
        ctx, facts = self.prover._context(w)
        s = ctx.state
        goal = w.z3.And(s.complete, w.z3.Not(s.closed), s.participants[ctx.node])
        return Setup(
            w,
            [*facts, selected(w, table, index, ctx)],
            {"returns only a member of a complete round of an open run": goal},
            self.prover._symbols(w, ctx, None),
        )

    # -- the obligations ------------------------------------------------------------------
    def obligations(self) -> Iterator[Outcome]:
        name = self.variant.name
        check = self.prover.check_setup
        before = self.prover.refuted
        table = self.variant.table(Op.JOIN)
        for index, r in enumerate(table.rows):
            if r.then is Action.FINISH:
                yield from check(
                    f"{name}: {table.qualified(index)} (finish)",
                    lambda w, index=index: self.setup_finish_row(w, index),  # type: ignore[misc]
                    "a context where it returns",
                    answers=True,
                )
        yield from check(
            f"{name}: answers: the start", self.setup_base, "a violation", answers=True
        )
        for move in TRANSITIONS:
            build: Callable[[World], Setup] = lambda w, move=move: self.setup_move(w, move)  # type: ignore[misc]  # noqa: E731
            yield from check(
                f"{name}: answers: {move} keeps",
                build,
                "counterexample to induction",
                answers=True,
            )
        yield from check(
            f"{name}: answers imply",
            self.setup_consequences,
            "a counterexample",
            answers=True,
        )
        known = prove_model.UNSAFE_ANSWERS.get(name)
        if known and self.prover.refuted == before:
            yield Outcome(
                f"{name}: answers are refuted somewhere, as documented",
                "FAILS",
                0.0,
                [
                    f"model_check.prove_model.UNSAFE_ANSWERS says {name} breaks the answer "
                    f"properties ({known}), but every answer obligation holds: remove it "
                    "from that list if the protocol was fixed"
                ],
            )


def answer_obligations(prover: Prover) -> Iterator[Outcome]:
    """The answer obligations of ``prover``'s variant (run after its table obligations,
    whose verdicts decide which lemmas a write may assume)."""
    yield from AnswerProofs(prover).obligations()
