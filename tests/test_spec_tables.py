"""Every row of every decision table, with the inputs that select it and its boundary.

Each case builds a :class:`spec.tables.Context` from a short description of the situation
(the node's role, the round's size, clock offsets) and pins the selected row index *and*
action. A meta-test fails when a row exists that no case selects, so adding a row to a
table without a test breaks the suite. An independent oracle (the reference's if/else
chains, re-stated below in plain Python) is compared with the tables over random contexts.
Finally, docs/protocol.md must list every row exactly as the tables have it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spec.settings import Settings
from spec.state import NodeId, RendezvousState
from spec.tables import (
    ATOM_DOCS,
    QUERY,
    ROW_NAME,
    UPSTREAM_CLOSE,
    UPSTREAM_EXIT,
    UPSTREAM_JOIN,
    UPSTREAM_KEEP_ALIVE,
    Atom,
    Context,
    NoRowMatches,
    Row,
    Table,
    row,
)
from spec.variants import UPSTREAM, get_variant
from spec.vocabulary import Action, Op

ROOT = Path(__file__).resolve().parent.parent

ME = NodeId("worker-5.example.com", 5000, 0)
PEERS = tuple(NodeId(f"peer-{i}.example.com", 100 + i, 0) for i in range(6))
SETTINGS = Settings(min_nodes=2, max_nodes=3)
INTERVAL = SETTINGS.keep_alive_interval  # 5000 ms
WINDOW = UPSTREAM.rollback_window  # 5000 ms
WALL = 1_800_000_000_000
MONO = 7_000_000
OP_DEADLINE = MONO + 60_000

TABLES: dict[str, Table] = {
    "UPSTREAM_EXIT": UPSTREAM_EXIT,
    "UPSTREAM_JOIN": UPSTREAM_JOIN,
    "UPSTREAM_CLOSE": UPSTREAM_CLOSE,
    "UPSTREAM_KEEP_ALIVE": UPSTREAM_KEEP_ALIVE,
    "QUERY": QUERY,
}


@dataclass(frozen=True)
class Situation:
    """A readable description of a context, relative to the node's clocks.

    ``role`` is where ME is listed; ``members`` is the total number of participants
    (including ME when it is one); ``beat_age`` is how old ME's heartbeat is (None: no
    heartbeat); ``last_call`` is the last-call deadline relative to wall_now (None: unset);
    ``late`` is mono_now - op_deadline (0: exactly at the deadline, not past it).
    """

    closed: bool = False
    complete: bool = False
    role: str | None = None
    members: int = 0
    beat_age: int | None = None
    last_call: int | None = None
    late: int = -1000

    def context(self) -> Context:
        me_in = self.role == "participant"
        assert self.members >= me_in, "a participant counts itself among the members"
        others = PEERS[: self.members - (1 if me_in else 0)]
        participants = {n: 0 for n in others}
        if me_in:
            participants[ME] = 0
        if self.complete:
            participants = {n: r for r, n in enumerate(sorted(participants))}
        beats = {n: WALL for n in participants}
        beat_age = self.beat_age
        if beat_age is None and self.role is not None:
            beat_age = 0
        if beat_age is not None:
            beats[ME] = WALL - beat_age
        state = RendezvousState.build(
            closed=self.closed,
            complete=self.complete,
            deadline=None if self.last_call is None else WALL + self.last_call,
            participants=participants,
            wait_list=[ME] if self.role == "waiting" else [],
            redundancy_list=[ME] if self.role == "redundant" else [],
            last_heartbeats=beats,
        )
        return Context(
            node=ME,
            state=state,
            settings=SETTINGS,
            mono_now=OP_DEADLINE + self.late,
            wall_now=WALL,
            op_deadline=OP_DEADLINE,
            rollback_window=WINDOW,
        )


S = Situation
P, W, R = "participant", "waiting", "redundant"

# fmt: off
# (table, situation, expected row, expected action, id)
CASES: list[tuple[str, Situation, int, Action, str]] = [
    # ---- exit ---------------------------------------------------------------------------
    ("UPSTREAM_EXIT", S(), 0, Action.FINISH, "exit-not-participant"),
    ("UPSTREAM_EXIT", S(role=W, late=10_000), 0, Action.FINISH, "exit-waiting-late-finish"),
    ("UPSTREAM_EXIT", S(role=P, members=2), 1, Action.REMOVE_FROM_PARTICIPANTS, "exit-leave"),
    ("UPSTREAM_EXIT", S(role=P, members=2, late=0), 1, Action.REMOVE_FROM_PARTICIPANTS,
     "exit-deadline-exactly-reached-is-not-past"),
    ("UPSTREAM_EXIT", S(role=P, members=2, late=1), 2, Action.ERROR_TIMEOUT,
     "exit-1ms-past-deadline"),
    # ---- join: closed -------------------------------------------------------------------
    ("UPSTREAM_JOIN", S(closed=True, role=R, members=3), 0, Action.ERROR_GRACEFUL_EXIT,
     "join-closed-redundant"),
    ("UPSTREAM_JOIN", S(closed=True, role=W, members=2, complete=True), 1, Action.ERROR_CLOSED,
     "join-closed-waiting"),
    ("UPSTREAM_JOIN", S(closed=True, role=P, members=2, complete=True), 1, Action.ERROR_CLOSED,
     "join-closed-participant-of-complete-round"),
    ("UPSTREAM_JOIN", S(closed=True), 1, Action.ERROR_CLOSED, "join-closed-stranger"),
    # ---- join: redundant ----------------------------------------------------------------
    ("UPSTREAM_JOIN", S(role=R, members=3, complete=True, beat_age=INTERVAL), 2,
     Action.KEEP_ALIVE, "join-redundant-full-heartbeat-exactly-due"),
    ("UPSTREAM_JOIN", S(role=R, members=3, complete=True, beat_age=INTERVAL - 1), 3,
     Action.SYNC, "join-redundant-full-heartbeat-1ms-newer"),
    ("UPSTREAM_JOIN", S(role=R, members=3, complete=True, late=100_000), 3, Action.SYNC,
     "join-redundant-full-waits-even-past-deadline"),
    ("UPSTREAM_JOIN", S(role=R, members=2, complete=True), 4,
     Action.REMOVE_FROM_REDUNDANCY_LIST, "join-redundant-room-freed"),
    ("UPSTREAM_JOIN", S(role=R, members=4, complete=True), 4,
     Action.REMOVE_FROM_REDUNDANCY_LIST, "join-redundant-above-max-is-not-at-max"),
    ("UPSTREAM_JOIN", S(role=R, members=2, late=100_000), 4,
     Action.REMOVE_FROM_REDUNDANCY_LIST, "join-redundant-room-freed-past-deadline"),
    # ---- join: success ------------------------------------------------------------------
    ("UPSTREAM_JOIN", S(role=P, members=2, complete=True), 5, Action.FINISH,
     "join-complete-with-me"),
    ("UPSTREAM_JOIN", S(role=P, members=2, complete=True, late=100_000), 5, Action.FINISH,
     "join-complete-with-me-past-deadline"),
    # ---- join: past the deadline, rollback window ----------------------------------------
    ("UPSTREAM_JOIN", S(role=P, members=1, late=1), 6, Action.REMOVE_FROM_PARTICIPANTS,
     "join-participant-1ms-past-deadline"),
    ("UPSTREAM_JOIN", S(role=P, members=1, late=WINDOW), 6, Action.REMOVE_FROM_PARTICIPANTS,
     "join-participant-at-end-of-rollback-window"),
    ("UPSTREAM_JOIN", S(role=P, members=1, late=WINDOW + 1), 8, Action.ERROR_TIMEOUT,
     "join-participant-1ms-past-rollback-window"),
    ("UPSTREAM_JOIN", S(role=P, members=1, late=0), 14, Action.SYNC,
     "join-participant-deadline-exactly-reached-waits"),
    ("UPSTREAM_JOIN", S(role=W, members=2, complete=True, late=1), 7,
     Action.REMOVE_FROM_WAIT_LIST, "join-waiting-1ms-past-deadline"),
    ("UPSTREAM_JOIN", S(role=W, members=2, complete=True, late=WINDOW), 7,
     Action.REMOVE_FROM_WAIT_LIST, "join-waiting-at-end-of-rollback-window"),
    ("UPSTREAM_JOIN", S(role=W, members=2, complete=True, late=WINDOW + 1), 8,
     Action.ERROR_TIMEOUT, "join-waiting-1ms-past-rollback-window"),
    ("UPSTREAM_JOIN", S(late=1), 8, Action.ERROR_TIMEOUT, "join-stranger-past-deadline"),
    ("UPSTREAM_JOIN", S(members=2, complete=True, late=1), 8, Action.ERROR_TIMEOUT,
     "join-stranger-complete-round-past-deadline"),
    # ---- join: a complete round without me -----------------------------------------------
    ("UPSTREAM_JOIN", S(members=2, complete=True, late=0), 9, Action.ADD_TO_WAIT_LIST,
     "join-late-below-max-deadline-exactly-reached"),
    ("UPSTREAM_JOIN", S(members=3, complete=True), 10, Action.ADD_TO_REDUNDANCY_LIST,
     "join-late-round-full"),
    ("UPSTREAM_JOIN", S(members=4, complete=True), 10, Action.ADD_TO_REDUNDANCY_LIST,
     "join-late-round-above-max"),
    ("UPSTREAM_JOIN", S(role=W, members=2, complete=True), 14, Action.SYNC,
     "join-already-waiting-below-max"),
    ("UPSTREAM_JOIN", S(role=W, members=3, complete=True), 14, Action.SYNC,
     "join-already-waiting-round-full"),
    # ---- join: an open round -------------------------------------------------------------
    ("UPSTREAM_JOIN", S(role=P, members=2, last_call=-1), 11, Action.MARK_RENDEZVOUS_COMPLETE,
     "join-last-call-over-by-1ms"),
    ("UPSTREAM_JOIN", S(role=P, members=2, last_call=-1, late=0), 11,
     Action.MARK_RENDEZVOUS_COMPLETE, "join-last-call-over-at-op-deadline"),
    ("UPSTREAM_JOIN", S(role=P, members=2, last_call=0), 14, Action.SYNC,
     "join-last-call-deadline-equals-wall-now-not-over"),
    ("UPSTREAM_JOIN", S(role=P, members=2, last_call=None), 14, Action.SYNC,
     "join-no-last-call-deadline"),
    ("UPSTREAM_JOIN", S(role=P, members=1, last_call=-1), 14, Action.SYNC,
     "join-last-call-over-but-below-min"),
    ("UPSTREAM_JOIN", S(role=P, members=4, last_call=-1), 14, Action.SYNC,
     "join-last-call-over-but-above-max"),
    ("UPSTREAM_JOIN", S(role=P, members=3, last_call=-1), 11, Action.MARK_RENDEZVOUS_COMPLETE,
     "join-last-call-over-at-max"),
    ("UPSTREAM_JOIN", S(), 12, Action.ADD_TO_PARTICIPANTS, "join-empty-round"),
    ("UPSTREAM_JOIN", S(members=2, last_call=5), 12, Action.ADD_TO_PARTICIPANTS,
     "join-open-round-with-others"),
    ("UPSTREAM_JOIN", S(role=W, members=1), 12, Action.ADD_TO_PARTICIPANTS,
     "join-waiting-node-joins-open-round"),
    ("UPSTREAM_JOIN", S(late=0), 12, Action.ADD_TO_PARTICIPANTS,
     "join-deadline-exactly-reached-still-joins"),
    # ---- join: wait, keeping the heartbeat fresh -----------------------------------------
    ("UPSTREAM_JOIN", S(role=P, members=1, beat_age=INTERVAL), 13, Action.KEEP_ALIVE,
     "join-participant-heartbeat-exactly-due"),
    ("UPSTREAM_JOIN", S(role=P, members=1, beat_age=INTERVAL + 1), 13, Action.KEEP_ALIVE,
     "join-participant-heartbeat-overdue"),
    ("UPSTREAM_JOIN", S(role=P, members=1, beat_age=INTERVAL - 1), 14, Action.SYNC,
     "join-participant-heartbeat-1ms-newer"),
    ("UPSTREAM_JOIN", S(role=W, members=2, complete=True, beat_age=INTERVAL), 13,
     Action.KEEP_ALIVE, "join-waiting-heartbeat-due"),
    # ---- close --------------------------------------------------------------------------
    ("UPSTREAM_CLOSE", S(closed=True), 0, Action.FINISH, "close-already-closed"),
    ("UPSTREAM_CLOSE", S(closed=True, late=100_000), 0, Action.FINISH,
     "close-already-closed-past-deadline"),
    ("UPSTREAM_CLOSE", S(late=1), 1, Action.ERROR_TIMEOUT, "close-1ms-past-deadline"),
    ("UPSTREAM_CLOSE", S(late=0), 2, Action.MARK_RENDEZVOUS_CLOSED,
     "close-deadline-exactly-reached"),
    ("UPSTREAM_CLOSE", S(role=P, members=2, complete=True), 2, Action.MARK_RENDEZVOUS_CLOSED,
     "close-open-rendezvous"),
    # ---- keep-alive ---------------------------------------------------------------------
    ("UPSTREAM_KEEP_ALIVE", S(), 0, Action.FINISH, "keep-alive-no-heartbeat"),
    ("UPSTREAM_KEEP_ALIVE", S(role=P, members=1, beat_age=INTERVAL - 1, late=100), 0,
     Action.FINISH, "keep-alive-heartbeat-1ms-newer-than-due"),
    ("UPSTREAM_KEEP_ALIVE", S(role=P, members=1, beat_age=INTERVAL), 1, Action.KEEP_ALIVE,
     "keep-alive-heartbeat-exactly-due"),
    ("UPSTREAM_KEEP_ALIVE", S(role=P, members=1, beat_age=INTERVAL, late=0), 1,
     Action.KEEP_ALIVE, "keep-alive-deadline-exactly-reached"),
    ("UPSTREAM_KEEP_ALIVE", S(role=P, members=1, beat_age=INTERVAL, late=1), 2,
     Action.ERROR_TIMEOUT, "keep-alive-1ms-past-deadline"),
    ("UPSTREAM_KEEP_ALIVE", S(role=R, members=3, beat_age=INTERVAL), 1, Action.KEEP_ALIVE,
     "keep-alive-redundant-node"),
    # ---- query --------------------------------------------------------------------------
    ("QUERY", S(), 0, Action.FINISH, "query-empty"),
    ("QUERY", S(closed=True, late=100_000), 0, Action.FINISH, "query-closed-late"),
]
# fmt: on


@pytest.mark.parametrize(
    ("table_name", "situation", "index", "action"),
    [pytest.param(t, s, i, a, id=name) for t, s, i, a, name in CASES],
)
def test_row_selected(table_name: str, situation: Situation, index: int, action: Action) -> None:
    table = TABLES[table_name]
    ctx = situation.context()
    assert table.select(ctx) == index, (
        f"{table_name}: expected row {index} [{table.rows[index].guard_text()}], got row "
        f"{table.select(ctx)} [{table.rows[table.select(ctx)].guard_text()}]"
    )
    assert table.rows[index].then is action
    assert table.decide(ctx) is action


def test_case_ids_are_unique() -> None:
    names = [name for *_, name in CASES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("table_name", sorted(TABLES))
def test_every_row_has_a_case(table_name: str) -> None:
    table = TABLES[table_name]
    covered = {i for t, _, i, _, _ in CASES if t == table_name}
    missing = [f"row {i}: {r.guard_text()}" for i, r in enumerate(table.rows) if i not in covered]
    assert not missing, f"{table_name} rows without a test case: {missing}"


@pytest.mark.parametrize("table_name", sorted(TABLES))
def test_every_row_has_a_near_miss_case(table_name: str) -> None:
    """The boundary of each row: some case meets all of its literals but exactly one, and so
    falls through to a later row. Catch-all rows (no literals) have no boundary."""
    table = TABLES[table_name]
    contexts = [s.context() for t, s, _, _, _ in CASES if t == table_name]
    for index, candidate in enumerate(table.rows):
        if not candidate.when:
            continue
        near = [
            ctx
            for ctx in contexts
            if sum(not lit.holds(ctx) for lit in candidate.when) == 1 and table.select(ctx) > index
        ]
        assert near, f"{table_name} row {index} [{candidate.guard_text()}] has no near-miss case"


@pytest.mark.parametrize("table_name", sorted(TABLES))
def test_tables_end_in_a_catch_all(table_name: str) -> None:
    assert TABLES[table_name].rows[-1].when == ()


def test_every_atom_is_documented() -> None:
    assert set(ATOM_DOCS) == set(Atom)
    assert all(atom.doc for atom in Atom)


def test_a_table_without_a_match_raises_no_row_matches() -> None:
    partial = Table(Op.CLOSE, (row("already_closed", Atom.CLOSED, then=Action.FINISH),))
    ctx = S().context()
    with pytest.raises(NoRowMatches, match="no row of the close table matches") as info:
        partial.select(ctx)
    assert info.value.op is Op.CLOSE
    assert info.value.ctx is ctx


def test_guard_text() -> None:
    assert UPSTREAM_JOIN.rows[0].guard_text() == "closed and redundant"
    assert UPSTREAM_JOIN.rows[9].guard_text() == "complete and below_max and not waiting"
    assert UPSTREAM_JOIN.rows[-1].guard_text() == "otherwise"


# ---------------------------------------------------------------------------------------
# The oracle: the reference's decision chains, re-stated independently.
# ---------------------------------------------------------------------------------------
def _beat_is_due(ctx: Context) -> bool:
    beat = dict(ctx.state.last_heartbeats).get(ctx.node)
    if beat is None:
        return False
    return ctx.wall_now - beat >= ctx.settings.keep_alive_interval


def oracle_exit(ctx: Context) -> Action:
    if ctx.node not in dict(ctx.state.participants):
        return Action.FINISH
    if ctx.mono_now <= ctx.op_deadline:
        return Action.REMOVE_FROM_PARTICIPANTS
    return Action.ERROR_TIMEOUT


def oracle_join(ctx: Context) -> Action:
    s, me, cfg = ctx.state, ctx.node, ctx.settings
    members = dict(s.participants)
    count = len(members)
    if s.closed:
        # The reference raises its graceful-exit error here instead of returning.
        return Action.ERROR_GRACEFUL_EXIT if me in s.redundancy_list else Action.ERROR_CLOSED
    if me in s.redundancy_list:
        if count != cfg.max_nodes:
            return Action.REMOVE_FROM_REDUNDANCY_LIST
        return Action.KEEP_ALIVE if _beat_is_due(ctx) else Action.SYNC
    mine = me in members
    if mine and s.complete:
        return Action.FINISH
    if ctx.mono_now > ctx.op_deadline:
        if ctx.mono_now - ctx.op_deadline <= ctx.rollback_window:
            if mine:
                return Action.REMOVE_FROM_PARTICIPANTS
            if me in s.wait_list:
                return Action.REMOVE_FROM_WAIT_LIST
        return Action.ERROR_TIMEOUT
    if not s.complete and not mine:
        return Action.ADD_TO_PARTICIPANTS
    if s.complete and me not in s.wait_list:
        if count < cfg.max_nodes:
            return Action.ADD_TO_WAIT_LIST
        return Action.ADD_TO_REDUNDANCY_LIST
    if (
        not s.complete
        and s.deadline is not None
        and cfg.min_nodes <= count <= cfg.max_nodes
        and ctx.wall_now > s.deadline
    ):
        return Action.MARK_RENDEZVOUS_COMPLETE
    return Action.KEEP_ALIVE if _beat_is_due(ctx) else Action.SYNC


def oracle_close(ctx: Context) -> Action:
    if ctx.state.closed:
        return Action.FINISH
    if ctx.mono_now > ctx.op_deadline:
        return Action.ERROR_TIMEOUT
    return Action.MARK_RENDEZVOUS_CLOSED


def oracle_keep_alive(ctx: Context) -> Action:
    if not _beat_is_due(ctx):
        return Action.FINISH
    if ctx.mono_now > ctx.op_deadline:
        return Action.ERROR_TIMEOUT
    return Action.KEEP_ALIVE


def oracle_query(ctx: Context) -> Action:
    return Action.FINISH


ORACLES: dict[str, Callable[[Context], Action]] = {
    "UPSTREAM_EXIT": oracle_exit,
    "UPSTREAM_JOIN": oracle_join,
    "UPSTREAM_CLOSE": oracle_close,
    "UPSTREAM_KEEP_ALIVE": oracle_keep_alive,
    "QUERY": oracle_query,
}

_POOL = (ME, *PEERS[:4])
_EDGE_OFFSETS = (-100_000, -1, 0, 1, INTERVAL - 1, INTERVAL, INTERVAL + 1)


@st.composite
def contexts(draw: st.DrawFn) -> Context:
    """Random contexts, including ones no valid run produces (overlapping lists)."""
    min_nodes = draw(st.integers(1, 3))
    max_nodes = draw(st.integers(min_nodes, 4))
    settings = Settings(min_nodes=min_nodes, max_nodes=max_nodes)
    pool = st.lists(st.sampled_from(_POOL), max_size=len(_POOL), unique=True)
    participants = draw(pool)
    complete = draw(st.booleans())
    beats = {n: WALL - draw(st.sampled_from(_EDGE_OFFSETS)) for n in draw(pool)}
    deadline = draw(st.none() | st.sampled_from(_EDGE_OFFSETS).map(lambda d: WALL + d))
    late = draw(
        st.sampled_from((-100_000, -1, 0, 1, 2, WINDOW - 1, WINDOW, WINDOW + 1, 100_000))
        | st.integers(-20_000, 20_000)
    )
    state = RendezvousState.build(
        closed=draw(st.booleans()),
        complete=complete,
        deadline=deadline,
        participants={n: (r if complete else 0) for r, n in enumerate(sorted(participants))},
        wait_list=draw(pool),
        redundancy_list=draw(pool),
        last_heartbeats=beats,
    )
    return Context(
        node=ME,
        state=state,
        settings=settings,
        mono_now=OP_DEADLINE + late,
        wall_now=WALL,
        op_deadline=OP_DEADLINE,
        rollback_window=WINDOW,
    )


@pytest.mark.parametrize("table_name", sorted(TABLES))
@given(ctx=contexts())
def test_table_agrees_with_the_reference_oracle(table_name: str, ctx: Context) -> None:
    assert TABLES[table_name].decide(ctx) is ORACLES[table_name](ctx), ctx.state.describe()


# ---------------------------------------------------------------------------------------
# docs/protocol.md cannot go stale.
# ---------------------------------------------------------------------------------------
DOC_SECTIONS = {
    "UPSTREAM_EXIT": "### The exit table",
    "UPSTREAM_JOIN": "### The join table",
    "UPSTREAM_CLOSE": "### The close table",
    "UPSTREAM_KEEP_ALIVE": "### The keep-alive table",
    "QUERY": "### The query table",
}


def _doc_section(heading: str) -> list[str]:
    lines = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8").splitlines()
    assert heading in lines, f"docs/protocol.md has no heading {heading!r}"
    start = lines.index(heading) + 1
    end = next(
        (i for i in range(start, len(lines)) if lines[i].startswith("#")),
        len(lines),
    )
    return lines[start:end]


VARIANT_DOC_SECTIONS = {
    ("hardened", Op.EXIT): "#### `hardened` and `scale`: the exit table",
    ("scale", Op.EXIT): "#### `hardened` and `scale`: the exit table",
    ("hardened", Op.JOIN): "#### `hardened`: the join table",
    ("scale", Op.JOIN): "#### `scale`: the join table",
    ("scale", Op.KEEP_ALIVE): "#### `scale`: the keep-alive table",
}
"""Tables of the derived variants that differ from upstream's, and where the doc lists them."""

