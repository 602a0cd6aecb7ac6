"""The node machine, driven event by event like an interpreter would.

Transcript tests read top to bottom: each ``step`` feeds one event and the assertions pin
the request the machine asks for (Read / CompareAndSet / Wait / Done / Fail), the action
and table row it decided, and the parts of its local state that matter.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec.codec import decode, decode_with_protocol, encode
from spec.invariants import check_step
from spec.machine import (
    STATE_KEY,
    CasResult,
    CompareAndSet,
    Config,
    Done,
    Fail,
    InvalidTransition,
    IoFailed,
    Local,
    Now,
    Phase,
    Read,
    ReadResult,
    StartOp,
    Step,
    Wait,
    WokeUp,
    closed_for,
    context,
    evolve,
    known_of,
    newer,
    next_timer,
    nodes_waiting,
    step,
)
from spec.settings import Settings
from spec.state import EMPTY_STATE, NodeId, RendezvousState
from spec.tables import Atom, Context
from spec.variants import HARDENED, SCALE, TORCH_213, UPSTREAM, VARIANTS, Variant
from spec.vocabulary import Action, FailKind, Op

ME = NodeId("worker-0.example.com", 4242, 0)
A, B, C = (NodeId(f"worker-{i}.example.com", 4242, 0) for i in (1, 2, 3))
SETTINGS = Settings(min_nodes=2, max_nodes=3, cache_duration=1000)
CONFIG = Config(SETTINGS)
PROTOCOL = CONFIG.variant.name
"""The protocol of :data:`CONFIG`: the one its states are written by."""
MONO = 50_000
WALL = 1_800_000_000_000
JOIN = SETTINGS.join_timeout
INTERVAL = SETTINGS.keep_alive_interval
EXPIRY = SETTINGS.heartbeat_expiry


def at(dt: int = 0) -> Now:
    """The node's clocks ``dt`` ms after the start of a test (both advance together)."""
    return Now(MONO + dt, WALL + dt)


def started(op: Op, dt: int = 0, local: Local | None = None, config: Config = CONFIG) -> Step:
    return step(local or Local(ME), StartOp(op, MONO + dt + JOIN, at(dt)), config)


def read(s: Step, state: RendezvousState | None, token: int, dt: int = 0) -> Step:
    assert isinstance(s.request, Read)
    data = None if state is None else encode(state, CONFIG.variant.name)
    return step(s.local, ReadResult(data, token, at(dt)), CONFIG)


# -- transcripts ------------------------------------------------------------------------
def test_join_transcript_from_an_empty_store_to_completion() -> None:
    s = started(Op.JOIN)
    assert s.request == Read(STATE_KEY)
    assert s.local.phase is Phase.READING
    assert s.local.op is Op.JOIN
    assert s.local.deadline == MONO + JOIN

    # The key is absent: join the open round and write it.
    s = step(s.local, ReadResult(None, None, at()), CONFIG)
    assert (s.action, s.row) == (Action.ADD_TO_PARTICIPANTS, "join.join_open_round")
    assert isinstance(s.request, CompareAndSet)
    assert s.request.token is None
    written = decode(s.request.data)
    assert written.participant_map() == {ME: 0}
    assert written.heartbeat_of(ME) == WALL
    assert s.local.dirty and s.local.phase is Phase.WRITING

    # The write succeeded: nothing to do but wait (below min_nodes).
    s = step(s.local, CasResult(s.request.data, 1, True, at(3)), CONFIG)
    assert (s.action, s.row) == (Action.SYNC, "join.wait")
    assert s.request == Wait(STATE_KEY, 1, MONO + INTERVAL)  # our heartbeat becomes due
    assert not s.local.dirty and s.local.synced_at == MONO + 3

    # Woken by a change: a peer joined and started the last call.
    s = step(s.local, WokeUp(at(10)), CONFIG)
    assert s.request == Read(STATE_KEY)
    two = written.evolve(
        participants={ME: 0, A: 0},
        deadline=WALL + 20 + SETTINGS.last_call_timeout,
        last_heartbeats={ME: WALL, A: WALL + 20},
    )
    s = read(s, two, 2, dt=20)
    assert s.action is Action.SYNC
    assert isinstance(s.request, Wait)
    assert s.request.until == MONO + INTERVAL  # still earlier than the last call's end

    # Our heartbeat falls due: refresh it.
    s = step(s.local, WokeUp(at(INTERVAL)), CONFIG)
    s = read(s, two, 2, dt=INTERVAL)
    assert (s.action, s.row) == (Action.KEEP_ALIVE, "join.keep_alive_while_waiting")
    assert isinstance(s.request, CompareAndSet)
    assert s.request.token == 2
    refreshed = decode(s.request.data)
    assert refreshed.heartbeat_of(ME) == WALL + INTERVAL
    s = step(s.local, CasResult(s.request.data, 3, True, at(INTERVAL)), CONFIG)
    assert s.action is Action.SYNC

    # The last call ends: complete the round.
    end = SETTINGS.last_call_timeout + 21
    s = step(s.local, WokeUp(at(end)), CONFIG)
    s = read(s, refreshed.evolve(last_heartbeats={ME: WALL + end, A: WALL + end}), 3, dt=end)
    assert (s.action, s.row) == (Action.MARK_RENDEZVOUS_COMPLETE, "join.complete_after_last_call")
    assert isinstance(s.request, CompareAndSet)
    final = decode(s.request.data)
    assert final.complete and final.participant_map() == {ME: 0, A: 1}
    s = step(s.local, CasResult(s.request.data, 4, True, at(end)), CONFIG)
    assert (s.action, s.row) == (Action.FINISH, "join.complete_with_us")
    assert s.request == Done(Op.JOIN)
    assert s.local.phase is Phase.IDLE and s.local.op is None
    assert s.local.view == final


