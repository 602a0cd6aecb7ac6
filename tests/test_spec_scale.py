"""The ``scale`` variant: announcements, folds, and the machine steps that carry them.

The fold is checked against its definition (each announced node joining on its own, one
after the other), the FOLD_DUE atom against each of its three reasons, and the machine
against a small in-test interpreter (a dict register and announcement sets) in which N
nodes join one round with a single compare-and-set.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spec.codec import CorruptState, decode, decode_node, encode, encode_node
from spec.effects import add_to_participants, fold_and_complete, fold_announced
from spec.invariants import check_state, check_step
from spec.machine import (
    Announce,
    Announced,
    AnnouncedMembers,
    Beat,
    Beaten,
    BeatValues,
    CasResult,
    CompareAndSet,
    Config,
    Done,
    Fail,
    InvalidTransition,
    Local,
    Now,
    Phase,
    Read,
    ReadAnnounced,
    ReadBeats,
    ReadResult,
    StartOp,
    Step,
    Wait,
    Withdraw,
    Withdrawn,
    WokeUp,
    context,
    evolve,
    next_timer,
    step,
    watched,
)
from spec.settings import Settings
from spec.state import EMPTY_STATE, NodeId, RendezvousState
from spec.tables import Atom, row
from spec.variants import HARDENED, SCALE, UPSTREAM, VARIANTS
from spec.vocabulary import Action, FailKind, Op

NODES = tuple(NodeId("h", i) for i in range(6))
WALL = 1_000_000


def sequential_fold(
    state: RendezvousState, announced: tuple[NodeId, ...], settings: Settings, wall: int
) -> RendezvousState:
    """The fold's definition: each announced node joins by itself, in sorted order."""
    new = state
    for node in sorted(set(announced)):
        if new.complete:
            break
        if new.is_participant(node) or new.is_redundant(node):
            continue
        new = add_to_participants(new, node, settings, wall)
    return new


@st.composite
def open_rounds(draw: st.DrawFn) -> tuple[RendezvousState, Settings]:
    low = draw(st.integers(1, 4))
    settings = Settings(min_nodes=low, max_nodes=draw(st.integers(low, 5)))
    pool = list(NODES)
    members = draw(st.lists(st.sampled_from(pool), unique=True, max_size=settings.max_nodes - 1))
    rest = [n for n in pool if n not in members]
    waiting = draw(st.lists(st.sampled_from(rest), unique=True, max_size=2)) if rest else []
    rest = [n for n in rest if n not in waiting]
    spare = draw(st.lists(st.sampled_from(rest), unique=True, max_size=1)) if rest else []
    listed = [*members, *waiting, *spare]
    deadline = WALL + 5 if len(members) >= settings.min_nodes else None
    state = RendezvousState.build(
        round=draw(st.integers(0, 3)),
        deadline=deadline,
        participants={n: 0 for n in members},
        wait_list=waiting,
        redundancy_list=spare,
        last_heartbeats={n: WALL - 1 for n in listed},
    )
    return state, settings


@given(case=open_rounds(), announced=st.lists(st.sampled_from(NODES), max_size=8))
def test_fold_is_each_announced_node_joining_in_turn(
    case: tuple[RendezvousState, Settings], announced: list[NodeId]
) -> None:
    state, settings = case
    folded = fold_announced(state, NODES[0], tuple(announced), settings, WALL)
    assert folded == sequential_fold(state, tuple(announced), settings, WALL)
    assert check_step(state, folded, settings) == []


@given(case=open_rounds(), announced=st.lists(st.sampled_from(NODES), max_size=8))
def test_fold_and_complete_ends_the_last_call(
    case: tuple[RendezvousState, Settings], announced: list[NodeId]
) -> None:
    state, settings = case
    done = fold_and_complete(state, NODES[0], tuple(announced), settings, WALL)
    folded = sequential_fold(state, tuple(announced), settings, WALL)
    assert done.participant_nodes() == folded.participant_nodes()
    viable = settings.min_nodes <= folded.num_participants <= settings.max_nodes
    assert done.complete is (folded.complete or viable)
    assert check_step(state, done, settings) == []


def test_a_fold_of_a_complete_round_changes_nothing() -> None:
    settings = Settings(min_nodes=1, max_nodes=3)
    complete = RendezvousState.build(
        complete=True, participants={NODES[0]: 0}, last_heartbeats={NODES[0]: WALL}
    )
    assert fold_announced(complete, NODES[0], NODES[1:3], settings, WALL) == complete


