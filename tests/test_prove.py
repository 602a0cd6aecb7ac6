"""The z3 proofs: they hold for the real variants, they catch planted bugs, and the
symbolic model agrees with spec/ on concrete states (so it cannot drift silently)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hypothesis
import pytest
import z3
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from model_check import prove as P
from model_check import prove_model as M
from spec import effects as E
from spec.invariants import STATE_INVARIANTS, STEP_INVARIANTS
from spec.settings import Settings
from spec.state import Millis, NodeId, RendezvousState
from spec.tables import Atom, Context, row
from spec.variants import UPSTREAM, VARIANTS, Variant
from spec.vocabulary import Action, Op

EXAMPLES = 40
"""Per cross-check test: each example is a few small z3 queries."""
NODES = (NodeId("n", 0), NodeId("n", 1), NodeId("n", 2))


# ---------------------------------------------------------------------------------------
# Strategies: small arbitrary states (invariants may be violated on purpose)
# ---------------------------------------------------------------------------------------
@st.composite
def states(draw: st.DrawFn) -> RendezvousState:
    members: dict[NodeId, int] = {}
    waiting, redundant = [], []
    beats: dict[NodeId, Millis] = {}
    for node in NODES:
        if draw(st.booleans()):
            members[node] = draw(st.integers(0, 3))
        if draw(st.integers(0, 3)) == 0:
            waiting.append(node)
        if draw(st.integers(0, 3)) == 0:
            redundant.append(node)
        if draw(st.integers(0, 4)) > 0:
            beats[node] = draw(st.integers(0, 40))
    return RendezvousState.build(
        round=draw(st.integers(0, 2)),
        complete=draw(st.booleans()),
        closed=draw(st.booleans()),
        deadline=draw(st.none() | st.integers(0, 40)),
        participants=members,
        wait_list=waiting,
        redundancy_list=redundant,
        last_heartbeats=beats,
    )


@st.composite
def settings_(draw: st.DrawFn) -> Settings:
    low = draw(st.integers(1, 3))
    return Settings(
        min_nodes=low,
        max_nodes=draw(st.integers(low, 4)),
        last_call_timeout=draw(st.integers(1, 5)),
        keep_alive_interval=draw(st.integers(1, 5)),
        keep_alive_max_attempt=draw(st.integers(1, 3)),
    )


def world() -> M.World:
    return M.World(z3, NODES)


def node_const(w: M.World, node: NodeId) -> Any:
    return w.consts[w.ids.index(node)]


def forced(w: M.World, hypotheses: list[Any], pairs: list[tuple[Any, Any]]) -> None:
    """The hypotheses are satisfiable and force every expr to its expected value."""
    solver = z3.Solver()
    solver.add(*w.axioms, *hypotheses)
    assert solver.check() == z3.sat, "the symbolic model is inconsistent on a real state"
    solver.add(z3.Or(*[expr != value for expr, value in pairs]))
    if solver.check() == z3.sat:
        m = solver.model()
        wrong = [
            f"{expr} = {m.eval(expr, True)}, spec says {value}"
            for expr, value in pairs
            if not z3.is_true(m.eval(expr == value, True))
        ]
        raise AssertionError("symbolic model disagrees with spec: " + "; ".join(wrong[:5]))


def state_pairs(w: M.World, sym: M.SymState, real: RendezvousState) -> list[tuple[Any, Any]]:
    pairs: list[tuple[Any, Any]] = [
        (sym.round, real.round),
        (sym.complete, real.complete),
        (sym.closed, real.closed),
        (sym.has_deadline, real.deadline is not None),
        (sym.n_participants, real.num_participants),
    ]
    if real.deadline is not None:
        pairs.append((sym.deadline, real.deadline))
    for node in NODES:
        c = node_const(w, node)
        pairs += [
            (sym.participants[c], real.is_participant(node)),
            (sym.waiting[c], real.is_waiting(node)),
            (sym.redundant[c], real.is_redundant(node)),
            (sym.beating[c], real.heartbeat_of(node) is not None),
        ]
        rank = real.rank_of(node)
        if rank is not None:
            pairs.append((sym.ranks[c], rank))
        beat = real.heartbeat_of(node)
        if beat is not None:
            pairs.append((sym.beats[c], beat))
    return [(a, z3.BoolVal(b) if isinstance(b, bool) else z3.IntVal(b)) for a, b in pairs]


def check_effect_agrees(
    effect: E.Effect, model: M.SymEffect, state: RendezvousState, settings: Settings, who: int
) -> None:
    w = world()
    node = NODES[who]
    wall = 50
    after = model(
        w,
        M.concrete_state(w, state),
        node_const(w, node),
        M.concrete_settings(w, settings),
        z3.IntVal(wall),
    )
    real = effect(state, node, settings, wall)
    forced(w, list(w.side), state_pairs(w, after, real))


# ---------------------------------------------------------------------------------------
# Cross-checks: the symbolic model against spec/ on concrete states
# ---------------------------------------------------------------------------------------
def test_every_upstream_effect_has_a_symbolic_model() -> None:
    for variant in VARIANTS.values():
        for action, effect in variant.effects.items():
            assert effect in M.SYMBOLIC_EFFECTS, f"{variant.name}: {action.value}"


def test_every_named_invariant_has_an_encoding() -> None:
    assert P.coverage_problems() == []
    assert set(M.SYMBOLIC_STATE_INVARIANTS) == {i.name for i in STATE_INVARIANTS}
    assert set(M.SYMBOLIC_STEP_INVARIANTS) == {i.name for i in STEP_INVARIANTS}


MODELLED = sorted(M.SYMBOLIC_EFFECTS, key=lambda f: f.__name__)


@pytest.mark.parametrize("effect", MODELLED, ids=[f.__name__ for f in MODELLED])
@hypothesis_settings(max_examples=EXAMPLES)
@given(state=states(), settings=settings_(), who=st.integers(0, 2))
def test_symbolic_effect_equals_spec_effect(
    effect: E.Effect, state: RendezvousState, settings: Settings, who: int
) -> None:
    check_effect_agrees(effect, M.SYMBOLIC_EFFECTS[effect], state, settings, who)


FOLDS = sorted(M.SYMBOLIC_FOLDS, key=lambda f: f.__name__)


def test_every_variant_fold_has_a_symbolic_model() -> None:
    for variant in VARIANTS.values():
        for action, fold in variant.folds.items():
            assert fold in M.SYMBOLIC_FOLDS, f"{variant.name}: {action.value}"
    assert VARIANTS["scale"].folds  # the check above is not vacuous


def check_fold_agrees(
    fold: E.Fold,
    model: M.SymFold,
    state: RendezvousState,
    settings: Settings,
    who: int,
    announced: tuple[NodeId, ...],
) -> None:
    w = world()
    wall = 50
    members = w.set_of(lambda x: z3.Or(False, *[x == node_const(w, n) for n in announced]))
    after = model(
        w,
        M.concrete_state(w, state),
        node_const(w, NODES[who]),
        members,
        M.concrete_settings(w, settings),
        z3.IntVal(wall),
    )
    real = fold(state, NODES[who], announced, settings, wall)
    forced(w, list(w.side), state_pairs(w, after, real))


@pytest.mark.parametrize("fold", FOLDS, ids=[f.__name__ for f in FOLDS])
@hypothesis_settings(max_examples=EXAMPLES)
@given(
    state=states(),
    settings=settings_(),
    who=st.integers(0, 2),
    announced=st.sets(st.sampled_from(NODES)),
)
def test_symbolic_fold_equals_spec_fold(
    fold: E.Fold,
    state: RendezvousState,
    settings: Settings,
    who: int,
    announced: set[NodeId],
) -> None:
    hypothesis.assume(state.num_participants <= settings.max_nodes)
    check_fold_agrees(fold, M.SYMBOLIC_FOLDS[fold], state, settings, who, tuple(announced))


def test_a_planted_fold_that_ignores_max_nodes_fails_the_proof() -> None:
    def s_fold_everyone(
        w: M.World, s: M.SymState, me: Any, announced: Any, st_: M.SymSettings, wall: Any
    ) -> M.SymState:
        joined = w.set_of(lambda x: z3.Or(s.participants[x], announced[x]))
        n = w.fresh("n", z3.IntSort())
        w.side.extend(w.card_facts(joined, n))
        return s.evolve(participants=joined, n_participants=n)

    fold = VARIANTS["scale"].folds[Action.FOLD]
    outcomes = P.Prover(VARIANTS["scale"], fold_models={fold: s_fold_everyone})
    failed = {o.name for o in outcomes.prove() if not o.holds}
    fold_row = next(
        i for i, r in enumerate(VARIANTS["scale"].table(Op.JOIN).rows) if r.then is Action.FOLD
    )
    key = (
        f"scale: {VARIANTS['scale'].table(Op.JOIN).qualified(fold_row)} (fold_announcements) "
        "keeps participants_within_max"
    )
    assert key in failed, sorted(failed)


PRUNERS = sorted(M.SYMBOLIC_PRUNERS, key=lambda f: f.__name__)


def test_every_variant_prune_has_a_symbolic_model() -> None:
    for variant in VARIANTS.values():
        assert variant.prune in M.SYMBOLIC_PRUNERS, variant.name


@pytest.mark.parametrize("pruner", PRUNERS, ids=[f.__name__ for f in PRUNERS])
@hypothesis_settings(max_examples=EXAMPLES)
@given(state=states(), settings=settings_(), dead=st.sets(st.integers(0, 2)))
def test_symbolic_prune_equals_spec_prune(
    pruner: Callable[..., E.Sanitized],
    state: RendezvousState,
    settings: Settings,
    dead: set[int],
) -> None:
    w = world()
    nodes = tuple(NODES[i] for i in sorted(dead))
    dead_set = w.set_of(lambda x: z3.Or(False, *[x == node_const(w, n) for n in nodes]))
    model = M.SYMBOLIC_PRUNERS[pruner]
    after = model(w, M.concrete_state(w, state), dead_set, M.concrete_settings(w, settings))
    real = pruner(state, nodes, settings).state
    forced(w, list(w.side), state_pairs(w, after, real))


@hypothesis_settings(max_examples=EXAMPLES)
@given(state=states(), settings=settings_(), wall=st.integers(0, 60))
def test_symbolic_sanitize_equals_spec_sanitize(
    state: RendezvousState, settings: Settings, wall: int
) -> None:
    w = world()
    after = M.s_sanitize(w, M.concrete_state(w, state), M.concrete_settings(w, settings), wall)
    real = E.sanitize(state, settings, wall).state
    forced(w, list(w.side), state_pairs(w, after, real))


@hypothesis_settings(max_examples=EXAMPLES)
@given(
    state=states(),
    settings=settings_(),
    who=st.integers(0, 2),
    mono=st.integers(0, 30),
    wall=st.integers(0, 60),
    op_deadline=st.integers(0, 30),
    window=st.integers(0, 10),
)
def test_symbolic_atoms_equal_spec_atoms(
    state: RendezvousState,
    settings: Settings,
    who: int,
    mono: int,
    wall: int,
    op_deadline: int,
    window: int,
) -> None:
    w = world()
    ctx = Context(NODES[who], state, settings, mono, wall, op_deadline, window)
    sym = M.SymContext(
        node_const(w, NODES[who]),
        M.concrete_state(w, state),
        M.concrete_settings(w, settings),
        z3.IntVal(mono),
        z3.IntVal(wall),
        z3.IntVal(op_deadline),
        z3.IntVal(window),
    )
    pairs = [(M.sym_atom(w, a, sym), z3.BoolVal(a.holds(ctx))) for a in Atom]
    forced(w, [], pairs)


@hypothesis_settings(max_examples=EXAMPLES)
@given(before=states(), after=states(), settings=settings_())
def test_symbolic_invariants_equal_spec_invariants(
    before: RendezvousState, after: RendezvousState, settings: Settings
) -> None:
    w = world()
    b, a = M.concrete_state(w, before), M.concrete_state(w, after)
    s = M.concrete_settings(w, settings)
    pairs = [
        (M.SYMBOLIC_STATE_INVARIANTS[inv.name](w, b, s), inv.check(before, settings) is None)
        for inv in STATE_INVARIANTS
    ]
    pairs += [
        (
            M.SYMBOLIC_STEP_INVARIANTS[inv.name](w, b, a, s),
            inv.check(before, after, settings) is None,
        )
        for inv in STEP_INVARIANTS
    ]
    pairs.append((M.inv_open_round_below_max(w, b, s), P.aux_holds(before, settings)))
    forced(w, [], [(x, z3.BoolVal(v)) for x, v in pairs])


def test_invariant_cross_check_sees_completions() -> None:
    # The random pairs above rarely complete a round; pin the completion invariant on
    # real completions (a good one and a bad one).
    a, b = NODES[0], NODES[1]
    settings = Settings(min_nodes=2, max_nodes=2)
    before = RendezvousState.build(participants={a: 0}, last_heartbeats={a: 1, b: 1})
    good = E.add_to_participants(before, b, settings, 5)
    bad = good.evolve(participants={a: 0, b: 0})
    w = world()
    s = M.concrete_settings(w, settings)
    for after, ok in ((good, True), (bad, False)):
        sym = M.step_completion_assigns_ranks(
            w, M.concrete_state(w, before), M.concrete_state(w, after), s
        )
        forced(w, [], [(sym, z3.BoolVal(ok))])


# ---------------------------------------------------------------------------------------
# The proofs hold for every variant
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_obligation_holds_for_every_variant(name: str) -> None:
    outcomes = list(P.Prover(VARIANTS[name]).prove())
    # upstream's documented answer failures are "refuted" (tests/test_prove_answers.py).
    failed = [f"{o.verdict} {o.name}: {o.detail}" for o in outcomes if o.failed]
    assert not failed, "\n".join(failed)
    names = {o.name for o in outcomes}
    for op in Op:
        assert f"{name}: {op.value} table is total" in names
        for i in range(len(VARIANTS[name].table(op).rows)):
            qualified = VARIANTS[name].table(op).qualified(i)
            assert any(n.startswith(f"{name}: {qualified} (") for n in names)
    assert f"{name}: sanitize keeps lists_disjoint" in names
    join = VARIANTS[name].table(Op.JOIN)
    joins = (Action.ADD_TO_PARTICIPANTS, Action.FOLD)
    add = next(i for i, r in enumerate(join.rows) if r.then in joins)
    action = join.rows[add].then.value
    assert f"{name}: {join.qualified(add)} ({action}) keeps participants_within_max" in names


def test_main_exits_zero_and_names_each_obligation(capsys: pytest.CaptureFixture[str]) -> None:
    assert P.main(["--variant", "upstream", "--no-times"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("prove: protocols=upstream nodes=any")
    assert (
        "holds   upstream: exit.leave_round (remove_from_participants) keeps lists_disjoint" in out
    )
    assert out.rstrip().splitlines()[-1].endswith("fail=0 unknown=0")


def test_a_missing_atom_formula_fails_coverage(monkeypatch: pytest.MonkeyPatch) -> None:
    partial = {a: f for a, f in M.ATOM_FORMULAS.items() if a is not Atom.HEARTBEAT_DUE}
    monkeypatch.setattr(M, "ATOM_FORMULAS", partial)
    outcomes = list(P.prove_all([UPSTREAM]))
    assert [o.verdict for o in outcomes] == ["FAILS"]
    assert "atom heartbeat_due has no symbolic definition" in outcomes[0].detail[0]


def test_main_rejects_an_unknown_variant(capsys: pytest.CaptureFixture[str]) -> None:
    assert P.main(["--variant", "nope"]) == 2
    assert "unknown protocol nope" in capsys.readouterr().err
    assert P.main(["--protocol", "nope"]) == 2
    assert "unknown protocol nope" in capsys.readouterr().err


def test_protocol_and_variant_name_one_option(capsys: pytest.CaptureFixture[str]) -> None:
    # The checker, the handler and prove call it a protocol; --variant stays an alias.
    assert P.main(["--protocol", "torch-2.13", "--variant", "upstream", "--no-times"]) == 0
    assert capsys.readouterr().out.startswith("prove: protocols=torch-2.13,upstream ")


# ---------------------------------------------------------------------------------------
# Planted bugs: the proofs must fail with a counterexample that spec confirms
# ---------------------------------------------------------------------------------------
def failures(variant: Variant, models: dict[E.Effect, M.SymEffect] | None = None) -> dict[str, str]:
    out = P.Prover(variant, models=models).prove()
    return {o.name: "\n".join(o.detail) for o in out if not o.holds}


def test_table_without_the_complete_guard_breaks_participants_within_max(
    capsys: pytest.CaptureFixture[str],
) -> None:
    broken = UPSTREAM.derive(
        "no-complete-guard",
        description="join an open or complete round alike",
        rows={
            (Op.JOIN, 12): row("join_any_round", ~Atom.PARTICIPANT, then=Action.ADD_TO_PARTICIPANTS)
        },
    )
    assert P.report(P.Prover(broken).prove(), failures_only=True, times=False) == 1
    printed = capsys.readouterr().out
    assert printed.splitlines()[-1].startswith("obligations=")
    assert " fail=0 " not in printed
    failed = failures(broken)
    name = (
        "no-complete-guard: join.join_any_round (add_to_participants) keeps participants_within_max"
    )
    assert name in failed
    detail = failed[name]
    assert "counterexample to induction" in detail
    assert "before: " in detail and "after: " in detail
    assert "spec confirms: participants_within_max" in detail


def test_table_without_a_catch_all_is_not_total() -> None:
    broken = UPSTREAM.derive("gap", description="no default", rows={(Op.JOIN, 14): None})
    failed = failures(broken)
    assert "spec confirms: NoRowMatches" in failed["gap: join table is total"]


def test_a_shadowed_row_is_dead() -> None:
    shadow = row("shadow", Atom.CLOSED, then=Action.ERROR_CLOSED)
    broken = UPSTREAM.derive("shadow", description="x", insert={(Op.JOIN, 0): shadow})
    # An upstream variant also fails upstream's answer obligations (it is not the named
    # upstream, so they are failures, not documented refutations): leave those aside.
    failed = {
        name: detail
        for name, detail in failures(broken).items()
        if "answers" not in name and P.AUX_STEP not in name
    }
    # The new row 0 shadows the old rows 0 and 1 (now 1 and 2); nothing else fails.
    assert sorted(failed) == [
        "shadow: join.closed (error_closed) is live",
        "shadow: join.closed_while_redundant (error_graceful_exit) is live",
    ]
    assert all("dead row" in detail for detail in failed.values())


# Broken effects, each with its symbolic model (cross-checked like the real ones).
def add_keeping_wait_list(
    state: RendezvousState, node: NodeId, settings: Settings, wall_now: Millis
) -> RendezvousState:
    new = E.add_to_participants(state, node, settings, wall_now)
    return new.evolve(wait_list=(*new.wait_list, node)) if state.is_waiting(node) else new


def s_add_keeping_wait_list(
    w: M.World, s: M.SymState, me: Any, st_: M.SymSettings, wall: Any
) -> M.SymState:
    new = M.s_add_to_participants(w, s, me, st_, wall)
    return new.evolve(waiting=z3.Store(new.waiting, me, s.waiting[me]))


def complete_in_reverse(
    state: RendezvousState, node: NodeId, settings: Settings, wall_now: Millis
) -> RendezvousState:
    members = state.participant_nodes()
    ranks = {m: len(members) - 1 - i for i, m in enumerate(members)}
    return state.evolve(complete=True, deadline=None, participants=ranks)


def s_complete_in_reverse(
    w: M.World, s: M.SymState, me: Any, st_: M.SymSettings, wall: Any
) -> M.SymState:
    done = M.s_mark_complete(w, s, me, st_, wall)
    flipped = w.set_of(lambda x: s.n_participants - 1 - done.ranks[x])
    return done.evolve(ranks=flipped)


def leave_reopens(
    state: RendezvousState, node: NodeId, settings: Settings, wall_now: Millis
) -> RendezvousState:
    return E.remove_from_participants(state, node, settings, wall_now).evolve(closed=False)


def s_leave_reopens(
    w: M.World, s: M.SymState, me: Any, st_: M.SymSettings, wall: Any
) -> M.SymState:
    return M.s_remove_from_participants(w, s, me, st_, wall).evolve(closed=z3.BoolVal(False))


PLANTED: list[tuple[Action, E.Effect, M.SymEffect, str]] = [
    (Action.ADD_TO_PARTICIPANTS, add_keeping_wait_list, s_add_keeping_wait_list,
     "join.join_open_round (add_to_participants) keeps lists_disjoint"),
    (Action.MARK_RENDEZVOUS_COMPLETE, complete_in_reverse, s_complete_in_reverse,
     "join.complete_after_last_call (mark_rendezvous_complete) keeps complete_ranks_distinct"),
    (Action.REMOVE_FROM_PARTICIPANTS, leave_reopens, s_leave_reopens,
     "exit.leave_round (remove_from_participants) respects closed_reopens_empty"),
]  # fmt: skip


@pytest.mark.parametrize(
    "action,effect,model,expected", PLANTED, ids=[p[1].__name__ for p in PLANTED]
)
def test_planted_broken_effect_fails_with_a_confirmed_counterexample(
    action: Action, effect: E.Effect, model: M.SymEffect, expected: str
) -> None:
    broken = UPSTREAM.derive("planted", description="x", effects={action: effect})
    failed = failures(broken, {effect: model})
    assert f"planted: {expected}" in failed, sorted(failed)
    detail = failed[f"planted: {expected}"]
    assert "counterexample to induction with" in detail
    assert f"replayed on spec ({effect.__name__})" in detail
    assert "spec confirms:" in detail


@pytest.mark.parametrize(
    "action,effect,model,expected", PLANTED, ids=[p[1].__name__ for p in PLANTED]
)
@hypothesis_settings(max_examples=EXAMPLES)
@given(state=states(), settings=settings_(), who=st.integers(0, 2))
def test_planted_models_are_faithful_too(
    action: Action,
    effect: E.Effect,
    model: M.SymEffect,
    expected: str,
    state: RendezvousState,
    settings: Settings,
    who: int,
) -> None:
    check_effect_agrees(effect, model, state, settings, who)


def test_an_effect_without_a_symbolic_model_fails_loudly() -> None:
    broken = UPSTREAM.derive(
        "unmodelled", description="x", effects={Action.REMOVE_FROM_PARTICIPANTS: leave_reopens}
    )
    failed = failures(broken)
    key = "unmodelled: exit.leave_round (remove_from_participants) has a symbolic model"
    assert "has no symbolic model" in failed[key]


def test_a_planted_model_drift_is_caught_by_the_cross_check() -> None:
    # A symbolic keep_alive that forgets to record the heartbeat must disagree with spec.
    def s_forgetful(
        w: M.World, s: M.SymState, me: Any, st_: M.SymSettings, wall: Any
    ) -> M.SymState:
        return s

    state = RendezvousState.build(wait_list=[NODES[0]], last_heartbeats={NODES[0]: 1})
    with pytest.raises(AssertionError, match="disagrees with spec"):
        check_effect_agrees(E.keep_alive, s_forgetful, state, Settings(), 0)