def test_exit_transcript() -> None:
    init = RendezvousState.build(
        complete=True, participants={ME: 0, A: 1}, last_heartbeats={ME: WALL, A: WALL}
    )
    s = read(started(Op.EXIT), init, 7)
    assert (s.action, s.row) == (Action.REMOVE_FROM_PARTICIPANTS, "exit.leave_round")
    assert isinstance(s.request, CompareAndSet)
    assert s.request.token == 7
    assert decode(s.request.data).participant_map() == {A: 1}
    s = step(s.local, CasResult(s.request.data, 8, True, at(1)), CONFIG)
    assert s.request == Done(Op.EXIT)
    assert s.row == "exit.nothing_to_leave"


def test_close_transcript() -> None:
    s = read(started(Op.CLOSE), RendezvousState.build(round=2), 1)
    assert s.action is Action.MARK_RENDEZVOUS_CLOSED
    assert isinstance(s.request, CompareAndSet)
    assert decode(s.request.data) == RendezvousState.build(round=2, closed=True)
    s = step(s.local, CasResult(s.request.data, 2, True, at()), CONFIG)
    assert s.request == Done(Op.CLOSE)


@pytest.mark.parametrize(
    ("init", "action", "kind"),
    [
        pytest.param(
            RendezvousState.build(closed=True), Action.ERROR_CLOSED, FailKind.CLOSED, id="closed"
        ),
        pytest.param(
            RendezvousState.build(closed=True, redundancy_list=[ME], last_heartbeats={ME: WALL}),
            Action.ERROR_GRACEFUL_EXIT,
            FailKind.GRACEFUL_EXIT,
            id="graceful-exit",
        ),
    ],
)
def test_join_failures_from_the_table(
    init: RendezvousState, action: Action, kind: FailKind
) -> None:
    s = read(started(Op.JOIN), init, 1)
    assert s.action is action
    assert isinstance(s.request, Fail)
    assert (s.request.op, s.request.kind) == (Op.JOIN, kind)
    assert str(ME) in s.request.message or "closed" in s.request.message
    assert s.local.phase is Phase.IDLE and s.local.op is None


def test_join_timeout_fails_with_timeout() -> None:
    s = step(Local(ME), StartOp(Op.JOIN, MONO - 1, at()), CONFIG)
    s = read(s, RendezvousState.build(), 1)
    assert (s.action, s.row) == (Action.ERROR_TIMEOUT, "join.timed_out")
    assert isinstance(s.request, Fail)
    assert s.request.kind is FailKind.TIMEOUT
    assert "join" in s.request.message and "deadline" in s.request.message


# -- cache ------------------------------------------------------------------------------
def _idle_after_query(dt: int = 0) -> Local:
    s = read(started(Op.QUERY, dt=dt), RendezvousState.build(round=1), 5, dt=dt)
    assert s.request == Done(Op.QUERY)
    assert s.local.synced_at == MONO + dt
    return s.local


def test_a_fresh_view_is_reused_within_the_cache_duration() -> None:
    local = _idle_after_query()
    s = started(Op.QUERY, dt=SETTINGS.cache_duration, local=local)
    assert s.request == Done(Op.QUERY)  # no Read: the view is exactly cache_duration old


def test_a_view_1ms_older_than_the_cache_duration_is_read_again() -> None:
    local = _idle_after_query()
    s = started(Op.QUERY, dt=SETTINGS.cache_duration + 1, local=local)
    assert s.request == Read(STATE_KEY)


def test_cache_duration_zero_always_reads() -> None:
    config = Config(dataclasses.replace(SETTINGS, cache_duration=0))
    local = _idle_after_query()
    assert started(Op.QUERY, local=local, config=config).request == Read(STATE_KEY)


def test_woke_up_invalidates_the_cache() -> None:
    alone = RendezvousState.build(participants={ME: 0}, last_heartbeats={ME: WALL})
    s = read(started(Op.JOIN), alone, 1)
    assert isinstance(s.request, Wait)
    s = step(s.local, WokeUp(at()), CONFIG)  # same instant: the cache would still be fresh
    assert s.request == Read(STATE_KEY)
    assert s.local.synced_at is None


# -- the node's other machine state (StartOp.known) ---------------------------------------
def _knows(state: RendezvousState, token: int, dt: int = 0) -> Local:
    """A machine state that has just read ``state`` (at ``dt``) and is idle again."""
    s = read(started(Op.QUERY, dt=dt), state, token, dt=dt)
    assert s.request == Done(Op.QUERY)
    return s.local


def test_a_query_counts_the_round_the_join_just_completed() -> None:
    # init: the query machine read round 4 with C waiting; then the join machine got
    # round 5 complete (C joined it) as the answer to its compare-and-set
    before = RendezvousState.build(
        round=4,
        complete=True,
        participants={ME: 0, A: 1},
        wait_list=[B],
        last_heartbeats=dict.fromkeys((ME, A, B), WALL),
    )
    after = RendezvousState.build(
        round=5,
        complete=True,
        participants={ME: 0, A: 1, B: 2},
        last_heartbeats=dict.fromkeys((ME, A, B), WALL),
    )
    query = _knows(before, 1)
    join = _knows(after, 2, dt=10)
    # act: num_nodes_waiting() within the cache duration of both reads
    known = known_of(join)
    s = step(query, StartOp(Op.QUERY, MONO + 20 + JOIN, at(20), known=known), CONFIG)
    # check: answered from the newer view, without a read; its token comes along
    assert s.request == Done(Op.QUERY)
    assert (s.local.view, s.local.token, s.local.synced_at) == (after, 2, MONO + 10)
    # without the other machine's view the count would be 1, from round 4
    alone = step(query, StartOp(Op.QUERY, MONO + 20 + JOIN, at(20)), CONFIG)
    assert alone.request == Done(Op.QUERY) and alone.local.view.wait_list == (B,)


