"""Named invariants: each one catches a state that violates it, by name; and the states the
reference protocol's tables and effects produce from valid states keep all of them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec.effects import sanitize
from spec.invariants import (
    STATE_INVARIANTS,
    STEP_INVARIANTS,
    check_state,
    check_step,
)
from spec.settings import Settings
from spec.state import EMPTY_STATE, NodeId, RendezvousState
from spec.tables import Context
from spec.variants import UPSTREAM
from spec.vocabulary import Op

A, B, C, D = (NodeId(f"n{i}", 1) for i in range(4))
S = Settings(min_nodes=2, max_nodes=3)
T = 1_800_000_000_000


def test_names_are_unique_and_documented() -> None:
    names = [i.name for i in STATE_INVARIANTS] + [i.name for i in STEP_INVARIANTS]
    assert len(names) == len(set(names))
    assert all(i.doc for i in STATE_INVARIANTS)
    assert all(i.doc for i in STEP_INVARIANTS)


VALID = RendezvousState.build(
    round=1,
    complete=True,
    participants={A: 0, B: 1},
    wait_list=[C],
    redundancy_list=[D],
    last_heartbeats={A: T, B: T, C: T, D: T},
)

STATE_VIOLATIONS = [
    pytest.param(
        "lists_disjoint",
        VALID.evolve(wait_list=[C, A]),
        "n0_1_0 in both the participants and the wait list",
        id="participant-also-waiting",
    ),
    pytest.param(
        "lists_disjoint",
        VALID.evolve(redundancy_list=[C, D]),
        "n2_1_0 in both the redundancy list and the wait list",
        id="waiting-also-redundant",
    ),
    pytest.param(
        "participants_within_max",
        RendezvousState.build(
            participants=dict.fromkeys((A, B, C, D), 0),
            last_heartbeats=dict.fromkeys((A, B, C, D), T),
        ),
        "4 participants exceed max_nodes (3)",
        id="too-many",
    ),
    pytest.param(
        "complete_ranks_distinct",
        VALID.evolve(participants={A: 0, B: 0}),
        "duplicate ranks [0, 0]",
        id="duplicate-ranks",
    ),
    pytest.param(
        "complete_ranks_distinct",
        VALID.evolve(participants={A: 1, B: 0}),
        "not in sorted node order",
        id="unsorted-ranks",
    ),
    pytest.param(
        "listed_nodes_have_heartbeats",
        VALID.evolve(last_heartbeats={A: T, B: T, C: T}),
        "n3_1_0 listed without a heartbeat",
        id="redundant-without-heartbeat",
    ),
    pytest.param(
        "listed_nodes_have_heartbeats",
        VALID.evolve(last_heartbeats={B: T, C: T, D: T}),
        "n0_1_0 listed without a heartbeat",
        id="participant-without-heartbeat",
    ),
    pytest.param(
        "open_round_has_no_ranks",
        VALID.evolve(complete=False),
        "open round, yet n1_1_0 already hold ranks",
        id="open-round-with-ranks",
    ),
]


@pytest.mark.parametrize(("name", "state", "message"), STATE_VIOLATIONS)
def test_state_invariant_violation_is_reported_by_name(
    name: str, state: RendezvousState, message: str
) -> None:
    found = check_state(state, S)
    assert [n for n, _ in found] == [name]
    assert message in found[0][1]


def test_the_valid_state_has_no_violations() -> None:
    assert check_state(VALID, S) == []
    assert check_state(EMPTY_STATE, S) == []


def test_a_complete_round_with_a_rank_gap_is_valid() -> None:
    # After an exit or a prune, survivors keep their old ranks.
    survivors = VALID.evolve(participants={B: 1}, last_heartbeats={B: T, C: T, D: T})
    assert check_state(survivors, S) == []


def test_every_state_invariant_has_a_violation_case() -> None:
    covered = {p.values[0] for p in STATE_VIOLATIONS}
    assert covered == {i.name for i in STATE_INVARIANTS}


OPEN3 = RendezvousState.build(
    participants={A: 0, B: 0, C: 0}, last_heartbeats={A: T, B: T, C: T}, deadline=T
)
STEP_VIOLATIONS = [
    pytest.param(
        "closed_reopens_empty",
        VALID.evolve(closed=True),
        VALID,
        "a closed rendezvous was reopened",
        id="reopened",
    ),
    pytest.param(
        "round_never_decreases",
        VALID.evolve(round=4),
        VALID,
        "the round went back from 4 to 1",
        id="round-back",
    ),
    pytest.param(
        "round_never_decreases",
        VALID.evolve(round=2),
        VALID,
        "the round went back from 2 to 1",
        id="round-back-by-one",
    ),
    pytest.param(
        "completion_assigns_ranks",
        OPEN3.evolve(participants={A: 0, B: 0}),
        RendezvousState.build(
            complete=True, participants={A: 0, B: 2}, last_heartbeats={A: T, B: T}
        ),
        "round 0 completed with ranks [0, 2] in sorted node order, not 0..1",
        id="rank-gap-at-completion",
    ),
    pytest.param(
        "completion_assigns_ranks",
        OPEN3.evolve(participants={A: 0}),
        RendezvousState.build(complete=True, participants={A: 0}, last_heartbeats={A: T}),
        "round 0 completed with 1 participants, outside [2, 3]",
        id="too-few-at-completion",
    ),
    pytest.param(
        "completion_assigns_ranks",
        VALID,
        VALID.evolve(round=2, participants={A: 1, B: 2}),
        "round 2 completed with ranks [1, 2] in sorted node order, not 0..1",
        id="next-round-completed-with-stale-ranks",
    ),
    pytest.param(
        "complete_membership_frozen",
        VALID,
        VALID.evolve(participants={A: 0, B: 1, C: 2}, wait_list=[]),
        "n2_1_0 was added to round 1 after it completed",
        id="joined-a-complete-round",
    ),
    pytest.param(
        "complete_membership_frozen",
        VALID,
        VALID.evolve(participants={B: 0}, last_heartbeats={B: T, C: T, D: T}),
        "rank in complete round 1 changed from 1 to 0",
        id="rank-renumbered-in-a-complete-round",
    ),
]


@pytest.mark.parametrize(("name", "before", "after", "message"), STEP_VIOLATIONS)
def test_step_invariant_violation_is_reported_by_name(
    name: str, before: RendezvousState, after: RendezvousState, message: str
) -> None:
    found = check_step(before, after, S)
    assert [n for n, _ in found] == [name]
    assert message in found[0][1]


def test_completion_in_reverse_order_breaks_both_rank_invariants() -> None:
    before = OPEN3.evolve(participants={A: 0, B: 0})
    after = RendezvousState.build(
        complete=True, participants={A: 1, B: 0}, last_heartbeats={A: T, B: T}
    )
    found = dict(check_step(before, after, S))
    assert sorted(found) == ["complete_ranks_distinct", "completion_assigns_ranks"]
    assert "ranks [1, 0] in sorted node order, not 0..1" in found["completion_assigns_ranks"]


def test_every_step_invariant_has_a_violation_case() -> None:
    covered = {p.values[0] for p in STEP_VIOLATIONS}
    assert covered == {i.name for i in STEP_INVARIANTS}


def test_unchanged_and_next_round_are_valid_steps() -> None:
    assert check_step(VALID, VALID, S) == []


def test_a_member_may_leave_a_complete_round() -> None:
    left = VALID.evolve(participants={A: 0}, last_heartbeats={A: T, C: T, D: T})
    assert check_step(VALID, left, S) == []
    nxt = RendezvousState.build(round=2, wait_list=[C], last_heartbeats={C: T})
    assert check_step(VALID, nxt, S) == []


def test_check_step_includes_state_invariants_of_the_after_state() -> None:
    bad = VALID.evolve(closed=False, wait_list=[A, C])
    names = [n for n, _ in check_step(VALID.evolve(closed=True), bad, S)]
    assert names == ["closed_reopens_empty", "lists_disjoint"]


# -- the protocol keeps its invariants --------------------------------------------------------
NODES = tuple(NodeId(f"worker-{i}", 100 + i) for i in range(5))
# Weighted by repetition: mostly joins, rarely a close (closing ends all progress).
OPS = (Op.JOIN,) * 12 + (Op.EXIT,) * 4 + (Op.KEEP_ALIVE,) * 3 + (Op.CLOSE,)
LATE = (-1000,) * 8 + (0, 1, 5000, 5001)

moves = st.lists(
    st.tuples(
        st.integers(0, len(NODES) - 1),  # who acts
        st.sampled_from(OPS),
        st.sampled_from((0, 1, 1000, 4999, 5000, 15_001, 30_001)),  # wall time advance
        st.sampled_from(LATE),  # mono_now - op deadline
        st.booleans(),  # sanitize before deciding (a fresh read) or act on the cached view
    ),
    min_size=5,
    max_size=60,
)


@settings(max_examples=300)
@given(
    moves=moves,
    bounds=st.sampled_from([(1, 1), (1, 3), (2, 3), (2, 2), (3, 5)]),
)
def test_tables_and_effects_keep_the_invariants(
    moves: list[tuple[int, Op, int, int, bool]], bounds: tuple[int, int]
) -> None:
    cfg = Settings(min_nodes=bounds[0], max_nodes=bounds[1])
    state, wall, mono = EMPTY_STATE, T, 10**6
    for who, op, advance, late, prune in moves:
        wall += advance
        mono += advance
        if prune:
            cleaned = sanitize(state, cfg, wall).state
            assert check_step(state, cleaned, cfg) == [], (state.describe(), "sanitize")
            state = cleaned
        node = NODES[who]
        ctx = Context(node, state, cfg, mono, wall, mono - late, UPSTREAM.rollback_window)
        action = UPSTREAM.table(op).decide(ctx)
        if not action.mutates:
            continue
        after = UPSTREAM.effects[action](state, node, cfg, wall)
        problems = check_step(state, after, cfg)
        assert problems == [], (state.describe(), node, op, action, problems)
        state = after