def test_a_fold_starts_the_last_call_when_it_crosses_min_nodes() -> None:
    settings = Settings(min_nodes=2, max_nodes=4)
    folded = fold_announced(EMPTY_STATE, NODES[0], NODES[:3], settings, WALL)
    assert folded.participant_nodes() == NODES[:3]
    assert folded.deadline == WALL + settings.last_call_timeout
    assert not folded.complete


def test_a_fold_stops_at_max_nodes_and_completes() -> None:
    settings = Settings(min_nodes=2, max_nodes=3)
    folded = fold_announced(EMPTY_STATE, NODES[5], NODES[::-1], settings, WALL)
    assert folded.complete and folded.deadline is None
    assert folded.participants == ((NODES[0], 0), (NODES[1], 1), (NODES[2], 2))


# -- the table and the atoms ---------------------------------------------------------------
def test_scale_is_a_named_diff_of_hardened() -> None:
    assert VARIANTS["scale"] is SCALE
    assert SCALE.parent == HARDENED.name
    # join: 4 rows replaced (4 removed, 4 added) and 8 added (a fold, a withdrawal, and a
    # watch and a prune for each kind of standing by, and for a newcomer waiting at a closed
    # run); keep_alive: 3 removed and 5 added; two folds; heartbeats under keys.
    assert len(SCALE.changes) == 27
    assert SCALE.changes[-1] == "heartbeats: state -> keys"
    actions = [r.then for r in SCALE.table(Op.JOIN).rows]
    assert Action.ADD_TO_PARTICIPANTS not in actions
    assert {Action.ANNOUNCE, Action.FOLD, Action.FOLD_AND_COMPLETE} <= set(actions)


def test_a_folding_row_without_its_fold_is_rejected() -> None:
    with pytest.raises(ValueError, match="fold_announcements has no fold"):
        HARDENED.derive(
            "broken",
            description="a fold row and no fold",
            insert={(Op.JOIN, 0): row("fold", Atom.FOLD_DUE, then=Action.FOLD)},
        )


def _ctx(
    size: int | None, age: int, participants: int, settings: Settings, before: int = 0
) -> bool:
    state = RendezvousState.build(
        participants={n: 0 for n in NODES[1 : 1 + participants]},
        last_heartbeats={n: WALL for n in NODES[1 : 1 + participants]},
    )
    local = Local(NODES[0], view=state, op=Op.JOIN, deadline=10**9)
    if size is not None:
        local = Local(
            NODES[0], view=state, op=Op.JOIN, deadline=10**9, announced=(0, size, 100, before)
        )
    ctx = context(local, Now(100 + age, WALL), Config(settings, SCALE))
    return Atom.FOLD_DUE.holds(ctx)


@pytest.mark.parametrize(
    ("size", "age", "participants", "due"),
    [
        (None, 0, 0, False),  # not announced
        (4, 0, 0, True),  # filled the round
        (2, 0, 0, True),  # reached min, nobody folded yet
        (2, 0, 2, False),  # reached min, somebody folded: wait
        (3, 0, 2, False),  # between min and max: wait for the fold or the last call
        (4, 5_001, 0, False),  # stale: renew the announcement first (fresh size)
    ],
)
def test_fold_due_has_two_reasons(size: int | None, age: int, participants: int, due: bool) -> None:
    settings = Settings(min_nodes=2, max_nodes=4)
    assert _ctx(size, age, participants, settings) is due


@pytest.mark.parametrize(
    ("size", "before", "participants", "due"),
    [
        (4, 3, 2, False),  # the last call runs; full only now: the filler folds
        (4, 4, 2, True),  # full an interval ago and still no fold: the filler is gone
        (4, 3, 0, True),  # min reached an interval ago and no fold: start the last call
        (2, 1, 0, False),  # a renewal finds min just reached: whoever reached it folds
        (3, 2, 0, True),  # min reached an interval ago and nobody folded
        (3, 3, 2, False),  # somebody folded meanwhile: wait
    ],
)
def test_a_renewal_folds_only_a_threshold_reached_an_interval_ago(
    size: int, before: int, participants: int, due: bool
) -> None:
    settings = Settings(min_nodes=2, max_nodes=4)
    assert _ctx(size, 0, participants, settings, before) is due


def test_a_renewal_remembers_the_size_of_the_announcement_it_renews() -> None:
    settings = Settings(min_nodes=2, max_nodes=3)
    config = Config(settings, SCALE)
    now = Now(0, WALL)
    local = Local(NODES[0], op=Op.JOIN, deadline=10**9, phase=Phase.ANNOUNCING)
    first = step(local, Announced(1, now), config).local
    assert first.announced == (0, 1, 0, 0)
    renewing = evolve(first, phase=Phase.ANNOUNCING)
    later = Now(6_000, WALL + 6_000)
    assert step(renewing, Announced(3, later), config).local.announced == (0, 3, 6_000, 1)