@pytest.mark.parametrize(
    ("mine", "theirs", "adopted"),
    [
        (RendezvousState.build(round=2), RendezvousState.build(round=3), True),
        (RendezvousState.build(round=3), RendezvousState.build(round=2), False),
        (RendezvousState.build(round=3), RendezvousState.build(round=3, complete=True), True),
        (RendezvousState.build(round=3, complete=True), RendezvousState.build(round=3), False),
        (RendezvousState.build(round=4), RendezvousState.build(round=4, closed=True), True),
        (RendezvousState.build(round=4, closed=True), RendezvousState.build(round=4), False),
        # a closed round goes on only as a later round of the next job (epoch)
        (
            RendezvousState.build(round=4, closed=True),
            RendezvousState.build(round=5, epoch=1),
            True,
        ),
        (
            RendezvousState.build(round=5, epoch=1),
            RendezvousState.build(round=4, closed=True),
            False,
        ),
        # a tie on (epoch, round, closed, complete): not ordered, keep our own
        (RendezvousState.build(round=3), RendezvousState.build(round=3, wait_list=[A]), False),
    ],
)
def test_a_started_op_takes_the_other_view_only_when_it_is_newer(
    mine: RendezvousState, theirs: RendezvousState, adopted: bool
) -> None:
    local = _knows(mine, 1)
    other = _knows(theirs, 2)
    s = step(local, StartOp(Op.QUERY, MONO + JOIN, at(), known=known_of(other)), CONFIG)
    assert s.local.view == (theirs if adopted else mine)
    assert s.local.token == (2 if adopted else 1)
    assert newer(theirs, mine) is adopted


def test_a_dirty_view_is_neither_handed_over_nor_replaced() -> None:
    newer_state = RendezvousState.build(round=8)
    # a machine with a change not yet written hands nothing over ...
    s = read(started(Op.JOIN), RendezvousState.build(), 1)
    assert s.action is Action.ADD_TO_PARTICIPANTS and s.local.dirty
    assert known_of(s.local) is None
    # ... and keeps its change (its next sync writes it) whatever the other one knows
    dirty = dataclasses.replace(s.local, phase=Phase.IDLE, op=None)
    known = known_of(_knows(newer_state, 2))
    out = step(dirty, StartOp(Op.JOIN, MONO + JOIN, at(), known=known), CONFIG)
    assert out.local.view == dirty.view
    assert isinstance(out.request, CompareAndSet)
    # a machine that never read knows nothing
    assert known_of(Local(ME)) is None


# -- CAS conflicts ----------------------------------------------------------------------
def test_cas_conflict_re_decides_on_the_returned_state() -> None:
    s = read(started(Op.JOIN), RendezvousState.build(), 1)
    assert s.action is Action.ADD_TO_PARTICIPANTS
    assert isinstance(s.request, CompareAndSet)
    # Meanwhile the round filled up and completed without us.
    full = RendezvousState.build(
        complete=True,
        participants={A: 0, B: 1, C: 2},
        last_heartbeats={A: WALL, B: WALL, C: WALL},
    )
    s = step(s.local, CasResult(encode(full, PROTOCOL), 9, False, at(2)), CONFIG)
    assert s.action is Action.ADD_TO_REDUNDANCY_LIST
    assert isinstance(s.request, CompareAndSet)
    assert s.request.token == 9
    assert decode(s.request.data).redundancy_list == (ME,)
    assert decode(s.request.data).participants == full.participants


# -- pruning and dirtiness, per variant -------------------------------------------------
def _with_dead_participant() -> RendezvousState:
    return RendezvousState.build(
        participants={A: 0, B: 0},
        deadline=WALL + 100,
        last_heartbeats={A: WALL - EXPIRY - 1, B: WALL},
    )


@pytest.mark.parametrize(
    ("config", "dirty"),
    [
        pytest.param(CONFIG, True, id="upstream"),
        pytest.param(Config(SETTINGS, TORCH_213), False, id="torch-2.13"),
    ],
)
def test_pruning_a_participant_marks_dirty_per_variant(config: Config, dirty: bool) -> None:
    s = started(Op.QUERY, config=config)
    data = encode(_with_dead_participant(), config.variant.name)
    s = step(s.local, ReadResult(data, 3, at()), config)
    assert s.request == Done(Op.QUERY)
    assert s.pruned == (A,)
    assert s.local.view.participant_map() == {B: 0}
    assert s.local.view.deadline is None  # epilogue: below min
    assert s.local.dirty is dirty
    # The next operation writes the pruned view first only when dirty.
    nxt = started(Op.QUERY, local=s.local, config=config)
    if dirty:
        assert nxt.request == CompareAndSet(STATE_KEY, encode(s.local.view, config.variant.name), 3)
    else:
        assert nxt.request == Done(Op.QUERY)  # cache still fresh, nothing to write


