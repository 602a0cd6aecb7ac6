"""Protocol variants: a variant is the tables, the effects and a few switches.

A new variant is a small, named diff of an existing one (:meth:`Variant.derive`): replace
a row, swap an effect, flip a switch. ``hardened`` and ``scale`` give their own tables
whole, spelled out row by row in :mod:`spec.tables`; that they are upstream with the diff
docs/protocol.md documents is a test (tests/test_spec_variants.py).

Every consumer (the node machine, the model checker,
the real handler, the diagrams) takes a variant, so a variant is one value, never a
second implementation.

Switches:

``prune_marks_dirty``
    Whether pruning a dead *participant* during sanitize makes the node write the pruned
    state back on its next sync even if its own action does not mutate anything. The
    reference port does (the seed sets its dirty flag); PyTorch 2.13's module does not
    (the pruned copy is only written along with the node's next mutation). ``upstream``
    follows the seed; ``torch-2.13`` flips it. Pruning wait-list or redundant nodes
    alone never marks the state dirty in either.

``rollback_window``
    How long after its join deadline a node may still withdraw from the participants
    or the wait list before it reports the timeout (5 s in the reference).

``liveness_clock``
    ``"wall"`` (the reference): a heartbeat expires, and the last call ends, when the
    time written in the state is far enough behind *this* node's wall clock. ``"local"``:
    a node measures, on its own monotonic clock, how long it has seen a heartbeat value
    (or a last-call deadline) stand unchanged; the values written are only change
    markers. No two machines' clocks are ever compared; only their rates are assumed
    to agree within a small bound.

``heartbeats``
    ``"state"`` (the reference): a heartbeat is a time written into the shared state by
    a compare-and-set of the whole state, and every node observes every heartbeat on
    every read. ``"keys"``: each node writes its heartbeat under its own key (no
    compare-and-set, no conflict) and the state's heartbeat entries only record when a
    node was listed; a node listed in a complete round watches a few heartbeat keys
    (the first participant in sorted order watches everybody else listed, participants
    and nodes standing by on the wait or redundancy list; each of them watches it) on
    its own monotonic clock, and prunes a watched node whose heartbeat stood still past
    the expiry. Nodes of open rounds are not watched: a dead one is found once its
    round completes. Requires ``liveness_clock="local"``.

``counts_dropped_member``
    Whether a member's ``num_nodes_waiting()`` counts the member itself once the round it
    joined no longer holds it (the round ended, or the member was dropped from it). torch's
    agent learns that its round is over only from a count above 0; counted among the
    nodes waiting, it re-rendezvouses even when a fast new round completed without it
    and left nobody else waiting. The reference counts the wait list alone.

``prune``
    Removes the expired nodes (:func:`spec.effects.prune`, or the hardened
    :func:`spec.effects.prune_ending_broken_rounds`).

Effects compose as in the reference: ``add_to_participants`` completes the round itself
when it reaches ``max_nodes`` (one write, not two), by calling
:func:`spec.effects.mark_complete` directly. A variant that changes how rounds complete
must therefore replace both effects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from spec.codec import MAX_PROTOCOL_LEN, valid_protocol
from spec.effects import (
    UPSTREAM_EFFECTS,
    Effect,
    Fold,
    Sanitized,
    add_to_participants_clearing_wait_list,
    expired_by_wall,
    fold_and_complete_clearing_wait_list,
    fold_announced_clearing_wait_list,
    leave_ending_round,
    mark_complete_clearing_wait_list,
    prune,
    prune_ending_broken_rounds,
)
from spec.settings import SECOND, Settings
from spec.state import Millis, NodeId, RendezvousState
from spec.tables import (
    HARDENED_EXIT,
    HARDENED_JOIN,
    QUERY,
    SCALE_JOIN,
    SCALE_KEEP_ALIVE,
    UPSTREAM_CLOSE,
    UPSTREAM_EXIT,
    UPSTREAM_JOIN,
    UPSTREAM_KEEP_ALIVE,
    Atom,
    Row,
    Table,
)
from spec.vocabulary import Action, Op

Pruner = Callable[[RendezvousState, tuple[NodeId, ...], Settings], Sanitized]
"""Removes the given expired nodes from a freshly read state (see :func:`spec.effects.prune`)."""

WALL = "wall"
LOCAL = "local"
STATE_BEATS = "state"
KEY_BEATS = "keys"


@dataclass(frozen=True, eq=False)
class Variant:
    """One complete protocol: its tables, effects and switches."""

    name: str
    description: str
    tables: Mapping[Op, Table]
    effects: Mapping[Action, Effect]
    prune_marks_dirty: bool = True
    counts_dropped_member: bool = False
    """See the module docstring."""
    rollback_window: Millis = 5 * SECOND
    prune: Pruner = prune
    """Removes expired nodes from every state a node reads or gets back from a write."""
    liveness_clock: str = WALL
    """How a node decides that another node's heartbeat and the last call are over:
    ``"wall"`` compares the times written in the state with its own wall clock (the
    reference); ``"local"`` measures, on its own monotonic clock, how long a value has
    stood unchanged since it first saw it, so no two machines' clocks are compared."""
    heartbeats: str = STATE_BEATS
    """Where heartbeats live: ``"state"`` (inside the shared state) or ``"keys"`` (one
    key per node, watched by a few others; see the module docstring)."""
    folds: Mapping[Action, Fold] = field(default_factory=lambda: MappingProxyType({}))
    """The fold of each folding action (announcing variants; see :attr:`Action.folds`)."""
    parent: str | None = None
    changes: tuple[str, ...] = field(default=())
    """Human-readable list of what differs from ``parent``."""

    def __post_init__(self) -> None:
        if not valid_protocol(self.name):
            raise ValueError(
                f"variant name {self.name!r} cannot be recorded in the shared state (every "
                f"state names the protocol that wrote it): use 1 to {MAX_PROTOCOL_LEN} "
                f"printable ASCII characters without spaces, e.g. 'hardened-fix'"
            )
        if self.liveness_clock not in (WALL, LOCAL):
            raise ValueError(
                f"variant {self.name!r}: liveness_clock must be {WALL!r} or {LOCAL!r}, "
                f"got {self.liveness_clock!r}"
            )
        if self.heartbeats not in (STATE_BEATS, KEY_BEATS):
            raise ValueError(
                f"variant {self.name!r}: heartbeats must be {STATE_BEATS!r} or "
                f"{KEY_BEATS!r}, got {self.heartbeats!r}"
            )
        if self.heartbeats == KEY_BEATS and self.liveness_clock != LOCAL:
            raise ValueError(
                f"variant {self.name!r}: heartbeats under keys are watched on the local "
                f"liveness clock; set liveness_clock={LOCAL!r}"
            )
        missing = [op.value for op in Op if op not in self.tables]
        if missing:
            raise ValueError(f"variant {self.name!r} has no table for {missing}")
        for op, table in self.tables.items():
            if table.op is not op:
                raise ValueError(f"variant {self.name!r}: table for {op} is for {table.op}")
            for r in table.rows:
                if r.then.folds:
                    if r.then not in self.folds:
                        raise ValueError(
                            f"variant {self.name!r}: action {r.then.value} has no fold"
                        )
                elif r.then is Action.PRUNE_DEAD:
                    continue  # its effect is the variant's prune
                elif r.then.mutates and r.then not in self.effects:
                    raise ValueError(f"variant {self.name!r}: action {r.then.value} has no effect")

    def table(self, op: Op) -> Table:
        return self.tables[op]

    @cached_property
    def announces(self) -> bool:
        """True when some guard looks at announcements (the node announces and folds).
        Computed once: the tables of a variant never change."""
        return any(
            lit.atom in (Atom.ANNOUNCED, Atom.FOLD_DUE)
            for table in self.tables.values()
            for r in table.rows
            for lit in r.when
        )

    @cached_property
    def reopens(self) -> bool:
        """True when a new job may reopen a closed run (some row reopens it): nodes then
        track their standing towards their job (``spec.machine.Local.job``) and leave
        the run at shutdown."""
        return any(r.then is Action.REOPEN for table in self.tables.values() for r in table.rows)

    def sanitize_by_wall(
        self, state: RendezvousState, settings: Settings, wall_now: Millis
    ) -> Sanitized:
        """This variant's pruning of the nodes expired by the wall clock ``wall_now``."""
        return self.prune(state, expired_by_wall(state, settings, wall_now), settings)

    def derive(
        self,
        name: str,
        *,
        description: str,
        tables: Mapping[Op, Table] | None = None,
        rows: Mapping[tuple[Op, int], Row | None] | None = None,
        insert: Mapping[tuple[Op, int], Row | tuple[Row, ...]] | None = None,
        effects: Mapping[Action, Effect] | None = None,
        folds: Mapping[Action, Fold] | None = None,
        prune_marks_dirty: bool | None = None,
        counts_dropped_member: bool | None = None,
        rollback_window: Millis | None = None,
        prune: Pruner | None = None,
        liveness_clock: str | None = None,
        heartbeats: str | None = None,
    ) -> Variant:
        """A new variant that differs from this one only as listed.

        ``tables`` replaces whole tables (the named variants give their own tables this
        way, spelled out in :mod:`spec.tables`); the change list names the rows added and
        removed. Then ``rows`` replaces the row at (op, index) (``None`` deletes it);
        ``insert`` puts a row, or several rows in the order given, before (op, index);
        indices refer to this variant's tables (``tests/test_spec_variants.py`` checks
        that ``hardened`` and ``scale`` are upstream with such a patch, as documented).
        """
        changes: list[str] = []
        new_tables = dict(self.tables)
        for op, table in sorted((tables or {}).items(), key=lambda kv: kv[0].value):
            changes.extend(_table_changes(self.tables[op], table))
            new_tables[op] = table
        tables = new_tables
        for (op, index), limit in [(k, 0) for k in rows or {}] + [(k, 1) for k in insert or {}]:
            size = len(tables[op].rows)
            if not 0 <= index < size + limit:
                raise ValueError(
                    f"variant {name!r}: the {op.value} table of {self.name!r} has rows "
                    f"0..{size - 1}; row index {index} is out of range (use an existing "
                    f"row, or {size} with insert= to append)"
                )
        touched = {op for op, _ in (rows or {})} | {op for op, _ in (insert or {})}
        for op in sorted(touched, key=lambda o: o.value):
            old = list(tables[op].rows)
            new: list[Row] = []
            for index, current in enumerate(old):
                for added in _inserted(insert, op, index):
                    new.append(added)
                    changes.append(f"{op.value}: insert before row {index}: {_fmt(added)}")
                replacement = (rows or {}).get((op, index), current)
                if (op, index) in (rows or {}):
                    if replacement is None:
                        changes.append(f"{op.value}: delete row {index}: {_fmt(current)}")
                        continue
                    changes.append(
                        f"{op.value}: row {index}: {_fmt(current)} -> {_fmt(replacement)}"
                    )
                assert replacement is not None
                new.append(replacement)
            for added in _inserted(insert, op, len(old)):
                new.append(added)
                changes.append(f"{op.value}: append {_fmt(added)}")
            tables[op] = Table(op, tuple(new))
        new_effects = dict(self.effects)
        for action, effect in sorted((effects or {}).items(), key=lambda kv: kv[0].value):
            new_effects[action] = effect
            changes.append(f"effect of {action.value}: {effect.__name__}")
        new_folds = dict(self.folds)
        for action, fold in sorted((folds or {}).items(), key=lambda kv: kv[0].value):
            new_folds[action] = fold
            changes.append(f"fold of {action.value}: {fold.__name__}")
        if prune_marks_dirty is not None and prune_marks_dirty != self.prune_marks_dirty:
            changes.append(f"prune_marks_dirty: {self.prune_marks_dirty} -> {prune_marks_dirty}")
        if counts_dropped_member is not None and (
            counts_dropped_member != self.counts_dropped_member
        ):
            changes.append(
                f"counts_dropped_member: {self.counts_dropped_member} -> {counts_dropped_member}"
            )
        if rollback_window is not None and rollback_window != self.rollback_window:
            changes.append(f"rollback_window: {self.rollback_window} -> {rollback_window} ms")
        if prune is not None and prune is not self.prune:
            changes.append(f"prune: {self.prune.__name__} -> {prune.__name__}")
        if liveness_clock is not None and liveness_clock != self.liveness_clock:
            changes.append(f"liveness_clock: {self.liveness_clock} -> {liveness_clock}")
        if heartbeats is not None and heartbeats != self.heartbeats:
            changes.append(f"heartbeats: {self.heartbeats} -> {heartbeats}")
        return Variant(
            name=name,
            description=description,
            tables=MappingProxyType(tables),
            effects=MappingProxyType(new_effects),
            folds=MappingProxyType(new_folds),
            prune_marks_dirty=(
                self.prune_marks_dirty if prune_marks_dirty is None else prune_marks_dirty
            ),
            counts_dropped_member=(
                self.counts_dropped_member
                if counts_dropped_member is None
                else counts_dropped_member
            ),
            rollback_window=self.rollback_window if rollback_window is None else rollback_window,
            prune=self.prune if prune is None else prune,
            liveness_clock=self.liveness_clock if liveness_clock is None else liveness_clock,
            heartbeats=self.heartbeats if heartbeats is None else heartbeats,
            parent=self.name,
            changes=tuple(changes),
        )


