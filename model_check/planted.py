"""Deliberately broken protocol variants: the checker must catch each of them.

Each is a :meth:`spec.Variant.derive` diff of ``upstream`` (or of ``hardened`` or ``scale``,
for the ones about their own rows and effects); none is a protocol anyone should run. The
``planted-old-*`` ones are ``hardened`` and ``scale`` as they were before a fix, kept so that
the counterexamples of docs/findings.md stay reproducible. The CLI accepts them as
``--protocol planted-...`` so a counterexample can be replayed from the command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from spec import (
    HARDENED,
    SCALE,
    UPSTREAM,
    Action,
    Atom,
    NodeId,
    Op,
    RendezvousState,
    Settings,
    Variant,
    row,
)
from spec.effects import (
    add_to_participants,
    fold_and_complete,
    fold_announced,
    mark_complete,
    remove_from_participants,
)
from spec.state import Millis


def _join_row(variant: Variant, name: str) -> tuple[Op, int]:
    """The derive key of ``variant``'s join row called ``name`` (found by its stable name,
    so that a reordered table moves the planted bug along with the row)."""
    return (Op.JOIN, variant.table(Op.JOIN).index(name))


def mark_complete_reversed(
    state: RendezvousState, node: NodeId, settings: Settings, wall_now: Millis
) -> RendezvousState:
    """Planted bug: ranks assigned in reverse sorted order."""
    members = state.participant_nodes()
    ranks = {m: len(members) - 1 - i for i, m in enumerate(members)}
    return state.evolve(complete=True, deadline=None, participants=ranks)


def remove_from_participants_no_epilogue(
    state: RendezvousState, node: NodeId, settings: Settings, wall_now: Millis
) -> RendezvousState:
    """Planted bug: leaving never runs the round epilogue (the round never advances)."""
    members = state.participant_map()
    members.pop(node, None)
    beats = state.heartbeat_map()
    beats.pop(node, None)
    return state.evolve(participants=members, last_heartbeats=beats)


_COMPLETION = _join_row(UPSTREAM, "complete_after_last_call")

IGNORES_MIN = UPSTREAM.derive(
    "planted-ignores-min",
    description=(
        "completion row without SIZE_IN_RANGE and LAST_CALL_OVER: a participant completes "
        "the round as soon as it sees it, below min_nodes"
    ),
    rows={
        _COMPLETION: row(
            "planted_complete_at_once",
            ~Atom.COMPLETE,
            Atom.PARTICIPANT,
            then=Action.MARK_RENDEZVOUS_COMPLETE,
            why="planted: completes without checking the size or the last call",
        ),
    },
)

NO_SIZE_GUARD = UPSTREAM.derive(
    "planted-no-size-guard",
    description=(
        "completion row without SIZE_IN_RANGE only (the last call still gates it); the "
        "checker finds no violation because the last-call deadline exists only while "
        "min_nodes <= participants, so this guard is redundant in upstream"
    ),
    rows={
        _COMPLETION: row(
            "planted_complete_any_size",
            ~Atom.COMPLETE,
            Atom.PARTICIPANT,
            Atom.LAST_CALL_OVER,
            then=Action.MARK_RENDEZVOUS_COMPLETE,
            why="planted: completes after the last call without checking the size",
        ),
    },
)

REVERSED_RANKS = UPSTREAM.derive(
    "planted-reversed-ranks",
    description="completion assigns ranks in reverse sorted order",
    effects={Action.MARK_RENDEZVOUS_COMPLETE: mark_complete_reversed},
)

NO_EPILOGUE = UPSTREAM.derive(
    "planted-no-epilogue",
    description=(
        "leaving a round never runs the epilogue: the last leaver does not open the next round"
    ),
    effects={Action.REMOVE_FROM_PARTICIPANTS: remove_from_participants_no_epilogue},
)


BUSY_KEEP_ALIVE = UPSTREAM.derive(
    "planted-busy-keep-alive",
    description=(
        "a participant of an open round refreshes its heartbeat instead of waiting: it "
        "writes the same state again and again without time passing (a livelock)"
    ),
    insert={
        _join_row(UPSTREAM, "wait"): row(
            "planted_busy_keep_alive",
            ~Atom.COMPLETE,
            Atom.PARTICIPANT,
            then=Action.KEEP_ALIVE,
            why="planted: never waits",
        ),
    },
)


NEVER_FINISHES = UPSTREAM.derive(
    "planted-never-finishes",
    description=(
        "a participant of a complete round keeps its heartbeat and waits instead of "
        "finishing: no next_rendezvous call ever returns, nor times out"
    ),
    insert={
        _join_row(UPSTREAM, "complete_with_us"): row(
            "planted_keep_alive_when_complete",
            Atom.COMPLETE,
            Atom.PARTICIPANT,
            Atom.HEARTBEAT_DUE,
            then=Action.KEEP_ALIVE,
            why="planted: stays alive in a complete round",
        ),
    },
    rows={
        _join_row(UPSTREAM, "complete_with_us"): row(
            "planted_wait_when_complete",
            Atom.COMPLETE,
            Atom.PARTICIPANT,
            then=Action.SYNC,
            why="planted: waits for a round that is already complete",
        ),
    },
)

NEVER_JOINS = UPSTREAM.derive(
    "planted-never-joins",
    description=(
        "the join row that adds a node to an open round is deleted: nobody ever becomes a "
        "participant, every call times out although enough nodes are calling"
    ),
    rows={_join_row(UPSTREAM, "join_open_round"): None},
)


def _standing_by_watch_rows() -> dict[tuple[Op, int], None]:
    names = ("standby_watch", "standby_prune_dead", "wait_list_watch", "wait_list_prune_dead")
    return {_join_row(SCALE, name): None for name in names}


UNWATCHED_STANDBY = SCALE.derive(
    "planted-unwatched-standby",
    description=(
        "scale without the rows by which a node standing by watches the first participant "
        "of the complete round it waits for (as scale was until they were added): a node "
        "standing by for a round whose members all died waits for it for ever, or until "
        "its deadline"
    ),
    rows=_standing_by_watch_rows(),
)

_OLD_EFFECTS = {
    Action.REMOVE_FROM_PARTICIPANTS: remove_from_participants,
    Action.MARK_RENDEZVOUS_COMPLETE: mark_complete,
    Action.ADD_TO_PARTICIPANTS: add_to_participants,
}

OLD_HARDENED = HARDENED.derive(
    "planted-old-hardened",
    description=(
        "hardened as it was before the agent-workload fixes (docs/findings.md, findings 6 "
        "and 7): a member that leaves a complete round leaves it complete with the others, "
        "and a round completes with whoever is still on its wait list"
    ),
    effects=_OLD_EFFECTS,
    counts_dropped_member=False,
)

OLD_SCALE = SCALE.derive(
    "planted-old-scale",
    description=(
        "scale as it was before the agent-workload fixes (docs/findings.md, findings 6 and "
        "7): leaving a complete round leaves it complete, and rounds complete (folds "
        "included) with whoever is still on the wait list"
    ),
    effects=_OLD_EFFECTS,
    folds={Action.FOLD: fold_announced, Action.FOLD_AND_COMPLETE: fold_and_complete},
    counts_dropped_member=False,
)

_KEEPS_WAITERS = {
    Action.MARK_RENDEZVOUS_COMPLETE: mark_complete,
    Action.ADD_TO_PARTICIPANTS: add_to_participants,
}

WAITERS_OUTLIVE_COMPLETION = HARDENED.derive(
    "planted-waiters-outlive-completion",
    description=(
        "hardened whose rounds complete with whoever is still on the wait list (finding 7's "
        "fix undone, the others kept): a surplus or dead waiter is counted by every member "
        "right after each round forms"
    ),
    effects=_KEEPS_WAITERS,
)

SCALE_WAITERS_OUTLIVE_COMPLETION = SCALE.derive(
    "planted-scale-waiters-outlive-completion",
    description=(
        "scale whose rounds (folds included) complete with whoever is still on the wait "
        "list (finding 7's fix undone, the others kept)"
    ),
    effects=_KEEPS_WAITERS,
    folds={Action.FOLD: fold_announced, Action.FOLD_AND_COMPLETE: fold_and_complete},
)

CROWD = 7
"""Participants from which :func:`mark_complete_crowded` misbehaves: more than exhaustive
search can hold (N <= 4 never has that many; at N = 8 with every fault the second round is
far deeper than breadth-first search gets, see docs/model_checker.md, "Swarm mode")."""


def mark_complete_crowded(
    state: RendezvousState, node: NodeId, settings: Settings, wall_now: Millis
) -> RendezvousState:
    """Planted bug: hardened's completion, except that a round after the first that
    completes with :data:`CROWD` or more participants gives its last member the rank of
    the one before it (two members share a rank; none has the top one)."""
    done = HARDENED.effects[Action.MARK_RENDEZVOUS_COMPLETE](state, node, settings, wall_now)
    members = done.participant_nodes()
    if done.round < 1 or len(members) < CROWD:
        return done
    ranks = done.participant_map()
    ranks[members[-1]] = ranks[members[-2]]
    return done.evolve(participants=ranks)


CROWDED_RANKS = HARDENED.derive(
    "planted-crowded-ranks",
    description=(
        f"hardened whose completion of a round after the first with {CROWD} or more "
        "participants gives two members the same rank: a bug only a run with many nodes "
        "and a second round can show (found by swarm mode at N = 8, out of exhaustive reach)"
    ),
    effects={Action.MARK_RENDEZVOUS_COMPLETE: mark_complete_crowded},
)

DROPPED_MEMBER_UNCOUNTED = HARDENED.derive(
    "planted-dropped-member-uncounted",
    description=(
        "hardened whose num_nodes_waiting() counts the wait list alone: a member whose "
        "round ended, and which a fast new round then dropped from the wait list, is "
        "never told"
    ),
    counts_dropped_member=False,
)


REOPEN_FORGETS_JOB = HARDENED.derive(
    "planted-reopen-forgets-job",
    description=(
        "hardened without the join row by which a node whose job closed the run fails "
        "once a new job has reopened it: a node of the closed job that was still joining "
        "when the run was reopened joins the new job's rounds"
    ),
    rows={_join_row(HARDENED, "later_job"): None},
)

REOPEN_UNDER_MEMBERS = HARDENED.derive(
    "planted-reopen-under-members",
    description=(
        "hardened whose newcomers reopen a closed run without waiting until nobody is "
        "listed in it: a new job starts while members of the closed one still train"
    ),
    rows={
        _join_row(HARDENED, "reopen_vacant_run"): row(
            "planted_reopen_under_members",
            Atom.CLOSED,
            Atom.NEWCOMER,
            then=Action.REOPEN,
            why="planted: reopen whoever is still listed",
        )
    },
)

PLANTED: Mapping[str, Variant] = MappingProxyType(
    {
        v.name: v
        for v in (
            IGNORES_MIN,
            NO_SIZE_GUARD,
            REVERSED_RANKS,
            NO_EPILOGUE,
            BUSY_KEEP_ALIVE,
            NEVER_FINISHES,
            NEVER_JOINS,
            UNWATCHED_STANDBY,
            OLD_HARDENED,
            OLD_SCALE,
            WAITERS_OUTLIVE_COMPLETION,
            SCALE_WAITERS_OUTLIVE_COMPLETION,
            DROPPED_MEMBER_UNCOUNTED,
            CROWDED_RANKS,
            REOPEN_FORGETS_JOB,
            REOPEN_UNDER_MEMBERS,
        )
    }
)