# -- the machine -----------------------------------------------------------------------------
def _start_join(local: Local, config: Config, now: Now) -> Step:
    return step(local, StartOp(Op.JOIN, now.mono + 60_000, now), config)


def test_an_announcer_waits_then_a_stale_fold_reads_again() -> None:
    settings = Settings(min_nodes=2, max_nodes=3)
    config = Config(settings, SCALE)
    now = Now(0, WALL)
    me = NODES[0]
    s = _start_join(Local(me), config, now)
    assert isinstance(s.request, Read)
    s = step(s.local, ReadResult(None, None, now), config)
    assert s.action is Action.ANNOUNCE and s.request == Announce(0, encode_node(me))
    assert s.local.phase is Phase.ANNOUNCING
    s = step(s.local, Announced(1, now), config)
    assert s.action is Action.SYNC and isinstance(s.request, Wait)
    # It renews its announcement a keep-alive interval later at the latest: the set's
    # size it gets back tells whether the node that should have folded did not.
    assert s.request.until == settings.keep_alive_interval + 1
    later = Now(settings.keep_alive_interval + 1, WALL)
    s = step(s.local, WokeUp(later), config)
    s = step(s.local, ReadResult(None, None, later), config)
    assert s.action is Action.ANNOUNCE and s.request == Announce(0, encode_node(me))
    s = step(s.local, Announced(2, later), config)  # another node announced meanwhile
    # That node reached min_nodes and folds: a renewal that merely finds min reached
    # leaves the fold to it, and waits another interval.
    assert s.action is Action.SYNC and isinstance(s.request, Wait)
    assert s.request.until == later.mono + settings.keep_alive_interval + 1
    last = Now(later.mono + settings.keep_alive_interval + 1, WALL)
    s = step(s.local, WokeUp(last), config)
    s = step(s.local, ReadResult(None, None, last), config)
    assert s.action is Action.ANNOUNCE and s.request == Announce(0, encode_node(me))
    # Still no fold a whole interval after min was reached: that node is gone, so this one
    # folds.
    s = step(s.local, Announced(2, last), config)
    assert s.action is Action.FOLD and s.request == ReadAnnounced(0)
    s = step(s.local, AnnouncedMembers((encode_node(me),), last), config)
    assert isinstance(s.request, CompareAndSet) and s.local.dirty
    assert decode(s.request.data).participant_nodes() == (me,)


def test_a_corrupt_member_fails_with_corrupt_state() -> None:
    config = Config(Settings(min_nodes=1, max_nodes=2), SCALE)
    now = Now(0, WALL)
    s = _start_join(Local(NODES[0]), config, now)
    s = step(s.local, ReadResult(None, None, now), config)
    s = step(s.local, Announced(1, now), config)
    assert s.action is Action.FOLD
    s = step(s.local, AnnouncedMembers((b"not a node",), now), config)
    assert isinstance(s.request, Fail) and s.request.kind is FailKind.CORRUPT_STATE
    assert "announcement set" in s.request.message
    assert s.local.phase is Phase.IDLE and s.local.folding is None


def test_announcement_answers_out_of_phase_are_refused() -> None:
    config = Config(Settings(), SCALE)
    with pytest.raises(InvalidTransition):
        step(Local(NODES[0]), Announced(1, Now(0, 0)), config)
    with pytest.raises(InvalidTransition):
        step(Local(NODES[0]), AnnouncedMembers((), Now(0, 0)), config)


class Interpreter:
    """A linearizable register and announcement sets, serving one request at a time."""

    def __init__(self) -> None:
        self.data: bytes | None = None
        self.version = 0
        self.sets: dict[int, set[bytes]] = {}
        self.beats: dict[NodeId, bytes] = {}
        self.cas = 0
        self.conflicts = 0

    @property
    def token(self) -> int | None:
        return None if self.data is None else self.version

    def serve(self, s: Step, now: Now) -> object:
        request = s.request
        if isinstance(request, Read):
            return ReadResult(self.data, self.token, now)
        if isinstance(request, CompareAndSet):
            self.cas += 1
            ok = request.token == self.token
            if ok:
                self.data, self.version = request.data, self.version + 1
            else:
                self.conflicts += 1
            return CasResult(self.data, self.token, ok, now)
        if isinstance(request, Announce):
            members = self.sets.setdefault(request.round, set())
            members.add(request.member)
            return Announced(len(members), now)
        if isinstance(request, ReadAnnounced):
            return AnnouncedMembers(tuple(sorted(self.sets.get(request.round, ()))), now)
        if isinstance(request, Wait):
            return WokeUp(now)
        if isinstance(request, Beat):
            self.beats[s.local.node] = request.value
            return Beaten(now)
        if isinstance(request, ReadBeats):
            return BeatValues(tuple(self.beats.get(n) for n in request.nodes), now)
        raise AssertionError(f"unexpected request {request}")


