"""The decision tables: every rule of the protocol lives here.

Theory of operation. A node runs one *operation* at a time (exit, join, close,
keep-alive, query). Each time its view of the shared state changes, it looks the
situation up in the operation's table: the rows are read top to bottom and the first row
whose guard holds gives the *action* (mutate the state, wait, finish or fail). A guard is
a conjunction of *literals*: named atomic predicates over the context, each possibly
negated. The tables are closed-world: a situation no row covers is an error
(:class:`NoRowMatches`), never a silent default, and every table here ends in a row that
always matches.

Rules of this module:
- it never reads a clock: ``mono_now`` and ``wall_now`` arrive in the :class:`Context`;
- no rule is hidden in code: the atoms are one-line predicates, the row order is the
  decision order, and tools (diagrams, z3, tests) read the same rows the node executes.

The ``UPSTREAM_*`` tables reproduce PyTorch's dynamic rendezvous decisions (the
reference port in ``shared/seed``): its if/else chains, flattened row by row.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass

from spec.settings import Settings
from spec.state import Millis, NodeId, RendezvousState
from spec.vocabulary import Action, Op


@dataclass(frozen=True)
class Context:
    """Everything a guard may look at."""

    node: NodeId
    state: RendezvousState
    settings: Settings
    mono_now: Millis
    """The node's monotonic clock (op deadlines are on this clock)."""
    wall_now: Millis
    """The node's wall clock (heartbeats and the last-call deadline are on this clock)."""
    op_deadline: Millis
    """Monotonic instant after which the running operation has timed out."""
    rollback_window: Millis
    """After the op deadline, how long a joining node may still undo its membership."""
    last_call_age: Millis | None = None
    """Local liveness clock only: how long this node has seen the current last-call
    deadline (on its monotonic clock). None under the wall clock, or with no last call."""
    announce_size: int | None = None
    """Announcing variants only: the size of the current round's announcement set that
    this node's own announcement returned; None if it has not announced in this round."""
    announce_age: Millis | None = None
    """Announcing variants only: monotonic time since this node announced in this round."""
    announce_before: int | None = None
    """Announcing variants only: when this node's latest announcement in this round renewed
    an earlier one, the set size that earlier announcement returned; None for a first
    announcement."""
    beat_age: Millis | None = None
    """Heartbeat keys only: monotonic time since this node last wrote its heartbeat key
    (None: never)."""
    watch_age: Millis | None = None
    """Heartbeat keys only: monotonic time since this node last read the heartbeat keys
    of the nodes it monitors (None: never)."""
    job_offset: int = 0
    """The state's epoch minus the epoch of the job this node belongs to
    (``spec.machine.Local.job``): below 0, the state is the closed run of an earlier job
    (this node is a newcomer); above 0, a later job has reopened the run (this node's
    own job was closed); 0 otherwise, and whenever the variant does not track jobs."""
    dead: tuple[NodeId, ...] = ()
    """Heartbeat keys only: monitored nodes, still listed in the state, whose heartbeat
    this node has watched stand still for longer than the expiry."""


class Atom(enum.Enum):
    """A named atomic predicate over a :class:`Context`."""

    CLOSED = "closed"
    COMPLETE = "complete"
    PARTICIPANT = "participant"
    WAITING = "waiting"
    REDUNDANT = "redundant"
    AT_MAX = "at_max"
    BELOW_MAX = "below_max"
    SIZE_IN_RANGE = "size_in_range"
    LAST_CALL_OVER = "last_call_over"
    PAST_DEADLINE = "past_deadline"
    IN_ROLLBACK_WINDOW = "in_rollback_window"
    HEARTBEAT_DUE = "heartbeat_due"
    ANNOUNCED = "announced"
    IN_ANNOUNCEMENTS = "in_announcements"
    FOLD_DUE = "fold_due"
    BEAT_DUE = "beat_due"
    WATCH_DUE = "watch_due"
    MONITORED_DEAD = "monitored_dead"
    NEWCOMER = "newcomer"
    LATER_JOB = "later_job"
    VACANT = "vacant"

    def __invert__(self) -> Literal:
        return Literal(self, False)

    @property
    def doc(self) -> str:
        """The predicate's meaning, for diagrams and docs."""
        return ATOM_DOCS[self]

    def holds(self, ctx: Context) -> bool:
        return ATOM_PREDICATES[self](ctx)