@pytest.mark.parametrize("config", [CONFIG, Config(SETTINGS, TORCH_213)], ids=["up", "torch"])
def test_pruning_only_waiting_nodes_never_marks_dirty(config: Config) -> None:
    state = RendezvousState.build(
        participants={B: 0},
        wait_list=[A],
        redundancy_list=[C],
        last_heartbeats={A: WALL - EXPIRY - 1, B: WALL, C: WALL - EXPIRY - 1},
    )
    data = encode(state, config.variant.name)
    s = step(started(Op.QUERY, config=config).local, ReadResult(data, 1, at()), config)
    assert s.pruned == (A, C)
    assert not s.local.dirty


def test_dirty_view_is_written_after_a_wait() -> None:
    alive = RendezvousState.build(
        participants={ME: 0, A: 0}, last_heartbeats={ME: WALL, A: WALL - EXPIRY - 1}
    )
    s = read(started(Op.JOIN), alive, 4)
    assert s.pruned == (A,)
    assert s.local.dirty
    assert isinstance(s.request, Wait)
    s = step(s.local, WokeUp(at(1)), CONFIG)
    assert isinstance(s.request, CompareAndSet)
    assert s.request.token == 4
    assert decode(s.request.data).participant_map() == {ME: 0}


# -- redundancy list resets the deadline ------------------------------------------------
def test_leaving_the_redundancy_list_resets_the_op_deadline() -> None:
    state = RendezvousState.build(
        complete=True,
        participants={A: 0, B: 1},
        redundancy_list=[ME],
        last_heartbeats={A: WALL, B: WALL, ME: WALL},
    )
    s = step(Local(ME), StartOp(Op.JOIN, MONO + 10, at()), CONFIG)
    s = step(s.local, ReadResult(encode(state, PROTOCOL), 1, at(777)), CONFIG)
    assert (s.action, s.row) == (Action.REMOVE_FROM_REDUNDANCY_LIST, "join.standby_retry")
    assert s.local.deadline == MONO + 777 + JOIN
    assert isinstance(s.request, CompareAndSet)


def test_other_actions_keep_the_op_deadline() -> None:
    s = step(Local(ME), StartOp(Op.JOIN, MONO + 10, at()), CONFIG)
    s = read(s, RendezvousState.build(), 1, dt=5)
    assert s.action is Action.ADD_TO_PARTICIPANTS
    assert s.local.deadline == MONO + 10


# -- failures -----------------------------------------------------------------------------
@pytest.mark.parametrize("data", [b"", b"\x80\x04pickle", b'{"v":2}', b"[]"])
@pytest.mark.parametrize("via", ["read", "cas"])
def test_corrupt_bytes_fail_with_corrupt_state(data: bytes, via: str) -> None:
    s = started(Op.JOIN)
    if via == "cas":
        s = step(s.local, ReadResult(None, None, at()), CONFIG)
        assert isinstance(s.request, CompareAndSet)
        s = step(s.local, CasResult(data, 1, False, at()), CONFIG)
    else:
        s = step(s.local, ReadResult(data, 1, at()), CONFIG)
    assert isinstance(s.request, Fail)
    assert (s.request.op, s.request.kind) == (Op.JOIN, FailKind.CORRUPT_STATE)
    assert "corrupt" in s.request.message
    assert s.local.phase is Phase.IDLE


def test_read_bytes_go_through_the_configured_decoder() -> None:
    decoded: list[bytes] = []

    def remembering(data: bytes, protocol: str) -> RendezvousState:
        decoded.append(data)
        return decode(data, protocol)

    config = Config(SETTINGS, decode=remembering)
    state = RendezvousState.build(participants={A: 0}, last_heartbeats={A: WALL})
    data = encode(state, PROTOCOL)
    s = step(started(Op.JOIN, config=config).local, ReadResult(data, 1, at()), config)
    assert decoded == [data]
    assert A in s.local.view.participant_map()
    s = step(started(Op.JOIN, config=config).local, ReadResult(b"[]", 1, at()), config)
    assert isinstance(s.request, Fail) and s.request.kind is FailKind.CORRUPT_STATE


@pytest.mark.parametrize("via", ["read", "lost write"])
def test_a_state_of_another_protocol_fails_the_operation_naming_both(via: str) -> None:
    # Issue 26, item 3: a node never acts on a state another protocol wrote.
    data = encode(RendezvousState.build(participants={A: 0}, last_heartbeats={A: WALL}), "scale")
    s = started(Op.JOIN)
    if via == "read":
        s = step(s.local, ReadResult(data, 1, at()), CONFIG)
    else:
        s = step(s.local, ReadResult(None, None, at()), CONFIG)  # -> CAS of our own
        assert isinstance(s.request, CompareAndSet)
        s = step(s.local, CasResult(data, 1, False, at()), CONFIG)
    assert isinstance(s.request, Fail)
    assert (s.request.op, s.request.kind) == (Op.JOIN, FailKind.PROTOCOL_MISMATCH)
    assert "protocol 'scale'" in s.request.message
    assert f"protocol {PROTOCOL!r}" in s.request.message
    assert A not in s.local.view.participant_map()  # nothing of the foreign state taken in


def test_a_node_writes_its_protocol_into_the_state() -> None:
    for variant in VARIANTS.values():
        config = Config(SETTINGS, variant)
        s = step(started(Op.CLOSE, config=config).local, ReadResult(None, None, at()), config)
        assert isinstance(s.request, CompareAndSet), variant.name
        assert decode_with_protocol(s.request.data)[1] == variant.name


