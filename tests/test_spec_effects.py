"""Effects, the round epilogue and sanitize, each written as init / act / check."""

from __future__ import annotations

import pytest

from spec.effects import (
    UPSTREAM_EFFECTS,
    Sanitized,
    add_to_participants,
    add_to_participants_clearing_wait_list,
    add_to_redundancy_list,
    add_to_wait_list,
    keep_alive,
    leave_ending_round,
    mark_closed,
    mark_complete,
    mark_complete_clearing_wait_list,
    remove_from_participants,
    remove_from_redundancy_list,
    remove_from_wait_list,
    remove_participant_epilogue,
    sanitize,
    sanitize_ending_broken_rounds,
)
from spec.settings import Settings
from spec.state import EMPTY_STATE, NodeId, RendezvousState
from spec.vocabulary import Action

A, B, C, D = (NodeId(f"host-{x}", 10, 0) for x in "abcd")
ME = NodeId("host-m", 42, 0)
S = Settings(min_nodes=2, max_nodes=3, last_call_timeout=30_000)
NOW = 1_800_000_000_000
EXPIRY = S.heartbeat_expiry  # 15_000 ms


def members(*nodes: NodeId, ranked: bool = False) -> dict[NodeId, int]:
    return {n: (i if ranked else 0) for i, n in enumerate(sorted(nodes))}


def beats(*nodes: NodeId, at: int = NOW - 1000) -> dict[NodeId, int]:
    return dict.fromkeys(nodes, at)


def test_every_mutating_action_has_an_effect() -> None:
    # Folds read the announcement set first; prune_dead applies the variant's prune.
    special = {a for a in Action if a.folds} | {Action.PRUNE_DEAD}
    assert {a for a in Action if a.mutates} - special == set(UPSTREAM_EFFECTS)


# -- add to participants -----------------------------------------------------------------
def test_first_participant_joins_without_last_call() -> None:
    # init: an empty open round
    # act
    after = add_to_participants(EMPTY_STATE, A, S, NOW)
    # check: member with rank 0 and a heartbeat now; below min, so no last call yet
    assert after.participant_map() == {A: 0}
    assert after.heartbeat_of(A) == NOW
    assert after.deadline is None
    assert not after.complete


def test_reaching_min_sets_the_last_call_deadline() -> None:
    init = RendezvousState.build(participants=members(A), last_heartbeats=beats(A))
    after = add_to_participants(init, B, S, NOW)
    assert after.num_participants == S.min_nodes
    assert after.deadline == NOW + S.last_call_timeout
    assert not after.complete


def test_joining_above_min_keeps_the_existing_deadline() -> None:
    init = RendezvousState.build(participants=members(A, B), last_heartbeats=beats(A, B))
    init = init.evolve(deadline=NOW + 7)
    wide = Settings(min_nodes=2, max_nodes=4)
    after = add_to_participants(init, C, wide, NOW)
    assert after.deadline == NOW + 7
    assert not after.complete


def test_reaching_max_completes_with_sorted_ranks() -> None:
    init = RendezvousState.build(
        participants=members(C, A), last_heartbeats=beats(A, C), deadline=NOW - 5
    )
    after = add_to_participants(init, B, S, NOW)
    assert after.complete
    assert after.deadline is None
    assert after.participant_map() == {A: 0, B: 1, C: 2}


def test_min_equals_max_sets_then_clears_the_deadline() -> None:
    one = Settings(min_nodes=1, max_nodes=1)
    after = add_to_participants(EMPTY_STATE, A, one, NOW)
    assert after.complete
    assert after.deadline is None
    assert after.participant_map() == {A: 0}


def test_joining_from_the_wait_list_leaves_it() -> None:
    init = RendezvousState.build(wait_list=[ME, A], last_heartbeats=beats(ME, A, at=NOW - 9))
    after = add_to_participants(init, ME, S, NOW)
    assert after.wait_list == (A,)
    assert after.is_participant(ME)
    assert after.heartbeat_of(ME) == NOW
    assert after.heartbeat_of(A) == NOW - 9


# -- wait list, redundancy list ----------------------------------------------------------
def test_add_to_wait_list_leaves_the_redundancy_list() -> None:
    init = RendezvousState.build(redundancy_list=[ME, A], last_heartbeats=beats(ME, A))
    after = add_to_wait_list(init, ME, S, NOW)
    assert after.wait_list == (ME,)
    assert after.redundancy_list == (A,)
    assert after.heartbeat_of(ME) == NOW