def _heartbeat_due(ctx: Context) -> bool:
    beat = ctx.state.heartbeat_of(ctx.node)
    return beat is not None and beat <= ctx.wall_now - ctx.settings.keep_alive_interval


def _last_call_over(ctx: Context) -> bool:
    deadline = ctx.state.deadline
    if deadline is None:
        return False
    if ctx.last_call_age is not None:
        # Local liveness clock: this node has itself watched a whole last call go by.
        return ctx.last_call_age > ctx.settings.last_call_timeout
    return deadline < ctx.wall_now


def _announced(ctx: Context) -> bool:
    age = ctx.announce_age
    fresh = age is not None and age <= ctx.settings.keep_alive_interval
    return ctx.announce_size is not None and fresh


def _fold_due(ctx: Context) -> bool:
    size = ctx.announce_size
    if size is None or not _announced(ctx):
        return False
    settings = ctx.settings
    before = ctx.announce_before
    if size >= settings.max_nodes and (before is None or before >= settings.max_nodes):
        # This announcement filled the round; or it renews one that already found the
        # round full an interval ago, and nobody has folded since (the filler crashed).
        return True
    # Enough announced to start the last call, and nobody folded yet: as above, a renewal
    # folds only if its earlier announcement had already found enough. A renewal that
    # merely finds a threshold reached leaves the fold to whoever reached it, so that
    # renewals during a long round do not all fold at once (each but one a lost write).
    if size >= settings.min_nodes and ctx.state.num_participants < settings.min_nodes:
        return before is None or before >= settings.min_nodes
    return False


def _beat_due(ctx: Context) -> bool:
    return ctx.state.is_listed(ctx.node) and (
        ctx.beat_age is None or ctx.beat_age >= ctx.settings.keep_alive_interval
    )


def _watch_due(ctx: Context) -> bool:
    listed = ctx.state.is_listed(ctx.node)
    member = ctx.state.complete and listed
    # A newcomer at a closed run watches whoever is still listed in it (machine.watched).
    if not (member or (ctx.state.closed and ctx.job_offset < 0 and not listed)):
        return False
    return ctx.watch_age is None or ctx.watch_age >= ctx.settings.keep_alive_interval


ATOM_PREDICATES: dict[Atom, Callable[[Context], bool]] = {
    Atom.CLOSED: lambda c: c.state.closed,
    Atom.COMPLETE: lambda c: c.state.complete,
    Atom.PARTICIPANT: lambda c: c.state.is_participant(c.node),
    Atom.WAITING: lambda c: c.state.is_waiting(c.node),
    Atom.REDUNDANT: lambda c: c.state.is_redundant(c.node),
    Atom.AT_MAX: lambda c: c.state.num_participants == c.settings.max_nodes,
    Atom.BELOW_MAX: lambda c: c.state.num_participants < c.settings.max_nodes,
    Atom.SIZE_IN_RANGE: lambda c: (
        c.settings.min_nodes <= c.state.num_participants <= c.settings.max_nodes
    ),
    Atom.LAST_CALL_OVER: _last_call_over,
    Atom.PAST_DEADLINE: lambda c: c.mono_now > c.op_deadline,
    Atom.IN_ROLLBACK_WINDOW: lambda c: c.mono_now <= c.op_deadline + c.rollback_window,
    Atom.HEARTBEAT_DUE: _heartbeat_due,
    Atom.ANNOUNCED: _announced,
    Atom.IN_ANNOUNCEMENTS: lambda c: c.announce_size is not None,
    Atom.FOLD_DUE: _fold_due,
    Atom.BEAT_DUE: _beat_due,
    Atom.WATCH_DUE: _watch_due,
    Atom.MONITORED_DEAD: lambda c: bool(c.dead),
    Atom.NEWCOMER: lambda c: c.job_offset < 0,
    Atom.LATER_JOB: lambda c: c.job_offset > 0,
    Atom.VACANT: lambda c: (
        not (c.state.participants or c.state.wait_list or c.state.redundancy_list)
    ),
}

