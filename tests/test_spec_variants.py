"""Variants: small named diffs of the reference protocol."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from spec.codec import encode
from spec.effects import UPSTREAM_EFFECTS, Effect, keep_alive
from spec.machine import Config, Fail, Local, Now, ReadResult, StartOp, step
from spec.settings import Settings
from spec.state import NodeId, RendezvousState
from spec.tables import Atom, Table, row
from spec.variants import (
    HARDENED,
    HARDENED_EFFECTS,
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
        "exit: insert before row 0: [closed and waiting and not past_deadline -> "
        "remove_from_wait_list]",
        "exit: insert before row 0: [closed and redundant and not past_deadline -> "
        "remove_from_redundancy_list]",
        "join: insert before row 0: [later_job -> error_closed]",
        "join: insert before row 0: [closed and newcomer and vacant -> reopen]",
        "join: insert before row 0: [closed and newcomer and not past_deadline -> sync]",
        "join: insert before row 6: [past_deadline and not complete and participant and "
        "size_in_range -> mark_rendezvous_complete]",
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