def _fmt(r: Row) -> str:
    return f"[{r.guard_text()} -> {r.then.value}]"


def _table_changes(old: Table, new: Table) -> list[str]:
    """What replacing ``old`` by ``new`` changes, by row name."""
    if old.rows == new.rows:
        return []
    op = new.op.value
    before = {r.name: r for r in old.rows}
    after = {r.name: r for r in new.rows}
    out = [f"{op}: remove {name} {_fmt(r)}" for name, r in before.items() if name not in after]
    for index, r in enumerate(new.rows):
        if r.name not in before:
            where = next((n.name for n in new.rows[index + 1 :] if n.name in before), None)
            place = f"before {where}" if where else "at the end"
            out.append(f"{op}: add {r.name} {_fmt(r)} {place}")
    kept = [n for n in after if n in before]
    if kept != [n for n in before if n in after]:
        out.append(f"{op}: rows reordered")
    return out


def _inserted(
    insert: Mapping[tuple[Op, int], Row | tuple[Row, ...]] | None, op: Op, index: int
) -> tuple[Row, ...]:
    """The rows ``insert`` puts before (op, index), in order (none if it puts none)."""
    added = (insert or {}).get((op, index), ())
    return (added,) if isinstance(added, Row) else added


UPSTREAM = Variant(
    name="upstream",
    description="Faithful to PyTorch 2.13's dynamic rendezvous (the reference port).",
    tables=MappingProxyType(
        {
            Op.EXIT: UPSTREAM_EXIT,
            Op.JOIN: UPSTREAM_JOIN,
            Op.CLOSE: UPSTREAM_CLOSE,
            Op.KEEP_ALIVE: UPSTREAM_KEEP_ALIVE,
            Op.QUERY: QUERY,
        }
    ),
    effects=UPSTREAM_EFFECTS,
    prune_marks_dirty=True,
)