@pytest.mark.parametrize("n", [1, 3, 8, 32])
def test_n_nodes_join_one_round_with_one_write(n: int) -> None:
    settings = Settings(min_nodes=n, max_nodes=n)
    config = Config(settings, SCALE)
    store = Interpreter()
    now = Now(0, WALL)
    nodes = [NodeId("h", i) for i in range(n)]
    steps = {node: _start_join(Local(node), config, now) for node in nodes}
    # Round robin: each node carries one request at a time, waiting nodes included.
    for _ in range(20 * n):  # bounded: every node needs a handful of requests
        pending = [node for node in nodes if not isinstance(steps[node].request, Done)]
        if not pending:
            break
        for node in pending:
            event = store.serve(steps[node], now)
            steps[node] = step(steps[node].local, event, config)  # type: ignore[arg-type]
    assert all(isinstance(s.request, Done) for s in steps.values())
    assert store.cas == 1 and store.conflicts == 0
    assert store.data is not None
    final = decode(store.data)
    assert final.complete and final.participants == tuple((node, r) for r, node in enumerate(nodes))
    assert check_state(final, settings) == []
    assert all(s.local.view == final for s in steps.values())


def test_next_timer_without_an_announcement_is_unchanged() -> None:
    config = Config(Settings(), SCALE)
    local = Local(NODES[0], op=Op.JOIN, deadline=10_000)
    ctx = context(local, Now(0, WALL), config)
    assert next_timer(ctx, config, local) == 10_001


def test_node_identities_round_trip_and_garbage_is_refused() -> None:
    node = NodeId("host.example", 4242, 7)
    assert decode_node(encode_node(node)) == node
    assert encode_node(node) == b'["host.example",4242,7]'
    for garbage in (b"", b"[1,2]", b'["a",1]', b'["a",-1,0]', b"\xff", b'["a",1,2,3]'):
        with pytest.raises(CorruptState):
            decode_node(garbage)
    assert encode(EMPTY_STATE, "scale")  # the state codec is untouched by members


# -- heartbeats under keys -----------------------------------------------------------------------
COMPLETE3 = RendezvousState.build(
    complete=True,
    participants={NODES[0]: 0, NODES[1]: 1, NODES[2]: 2},
    last_heartbeats={NODES[0]: WALL, NODES[1]: WALL, NODES[2]: WALL},
)


def test_the_first_participant_watches_everybody_and_everybody_watches_it() -> None:
    assert watched(COMPLETE3, NODES[0]) == (NODES[1], NODES[2])
    assert watched(COMPLETE3, NODES[1]) == (NODES[0],)
    assert watched(COMPLETE3, NODES[3]) == ()  # not a participant
    open_round = COMPLETE3.evolve(complete=False, participants={NODES[0]: 0, NODES[1]: 0})
    assert watched(open_round, NODES[0]) == ()  # open rounds are not watched


def _keep_alive(local: Local, config: Config, now: Now) -> Step:
    s = step(local, StartOp(Op.KEEP_ALIVE, now.mono + 60_000, now), config)
    if isinstance(s.request, Read):  # not when the last read is within cache_duration
        s = step(s.local, ReadResult(encode(COMPLETE3, config.variant.name), 1, now), config)
    return s


def test_a_watcher_beats_reads_its_watched_keys_and_prunes_a_still_heartbeat() -> None:
    settings = Settings(min_nodes=2, max_nodes=3, keep_alive_interval=1_000)
    config = Config(settings, SCALE)
    t0 = Now(0, WALL)
    s = _keep_alive(Local(NODES[0]), config, t0)
    assert s.action is Action.BEAT and s.request == Beat(b"1")
    s = step(s.local, Beaten(t0), config)
    assert s.action is Action.WATCH and s.request == ReadBeats((NODES[1], NODES[2]))
    s = step(s.local, BeatValues((b"5", b"9"), t0), config)
    assert isinstance(s.request, Done)
    # One expiry later node 1 beat (its value changed) and node 2 did not.
    t1 = Now(settings.heartbeat_expiry + 1, WALL)
    s = _keep_alive(s.local, config, t1)
    assert s.action is Action.BEAT and s.request == Beat(b"2")
    s = step(s.local, Beaten(t1), config)
    assert s.action is Action.WATCH
    s = step(s.local, BeatValues((b"6", b"9"), t1), config)
    assert s.action is Action.PRUNE_DEAD and s.pruned == (NODES[2],)
    assert isinstance(s.request, CompareAndSet)
    after = decode(s.request.data)
    # hardened's prune ends the broken round: the survivors wait for the next one.
    assert after.round == 1 and not after.complete
    assert set(after.wait_list) == {NODES[0], NODES[1]}
    assert check_step(COMPLETE3, after, settings) == []