@pytest.mark.parametrize("phase", ["reading", "writing", "waiting"])
def test_io_failure_fails_with_connection_and_keeps_dirty(phase: str) -> None:
    s = started(Op.JOIN)
    if phase != "reading":
        s = step(s.local, ReadResult(None, None, at()), CONFIG)  # -> CAS, dirty
    if phase == "waiting":
        assert isinstance(s.request, CompareAndSet)
        s = step(s.local, CasResult(s.request.data, 1, True, at()), CONFIG)
        assert isinstance(s.request, Wait)
    before = s.local
    s = step(before, IoFailed("connection refused", at(1)), CONFIG)
    assert s.request == Fail(Op.JOIN, FailKind.CONNECTION, "connection refused")
    assert s.local == dataclasses.replace(before, phase=Phase.IDLE, op=None)
    if phase == "writing":
        assert s.local.dirty
        # The next operation writes the unconfirmed view first.
        nxt = started(Op.QUERY, local=s.local)
        assert isinstance(nxt.request, CompareAndSet)


def _in_phase(phase: Phase) -> Local:
    return Local(ME, phase=phase, op=None if phase is Phase.IDLE else Op.JOIN)


@pytest.mark.parametrize(
    ("phase", "event"),
    [
        (Phase.IDLE, ReadResult(None, None, at())),
        (Phase.IDLE, CasResult(None, None, True, at())),
        (Phase.IDLE, WokeUp(at())),
        (Phase.IDLE, IoFailed("x", at())),
        (Phase.READING, StartOp(Op.JOIN, MONO, at())),
        (Phase.READING, CasResult(None, None, True, at())),
        (Phase.READING, WokeUp(at())),
        (Phase.WRITING, ReadResult(None, None, at())),
        (Phase.WRITING, WokeUp(at())),
        (Phase.WRITING, StartOp(Op.QUERY, MONO, at())),
        (Phase.WAITING, ReadResult(None, None, at())),
        (Phase.WAITING, CasResult(None, None, True, at())),
        (Phase.WAITING, StartOp(Op.CLOSE, MONO, at())),
    ],
    ids=lambda v: v.value if isinstance(v, Phase) else type(v).__name__,
)
def test_wrong_phase_events_are_invalid_transitions(phase: Phase, event: object) -> None:
    local = _in_phase(phase)
    with pytest.raises(InvalidTransition) as info:
        step(local, event, CONFIG)  # type: ignore[arg-type]
    assert info.value.local is local
    assert info.value.event is event
    assert f"phase {phase.value}" in str(info.value)
    assert type(event).__name__ in str(info.value)


def test_an_unknown_event_type_is_an_invalid_transition() -> None:
    with pytest.raises(InvalidTransition):
        step(Local(ME), "read", CONFIG)  # type: ignore[arg-type]


# -- next_timer ---------------------------------------------------------------------------
def _ctx(
    state: RendezvousState, op_deadline: int = MONO + JOIN, mono: int = MONO, wall: int = WALL
) -> Context:
    local = Local(ME, view=state, deadline=op_deadline)
    return context(local, Now(mono, wall), CONFIG)


WINDOW = UPSTREAM.rollback_window


@pytest.mark.parametrize(
    ("state", "op_deadline", "expected"),
    [
        pytest.param(RendezvousState.build(), MONO + 10, MONO + 11, id="op-deadline-passes"),
        pytest.param(
            RendezvousState.build(), MONO - 10, MONO - 10 + WINDOW + 1, id="rollback-window-ends"
        ),
        pytest.param(
            RendezvousState.build(participants={ME: 0}, last_heartbeats={ME: WALL - 1000}),
            MONO + JOIN,
            MONO + INTERVAL - 1000,
            id="own-heartbeat-falls-due",
        ),
        pytest.param(
            RendezvousState.build(
                participants={ME: 0, A: 0},
                deadline=WALL + 300,
                last_heartbeats={ME: WALL, A: WALL},
            ),
            MONO + JOIN,
            MONO + 301,
            id="last-call-ends",
        ),
        pytest.param(
            RendezvousState.build(participants={A: 0}, last_heartbeats={A: WALL - EXPIRY + 1000}),
            MONO + JOIN,
            MONO + 1001,
            id="peer-heartbeat-expires",
        ),
        pytest.param(
            RendezvousState.build(
                participants={ME: 0, A: 0},
                deadline=WALL - 5,
                last_heartbeats={ME: WALL - EXPIRY - 3, A: WALL - EXPIRY - 7},
            ),
            MONO - WINDOW - 100,
            MONO + 1,
            id="everything-past-falls-back-to-now-plus-1",
        ),
    ],
)
def test_next_timer_candidates(state: RendezvousState, op_deadline: int, expected: int) -> None:
    assert next_timer(_ctx(state, op_deadline), CONFIG) == expected


def test_next_timer_converts_wall_instants_with_the_clock_offset() -> None:
    state = RendezvousState.build(participants={ME: 0}, last_heartbeats={ME: 10_000})
    # mono and wall differ arbitrarily; due at wall 15_000 = 3_000 ms from now
    ctx = _ctx(state, op_deadline=10**9, mono=123, wall=12_000)
    assert next_timer(ctx, CONFIG) == 123 + 3_000


@given(
    late=st.integers(-(10**7), 10**7),
    last_call=st.none() | st.integers(-(10**6), 10**6),
    beats=st.lists(st.integers(-(10**6), 10**6), max_size=4),
    mine=st.none() | st.integers(-(10**6), 10**6),
    mono=st.integers(0, 10**12),
)
def test_next_timer_is_always_after_now(
    late: int, last_call: int | None, beats: list[int], mine: int | None, mono: int
) -> None:
    peers = {NodeId("p", i): WALL + b for i, b in enumerate(beats)}
    if mine is not None:
        peers[ME] = WALL + mine
    state = RendezvousState.build(
        deadline=None if last_call is None else WALL + last_call, last_heartbeats=peers
    )
    ctx = _ctx(state, op_deadline=mono - late, mono=mono)
    until = next_timer(ctx, CONFIG)
    assert until > mono
    # While the op deadline is ahead, no wait outlasts it.
    if late < 0:
        assert until <= mono - late + 1