TORCH_213 = UPSTREAM.derive(
    "torch-2.13",
    description=(
        "As upstream, but pruning a dead participant does not by itself write the state "
        "back (PyTorch 2.13's sanitize leaves its dirty flag alone)."
    ),
    prune_marks_dirty=False,
)

HARDENED_EFFECTS: Mapping[Action, Effect] = MappingProxyType(
    {
        Action.REMOVE_FROM_PARTICIPANTS: leave_ending_round,
        Action.MARK_RENDEZVOUS_COMPLETE: mark_complete_clearing_wait_list,
        Action.ADD_TO_PARTICIPANTS: add_to_participants_clearing_wait_list,
    }
)
"""What ``hardened`` changes in upstream's effects: leaving a complete round ends it, and
a round completes with an empty wait list (see the effects' docstrings)."""

HARDENED = UPSTREAM.derive(
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
    tables={Op.EXIT: HARDENED_EXIT, Op.JOIN: HARDENED_JOIN},
    effects=HARDENED_EFFECTS,
    counts_dropped_member=True,
    prune=prune_ending_broken_rounds,
    liveness_clock=LOCAL,
)


SCALE = HARDENED.derive(
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
    tables={Op.JOIN: SCALE_JOIN, Op.KEEP_ALIVE: SCALE_KEEP_ALIVE},
    folds={
        Action.FOLD: fold_announced_clearing_wait_list,
        Action.FOLD_AND_COMPLETE: fold_and_complete_clearing_wait_list,
    },
)

VARIANTS: Mapping[str, Variant] = MappingProxyType(
    {v.name: v for v in (UPSTREAM, TORCH_213, HARDENED, SCALE)}
)
"""Every named variant, by name."""


DEFAULT_PROTOCOL = "scale"
"""The variant rdzv's handler runs unless told otherwise: ``scale``, which has every
guarantee of ``hardened`` and joins and beats without contention (one compare-and-set per
round, heartbeats under per-node keys), so it reaches 1,024 nodes where ``hardened`` does not
(docs/benchmarks.md). It needs a backend that keeps announcement sets and heartbeat keys
(every rdzv store) and a state that never expires; where either is missing, the handler
falls back to ``rdzv.api.FALLBACK_PROTOCOL`` (``rdzv.handler.default_variant``). It lives
here, not in ``rdzv``, so that the model checker can name it without importing the handler
(and, through it, torch)."""


def get_variant(name: str) -> Variant:
    """The variant called ``name``; a ``ValueError`` lists the known names otherwise."""
    try:
        return VARIANTS[name]
    except KeyError:
        known = ", ".join(sorted(VARIANTS))
        raise ValueError(f"unknown protocol variant {name!r}; choose one of: {known}") from None
