"""The answer proofs (model_check/prove_answers.py): what next_rendezvous returns holds
for any number of nodes under hardened and scale, is refuted for upstream where it really
fails (replayed on spec), and each answer property broken on purpose fails its obligation
with a counterexample."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import z3
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from test_prove import EXAMPLES, NODES, check_effect_agrees, settings_, states, world

from model_check import prove as P
from model_check import prove_answers as A
from model_check import prove_model as M
from spec import effects as E
from spec.settings import Settings
from spec.state import Millis, NodeId, RendezvousState
from spec.tables import Atom, row
from spec.variants import HARDENED, VARIANTS, Variant
from spec.vocabulary import Action, Op


def outcomes(
    variant: Variant, models: dict[E.Effect, M.SymEffect] | None = None
) -> list[M.Outcome]:
    return list(P.Prover(variant, models=models).prove())


def answer_names(name: str) -> list[str]:
    names = [f"{name}: answers: the start {g}" for g in _goal_names()]
    for move in A.TRANSITIONS:
        names += [f"{name}: answers: {move} keeps {g}" for g in _goal_names()]
    names += [f"{name}: answers imply {p}" for p in A.ANSWER_PROPERTIES]
    return names


def _goal_names() -> list[str]:
    w = M.World(z3)
    st_, _ = M.fresh_settings(w)
    s, c = M.fresh_state(w, "s"), A.fresh_completions(w, "c")
    names = list(A.global_invariants(w, s, c, st_))
    for label in ("k", "n"):
        names += list(A.node_invariants(w, A.fresh_record(w, label), c, label))
    return names


# ---------------------------------------------------------------------------------------
# The real variants
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["hardened", "scale"])
def test_every_answer_obligation_holds(name: str) -> None:
    out = outcomes(VARIANTS[name])
    bad = [f"{o.verdict} {o.name}: {o.detail}" for o in out if not o.holds]
    assert not bad, "\n".join(bad)
    held = {o.name for o in out}
    missing = [n for n in answer_names(name) if n not in held]
    assert not missing, missing
    finish = f"{name}: join.complete_with_us (finish) returns only a member of a complete round"
    assert f"{finish} of an open run" in held
    assert (
        f"{name}: exit.leave_round (remove_from_participants) respects complete_round_intact"
        in held
    )


@pytest.mark.parametrize("name", ["upstream", "torch-2.13"])
def test_upstream_is_refuted_where_it_really_fails(name: str) -> None:
    out = outcomes(VARIANTS[name])
    assert not [o for o in out if o.failed], [o.name for o in out if o.failed]
    refuted = {o.name: "\n".join(o.detail) for o in out if o.verdict == "refuted"}
    leave = f"{name}: exit.leave_round (remove_from_participants) respects complete_round_intact"
    assert leave in refuted, sorted(refuted)
    detail = refuted[leave]
    assert detail.startswith("expected: ")
    assert "spec confirms: complete_round_intact" in detail
    # The replay on spec shows failure 1: a remaining member returns another world size.
    assert "selects join.complete_with_us (finish)" in detail
    assert "world_size_agreement is broken" in detail
    assert f"{name}: sanitize respects complete_round_intact" in refuted
    assert f"{name}: answers: write keeps store_matches_its_completion" in refuted
    # Only the answer proofs and their lemma are refuted; the rest still holds.
    assert all("answers" in n or "complete_round_intact" in n for n in refuted)
    # What follows from the invariant still follows: the invariant is what breaks.
    assert all(o.holds for o in out if "answers imply" in o.name)


def test_main_counts_refutations_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert P.main(["--protocol", "upstream", "--no-times", "--failures-only"]) == 0
    out = capsys.readouterr().out
    last = out.rstrip().splitlines()[-1]
    assert " refuted=" in last and not last.startswith("obligations=0")
    assert " refuted=0 " not in last
    assert last.endswith("fail=0 unknown=0")
    assert "refuted upstream: exit.leave_round" not in out  # --failures-only hides them


def test_a_listed_unsafe_variant_whose_answers_hold_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(M, "UNSAFE_ANSWERS", {**M.UNSAFE_ANSWERS, "hardened": "planted"})
    out = outcomes(HARDENED)
    failed = [o for o in out if o.failed]
    assert [o.name for o in failed] == ["hardened: answers are refuted somewhere, as documented"]
    assert "remove it from that list" in failed[0].detail[0]


def test_the_intact_lemma_matches_its_concrete_form() -> None:
    a, b = NODES[0], NODES[1]
    done = RendezvousState.build(complete=True, participants={a: 0, b: 1})
    cases = [
        (done, done, True),
        (done, done.evolve(participants={a: 0}), False),  # lost a member, still complete
        (done, done.evolve(participants={a: 1, b: 0}), False),  # ranks changed
        (done, done.evolve(complete=False), False),
        (done, done.evolve(round=1, complete=False, participants={}), True),  # ended
        (done.evolve(complete=False), done.evolve(participants={a: 0}), True),
    ]
    for before, after, ok in cases:
        assert M.intact_holds(before, after) is ok
        w = world()
        s = M.concrete_settings(w, Settings())
        sym = M.step_complete_round_intact(
            w, M.concrete_state(w, before), M.concrete_state(w, after), s
        )
        solver = z3.Solver()
        solver.add(*w.axioms, sym != z3.BoolVal(ok))
        assert solver.check() == z3.unsat, (before.describe(), after.describe())


# ---------------------------------------------------------------------------------------
# Planted bugs: one per answer property
# ---------------------------------------------------------------------------------------
def planted_ranks(name: str, rank: Callable[[Any], Any]) -> tuple[E.Effect, M.SymEffect]:
    """hardened's completion with each member's sorted position ``r`` replaced by
    ``rank(r)``, as a Python effect and its symbolic model (``rank`` serves both)."""

    def effect(
        state: RendezvousState, node: NodeId, settings: Settings, wall_now: Millis
    ) -> RendezvousState:
        done = E.mark_complete_clearing_wait_list(state, node, settings, wall_now)
        return done.evolve(participants={m: rank(r) for m, r in done.participants})

    def model(w: M.World, s: M.SymState, me: Any, st_: M.SymSettings, wall: Any) -> M.SymState:
        done = M.s_mark_complete_clearing_wait_list(w, s, me, st_, wall)
        return done.evolve(ranks=w.array_of(lambda x: rank(done.ranks[x])))

    effect.__name__ = model.__name__ = name
    return effect, model


complete_all_rank_zero, s_complete_all_rank_zero = planted_ranks(
    "complete_all_rank_zero", lambda r: r - r
)
complete_ranks_from_one, s_complete_ranks_from_one = planted_ranks(
    "complete_ranks_from_one", lambda r: r + 1
)
PLANTED_EFFECTS = [
    (complete_all_rank_zero, s_complete_all_rank_zero),
    (complete_ranks_from_one, s_complete_ranks_from_one),
]


@pytest.mark.parametrize(
    "effect,model", PLANTED_EFFECTS, ids=[p[0].__name__ for p in PLANTED_EFFECTS]
)
@hypothesis_settings(max_examples=EXAMPLES)
@given(state=states(), settings=settings_(), who=st.integers(0, 2))
def test_planted_answer_models_are_faithful(
    effect: E.Effect, model: M.SymEffect, state: RendezvousState, settings: Settings, who: int
) -> None:
    check_effect_agrees(effect, model, state, settings, who)


def _join_index(name: str) -> int:
    table = HARDENED.table(Op.JOIN)
    return next(i for i, r in enumerate(table.rows) if r.name == name)


PLANTED: dict[str, tuple[Variant, dict[E.Effect, M.SymEffect] | None, str]] = {
    A.RETURN_IS_MEMBER: (
        HARDENED.derive(
            "finish-unlisted",
            description="return from any complete round",
            rows={(Op.JOIN, _join_index("complete_with_us")): row(
                "complete_with_us", Atom.COMPLETE, then=Action.FINISH
            )},
        ),
        None,
        "finish-unlisted: join.complete_with_us (finish) returns only a member of a "
        "complete round of an open run",
    ),
    A.WORLD_SIZE_AGREEMENT: (
        HARDENED.derive(
            "leave-keeps-complete",
            description="a member leaves a complete round, which stays complete",
            effects={Action.REMOVE_FROM_PARTICIPANTS: E.remove_from_participants},
        ),
        None,
        "leave-keeps-complete: answers: write keeps store_matches_its_completion",
    ),
    A.RANKS_DISTINCT: (
        HARDENED.derive(
            "rank-zero",
            description="every member gets rank 0",
            effects={Action.MARK_RENDEZVOUS_COMPLETE: complete_all_rank_zero},
        ),
        {complete_all_rank_zero: s_complete_all_rank_zero},
        "rank-zero: answers: write keeps completions_rank_in_sorted_order",
    ),
    A.RANK_IN_RANGE: (
        HARDENED.derive(
            "ranks-from-one",
            description="ranks 1..W",
            effects={Action.MARK_RENDEZVOUS_COMPLETE: complete_ranks_from_one},
        ),
        {complete_ranks_from_one: s_complete_ranks_from_one},
        "ranks-from-one: answers: write keeps completions_in_range",
    ),
    A.WORLD_SIZE_IN_RANGE: (
        HARDENED.derive(
            "below-min",
            description="complete on the deadline whatever the size",
            rows={(Op.JOIN, _join_index("complete_at_min_on_deadline")): row(
                "complete_at_min_on_deadline",
                Atom.PAST_DEADLINE,
                ~Atom.COMPLETE,
                Atom.PARTICIPANT,
                then=Action.MARK_RENDEZVOUS_COMPLETE,
            )},
        ),
        None,
        "below-min: answers: write keeps completions_in_range",
    ),
}  # fmt: skip


def test_every_answer_property_has_a_planted_bug() -> None:
    assert set(PLANTED) == set(A.ANSWER_PROPERTIES)


@pytest.mark.parametrize("prop", sorted(PLANTED))
def test_a_planted_bug_fails_its_answer_obligation(prop: str) -> None:
    variant, models, expected = PLANTED[prop]
    out = outcomes(variant, models)
    failed = {o.name: "\n".join(o.detail) for o in out if o.verdict == "FAILS"}
    assert expected in failed, sorted(failed)
    detail = failed[expected]
    assert "node(s):" in detail
    assert "before: " in detail
    assert not [o for o in out if o.verdict == "refuted"]