ATOM_DOCS: dict[Atom, str] = {
    Atom.CLOSED: "the rendezvous is closed",
    Atom.COMPLETE: "the current round is complete",
    Atom.PARTICIPANT: "this node is a participant of the current round",
    Atom.WAITING: "this node is on the wait list",
    Atom.REDUNDANT: "this node is on the redundancy list",
    Atom.AT_MAX: "participants == max_nodes",
    Atom.BELOW_MAX: "participants < max_nodes",
    Atom.SIZE_IN_RANGE: "min_nodes <= participants <= max_nodes",
    Atom.LAST_CALL_OVER: (
        "a last-call deadline is set and is earlier than this node's wall clock (local "
        "liveness clock: this node has seen it for longer than last_call_timeout)"
    ),
    Atom.PAST_DEADLINE: "this node's monotonic clock is past the operation's deadline",
    Atom.IN_ROLLBACK_WINDOW: "monotonic clock <= operation deadline + rollback window",
    Atom.HEARTBEAT_DUE: ("this node has a heartbeat and it is at least keep_alive_interval old"),
    Atom.ANNOUNCED: (
        "this node announced itself in the current round's announcement set at most "
        "keep_alive_interval ago (an older announcement is renewed, which returns the "
        "set's current size)"
    ),
    Atom.IN_ANNOUNCEMENTS: (
        "this node announced itself in the current round's announcement set (at any "
        "time) and has not taken the announcement back"
    ),
    Atom.FOLD_DUE: (
        "this node's announcement is fresh and should be folded: the set's size it got "
        "back reached max_nodes, or reached min_nodes while fewer are participants (for "
        "a renewal, only if the announcement it renews had already reached it)"
    ),
    Atom.BEAT_DUE: (
        "this node is listed and has not written its heartbeat key for keep_alive_interval"
    ),
    Atom.WATCH_DUE: (
        "this node is listed in a complete round (a participant, waiting or redundant), "
        "or is a newcomer at a closed run it is not listed in, and has not read the "
        "heartbeat keys it monitors for keep_alive_interval"
    ),
    Atom.MONITORED_DEAD: (
        "a node this node monitors, still listed, has shown the same heartbeat for longer "
        "than the expiry (on this node's monotonic clock)"
    ),
    Atom.NEWCOMER: (
        "the state is the closed run of an earlier job than this node's (the first state "
        "this node saw was closed: it belongs to the next job under the run id)"
    ),
    Atom.LATER_JOB: (
        "the state belongs to a later job than this node's: its own job closed the run "
        "and a new job has reopened it since"
    ),
    Atom.VACANT: "nobody is listed: no participant, no node waiting or standing by",
}


@dataclass(frozen=True)
class Literal:
    """An atom or its negation."""

    atom: Atom
    positive: bool = True

    def holds(self, ctx: Context) -> bool:
        return self.atom.holds(ctx) is self.positive

    def __str__(self) -> str:
        return self.atom.value if self.positive else f"not {self.atom.value}"


ROW_NAME = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
"""A row's name: a short snake_case identifier (``complete_at_min_on_deadline``)."""