DOCUMENTED_TABLES: dict[str, tuple[Table, str]] = {
    **{name: (TABLES[name], heading) for name, heading in DOC_SECTIONS.items()},
    **{
        f"{variant}:{op.value}": (get_variant(variant).tables[op], heading)
        for (variant, op), heading in VARIANT_DOC_SECTIONS.items()
    },
}


def test_every_table_that_differs_from_upstream_is_documented() -> None:
    upstream = get_variant("upstream")
    differing = {
        (name, op)
        for name in ("hardened", "scale")
        for op in Op
        if get_variant(name).tables[op].rows != upstream.tables[op].rows
    }
    assert differing == set(VARIANT_DOC_SECTIONS)


@pytest.mark.parametrize("table_name", sorted(DOCUMENTED_TABLES))
def test_protocol_doc_lists_every_row(table_name: str) -> None:
    table, heading = DOCUMENTED_TABLES[table_name]
    section = _doc_section(heading)
    rows = [line for line in section if line.startswith("| `")]
    expected = [f"| `{r.name}` | `{r.guard_text()}` | `{r.then.value}` |" for r in table.rows]
    assert len(rows) == len(expected), (
        f"docs/protocol.md lists {len(rows)} rows for {table_name}, the table has "
        f"{len(expected)}; update the doc"
    )
    for line, prefix in zip(rows, expected, strict=True):
        assert line.startswith(prefix), f"stale doc row {line!r}; expected it to start {prefix!r}"