def test_add_to_redundancy_list() -> None:
    init = RendezvousState.build(
        complete=True, participants=members(A, B, C, ranked=True), last_heartbeats=beats(A, B, C)
    )
    after = add_to_redundancy_list(init, ME, S, NOW)
    assert after.redundancy_list == (ME,)
    assert after.heartbeat_of(ME) == NOW
    assert after.participants == init.participants


def test_remove_from_wait_list_forgets_the_heartbeat() -> None:
    init = RendezvousState.build(wait_list=[ME, A], last_heartbeats=beats(ME, A))
    after = remove_from_wait_list(init, ME, S, NOW)
    assert after.wait_list == (A,)
    assert after.heartbeat_of(ME) is None
    assert after.heartbeat_of(A) == NOW - 1000


def test_remove_from_redundancy_list_forgets_the_heartbeat() -> None:
    init = RendezvousState.build(redundancy_list=[ME, A], last_heartbeats=beats(ME, A))
    after = remove_from_redundancy_list(init, ME, S, NOW)
    assert after.redundancy_list == (A,)
    assert after.heartbeat_of(ME) is None
    assert after.heartbeat_of(A) == NOW - 1000


# -- keep alive, complete, close ---------------------------------------------------------
def test_keep_alive_sets_only_this_nodes_heartbeat() -> None:
    init = RendezvousState.build(participants=members(A, ME), last_heartbeats=beats(A, ME))
    after = keep_alive(init, ME, S, NOW)
    assert after.heartbeat_map() == {A: NOW - 1000, ME: NOW}
    assert after.evolve(last_heartbeats=init.heartbeat_map()) == init


def test_mark_complete_assigns_sorted_ranks_and_clears_deadline() -> None:
    init = RendezvousState.build(
        participants=members(D, B, A), deadline=NOW - 1, last_heartbeats=beats(A, B, D)
    )
    after = mark_complete(init, A, S, NOW)
    assert after.complete
    assert after.deadline is None
    assert after.participant_map() == {A: 0, B: 1, D: 2}


def test_mark_closed() -> None:
    init = RendezvousState.build(participants=members(A), last_heartbeats=beats(A), round=4)
    after = mark_closed(init, A, S, NOW)
    assert after.closed
    assert after.evolve(closed=False) == init


# -- remove from participants and the epilogue ------------------------------------------
def test_last_participant_leaving_a_complete_round_opens_the_next() -> None:
    init = RendezvousState.build(
        round=3, complete=True, participants={ME: 0}, last_heartbeats=beats(ME)
    )
    after = remove_from_participants(init, ME, S, NOW)
    assert after.round == 4
    assert not after.complete
    assert after.participants == ()
    assert after.heartbeat_of(ME) is None


def test_survivors_of_a_complete_round_keep_their_ranks() -> None:
    init = RendezvousState.build(
        round=3,
        complete=True,
        participants=members(A, B, C, ranked=True),
        last_heartbeats=beats(A, B, C),
    )
    after = remove_from_participants(init, A, S, NOW)
    assert after.round == 3
    assert after.complete
    assert after.participant_map() == {B: 1, C: 2}


def test_dropping_below_min_in_an_open_round_cancels_the_last_call() -> None:
    init = RendezvousState.build(
        participants=members(A, B), deadline=NOW + 100, last_heartbeats=beats(A, B)
    )
    after = remove_from_participants(init, A, S, NOW)
    assert after.participant_map() == {B: 0}
    assert after.deadline is None
    assert after.round == 0


def test_staying_at_min_in_an_open_round_keeps_the_last_call() -> None:
    wide = Settings(min_nodes=2, max_nodes=4)
    init = RendezvousState.build(
        participants=members(A, B, C), deadline=NOW + 100, last_heartbeats=beats(A, B, C)
    )
    after = remove_from_participants(init, A, wide, NOW)
    assert after.deadline == NOW + 100


@pytest.mark.parametrize(
    ("init", "expected"),
    [
        pytest.param(
            RendezvousState.build(round=1, complete=True),
            RendezvousState.build(round=2, complete=False),
            id="complete-empty-next-round",
        ),
        pytest.param(
            RendezvousState.build(round=1, complete=True, participants={A: 1}, deadline=None),
            RendezvousState.build(round=1, complete=True, participants={A: 1}),
            id="complete-with-survivor-unchanged",
        ),
        pytest.param(
            RendezvousState.build(participants={A: 0}, deadline=NOW),
            RendezvousState.build(participants={A: 0}, deadline=None),
            id="open-below-min-clears-deadline",
        ),
        pytest.param(
            RendezvousState.build(participants={A: 0, B: 0}, deadline=NOW),
            RendezvousState.build(participants={A: 0, B: 0}, deadline=NOW),
            id="open-at-min-keeps-deadline",
        ),
        pytest.param(EMPTY_STATE, EMPTY_STATE, id="open-empty-stays-round-0"),
    ],
)
def test_epilogue(init: RendezvousState, expected: RendezvousState) -> None:
    assert remove_participant_epilogue(init, S) == expected