@dataclass(frozen=True)
class Row:
    """One rule: when every literal holds (and no earlier row matched), do ``then``.

    ``name`` identifies the row within its table for good: traces, events, coverage,
    diagrams and docs report a row as ``<op>.<name>`` (:meth:`Table.qualified`), never by
    its position, which differs between variants. A row that several variants share keeps
    its name in all of them; a row whose guard or action changes gets a new one."""

    name: str
    when: tuple[Literal, ...]
    then: Action
    why: str = ""

    def __post_init__(self) -> None:
        if not ROW_NAME.fullmatch(self.name):
            raise ValueError(
                f"row name {self.name!r} is not a snake_case identifier (e.g. "
                f"'complete_at_min_on_deadline')"
            )

    def matches(self, ctx: Context) -> bool:
        return all(lit.holds(ctx) for lit in self.when)

    def guard_text(self) -> str:
        return " and ".join(str(lit) for lit in self.when) or "otherwise"


def row(name: str, *when: Atom | Literal, then: Action, why: str = "") -> Row:
    """Build the row called ``name``; bare atoms are positive literals."""
    lits = tuple(w if isinstance(w, Literal) else Literal(w) for w in when)
    return Row(name, lits, then, why)


class NoRowMatches(Exception):
    """A table has no row for a context: the table is not total (a specification bug)."""

    def __init__(self, op: Op, ctx: Context) -> None:
        super().__init__(f"no row of the {op.value} table matches: {ctx.state.describe()}")
        self.op = op
        self.ctx = ctx