def test_wait_request_uses_next_timer() -> None:
    state = RendezvousState.build(
        participants={ME: 0, A: 0}, deadline=WALL + 250, last_heartbeats={ME: WALL, A: WALL}
    )
    s = read(started(Op.JOIN), state, 6)
    assert s.request == Wait(STATE_KEY, 6, MONO + 251)
    assert s.request.until == next_timer(context(s.local, at(), CONFIG), CONFIG)


# -- several machines over one register -----------------------------------------------------
@dataclasses.dataclass
class _Sim:
    """A tiny interpreter: one compare-and-set register, nodes served in a chosen order."""

    config: Config
    data: bytes | None = None
    token: int = 0
    clock: int = 0

    def serve(self, local: Local, request: object, advance: int) -> Step:
        self.clock += advance
        now = Now(MONO + self.clock, WALL + self.clock)
        if isinstance(request, Read):
            return step(local, ReadResult(self.data, self.token, now), self.config)
        if isinstance(request, CompareAndSet):
            has_set = request.token == self.token
            if has_set:
                before = EMPTY_STATE if self.data is None else decode(self.data)
                after = decode(request.data)
                problems = check_step(before, after, self.config.settings)
                assert problems == [], (before.describe(), after.describe(), problems)
                self.data, self.token = request.data, self.token + 1
            return step(local, CasResult(self.data, self.token, has_set, now), self.config)
        assert isinstance(request, Wait)
        if advance:  # the timer fires (else: woken early by a change, which is allowed)
            self.clock = max(self.clock, request.until - MONO)
        return step(local, WokeUp(Now(MONO + self.clock, WALL + self.clock)), self.config)


# Weighted by repetition: a close ends all progress, so it is rare.
_NEXT_OPS = (Op.JOIN,) * 8 + (Op.EXIT,) * 3 + (Op.KEEP_ALIVE,) * 3 + (Op.QUERY, Op.CLOSE)


@settings(max_examples=150)
@given(
    schedule=st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from((0, 0, 1, 700, 4000))),
        min_size=30,
        max_size=150,
    ),
    next_ops=st.lists(st.sampled_from(_NEXT_OPS), min_size=20, max_size=20),
    variant=st.sampled_from((UPSTREAM, TORCH_213)),
)
def test_machines_sharing_a_register_only_write_valid_states(
    schedule: list[tuple[int, int]], next_ops: list[Op], variant: Variant
) -> None:
    sim = _Sim(Config(Settings(min_nodes=2, max_nodes=3, cache_duration=500), variant))
    nodes = [NodeId(f"n{i}", 1) for i in range(4)]
    steps = [step(Local(n), StartOp(Op.JOIN, MONO + 60_000, at()), sim.config) for n in nodes]
    ops = iter(next_ops * 10)
    for who, advance in schedule:  # bounded by the schedule's length
        current = steps[who]
        if isinstance(current.request, Done | Fail):
            now = Now(MONO + sim.clock, WALL + sim.clock)
            start = StartOp(next(ops), now.mono + 60_000, now)
            steps[who] = step(current.local, start, sim.config)
            continue
        steps[who] = sim.serve(current.local, current.request, advance)


@pytest.mark.parametrize(
    ("count", "last_call_needed"),
    [pytest.param(3, False, id="3-nodes-complete-at-max"), pytest.param(2, True, id="2-nodes")],
)
def test_nodes_served_in_turn_complete_a_round_together(count: int, last_call_needed: bool) -> None:
    sim = _Sim(Config(Settings(min_nodes=2, max_nodes=3)))
    nodes = [NodeId(f"host-{i}", 7) for i in range(count)]
    steps = [step(Local(n), StartOp(Op.JOIN, MONO + JOIN, at()), sim.config) for n in nodes]
    for _ in range(1000):  # bound: far more turns than a round needs
        pending = [i for i, s in enumerate(steps) if not isinstance(s.request, Done | Fail)]
        if not pending:
            break
        for i in pending:
            steps[i] = sim.serve(steps[i].local, steps[i].request, 1)
    assert [s.request for s in steps] == [Done(Op.JOIN)] * count
    assert sim.data is not None
    final = decode(sim.data)
    assert final.complete
    assert final.participant_map() == {n: r for r, n in enumerate(sorted(nodes))}
    for s in steps:
        assert s.local.view.participant_map() == final.participant_map()
    # Completing below max_nodes has to wait for the last call to end.
    assert (sim.clock >= SETTINGS.last_call_timeout) is last_call_needed


# -- the local liveness clock (hardened) ------------------------------------------------
UNCACHED = dataclasses.replace(SETTINGS, cache_duration=0)  # every query reads the store
HARD = Config(UNCACHED, HARDENED)
WALL_CLOCK = Config(UNCACHED, UPSTREAM)


def query(config: Config, local: Local, state: RendezvousState, mono: int, wall: int) -> Step:
    s = step(local, StartOp(Op.QUERY, mono + JOIN, Now(mono, wall)), config)
    assert isinstance(s.request, Read)
    s = step(s.local, ReadResult(encode(state, config.variant.name), 1, Now(mono, wall)), config)
    assert isinstance(s.request, Done)
    return s


# A's heartbeat was written 1 s ago by A's clock; this node's wall clock runs 100 s ahead.
SKEWED = RendezvousState.build(
    complete=True, participants={A: 0, ME: 1}, last_heartbeats={A: WALL - 1000, ME: WALL}
)