def test_removing_a_non_member_changes_nothing_but_runs_the_epilogue() -> None:
    init = RendezvousState.build(participants={A: 0}, deadline=NOW)
    after = remove_from_participants(init, ME, S, NOW)
    assert after == init.evolve(deadline=None)


# -- sanitize ---------------------------------------------------------------------------
def test_heartbeat_exactly_at_the_expiry_is_not_expired() -> None:
    init = RendezvousState.build(participants={A: 0}, last_heartbeats={A: NOW - EXPIRY})
    result = sanitize(init, S, NOW)
    assert result == Sanitized(init, (), False)


def test_heartbeat_1ms_older_than_the_expiry_is_pruned() -> None:
    init = RendezvousState.build(
        participants={A: 0, B: 0},
        deadline=NOW + 10,
        last_heartbeats={A: NOW - EXPIRY - 1, B: NOW},
    )
    result = sanitize(init, S, NOW)
    assert result.dead == (A,)
    assert result.removed_participant
    assert result.state.participant_map() == {B: 0}
    assert result.state.heartbeat_map() == {B: NOW}
    # the epilogue ran: below min in an open round
    assert result.state.deadline is None


def test_sanitize_prunes_from_every_list_and_sorts_the_dead() -> None:
    old = NOW - EXPIRY - 1
    init = RendezvousState.build(
        round=2,
        complete=True,
        participants={C: 0, ME: 1},
        wait_list=[B],
        redundancy_list=[A],
        last_heartbeats={A: old, B: old, C: old, ME: NOW},
    )
    result = sanitize(init, S, NOW)
    assert result.dead == (A, B, C)
    assert result.removed_participant
    assert result.state == RendezvousState.build(
        round=2, complete=True, participants={ME: 1}, last_heartbeats={ME: NOW}
    )


def test_sanitize_of_the_last_participant_of_a_complete_round_opens_the_next() -> None:
    init = RendezvousState.build(
        round=5, complete=True, participants={A: 0}, last_heartbeats={A: NOW - EXPIRY - 1}
    )
    result = sanitize(init, S, NOW)
    assert result.state == RendezvousState.build(round=6)
    assert result.removed_participant


def test_sanitize_of_wait_and_redundancy_nodes_only_runs_no_epilogue() -> None:
    # An open round below min that still has a deadline: the epilogue would clear it.
    old = NOW - EXPIRY - 1
    init = RendezvousState.build(
        participants={ME: 0},
        deadline=NOW + 50,
        wait_list=[A],
        redundancy_list=[B],
        last_heartbeats={A: old, B: old, ME: NOW},
    )
    result = sanitize(init, S, NOW)
    assert result.dead == (A, B)
    assert not result.removed_participant
    assert result.state.deadline == NOW + 50
    assert result.state.wait_list == ()
    assert result.state.redundancy_list == ()


def test_sanitize_drops_orphan_heartbeats() -> None:
    init = RendezvousState.build(last_heartbeats={A: NOW - EXPIRY - 1})
    result = sanitize(init, S, NOW)
    assert result == Sanitized(EMPTY_STATE, (A,), False)


def test_effects_do_not_mutate_their_input() -> None:
    init = RendezvousState.build(
        participants=members(A, B), wait_list=[C], last_heartbeats=beats(A, B, C)
    )
    snapshot = (init.participants, init.wait_list, init.last_heartbeats, init.heartbeat_map())
    for effect in UPSTREAM_EFFECTS.values():
        effect(init, C, S, NOW)
    sanitize(init, S, NOW + 10**9)
    assert (init.participants, init.wait_list, init.last_heartbeats, init.heartbeat_map()) == (
        snapshot
    )


# -- the hardened sanitize -------------------------------------------------------------
def test_hardened_sanitize_ends_a_complete_round_that_lost_a_member() -> None:
    # init: a complete round of three, C silent past the expiry; D waits for the next round
    state = RendezvousState.build(
        round=4,
        complete=True,
        participants=members(A, B, C, ranked=True),
        wait_list=[D],
        last_heartbeats={**beats(A, B, D), C: NOW - EXPIRY - 1},
    )
    # act
    out = sanitize_ending_broken_rounds(state, S, NOW)
    # check: the survivors are queued for round 5 with D; the round is open again
    assert out.dead == (C,)
    assert out.removed_participant
    assert out.state == RendezvousState.build(
        round=5, wait_list=[A, B, D], last_heartbeats=beats(A, B, D)
    )


