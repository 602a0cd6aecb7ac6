"""Variants: small named diffs of the reference protocol."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from spec.codec import encode
from spec.effects import (
    UPSTREAM_EFFECTS,
    Effect,
    fold_and_complete_clearing_wait_list,
    fold_announced_clearing_wait_list,
    keep_alive,
    prune_ending_broken_rounds,
)
from spec.machine import Config, Fail, Local, Now, ReadResult, StartOp, step
from spec.settings import Settings
from spec.state import NodeId, RendezvousState
from spec.tables import UPSTREAM_JOIN, Atom, Table, row
from spec.variants import (
    HARDENED,
    HARDENED_EFFECTS,
    KEY_BEATS,
    LOCAL,
    SCALE,
    TORCH_213,
    UPSTREAM,
    VARIANTS,
    Variant,
    get_variant,
)
from spec.vocabulary import Action, FailKind, Op


def test_upstream_is_the_root() -> None:
    assert UPSTREAM.name == "upstream"
    assert UPSTREAM.parent is None
    assert UPSTREAM.changes == ()
    assert UPSTREAM.prune_marks_dirty is True
    assert UPSTREAM.rollback_window == 5000
    assert set(UPSTREAM.tables) == set(Op)
    assert dict(UPSTREAM.effects) == dict(UPSTREAM_EFFECTS)


def test_torch_213_differs_from_upstream_only_in_prune_marks_dirty() -> None:
    assert TORCH_213.name == "torch-2.13"
    assert TORCH_213.parent == "upstream"
    assert TORCH_213.changes == ("prune_marks_dirty: True -> False",)
    assert TORCH_213.prune_marks_dirty is False
    assert TORCH_213.rollback_window == UPSTREAM.rollback_window
    for op in Op:
        assert TORCH_213.table(op) == UPSTREAM.table(op)
    assert dict(TORCH_213.effects) == dict(UPSTREAM.effects)


def test_registry_and_lookup() -> None:
    assert dict(VARIANTS) == {
        "upstream": UPSTREAM,
        "torch-2.13": TORCH_213,
        "hardened": HARDENED,
        "scale": SCALE,
    }
    assert [v.announces for v in VARIANTS.values()] == [False, False, False, True]
    assert get_variant("upstream") is UPSTREAM
    assert get_variant("torch-2.13") is TORCH_213
    assert get_variant("hardened") is HARDENED


def test_hardened_is_a_small_named_diff_of_upstream() -> None:
    assert HARDENED.parent == "upstream"
    assert HARDENED.changes == (
        # a reused run id: a newcomer of the next job leaves a closed run's lists, waits
        # for the closed job's members to go, then reopens the run (issue 26, item 1)
        "exit: add leave_closed_wait_list [closed and waiting and not past_deadline -> "
        "remove_from_wait_list] before nothing_to_leave",
        "exit: add leave_closed_redundancy_list [closed and redundant and not past_deadline "
        "-> remove_from_redundancy_list] before nothing_to_leave",
        "join: add later_job [later_job -> error_closed] before closed_while_redundant",
        "join: add reopen_vacant_run [closed and newcomer and vacant -> reopen] before "
        "closed_while_redundant",
        "join: add newcomer_wait [closed and newcomer and not past_deadline -> sync] before "
        "closed_while_redundant",
        "join: add complete_at_min_on_deadline [past_deadline and not complete and "
        "participant and size_in_range -> mark_rendezvous_complete] before withdraw_participant",
        "effect of add_to_participants: add_to_participants_clearing_wait_list",
        "effect of mark_rendezvous_complete: mark_complete_clearing_wait_list",
        "effect of remove_from_participants: leave_ending_round",
        "counts_dropped_member: False -> True",
        "prune: prune -> prune_ending_broken_rounds",
        "liveness_clock: wall -> local",
    )
    assert HARDENED.prune_marks_dirty is UPSTREAM.prune_marks_dirty
    assert dict(HARDENED.effects) == {**UPSTREAM.effects, **HARDENED_EFFECTS}
    for op in Op:
        if op not in {Op.JOIN, Op.EXIT}:
            assert HARDENED.table(op) == UPSTREAM.table(op)


@pytest.mark.parametrize("name", ["hardend", "", "UPSTREAM", "torch"])
def test_unknown_variant_lists_the_known_names(name: str) -> None:
    with pytest.raises(ValueError) as info:
        get_variant(name)
    message = str(info.value)
    assert f"unknown protocol variant {name!r}" in message
    assert "choose one of: hardened, scale, torch-2.13, upstream" in message


# -- derive --------------------------------------------------------------------------------
NEW_ROW = row("new_row", Atom.CLOSED, then=Action.ERROR_CLOSED, why="test")


def test_derive_without_changes_lists_none() -> None:
    same = UPSTREAM.derive("same", description="no diff")
    assert same.changes == ()
    assert same.parent == "upstream"
    for op in Op:
        assert same.table(op) == UPSTREAM.table(op)


def test_derive_replace_delete_insert_append_and_switches() -> None:
    v = UPSTREAM.derive(
        "demo",
        description="every kind of change",
        rows={
            (Op.JOIN, 3): row("redundant_wait", Atom.REDUNDANT, then=Action.SYNC),
            (Op.EXIT, 0): None,
        },
        insert={(Op.CLOSE, 0): NEW_ROW, (Op.KEEP_ALIVE, 3): row("finish", then=Action.FINISH)},
        effects={Action.MARK_RENDEZVOUS_CLOSED: keep_alive},
        prune_marks_dirty=False,
        rollback_window=0,
    )
    assert v.changes == (
        "close: insert before row 0: [closed -> error_closed]",
        "exit: delete row 0: [not participant -> finish]",
        "join: row 3: [redundant and at_max -> sync] -> [redundant -> sync]",
        "keep_alive: append [otherwise -> finish]",
        "effect of mark_rendezvous_closed: keep_alive",
        "prune_marks_dirty: True -> False",
        "rollback_window: 5000 -> 0 ms",
    )
    assert v.table(Op.CLOSE).rows == (NEW_ROW, *UPSTREAM_CLOSE_ROWS)
    assert v.table(Op.EXIT).rows == UPSTREAM.table(Op.EXIT).rows[1:]
    assert v.table(Op.JOIN).rows[3].guard_text() == "redundant"
    assert v.table(Op.JOIN).rows[:3] == UPSTREAM.table(Op.JOIN).rows[:3]
    assert v.table(Op.JOIN).rows[4:] == UPSTREAM.table(Op.JOIN).rows[4:]
    assert len(v.table(Op.KEEP_ALIVE).rows) == 4
    assert v.effects[Action.MARK_RENDEZVOUS_CLOSED] is keep_alive
    assert (v.prune_marks_dirty, v.rollback_window) == (False, 0)
    # the parent is untouched
    assert len(UPSTREAM.table(Op.EXIT).rows) == 3
    assert UPSTREAM.effects[Action.MARK_RENDEZVOUS_CLOSED] is not keep_alive


UPSTREAM_CLOSE_ROWS = UPSTREAM.table(Op.CLOSE).rows


def test_derive_of_a_derived_variant_names_its_parent() -> None:
    child = TORCH_213.derive("child", description="x", prune_marks_dirty=True)
    assert child.parent == "torch-2.13"
    assert child.changes == ("prune_marks_dirty: False -> True",)


def test_derive_ignores_switches_set_to_their_current_value() -> None:
    v = UPSTREAM.derive("x", description="x", prune_marks_dirty=True, rollback_window=5000)
    assert v.changes == ()


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        pytest.param({"rows": {(Op.JOIN, 15): None}}, "rows 0..14; row index 15", id="replace"),
        pytest.param({"rows": {(Op.EXIT, -1): None}}, "row index -1", id="negative"),
        pytest.param(
            {"insert": {(Op.CLOSE, 4): NEW_ROW}}, "close table of 'upstream'", id="insert"
        ),
    ],
)
def test_derive_rejects_row_indices_out_of_range(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        UPSTREAM.derive("bad", description="x", **kwargs)  # type: ignore[arg-type]
    assert fragment in str(info.value)
    assert "out of range" in str(info.value)


def test_a_variant_needs_a_table_for_every_op() -> None:
    tables: dict[Op, Table] = {op: t for op, t in UPSTREAM.tables.items() if op is not Op.QUERY}
    with pytest.raises(ValueError, match=r"variant 'x' has no table for \['query'\]"):
        Variant("x", "x", MappingProxyType(tables), UPSTREAM.effects)


def test_a_variant_table_must_be_for_its_op() -> None:
    tables = dict(UPSTREAM.tables)
    tables[Op.QUERY] = Table(Op.CLOSE, UPSTREAM.table(Op.QUERY).rows)
    with pytest.raises(ValueError, match=r"table for Op\.QUERY is for Op\.CLOSE"):
        Variant("x", "x", MappingProxyType(tables), UPSTREAM.effects)


def test_every_mutating_action_needs_an_effect() -> None:
    effects: dict[Action, Effect] = {
        a: e for a, e in UPSTREAM.effects.items() if a is not Action.KEEP_ALIVE
    }
    with pytest.raises(ValueError, match="action keep_alive has no effect"):
        Variant("x", "x", UPSTREAM.tables, MappingProxyType(effects))


def test_the_machine_runs_the_variant_it_is_given() -> None:
    # A participant 1 ms past its join deadline withdraws in upstream; with no rollback
    # window it reports the timeout at once.
    me = NodeId("me", 1)
    no_window = UPSTREAM.derive("no-window", description="x", rollback_window=0)
    state = RendezvousState.build(participants={me: 0}, last_heartbeats={me: 10})
    now = Now(1000, 10)
    settings = Settings(min_nodes=2, max_nodes=3)
    results = {}
    for variant in (UPSTREAM, no_window):
        config = Config(settings, variant)
        s = step(Local(me), StartOp(Op.JOIN, 999, now), config)
        s = step(s.local, ReadResult(encode(state, variant.name), 1, now), config)
        results[variant.name] = s
    assert results["upstream"].action is Action.REMOVE_FROM_PARTICIPANTS
    failed = results["no-window"].request
    assert isinstance(failed, Fail) and failed.kind is FailKind.TIMEOUT


# -- the documented diff ---------------------------------------------------------------
# hardened and scale are literal tables (spec.tables); these patches of upstream by row
# index are the diff docs/protocol.md ("Variants") documents, and must give exactly them.
# The join table row before which the hardened variant completes a viable round.
_FIRST_ROLLBACK_ROW = 6
assert UPSTREAM_JOIN.rows[_FIRST_ROLLBACK_ROW].then is Action.REMOVE_FROM_PARTICIPANTS

PATCHED_HARDENED = UPSTREAM.derive(
    "hardened",
    description=(
        "Fixes what the model checker finds in upstream: a complete round that loses a "
        "participant to expiry is ended and its survivors queued (so num_nodes_waiting "
        "reports it), and so is a complete round a member leaves (it called "
        "next_rendezvous again), so that nobody returns a round whose membership changed; "
        "a round completes with an empty wait list, so that a node it did not take (dead, "
        "slow or surplus) does not restart every member at once, and a member whose round no "
        "longer holds it counts itself as waiting; a participant whose join "
        "deadline passes while min_nodes is reached completes the round instead of "
        "abandoning it, and liveness and the last call are measured on each node's own "
        "monotonic clock. A node leaves a closed run at shutdown, and a new job under the "
        "same run id reopens it (one epoch up) once nobody of the closed job is listed."
    ),
    insert={
        (Op.JOIN, 0): (
            row(
                "later_job",
                Atom.LATER_JOB,
                then=Action.ERROR_CLOSED,
                why="this node's job was closed, and a new job has reopened the run since",
            ),
            row(
                "reopen_vacant_run",
                Atom.CLOSED,
                Atom.NEWCOMER,
                Atom.VACANT,
                then=Action.REOPEN,
                why="the job that closed this run id has ended: start a new one",
            ),
            row(
                "newcomer_wait",
                Atom.CLOSED,
                Atom.NEWCOMER,
                ~Atom.PAST_DEADLINE,
                then=Action.SYNC,
                why="a new job: wait until the closed job's nodes have left or died",
            ),
        ),
        (Op.JOIN, _FIRST_ROLLBACK_ROW): row(
            "complete_at_min_on_deadline",
            Atom.PAST_DEADLINE,
            ~Atom.COMPLETE,
            Atom.PARTICIPANT,
            Atom.SIZE_IN_RANGE,
            then=Action.MARK_RENDEZVOUS_COMPLETE,
            why="min reached: complete now rather than abandon a viable round",
        ),
        (Op.EXIT, 0): (
            row(
                "leave_closed_wait_list",
                Atom.CLOSED,
                Atom.WAITING,
                ~Atom.PAST_DEADLINE,
                then=Action.REMOVE_FROM_WAIT_LIST,
                why="the run is closed: leave it, so that a new job can reopen it",
            ),
            row(
                "leave_closed_redundancy_list",
                Atom.CLOSED,
                Atom.REDUNDANT,
                ~Atom.PAST_DEADLINE,
                then=Action.REMOVE_FROM_REDUNDANCY_LIST,
                why="the run is closed: leave it, so that a new job can reopen it",
            ),
        ),
    },
    effects=HARDENED.effects,
    counts_dropped_member=True,
    prune=prune_ending_broken_rounds,
    liveness_clock=LOCAL,
)

# Hardened's first two join rows let a new job reopen a closed run id; the scale variant
# inserts its watch rows for a newcomer before the second.
_NEWCOMER_SYNC_ROW = 2
assert PATCHED_HARDENED.tables[Op.JOIN].rows[_NEWCOMER_SYNC_ROW].then is Action.SYNC
_REUSE = 3
"""How many rows before upstream's first join row hardened inserts (a closed run's reuse)."""

# The hardened join rows the scale variant replaces: completing after the last call, and
# joining an open round.
_LAST_CALL_ROW = 12 + _REUSE
_JOIN_OPEN_ROW = 13 + _REUSE
assert PATCHED_HARDENED.tables[Op.JOIN].rows[_LAST_CALL_ROW].then is Action.MARK_RENDEZVOUS_COMPLETE
assert PATCHED_HARDENED.tables[Op.JOIN].rows[_JOIN_OPEN_ROW].then is Action.ADD_TO_PARTICIPANTS

_GIVE_UP_ROW = 9 + _REUSE
assert PATCHED_HARDENED.tables[Op.JOIN].rows[_GIVE_UP_ROW].then is Action.ERROR_TIMEOUT

_STAND_BY_BEAT_ROW = 2 + _REUSE
_STAND_BY_SYNC_ROW = 3 + _REUSE
_WAITING_BEAT_ROW = 14 + _REUSE
_WAITING_SYNC_ROW = 15 + _REUSE
assert PATCHED_HARDENED.tables[Op.JOIN].rows[_STAND_BY_BEAT_ROW].then is Action.KEEP_ALIVE
assert PATCHED_HARDENED.tables[Op.JOIN].rows[_STAND_BY_SYNC_ROW].then is Action.SYNC
assert PATCHED_HARDENED.tables[Op.JOIN].rows[_WAITING_BEAT_ROW].then is Action.KEEP_ALIVE
assert PATCHED_HARDENED.tables[Op.JOIN].rows[_WAITING_SYNC_ROW].then is Action.SYNC

PATCHED_SCALE = PATCHED_HARDENED.derive(
    "scale",
    description=(
        "Hardened, with joins that do not contend and heartbeats outside the state: a "
        "node joining an open round adds itself to the round's announcement set (one "
        "conflict-free store operation) and waits; the node whose announcement reaches "
        "min_nodes or max_nodes (or any announcer that waited a keep-alive interval in "
        "vain) folds the whole set into the state in one write, and the last call ends "
        "with a fold too. Each node beats under its own key; in a complete round the "
        "first participant watches everybody listed (the other participants and the "
        "nodes standing by) and everybody listed watches it. A node whose join deadline "
        "passes while only announced takes its announcement back."
    ),
    heartbeats=KEY_BEATS,
    rows={
        (Op.JOIN, _STAND_BY_BEAT_ROW): row(
            "standby_beat",
            Atom.REDUNDANT,
            Atom.AT_MAX,
            Atom.BEAT_DUE,
            then=Action.BEAT,
            why="stay alive while waiting for room",
        ),
        (Op.JOIN, _WAITING_BEAT_ROW): row(
            "beat_while_waiting", Atom.BEAT_DUE, then=Action.BEAT, why="heartbeat due while waiting"
        ),
        (Op.KEEP_ALIVE, 0): row(
            "nothing_due",
            ~Atom.BEAT_DUE,
            ~Atom.WATCH_DUE,
            ~Atom.MONITORED_DEAD,
            then=Action.FINISH,
            why="nothing due, nobody dead",
        ),
        (Op.KEEP_ALIVE, 1): row(
            "deadline_passed",
            Atom.PAST_DEADLINE,
            then=Action.ERROR_TIMEOUT,
            why="could not keep up in time",
        ),
        (Op.KEEP_ALIVE, 2): row(
            "watch", Atom.WATCH_DUE, then=Action.WATCH, why="read the heartbeats we watch"
        ),
        (Op.JOIN, _LAST_CALL_ROW): row(
            "fold_and_complete_after_last_call",
            ~Atom.COMPLETE,
            Atom.PARTICIPANT,
            Atom.SIZE_IN_RANGE,
            Atom.LAST_CALL_OVER,
            then=Action.FOLD_AND_COMPLETE,
            why="last call over: admit the latecomers and complete",
        ),
        (Op.JOIN, _JOIN_OPEN_ROW): row(
            "announce",
            ~Atom.COMPLETE,
            ~Atom.PARTICIPANT,
            ~Atom.ANNOUNCED,
            then=Action.ANNOUNCE,
            why="the round is open: announce ourselves",
        ),
    },
    insert={
        (Op.JOIN, _NEWCOMER_SYNC_ROW): (
            row(
                "newcomer_watch",
                Atom.CLOSED,
                Atom.NEWCOMER,
                ~Atom.PAST_DEADLINE,
                Atom.WATCH_DUE,
                then=Action.WATCH,
                why="a new job: read the heartbeats of the closed job's nodes still listed",
            ),
            row(
                "newcomer_prune_dead",
                Atom.CLOSED,
                Atom.NEWCOMER,
                ~Atom.PAST_DEADLINE,
                Atom.MONITORED_DEAD,
                then=Action.PRUNE_DEAD,
                why="a node of the closed job is dead: prune it",
            ),
        ),
        (Op.JOIN, _STAND_BY_SYNC_ROW): (
            row(
                "standby_watch",
                Atom.REDUNDANT,
                Atom.AT_MAX,
                Atom.WATCH_DUE,
                then=Action.WATCH,
                why="standing by: read the first participant's heartbeat",
            ),
            row(
                "standby_prune_dead",
                Atom.REDUNDANT,
                Atom.AT_MAX,
                Atom.MONITORED_DEAD,
                then=Action.PRUNE_DEAD,
                why="the round we stand by for lost its first participant: prune it",
            ),
        ),
        (Op.JOIN, _GIVE_UP_ROW): row(
            "withdraw_announcement",
            Atom.PAST_DEADLINE,
            Atom.IN_ROLLBACK_WINDOW,
            Atom.IN_ANNOUNCEMENTS,
            then=Action.WITHDRAW,
            why="take our announcement back before giving up",
        ),
        (Op.JOIN, _JOIN_OPEN_ROW + 1): row(
            "fold_announcements",
            ~Atom.COMPLETE,
            ~Atom.PARTICIPANT,
            Atom.FOLD_DUE,
            then=Action.FOLD,
            why="admit everybody announced so far",
        ),
        (Op.JOIN, _WAITING_SYNC_ROW): (
            row(
                "wait_list_watch",
                Atom.COMPLETE,
                Atom.WAITING,
                Atom.WATCH_DUE,
                then=Action.WATCH,
                why="waiting: read the first participant's heartbeat",
            ),
            row(
                "wait_list_prune_dead",
                Atom.COMPLETE,
                Atom.WAITING,
                Atom.MONITORED_DEAD,
                then=Action.PRUNE_DEAD,
                why="the round we wait for lost its first participant: prune it",
            ),
        ),
        (Op.KEEP_ALIVE, 2): row(
            "beat", Atom.BEAT_DUE, then=Action.BEAT, why="write our heartbeat key"
        ),
        (Op.KEEP_ALIVE, 3): row(
            "prune_dead", then=Action.PRUNE_DEAD, why="a watched node is dead: prune it"
        ),
    },
    folds={
        Action.FOLD: fold_announced_clearing_wait_list,
        Action.FOLD_AND_COMPLETE: fold_and_complete_clearing_wait_list,
    },
)


@pytest.mark.parametrize(
    ("literal", "patched"), [(HARDENED, PATCHED_HARDENED), (SCALE, PATCHED_SCALE)]
)
def test_the_literal_tables_are_the_documented_diff_of_upstream(
    literal: Variant, patched: Variant
) -> None:
    assert {op: t.rows for op, t in patched.tables.items()} == {
        op: t.rows for op, t in literal.tables.items()
    }
    assert dict(patched.effects) == dict(literal.effects)
    assert dict(patched.folds) == dict(literal.folds)
    for switch in ("prune_marks_dirty", "counts_dropped_member", "rollback_window", "prune"):
        assert getattr(patched, switch) == getattr(literal, switch), switch
    assert (patched.liveness_clock, patched.heartbeats) == (
        literal.liveness_clock,
        literal.heartbeats,
    )