def test_upstream_evicts_a_live_peer_when_the_wall_clocks_disagree() -> None:
    s = query(WALL_CLOCK, Local(ME), SKEWED, MONO, WALL + 100_000)
    assert set(s.pruned) == {A, ME}  # both look 100 s old to the fast clock


def test_hardened_measures_liveness_on_its_own_monotonic_clock() -> None:
    # First sight: every heartbeat value is 0 ms old, whatever the wall clocks say.
    s = query(HARD, Local(ME), SKEWED, MONO, WALL + 100_000)
    assert s.pruned == ()
    assert s.local.seen_beats == ((ME, WALL, MONO), (A, WALL - 1000, MONO))  # sorted
    # A keeps beating: its value changes, so its age restarts.
    beat = SKEWED.evolve(last_heartbeats={A: WALL + 4000, ME: WALL})
    s = query(HARD, s.local, beat, MONO + EXPIRY, WALL + 100_000 + EXPIRY)
    assert s.pruned == ()
    assert dict((n, seen) for n, _, seen in s.local.seen_beats) == {A: MONO + EXPIRY, ME: MONO}
    # ME's own value stood unchanged for exactly the expiry: not yet expired; 1 ms more is.
    assert query(HARD, s.local, beat, MONO + EXPIRY, WALL).pruned == ()
    late = query(HARD, s.local, beat, MONO + EXPIRY + 1, WALL)
    assert late.pruned == (ME,)
    assert ME not in {n for n, _, _ in late.local.seen_beats}


def test_hardened_prune_ends_a_complete_round_that_lost_a_member() -> None:
    s = query(HARD, Local(ME), SKEWED, MONO, WALL)
    s = query(HARD, s.local, SKEWED, MONO + EXPIRY + 1, WALL)  # nobody beat since
    assert set(s.pruned) == {A, ME}
    assert s.local.view.round == SKEWED.round + 1  # the last member left: next round


def test_hardened_last_call_is_timed_from_first_sight() -> None:
    open_round = RendezvousState.build(
        participants={A: 0, ME: 0},
        deadline=WALL - 10**9,  # long past by any wall clock: ignored under "local"
        last_heartbeats={A: WALL, ME: WALL},
    )
    s = query(HARD, Local(ME), open_round, MONO, WALL)
    assert s.local.seen_last_call == (WALL - 10**9, MONO)
    for dt, over in ((SETTINGS.last_call_timeout, False), (SETTINGS.last_call_timeout + 1, True)):
        ctx = context(s.local, Now(MONO + dt, WALL), HARD)
        assert ctx.last_call_age == dt
        assert Atom.LAST_CALL_OVER.holds(ctx) is over
    # Under the wall clock the same state's last call is long over.
    wall_local = query(WALL_CLOCK, Local(ME), open_round, MONO, WALL).local
    wall_ctx = context(wall_local, at(), WALL_CLOCK)
    assert wall_ctx.last_call_age is None and Atom.LAST_CALL_OVER.holds(wall_ctx)


def test_hardened_next_timer_uses_first_sight_times() -> None:
    s = query(HARD, Local(ME), SKEWED, MONO, WALL + 100_000)
    ctx = context(s.local, Now(MONO, WALL + 100_000), HARD)
    # Own heartbeat due by its own wall clock, 100 s ago: that timer is in the past; the
    # next one is the expiry of what was seen at MONO.
    assert next_timer(ctx, HARD, s.local) == MONO + EXPIRY + 1


# -- num_nodes_waiting: the one count the handler and the checker use -----------------------
ROUND_3 = RendezvousState.build(round=3, complete=True, participants={ME: 0, A: 1})


def test_a_member_of_its_current_round_counts_the_wait_list_only() -> None:
    waiting = ROUND_3.evolve(wait_list=[B, C])
    for variant in (UPSTREAM, HARDENED, SCALE):
        assert nodes_waiting(ROUND_3, ME, 3, variant) == 0
        assert nodes_waiting(waiting, ME, 3, variant) == 2


@pytest.mark.parametrize(
    "view",
    [
        # its round ended (a peer left) and the next one formed without it
        RendezvousState.build(round=4, complete=True, participants={A: 0, B: 1}),
        # its round ended and the next one is open, without it on the wait list
        RendezvousState.build(round=4, participants={A: 0}),
        # its round is current but no longer holds it
        RendezvousState.build(round=3, complete=True, participants={A: 0}),
    ],
)
def test_a_member_its_round_dropped_counts_itself_under_hardened_only(
    view: RendezvousState,
) -> None:
    assert nodes_waiting(view, ME, 3, HARDENED) == nodes_waiting(view, ME, 3, SCALE) == 1
    assert nodes_waiting(view, ME, 3, UPSTREAM) == nodes_waiting(view, ME, 3, TORCH_213) == 0


def test_a_node_on_the_wait_list_or_between_calls_is_not_counted_twice() -> None:
    queued = RendezvousState.build(round=4, participants={A: 0}, wait_list=[ME])
    assert nodes_waiting(queued, ME, 3, HARDENED) == 1
    # No round returned yet (or a call in progress): the wait list alone.
    assert (
        nodes_waiting(RendezvousState.build(round=4, participants={A: 0}), ME, None, HARDENED) == 0
    )


