"""Named invariants, shared by the model checker, the tests and the handler.

Two kinds:

- :class:`StateInvariant` holds of every shared state the protocol can produce;
- :class:`StepInvariant` holds of every write: (state before, state after).

Each check returns ``None`` when it holds, or a sentence saying what is wrong. Names are
stable: the checker reports violations by name.

Why "ranks are 0..W-1" is a step invariant: it holds at the moment a round completes.
Afterwards a member may exit or be pruned and the complete round legitimately keeps the
survivors' old ranks (a gap appears), so as a property of stored states it would be false.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from spec.settings import Settings
from spec.state import RendezvousState


@dataclass(frozen=True)
class StateInvariant:
    name: str
    doc: str
    check: Callable[[RendezvousState, Settings], str | None]


@dataclass(frozen=True)
class StepInvariant:
    name: str
    doc: str
    check: Callable[[RendezvousState, RendezvousState, Settings], str | None]


def _lists_disjoint(s: RendezvousState, _: Settings) -> str | None:
    groups = {
        "participants": set(s.participant_nodes()),
        "wait list": set(s.wait_list),
        "redundancy list": set(s.redundancy_list),
    }
    names = sorted(groups)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            both = sorted(groups[a] & groups[b])
            if both:
                return f"{', '.join(map(str, both))} in both the {a} and the {b}"
    return None


def _participants_within_max(s: RendezvousState, settings: Settings) -> str | None:
    if s.num_participants > settings.max_nodes:
        return f"{s.num_participants} participants exceed max_nodes ({settings.max_nodes})"
    return None


def _complete_ranks_distinct(s: RendezvousState, _: Settings) -> str | None:
    if not s.complete:
        return None
    ranks = [r for _, r in s.participants]
    if len(set(ranks)) != len(ranks):
        return f"a complete round has duplicate ranks {sorted(ranks)}"
    order = [n for n, _ in sorted(s.participants, key=lambda p: p[1])]
    if order != sorted(order):
        return "ranks of a complete round are not in sorted node order"
    return None


def _listed_nodes_have_heartbeats(s: RendezvousState, _: Settings) -> str | None:
    beats = s.heartbeat_map()
    listed = (*s.participant_nodes(), *s.wait_list, *s.redundancy_list)
    missing = sorted(n for n in listed if n not in beats)
    if missing:
        return f"{', '.join(map(str, missing))} listed without a heartbeat"
    return None


def _open_round_has_no_ranks(s: RendezvousState, _: Settings) -> str | None:
    if s.complete:
        return None
    ranked = sorted(n for n, r in s.participants if r != 0)
    if ranked:
        return f"open round, yet {', '.join(map(str, ranked))} already hold ranks"
    return None


STATE_INVARIANTS: tuple[StateInvariant, ...] = (
    StateInvariant(
        "lists_disjoint",
        "no node is in two of participants / wait list / redundancy list",
        _lists_disjoint,
    ),
    StateInvariant(
        "participants_within_max",
        "there are never more participants than max_nodes",
        _participants_within_max,
    ),
    StateInvariant(
        "complete_ranks_distinct",
        "in a complete round ranks are distinct and follow sorted node order",
        _complete_ranks_distinct,
    ),
    StateInvariant(
        "listed_nodes_have_heartbeats",
        "every participant, waiting and redundant node has a heartbeat",
        _listed_nodes_have_heartbeats,
    ),
    StateInvariant(
        "open_round_has_no_ranks",
        "ranks are only assigned when a round completes",
        _open_round_has_no_ranks,
    ),
)


def _closed_reopens_empty(b: RendezvousState, a: RendezvousState, _: Settings) -> str | None:
    if a.epoch != b.epoch and not (b.closed and not a.closed):
        return f"the epoch changed from {b.epoch} to {a.epoch} without a reopen"
    if b.closed and not a.closed:
        fresh = RendezvousState(round=a.round, epoch=b.epoch + 1)
        if a.round <= b.round or a != fresh:
            return (
                "a closed rendezvous was reopened other than as the next round, empty "
                f"(round {b.round} closed, then {a.describe()})"
            )
    return None


def _round_never_decreases(b: RendezvousState, a: RendezvousState, _: Settings) -> str | None:
    if a.round < b.round:
        return f"the round went back from {b.round} to {a.round}"
    return None


def _completion_assigns_ranks(
    b: RendezvousState, a: RendezvousState, settings: Settings
) -> str | None:
    completed = a.complete and (not b.complete or a.round != b.round)
    if not completed:
        return None
    w = a.num_participants
    ranks = [r for _, r in a.participants]  # in sorted node order
    if ranks != list(range(w)):
        return f"round {a.round} completed with ranks {ranks} in sorted node order, not 0..{w - 1}"
    if not settings.min_nodes <= w <= settings.max_nodes:
        return (
            f"round {a.round} completed with {w} participants, outside "
            f"[{settings.min_nodes}, {settings.max_nodes}]"
        )
    return None


def _complete_membership_frozen(b: RendezvousState, a: RendezvousState, _: Settings) -> str | None:
    if not (b.complete and a.complete and a.round == b.round):
        return None
    before = dict(b.participants)
    for node, rank in a.participants:
        if node not in before:
            return f"{node} was added to round {a.round} after it completed"
        if before[node] != rank:
            old = before[node]
            return f"{node}'s rank in complete round {a.round} changed from {old} to {rank}"
    return None


STEP_INVARIANTS: tuple[StepInvariant, ...] = (
    StepInvariant(
        "closed_reopens_empty",
        "once closed, the rendezvous stays closed, or a new job reopens it as a later round, empty",
        _closed_reopens_empty,
    ),
    StepInvariant(
        "round_never_decreases", "the round number never goes down", _round_never_decreases
    ),
    StepInvariant(
        "completion_assigns_ranks",
        "a round completes with ranks 0..W-1 in sorted node order and min <= W <= max",
        _completion_assigns_ranks,
    ),
    StepInvariant(
        "complete_membership_frozen",
        "a complete round only loses members: none joins it and no rank changes",
        _complete_membership_frozen,
    ),
)


def check_state(state: RendezvousState, settings: Settings) -> list[tuple[str, str]]:
    """All violated state invariants, as (name, explanation), in table order."""
    out = []
    for inv in STATE_INVARIANTS:
        problem = inv.check(state, settings)
        if problem is not None:
            out.append((inv.name, problem))
    return out


def check_step(
    before: RendezvousState, after: RendezvousState, settings: Settings
) -> list[tuple[str, str]]:
    """All violated step invariants and state invariants of ``after``."""
    out = []
    for inv in STEP_INVARIANTS:
        problem = inv.check(before, after, settings)
        if problem is not None:
            out.append((inv.name, problem))
    return out + check_state(after, settings)