@dataclass(frozen=True)
class Table:
    """An ordered, first-match-wins decision table for one operation."""

    op: Op
    rows: tuple[Row, ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for r in self.rows:
            if r.name in seen:
                raise ValueError(f"the {self.op.value} table has two rows named {r.name!r}")
            seen.add(r.name)

    def qualified(self, index: int) -> str:
        """The stable name of row ``index``: ``<op>.<name>``, e.g. ``join.timed_out``."""
        return f"{self.op.value}.{self.rows[index].name}"

    def index(self, name: str) -> int:
        """The position of the row called ``name`` (``<op>.`` in front is accepted)."""
        short = name.removeprefix(f"{self.op.value}.")
        for position, r in enumerate(self.rows):
            if r.name == short:
                return position
        known = ", ".join(r.name for r in self.rows)
        raise KeyError(f"the {self.op.value} table has no row {name!r}; its rows: {known}")

    def named(self, name: str) -> Row:
        """The row called ``name``."""
        return self.rows[self.index(name)]

    def select(self, ctx: Context) -> int:
        """Index of the first row whose guard holds."""
        for index, candidate in enumerate(self.rows):
            if candidate.matches(ctx):
                return index
        raise NoRowMatches(self.op, ctx)

    def decide(self, ctx: Context) -> Action:
        return self.rows[self.select(ctx)].then


# ---------------------------------------------------------------------------------------
# The reference protocol (PyTorch 2.13's dynamic rendezvous).
# ---------------------------------------------------------------------------------------
A = Atom
UPSTREAM_EXIT = Table(
    Op.EXIT,
    (
        row("nothing_to_leave", ~A.PARTICIPANT, then=Action.FINISH, why="nothing to leave"),
        row(
            "leave_round",
            ~A.PAST_DEADLINE,
            then=Action.REMOVE_FROM_PARTICIPANTS,
            why="leave the round",
        ),
        row("timed_out", then=Action.ERROR_TIMEOUT, why="could not leave before the deadline"),
    ),
)

UPSTREAM_JOIN = Table(
    Op.JOIN,
    (
        # A closed rendezvous: redundant nodes leave quietly, everybody else is told.
        row(
            "closed_while_redundant",
            A.CLOSED,
            A.REDUNDANT,
            then=Action.ERROR_GRACEFUL_EXIT,
            why="the job ended while this node was surplus",
        ),
        row("closed", A.CLOSED, then=Action.ERROR_CLOSED, why="no new rounds after a close"),
        # A surplus node waits while the round is full, and retries once it is not.
        row(
            "standby_keep_alive",
            A.REDUNDANT,
            A.AT_MAX,
            A.HEARTBEAT_DUE,
            then=Action.KEEP_ALIVE,
            why="stay alive while waiting for room",
        ),
        row("standby_wait", A.REDUNDANT, A.AT_MAX, then=Action.SYNC, why="the round is still full"),
        row(
            "standby_retry",
            A.REDUNDANT,
            then=Action.REMOVE_FROM_REDUNDANCY_LIST,
            why="room freed up: retry with a fresh join deadline",
        ),
        # Success.
        row(
            "complete_with_us",
            A.COMPLETE,
            A.PARTICIPANT,
            then=Action.FINISH,
            why="the round completed with us",
        ),
        # Past the join deadline: undo membership within the rollback window, then fail.
        row(
            "withdraw_participant",
            A.PAST_DEADLINE,
            A.IN_ROLLBACK_WINDOW,
            A.PARTICIPANT,
            then=Action.REMOVE_FROM_PARTICIPANTS,
            why="withdraw before giving up",
        ),
        row(
            "withdraw_from_wait_list",
            A.PAST_DEADLINE,
            A.IN_ROLLBACK_WINDOW,
            A.WAITING,
            then=Action.REMOVE_FROM_WAIT_LIST,
            why="withdraw before giving up",
        ),
        row(
            "timed_out", A.PAST_DEADLINE, then=Action.ERROR_TIMEOUT, why="the join deadline passed"
        ),
        # A complete round without us: wait for the next one, or stand by if it is full.
        row(
            "queue_for_next_round",
            A.COMPLETE,
            A.BELOW_MAX,
            ~A.WAITING,
            then=Action.ADD_TO_WAIT_LIST,
            why="late: queue for the next round",
        ),
        row(
            "stand_by",
            A.COMPLETE,
            ~A.BELOW_MAX,
            ~A.WAITING,
            then=Action.ADD_TO_REDUNDANCY_LIST,
            why="late and the round is full: stand by",
        ),
        # An open round: join it, and complete it once the last call is over.
        row(
            "complete_after_last_call",
            ~A.COMPLETE,
            A.PARTICIPANT,
            A.SIZE_IN_RANGE,
            A.LAST_CALL_OVER,
            then=Action.MARK_RENDEZVOUS_COMPLETE,
            why="last call over with enough nodes",
        ),
        row(
            "join_open_round",
            ~A.COMPLETE,
            ~A.PARTICIPANT,
            then=Action.ADD_TO_PARTICIPANTS,
            why="the round is open: join it",
        ),
        # Otherwise wait, keeping our heartbeat fresh.
        row(
            "keep_alive_while_waiting",
            A.HEARTBEAT_DUE,
            then=Action.KEEP_ALIVE,
            why="heartbeat due while waiting",
        ),
        row("wait", then=Action.SYNC, why="wait for the state to change"),
    ),
)

UPSTREAM_CLOSE = Table(
    Op.CLOSE,
    (
        row("already_closed", A.CLOSED, then=Action.FINISH, why="already closed"),
        row("timed_out", A.PAST_DEADLINE, then=Action.ERROR_TIMEOUT, why="could not close in time"),
        row("close", then=Action.MARK_RENDEZVOUS_CLOSED, why="close it"),
    ),
)

UPSTREAM_KEEP_ALIVE = Table(
    Op.KEEP_ALIVE,
    (
        row(
            "heartbeat_fresh",
            ~A.HEARTBEAT_DUE,
            then=Action.FINISH,
            why="heartbeat fresh (or not a member)",
        ),
        row(
            "refresh_heartbeat",
            ~A.PAST_DEADLINE,
            then=Action.KEEP_ALIVE,
            why="refresh the heartbeat",
        ),
        row("timed_out", then=Action.ERROR_TIMEOUT, why="could not refresh in time"),
    ),
)

QUERY = Table(
    Op.QUERY,
    (row("up_to_date", then=Action.FINISH, why="the view is up to date"),),
)

# ---------------------------------------------------------------------------------------
# The hardened and scale variants' own tables (spec.variants), spelled out row by row. A
# row they share with upstream (or scale with hardened) is repeated here with its name,
# guard, action and reason unchanged (tests/test_spec_tables.py checks that a name means
# one row in every variant), and tests/test_spec_variants.py checks that these tables are
# exactly upstream with the diff docs/protocol.md ("Variants") documents. Their close and
# query tables, and hardened's keep-alive table, are upstream's.
# ---------------------------------------------------------------------------------------
HARDENED_EXIT = Table(
    Op.EXIT,
    (
        row(
            "leave_closed_wait_list",
            A.CLOSED,
            A.WAITING,
            ~A.PAST_DEADLINE,
            then=Action.REMOVE_FROM_WAIT_LIST,
            why="the run is closed: leave it, so that a new job can reopen it",
        ),
        row(
            "leave_closed_redundancy_list",
            A.CLOSED,
            A.REDUNDANT,
            ~A.PAST_DEADLINE,
            then=Action.REMOVE_FROM_REDUNDANCY_LIST,
            why="the run is closed: leave it, so that a new job can reopen it",
        ),
        row("nothing_to_leave", ~A.PARTICIPANT, then=Action.FINISH, why="nothing to leave"),
        row(
            "leave_round",
            ~A.PAST_DEADLINE,
            then=Action.REMOVE_FROM_PARTICIPANTS,
            why="leave the round",
        ),
        row("timed_out", then=Action.ERROR_TIMEOUT, why="could not leave before the deadline"),
    ),
)

HARDENED_JOIN = Table(
    Op.JOIN,
    (
        row(
            "later_job",
            A.LATER_JOB,
            then=Action.ERROR_CLOSED,
            why="this node's job was closed, and a new job has reopened the run since",
        ),
        row(
            "reopen_vacant_run",
            A.CLOSED,
            A.NEWCOMER,
            A.VACANT,
            then=Action.REOPEN,
            why="the job that closed this run id has ended: start a new one",
        ),
        row(
            "newcomer_wait",
            A.CLOSED,
            A.NEWCOMER,
            ~A.PAST_DEADLINE,
            then=Action.SYNC,
            why="a new job: wait until the closed job's nodes have left or died",
        ),
        row(
            "closed_while_redundant",
            A.CLOSED,
            A.REDUNDANT,
            then=Action.ERROR_GRACEFUL_EXIT,
            why="the job ended while this node was surplus",
        ),
        row("closed", A.CLOSED, then=Action.ERROR_CLOSED, why="no new rounds after a close"),
        row(
            "standby_keep_alive",
            A.REDUNDANT,
            A.AT_MAX,
            A.HEARTBEAT_DUE,
            then=Action.KEEP_ALIVE,
            why="stay alive while waiting for room",
        ),
        row("standby_wait", A.REDUNDANT, A.AT_MAX, then=Action.SYNC, why="the round is still full"),
        row(
            "standby_retry",
            A.REDUNDANT,
            then=Action.REMOVE_FROM_REDUNDANCY_LIST,
            why="room freed up: retry with a fresh join deadline",
        ),
        row(
            "complete_with_us",
            A.COMPLETE,
            A.PARTICIPANT,
            then=Action.FINISH,
            why="the round completed with us",
        ),
        row(
            "complete_at_min_on_deadline",
            A.PAST_DEADLINE,
            ~A.COMPLETE,
            A.PARTICIPANT,
            A.SIZE_IN_RANGE,
            then=Action.MARK_RENDEZVOUS_COMPLETE,
            why="min reached: complete now rather than abandon a viable round",
        ),
        row(
            "withdraw_participant",
            A.PAST_DEADLINE,
            A.IN_ROLLBACK_WINDOW,
            A.PARTICIPANT,
            then=Action.REMOVE_FROM_PARTICIPANTS,
            why="withdraw before giving up",
        ),
        row(
            "withdraw_from_wait_list",
            A.PAST_DEADLINE,
            A.IN_ROLLBACK_WINDOW,
            A.WAITING,
            then=Action.REMOVE_FROM_WAIT_LIST,
            why="withdraw before giving up",
        ),
        row(
            "timed_out", A.PAST_DEADLINE, then=Action.ERROR_TIMEOUT, why="the join deadline passed"
        ),
        row(
            "queue_for_next_round",
            A.COMPLETE,
            A.BELOW_MAX,
            ~A.WAITING,
            then=Action.ADD_TO_WAIT_LIST,
            why="late: queue for the next round",
        ),
        row(
            "stand_by",
            A.COMPLETE,
            ~A.BELOW_MAX,
            ~A.WAITING,
            then=Action.ADD_TO_REDUNDANCY_LIST,
            why="late and the round is full: stand by",
        ),
        row(
            "complete_after_last_call",
            ~A.COMPLETE,
            A.PARTICIPANT,
            A.SIZE_IN_RANGE,
            A.LAST_CALL_OVER,
            then=Action.MARK_RENDEZVOUS_COMPLETE,
            why="last call over with enough nodes",
        ),
        row(
            "join_open_round",
            ~A.COMPLETE,
            ~A.PARTICIPANT,
            then=Action.ADD_TO_PARTICIPANTS,
            why="the round is open: join it",
        ),
        row(
            "keep_alive_while_waiting",
            A.HEARTBEAT_DUE,
            then=Action.KEEP_ALIVE,
            why="heartbeat due while waiting",
        ),
        row("wait", then=Action.SYNC, why="wait for the state to change"),
    ),
)

SCALE_JOIN = Table(
    Op.JOIN,
    (
        row(
            "later_job",
            A.LATER_JOB,
            then=Action.ERROR_CLOSED,
            why="this node's job was closed, and a new job has reopened the run since",
        ),
        row(
            "reopen_vacant_run",
            A.CLOSED,
            A.NEWCOMER,
            A.VACANT,
            then=Action.REOPEN,
            why="the job that closed this run id has ended: start a new one",
        ),
        row(
            "newcomer_watch",
            A.CLOSED,
            A.NEWCOMER,
            ~A.PAST_DEADLINE,
            A.WATCH_DUE,
            then=Action.WATCH,
            why="a new job: read the heartbeats of the closed job's nodes still listed",
        ),
        row(
            "newcomer_prune_dead",
            A.CLOSED,
            A.NEWCOMER,
            ~A.PAST_DEADLINE,
            A.MONITORED_DEAD,
            then=Action.PRUNE_DEAD,
            why="a node of the closed job is dead: prune it",
        ),
        row(
            "newcomer_wait",
            A.CLOSED,
            A.NEWCOMER,
            ~A.PAST_DEADLINE,
            then=Action.SYNC,
            why="a new job: wait until the closed job's nodes have left or died",
        ),
        row(
            "closed_while_redundant",
            A.CLOSED,
            A.REDUNDANT,
            then=Action.ERROR_GRACEFUL_EXIT,
            why="the job ended while this node was surplus",
        ),
        row("closed", A.CLOSED, then=Action.ERROR_CLOSED, why="no new rounds after a close"),
        row(
            "standby_beat",
            A.REDUNDANT,
            A.AT_MAX,
            A.BEAT_DUE,
            then=Action.BEAT,
            why="stay alive while waiting for room",
        ),
        row(
            "standby_watch",
            A.REDUNDANT,
            A.AT_MAX,
            A.WATCH_DUE,
            then=Action.WATCH,
            why="standing by: read the first participant's heartbeat",
        ),
        row(
            "standby_prune_dead",
            A.REDUNDANT,
            A.AT_MAX,
            A.MONITORED_DEAD,
            then=Action.PRUNE_DEAD,
            why="the round we stand by for lost its first participant: prune it",
        ),
        row("standby_wait", A.REDUNDANT, A.AT_MAX, then=Action.SYNC, why="the round is still full"),
        row(
            "standby_retry",
            A.REDUNDANT,
            then=Action.REMOVE_FROM_REDUNDANCY_LIST,
            why="room freed up: retry with a fresh join deadline",
        ),
        row(
            "complete_with_us",
            A.COMPLETE,
            A.PARTICIPANT,
            then=Action.FINISH,
            why="the round completed with us",
        ),
        row(
            "complete_at_min_on_deadline",
            A.PAST_DEADLINE,
            ~A.COMPLETE,
            A.PARTICIPANT,
            A.SIZE_IN_RANGE,
            then=Action.MARK_RENDEZVOUS_COMPLETE,
            why="min reached: complete now rather than abandon a viable round",
        ),
        row(
            "withdraw_participant",
            A.PAST_DEADLINE,
            A.IN_ROLLBACK_WINDOW,
            A.PARTICIPANT,
            then=Action.REMOVE_FROM_PARTICIPANTS,
            why="withdraw before giving up",
        ),
        row(
            "withdraw_from_wait_list",
            A.PAST_DEADLINE,
            A.IN_ROLLBACK_WINDOW,
            A.WAITING,
            then=Action.REMOVE_FROM_WAIT_LIST,
            why="withdraw before giving up",
        ),
        row(
            "withdraw_announcement",
            A.PAST_DEADLINE,
            A.IN_ROLLBACK_WINDOW,
            A.IN_ANNOUNCEMENTS,
            then=Action.WITHDRAW,
            why="take our announcement back before giving up",
        ),
        row(
            "timed_out", A.PAST_DEADLINE, then=Action.ERROR_TIMEOUT, why="the join deadline passed"
        ),
        row(
            "queue_for_next_round",
            A.COMPLETE,
            A.BELOW_MAX,
            ~A.WAITING,
            then=Action.ADD_TO_WAIT_LIST,
            why="late: queue for the next round",
        ),
        row(
            "stand_by",
            A.COMPLETE,
            ~A.BELOW_MAX,
            ~A.WAITING,
            then=Action.ADD_TO_REDUNDANCY_LIST,
            why="late and the round is full: stand by",
        ),
        row(
            "fold_and_complete_after_last_call",
            ~A.COMPLETE,
            A.PARTICIPANT,
            A.SIZE_IN_RANGE,
            A.LAST_CALL_OVER,
            then=Action.FOLD_AND_COMPLETE,
            why="last call over: admit the latecomers and complete",
        ),
        row(
            "announce",
            ~A.COMPLETE,
            ~A.PARTICIPANT,
            ~A.ANNOUNCED,
            then=Action.ANNOUNCE,
            why="the round is open: announce ourselves",
        ),
        row(
            "fold_announcements",
            ~A.COMPLETE,
            ~A.PARTICIPANT,
            A.FOLD_DUE,
            then=Action.FOLD,
            why="admit everybody announced so far",
        ),
        row("beat_while_waiting", A.BEAT_DUE, then=Action.BEAT, why="heartbeat due while waiting"),
        row(
            "wait_list_watch",
            A.COMPLETE,
            A.WAITING,
            A.WATCH_DUE,
            then=Action.WATCH,
            why="waiting: read the first participant's heartbeat",
        ),
        row(
            "wait_list_prune_dead",
            A.COMPLETE,
            A.WAITING,
            A.MONITORED_DEAD,
            then=Action.PRUNE_DEAD,
            why="the round we wait for lost its first participant: prune it",
        ),
        row("wait", then=Action.SYNC, why="wait for the state to change"),
    ),
)

SCALE_KEEP_ALIVE = Table(
    Op.KEEP_ALIVE,
    (
        row(
            "nothing_due",
            ~A.BEAT_DUE,
            ~A.WATCH_DUE,
            ~A.MONITORED_DEAD,
            then=Action.FINISH,
            why="nothing due, nobody dead",
        ),
        row(
            "deadline_passed",
            A.PAST_DEADLINE,
            then=Action.ERROR_TIMEOUT,
            why="could not keep up in time",
        ),
        row("beat", A.BEAT_DUE, then=Action.BEAT, why="write our heartbeat key"),
        row("watch", A.WATCH_DUE, then=Action.WATCH, why="read the heartbeats we watch"),
        row("prune_dead", then=Action.PRUNE_DEAD, why="a watched node is dead: prune it"),
    ),
)

del A