def test_protocol_doc_lists_every_atom() -> None:
    section = _doc_section("### Atoms")
    for atom in Atom:
        line = f"| `{atom.value}` | {atom.doc} |"
        assert line in section, f"docs/protocol.md: atom line missing or stale: {line!r}"


# -- row names ---------------------------------------------------------------------------


def _every_table() -> list[tuple[str, Table]]:
    """Every table of every named and planted variant, with where it comes from."""
    from model_check.planted import PLANTED

    variants = {n: get_variant(n) for n in ("upstream", "torch-2.13", "hardened", "scale")}
    variants.update(PLANTED)
    return [(f"{name}:{op.value}", v.tables[op]) for name, v in variants.items() for op in Op]


def test_every_row_has_a_name_unique_in_its_table() -> None:
    for where, table in _every_table():
        names = [r.name for r in table.rows]
        assert all(ROW_NAME.fullmatch(n) for n in names), f"{where}: unnamed row in {names}"
        assert len(names) == len(set(names)), f"{where}: duplicate row names in {names}"


def test_a_row_name_means_the_same_row_in_every_variant() -> None:
    """A row the variants share keeps its name; a changed row gets a new one. So
    ``join.timed_out`` in a trace of any variant is the same rule."""
    seen: dict[str, tuple[str, Row]] = {}
    for name in ("upstream", "torch-2.13", "hardened", "scale"):
        for op, table in get_variant(name).tables.items():
            for index, r in enumerate(table.rows):
                qualified = table.qualified(index)
                assert qualified == f"{op.value}.{r.name}"
                first = seen.setdefault(qualified, (name, r))
                assert first[1] == r, f"{qualified} differs between {first[0]} and {name}"


def test_tables_refuse_duplicate_and_malformed_names() -> None:
    with pytest.raises(ValueError, match="two rows named 'wait'"):
        Table(Op.CLOSE, (row("wait", then=Action.SYNC), row("wait", then=Action.FINISH)))
    with pytest.raises(ValueError, match="not a snake_case identifier"):
        row("Row 7", then=Action.SYNC)


def test_rows_are_found_by_name() -> None:
    assert UPSTREAM_JOIN.index("join.timed_out") == UPSTREAM_JOIN.index("timed_out") == 8
    assert UPSTREAM_JOIN.named("wait") is UPSTREAM_JOIN.rows[-1]
    with pytest.raises(KeyError, match="the join table has no row 'nope'"):
        UPSTREAM_JOIN.index("nope")