def test_hardened_sanitize_is_plain_sanitize_otherwise() -> None:
    open_round = RendezvousState.build(
        participants=members(A, B, C),
        deadline=NOW + 5,
        last_heartbeats={**beats(A, B), C: NOW - EXPIRY - 1},
    )
    waiting_only = RendezvousState.build(
        complete=True,
        participants=members(A, B, ranked=True),
        wait_list=[C],
        last_heartbeats={**beats(A, B), C: NOW - EXPIRY - 1},
    )
    last_member = RendezvousState.build(
        complete=True, participants=members(A, ranked=True), last_heartbeats={A: 0}
    )
    healthy = RendezvousState.build(
        complete=True, participants=members(A, B, ranked=True), last_heartbeats=beats(A, B)
    )
    for state in (open_round, waiting_only, last_member, healthy):
        assert sanitize_ending_broken_rounds(state, S, NOW) == sanitize(state, S, NOW)


# -- the hardened completion and exit ----------------------------------------------------
def test_a_round_completes_with_an_empty_wait_list_under_hardened() -> None:
    # init: an open round of two past its last call; C still on the wait list (it never
    # joined: dead, slow or surplus), D standing by
    state = RendezvousState.build(
        round=3,
        participants=members(A, B),
        deadline=NOW - 1,
        wait_list=[C],
        redundancy_list=[D],
        last_heartbeats=beats(A, B, C, D),
    )
    # act
    done = mark_complete_clearing_wait_list(state, A, S, NOW)
    # check: upstream's completion, minus the waiter and its heartbeat; D stays
    assert done == mark_complete(state, A, S, NOW).evolve(
        wait_list=(), last_heartbeats=beats(A, B, D)
    )
    assert done.redundancy_list == (D,)


def test_filling_a_round_drops_the_waiters_under_hardened() -> None:
    # init: two participants of three, C waiting (it was carried over from a round that
    # ended) but not joining this one
    state = RendezvousState.build(
        participants=members(A, B), wait_list=[C], last_heartbeats=beats(A, B, C)
    )
    # act: D fills the round
    full = add_to_participants_clearing_wait_list(state, D, S, NOW)
    # check: as upstream's, but C is no longer counted by num_nodes_waiting()
    upstream = add_to_participants(state, D, S, NOW)
    assert upstream.wait_list == (C,)
    assert full == upstream.evolve(wait_list=(), last_heartbeats=beats(A, B) | {D: NOW})


def test_joining_below_max_keeps_the_waiters_under_hardened() -> None:
    state = RendezvousState.build(wait_list=[C], last_heartbeats=beats(C))
    assert add_to_participants_clearing_wait_list(state, A, S, NOW) == add_to_participants(
        state, A, S, NOW
    )


def test_leaving_a_complete_round_ends_it_under_hardened() -> None:
    # init: a complete round of three; D waits for the next one
    state = RendezvousState.build(
        round=7,
        complete=True,
        participants=members(A, B, C, ranked=True),
        wait_list=[D],
        last_heartbeats=beats(A, B, C, D),
    )
    # act: A calls next_rendezvous again (its workers failed): the exit op leaves
    after = leave_ending_round(state, A, S, NOW)
    # check: round 8 opens with the survivors queued behind D; A's heartbeat is gone
    assert after == RendezvousState.build(
        round=8, wait_list=[B, C, D], last_heartbeats=beats(B, C, D)
    )
    # upstream keeps round 7 complete with a hole: B and C could still return it with
    # world size 2 and ranks 1 and 2
    kept = remove_from_participants(state, A, S, NOW)
    assert (kept.round, kept.complete, kept.participant_map()) == (7, True, {B: 1, C: 2})


def test_leaving_elsewhere_is_upstream_leaving_under_hardened() -> None:
    open_round = RendezvousState.build(
        participants=members(A, B), deadline=NOW, last_heartbeats=beats(A, B)
    )
    last = RendezvousState.build(
        complete=True, participants=members(A, ranked=True), last_heartbeats=beats(A)
    )
    outsider = RendezvousState.build(
        complete=True, participants=members(B, C, ranked=True), last_heartbeats=beats(B, C)
    )
    for state in (open_round, last, outsider):
        assert leave_ending_round(state, A, S, NOW) == remove_from_participants(state, A, S, NOW)