# -- is_closed(): closed for this node's job ------------------------------------------------
@pytest.mark.parametrize(
    ("view", "job", "closed"),
    [
        # the run this node's job uses, open, then closed
        (RendezvousState.build(round=3, epoch=1), 1, False),
        (RendezvousState.build(round=3, closed=True, epoch=1), 1, True),
        # a new job reopened the run after this node's job (epoch 1) closed it: open, but
        # not for this node, whose next join fails closed (later_job)
        (RendezvousState.build(round=5, participants={A: 0}, epoch=2), 1, True),
        # a newcomer (its job one epoch up) at the closed run: closed, as torch says
        (RendezvousState.build(round=3, closed=True, epoch=1), 2, True),
        # a node that has not read the run yet: the view alone
        (RendezvousState.build(round=5, epoch=2), None, False),
    ],
)
def test_is_closed_answers_for_the_nodes_own_job(
    view: RendezvousState, job: int | None, closed: bool
) -> None:
    assert closed_for(Local(ME, view=view, job=job)) is closed


# -- StartOp.sightings: a query borrows what its node has seen ------------------------------
def test_an_operation_starts_from_the_sightings_it_is_given() -> None:
    cfg = Config(SETTINGS, HARDENED)
    seen = ((A, WALL, MONO - EXPIRY - 1),)
    s = step(Local(ME), StartOp(Op.QUERY, MONO + JOIN, at(), sightings=seen), cfg)
    assert s.local.seen_beats == seen
    # Without sightings the machine state keeps its own.
    own = evolve(Local(ME), seen_beats=((B, WALL, MONO),))
    assert step(own, StartOp(Op.QUERY, MONO + JOIN, at()), cfg).local.seen_beats == own.seen_beats


def test_borrowed_sightings_let_a_query_prune_a_node_its_node_saw_stand_still() -> None:
    """A's heartbeat value has stood still, as the main machine state watched it, for
    longer than the expiry: a fresh query state that borrows those sightings prunes A at
    its first read; without them it would have to watch A for a whole expiry itself."""
    cfg = Config(SETTINGS, HARDENED)
    state = RendezvousState.build(
        round=0, participants={A: 0, ME: 0}, last_heartbeats={A: WALL - 1, ME: WALL}
    )
    seen = ((A, WALL - 1, MONO - EXPIRY - 1), (ME, WALL, MONO))
    borrowed = step(Local(ME), StartOp(Op.QUERY, MONO + JOIN, at(), sightings=seen), cfg)
    fresh = step(Local(ME), StartOp(Op.QUERY, MONO + JOIN, at()), cfg)
    data = ReadResult(encode(state, cfg.variant.name), 1, at())
    pruned = step(borrowed.local, data, cfg)
    assert pruned.pruned == (A,) and not pruned.local.view.is_participant(A)
    kept = step(fresh.local, data, cfg)
    assert kept.pruned == () and kept.local.view.is_participant(A)


def test_evolve_is_dataclasses_replace() -> None:
    local = Local(ME, view=ROUND_3, token=7, synced_at=MONO)
    hash(local)  # caches the hash, which the copy must not inherit
    changed = evolve(local, token=8, dirty=True)
    assert changed == dataclasses.replace(local, token=8, dirty=True)
    assert hash(changed) == hash(dataclasses.replace(local, token=8, dirty=True))
    assert local.token == 7 and not local.dirty
    with pytest.raises(AssertionError):
        evolve(local, no_such_field=1)


# -- a store outage (issue 26): silence while the store is away never counts -------------
def _after_outage(config: Config, fail_during_outage: bool) -> Step:
    """ME sees A's heartbeat, then the store is away for longer than the expiry (nobody
    can beat), with or without one failed read of ME's during it; then ME reads again."""
    s = query(config, Local(ME), SKEWED, MONO, WALL)
    local = s.local
    if fail_during_outage:
        f = step(local, StartOp(Op.QUERY, MONO + JOIN, at(INTERVAL)), config)
        assert isinstance(f.request, Read)
        f = step(f.local, IoFailed("store unreachable", at(INTERVAL)), config)
        assert isinstance(f.request, Fail) and f.request.kind is FailKind.CONNECTION
        local = f.local
    back = EXPIRY + INTERVAL  # the store answers again, holding the values of before
    return query(config, local, SKEWED, MONO + back, WALL + back)


def test_an_outage_longer_than_the_expiry_would_prune_live_peers_without_a_failure() -> None:
    # What a node that never noticed the outage judges (the rule needs a failed call).
    assert set(_after_outage(HARD, fail_during_outage=False).pruned) == {A, ME}


def test_a_failed_call_restarts_the_sightings_so_an_outage_prunes_nobody() -> None:
    s = _after_outage(HARD, fail_during_outage=True)
    assert s.pruned == ()
    assert s.local.view == SKEWED
    assert {seen for _, _, seen in s.local.seen_beats} == {MONO + EXPIRY + INTERVAL}
    # Ages run again from that read: still silent a whole expiry later, they are pruned.
    later = query(HARD, s.local, SKEWED, MONO + 2 * EXPIRY + INTERVAL + 1, WALL)
    assert set(later.pruned) == {A, ME}


def test_a_failed_call_forgets_sightings_and_watch_records_only_under_the_local_clock() -> None:
    sightings = ((A, WALL, MONO),)
    watch = ((A, b"3", MONO),)
    for config, kept in ((HARD, False), (Config(UNCACHED, SCALE), False), (WALL_CLOCK, True)):
        local = evolve(Local(ME), seen_beats=sightings, watch=watch)
        s = step(local, StartOp(Op.QUERY, MONO + JOIN, at()), config)
        s = step(s.local, IoFailed("store unreachable", at()), config)
        assert (s.local.seen_beats, s.local.watch) == ((sightings, watch) if kept else ((), ()))