def test_a_beating_node_is_never_found_dead() -> None:
    settings = Settings(min_nodes=2, max_nodes=3, keep_alive_interval=1_000)
    config = Config(settings, SCALE)
    local = Local(NODES[1])
    value = 0
    for k in range(6):  # one watch per interval; the watched first participant beats each time
        now = Now(k * settings.keep_alive_interval, WALL)
        s = _keep_alive(local, config, now)
        while not isinstance(s.request, Done):
            value += 1
            if isinstance(s.request, Beat):
                s = step(s.local, Beaten(now), config)
            elif isinstance(s.request, ReadBeats):
                s = step(s.local, BeatValues((str(value).encode(),), now), config)
            else:
                raise AssertionError(f"node 1 asked for {s.request} at interval {k}")
        local = s.local
    assert local.watch[0][0] == NODES[0]


def test_heartbeats_under_keys_need_the_local_liveness_clock() -> None:
    with pytest.raises(ValueError, match="local liveness clock"):
        UPSTREAM.derive("bad", description="keys on the wall clock", heartbeats="keys")


def _announced_then_past_deadline(config: Config, me: NodeId) -> tuple[Step, Now]:
    """A node announces itself in an open round, waits, and wakes past its deadline."""
    now = Now(0, WALL)
    s = step(Local(me), StartOp(Op.JOIN, 1_000, now), config)
    s = step(s.local, ReadResult(None, None, now), config)
    s = step(s.local, Announced(1, now), config)
    assert s.action is Action.SYNC
    late = Now(1_001, WALL)
    s = step(s.local, WokeUp(late), config)
    return step(s.local, ReadResult(None, None, late), config), late


def test_an_announcer_past_its_deadline_takes_its_announcement_back_then_times_out() -> None:
    config = Config(Settings(min_nodes=2, max_nodes=3), SCALE)
    me = NODES[0]
    s, late = _announced_then_past_deadline(config, me)
    assert s.action is Action.WITHDRAW and s.request == Withdraw(0, encode_node(me))
    assert s.local.phase is Phase.WITHDRAWING
    with pytest.raises(InvalidTransition):
        step(s.local, Announced(1, late), config)
    s = step(s.local, Withdrawn(late), config)
    # It reads again (a fold may have admitted it), however fresh its view was.
    assert isinstance(s.request, Read) and s.local.announced is None
    s = step(s.local, ReadResult(None, None, late), config)
    assert s.action is Action.ERROR_TIMEOUT and isinstance(s.request, Fail)
    assert s.request.kind is FailKind.TIMEOUT


def test_an_announcer_admitted_before_it_withdrew_leaves_the_round_too() -> None:
    config = Config(Settings(min_nodes=3, max_nodes=4), SCALE)
    me, other = NODES[0], NODES[1]
    s, late = _announced_then_past_deadline(config, me)
    assert s.action is Action.WITHDRAW
    s = step(s.local, Withdrawn(late), config)
    # A fold admitted both before the announcement left the set (min_nodes not reached).
    folded = fold_announced(EMPTY_STATE, other, (me, other), config.settings, WALL)
    s = step(s.local, ReadResult(encode(folded, config.variant.name), 1, late), config)
    assert s.action is Action.REMOVE_FROM_PARTICIPANTS
    assert isinstance(s.request, CompareAndSet)
    assert decode(s.request.data).participant_nodes() == (other,)


def test_past_the_rollback_window_an_announcer_gives_up_at_once() -> None:
    config = Config(Settings(min_nodes=2, max_nodes=3), SCALE)
    now = Now(0, WALL)
    s = step(Local(NODES[0]), StartOp(Op.JOIN, 1_000, now), config)
    s = step(s.local, ReadResult(None, None, now), config)
    s = step(s.local, Announced(1, now), config)
    gone = Now(1_000 + SCALE.rollback_window + 1, WALL)
    s = step(s.local, WokeUp(gone), config)
    s = step(s.local, ReadResult(None, None, gone), config)
    assert s.action is Action.ERROR_TIMEOUT
