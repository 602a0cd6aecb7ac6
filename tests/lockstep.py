"""Lockstep: the model checker's node and the real handler's, held to each other.

A checker trace (or any walk of the model) is replayed twice at once: by the model
(:func:`model_check.model.apply`, with its abstractions off) and by real
:class:`~rdzv.handler.DynamicRendezvousHandler` objects, one per process, over one
``memory://`` store, each with a :class:`~rdzv.clock.FakeClock`. For every machine step
the model takes, the matching real driver takes its own (it performs its pending request
on the real store, starts an operation as the handler does, or ends a wait), and the two
steps must agree: the same table, row and action, the same nodes pruned, the same request
(a compare-and-set's bytes decoded and compared up to the model's clock frame). After
every move the real store must hold what the model's does: the state, the announcement
sets and the heartbeat keys.

Clock frames: the model keeps every process's "now" at 0 (plus its skew) and moves every
stored and remembered time down a tick at each tick, capping times far in the past at a
floor (``model_check.model._shift_state``). The real clocks start at ``MONO0`` / ``WALL0``
and advance a tick at each tick. A real time ``v`` after ``k`` ticks is ``v - origin - k *
tick`` in the model's frame, capped at the same floor.

Faults: a crash (the process takes no step again), a restart under a new identity or the
same one (a fresh handler, its clock at the current time), and the store faults: each
process reaches the store through a :class:`FaultyBackend`, which fails the call the model fails (a
compare-and-set whose reply is lost after it was applied, or a call that never reaches the
store).
"""

from __future__ import annotations

import random
import uuid
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta

import spec
from model_check.canon import plain_fingerprint
from model_check.explore import FAULT_MOVES
from model_check.model import apply, enabled, initial_world
from model_check.world import Lane, ModelConfig, Move, World
from rdzv.api import RendezvousSettings, RendezvousTimeout
from rdzv.backend import RendezvousBackend, StoreRendezvousBackend
from rdzv.clock import FakeClock
from rdzv.handler import DynamicRendezvousHandler, NodeDriver
from rdzv.stores import open_store
from spec import (
    Announced,
    AnnouncedMembers,
    Beaten,
    BeatValues,
    CasResult,
    CompareAndSet,
    Done,
    Fail,
    IoFailed,
    ReadResult,
    RendezvousState,
    StartOp,
    Token,
    Wait,
    Withdrawn,
    WokeUp,
)

MONO0_MS = 1_000_000
"""Every real process's monotonic clock at the start of a walk (milliseconds)."""
WALL0_MS = 1_700_000_000_000
"""Every real process's wall clock at the start of a walk, before its skew."""
STORE_ANSWERS = (
    ReadResult,
    CasResult,
    Announced,
    AnnouncedMembers,
    Beaten,
    BeatValues,
    Withdrawn,
)
"""The events a driver produces itself, by performing its pending request on the store."""
REPLAYED_FAULTS = frozenset({"crash", "restart_new"})
MAX_POLLS = 4
"""A request takes at most this many polls to be answered (a lost compare-and-set takes
two: the write, then the re-read after a back-off that the rng below makes zero)."""


class LockstepDivergence(AssertionError):
    """The real node did something the model's did not (or the stores differ)."""


def exact_model(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with every abstraction off: the model's nodes then keep what real nodes
    keep (no forgotten records, heartbeat counts not taken modulo a small number)."""
    return replace(
        cfg,
        forget_stale=False,
        rotate_beats=False,
        forget_watch=False,
        forget_announce=False,
        beat_modulus=2**31,
    )


class StoreFault(ConnectionError):
    """What a :class:`FaultyBackend` raises for an injected fault."""


class FaultyBackend(RendezvousBackend):
    """One process's way to the shared backend, where the walk injects the model's store
    faults: :meth:`arm` makes the next call fail (``"down"``: it never reaches the store;
    ``"applied"``: a compare-and-set is carried out, then its reply is lost)."""

    def __init__(self, inner: RendezvousBackend) -> None:
        self.inner = inner
        self.armed: str | None = None
        self.injected = 0

    def arm(self, fault: str) -> None:
        self.armed = fault

    def _fault(self) -> None:
        if self.armed is not None:
            self.armed = None
            self.injected += 1
            raise StoreFault("injected by the lockstep walk: the store is unreachable")

    @property
    def name(self) -> str:
        return self.inner.name

    def get_state(self) -> tuple[bytes, Token] | None:
        self._fault()
        return self.inner.get_state()

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        if self.armed == "applied":
            self.inner.set_state(state, token)
        self._fault()
        return self.inner.set_state(state, token)

    def wait_for_change(self, token: Token | None, timeout: float) -> bool:
        self._fault()
        return self.inner.wait_for_change(token, 0.0)

    def announce(self, round_: int, member: bytes) -> int:
        self._fault()
        return self.inner.announce(round_, member)

    def announced(self, round_: int) -> list[bytes]:
        self._fault()
        return self.inner.announced(round_)

    def withdraw(self, round_: int, member: bytes) -> None:
        self._fault()
        self.inner.withdraw(round_, member)

    def beat(self, node: str, value: bytes) -> None:
        self._fault()
        self.inner.beat(node, value)

    def beats(self, nodes: Sequence[str]) -> list[bytes | None]:
        self._fault()
        return self.inner.beats(nodes)


class _NoBackoff(random.Random):
    """An rng whose back-off after a lost compare-and-set is zero: the model re-reads at
    once, in the same move."""

    def uniform(self, a: float, b: float) -> float:
        return a


@dataclass
class _RealProc:
    handler: DynamicRendezvousHandler
    clock: FakeClock
    backend: FaultyBackend

    def driver(self, lane: Lane) -> NodeDriver:
        h = self.handler
        return h.driver if lane is Lane.MAIN else h.control_driver


@dataclass
class Lockstep:
    """One walk, replayed by the model and by real handlers side by side."""

    cfg: ModelConfig
    run_id: str = field(default_factory=lambda: f"lockstep-{uuid.uuid4().hex[:12]}")

    def __post_init__(self) -> None:
        self.cfg = exact_model(self.cfg)
        self.store = open_store(f"memory://{self.run_id}")
        self.backend = StoreRendezvousBackend(self.store, self.run_id)
        self.world: World = initial_world(self.cfg)
        self.ticks = 0
        self.procs: list[_RealProc] = [self._real(p.ident, p.skew) for p in self.world.procs]
        self.steps = 0
        self.moves = 0
        self.returns: list[tuple[spec.NodeId, int, int | None, int]] = []
        """What each real node's joins returned: node, round, rank, world size."""
        self.rows: Counter[str] = Counter()
        """How often each row (by its qualified name) decided a step both sides took."""
        self._move: Move | None = None

    # -- building real nodes ----------------------------------------------------------
    def _settings(self) -> RendezvousSettings:
        s = self.cfg.settings
        ms = timedelta(milliseconds=1)
        return RendezvousSettings(
            run_id=self.run_id,
            min_nodes=s.min_nodes,
            max_nodes=s.max_nodes,
            timeout=RendezvousTimeout(
                join=s.join_timeout * ms,
                last_call=s.last_call_timeout * ms,
                close=s.close_timeout * ms,
                heartbeat=s.heartbeat_timeout * ms,
            ),
            keep_alive_interval=s.keep_alive_interval * ms,
            keep_alive_max_attempt=s.keep_alive_max_attempt,
        )

    def _real(self, node: spec.NodeId, skew: int) -> _RealProc:
        t = self.cfg.tick_ms
        elapsed = self.ticks * t
        clock = FakeClock(
            mono_start=(MONO0_MS + elapsed) / 1000,
            wall_start=(WALL0_MS + elapsed + skew * t) / 1000,
        )
        backend = FaultyBackend(self.backend)
        handler = DynamicRendezvousHandler(
            node=node,
            settings=self._settings(),
            backend_name="memory",
            store=self.store,
            backend=backend,
            variant=self.cfg.variant,
            cache_duration=self.cfg.settings.cache_duration / 1000,
            clock=clock,
            rng=_NoBackoff(0),
        )
        if handler.driver.config.settings != self.cfg.settings:
            raise AssertionError(
                f"the real handler's settings {handler.driver.config.settings} are not the "
                f"model's {self.cfg.settings}"
            )
        return _RealProc(handler, clock, backend)

    # -- clock frames ---------------------------------------------------------------------
    def _mono(self) -> int:
        return MONO0_MS + self.ticks * self.cfg.tick_ms

    def _wall_offset(self) -> int:
        return WALL0_MS + self.ticks * self.cfg.tick_ms

    def to_model(self, state: RendezvousState) -> RendezvousState:
        """A real state in the model's clock frame (times capped as the model caps them)."""
        cfg = self.cfg
        t = cfg.tick_ms
        lo_wall = min(0, cfg.skew_ticks) * t
        off = self._wall_offset()
        floor_beat = lo_wall - cfg.settings.heartbeat_expiry - t
        beats = tuple((n, max(b - off, floor_beat)) for n, b in state.last_heartbeats)
        deadline = state.deadline
        if deadline is not None:
            deadline = max(deadline - off, lo_wall - t)
        return replace(state, last_heartbeats=beats, deadline=deadline)

    # -- the walk ---------------------------------------------------------------------------
    def play(self, move: Move) -> None:
        """Apply ``move`` to both sides; raise :class:`LockstepDivergence` where they part."""
        if move not in enabled(self.world, self.cfg):
            raise ValueError(f"move {move} is not enabled")
        kind = move.kind
        self._move = move
        if kind == "tick":
            self.ticks += 1
            for proc in self.procs:
                proc.clock.advance(self.cfg.tick_ms / 1000)
        outcome = apply(self.world, move, self.cfg, self._observe)
        self.world = outcome.world
        if kind in ("restart_new", "restart_same"):
            p = self.world.procs[move.slot]
            self.procs[move.slot] = self._real(p.ident, p.skew)
        self.moves += 1
        self._compare_stores()

    def walk(self, moves: Sequence[Move]) -> None:
        for move in moves:
            self.play(move)

    def random_walk(self, seed: int, length: int, fault_odds: float = 0.05) -> list[Move]:
        """Play up to ``length`` moves chosen by ``random.Random(seed)`` among the enabled
        ones; a fault (or a worker failure) with probability ``fault_odds`` when there
        are other moves too, so that walks run long enough to reach later rounds.
        Returns the moves played."""
        rng = random.Random(seed)
        played: list[Move] = []
        for _ in range(length):
            moves = enabled(self.world, self.cfg)
            if not moves:
                break
            calm = [m for m in moves if m.kind not in FAULT_MOVES]
            faulty = [m for m in moves if m.kind in FAULT_MOVES]
            pick = faulty if faulty and (not calm or rng.random() < fault_odds) else calm
            move = rng.choice(pick)
            self.play(move)
            played.append(move)
        return played

    # -- one step -------------------------------------------------------------------------
    def _where(self, slot: int, lane: Lane) -> str:
        return (
            f"move {self.moves + 1} ({self._move}), process {slot} "
            f"({self.world.procs[slot].ident}), {lane.name.lower()} machine state, step "
            f"{self.steps}"
        )

    def _observe(self, slot: int, lane: Lane, event: spec.Event, model: spec.Step) -> None:
        self.steps += 1
        proc = self.procs[slot]
        driver = proc.driver(lane)
        before = driver.stats.steps
        if model.row is not None:
            self.rows[model.row] += 1
        if isinstance(event, StartOp):
            deadline = event.deadline - event.now.mono + self._mono()
            proc.handler.start_on(driver, event.op, deadline)
        elif isinstance(event, WokeUp):
            driver.wake()
        elif isinstance(event, IoFailed):
            # The move is a store fault: the real call fails the same way.
            move = self._move
            applied = move is not None and move.kind.endswith("cas_unknown_applied")
            proc.backend.arm("applied" if applied else "down")
            if isinstance(driver.request, Wait):
                driver._perform(block=True)  # one wait slice: the call fails
            else:
                driver.poll()
            if proc.backend.armed is not None:
                raise LockstepDivergence(
                    f"{self._where(slot, lane)}: the model failed a store call, but the "
                    f"real driver made none (request {driver.request!r})"
                )
        elif isinstance(event, STORE_ANSWERS):
            for _ in range(MAX_POLLS):
                if driver.stats.steps != before:
                    break
                driver.poll()
        else:
            raise LockstepDivergence(
                f"{self._where(slot, lane)}: the model fed {event!r}, which lockstep does not "
                "replay"
            )
        if driver.stats.steps != before + 1:
            raise LockstepDivergence(
                f"{self._where(slot, lane)}: the model fed {type(event).__name__} but the "
                f"real driver took {driver.stats.steps - before} steps (request "
                f"{driver.request!r})"
            )
        real = driver.last_step
        assert real is not None
        self._compare_step(slot, lane, event, model, real)
        done = real.request
        if isinstance(done, Done) and done.op is spec.Op.JOIN:
            view = driver.local.view
            rank = view.rank_of(driver.local.node)
            self.returns.append((driver.local.node, view.round, rank, view.num_participants))

    def _compare_step(
        self, slot: int, lane: Lane, event: spec.Event, model: spec.Step, real: spec.Step
    ) -> None:
        where = self._where(slot, lane)
        if (model.row, model.action) != (real.row, real.action):
            raise LockstepDivergence(
                f"{where}: after {type(event).__name__} the model's node took row "
                f"{model.row} -> {_action(model)} but the real node took row {real.row} -> "
                f"{_action(real)}"
            )
        if model.pruned != real.pruned:
            raise LockstepDivergence(
                f"{where}: the model's node pruned {model.pruned} but the real node "
                f"pruned {real.pruned}"
            )
        self._compare_request(where, model.request, real.request)

    def _compare_request(self, where: str, model: object, real: object) -> None:
        same: bool
        if type(model) is not type(real):
            same = False
        elif isinstance(model, CompareAndSet) and isinstance(real, CompareAndSet):
            same = model.key == real.key and spec.decode(model.data) == self.to_model(
                spec.decode(real.data)
            )
        elif isinstance(model, Wait) and isinstance(real, Wait):
            same = model.key == real.key
        elif isinstance(model, Done) and isinstance(real, Done):
            same = model.op == real.op
        elif isinstance(model, Fail) and isinstance(real, Fail):
            same = (model.op, model.kind) == (real.op, real.kind)
        else:  # reads, announcements, beats: every field must match
            same = model == real
        if not same:
            raise LockstepDivergence(
                f"{where}: the model's node asked for {_request(model, None)} but the real "
                f"node asked for {_request(real, self)}"
            )

    # -- the stores -----------------------------------------------------------------------
    def _compare_stores(self) -> None:
        where = f"after move {self.moves} ({self._move})"
        got = self.backend.get_state()
        real = None if got is None else self.to_model(spec.decode(got[0]))
        model = None if self.world.store is None else spec.decode(self.world.store)
        if real != model:
            raise LockstepDivergence(
                f"{where}: the model's store holds {_text(model)} but the real store holds "
                f"{_text(real)}"
            )
        last = 0 if model is None else model.round + 1
        rounds = {r for r, _ in self.world.announced} | set(range(last + 1))
        for r in sorted(rounds):
            want = sorted(n for rr, n in self.world.announced if rr == r)
            got_set = sorted(spec.decode_node(m) for m in self.backend.announced(r))
            if want != got_set:
                raise LockstepDivergence(
                    f"{where}: round {r}'s announcement set is {want} in the model but "
                    f"{got_set} in the real store"
                )
        nodes = sorted({p.ident for p in self.world.procs} | {n for n, _ in self.world.beats})
        want_beats = dict(self.world.beats)
        have_beats = self.backend.beats([str(n) for n in nodes])
        for n, have in zip(nodes, have_beats, strict=True):
            if want_beats.get(n) != have:
                raise LockstepDivergence(
                    f"{where}: {n}'s heartbeat key holds {want_beats.get(n)!r} in the model "
                    f"but {have!r} in the real store"
                )

    def close(self) -> None:
        close = getattr(self.store, "close", None)
        if callable(close):
            close()


def _action(step: spec.Step) -> str:
    return "-" if step.action is None else step.action.value


def _text(state: RendezvousState | None) -> str:
    return "nothing" if state is None else state.describe()


def _request(request: object, side: Lockstep | None) -> str:
    if isinstance(request, CompareAndSet):
        state = spec.decode(request.data)
        if side is not None:
            state = side.to_model(state)
        return f"compare-and-set of {state.describe()} (model frame)"
    return repr(request)


def leaf_paths(cfg: ModelConfig, limit: int, rows: set[str] | None = None) -> list[list[Move]]:
    """The move sequences from the initial world to the leaves of a breadth-first search
    tree of the checker's (abstract) model of ``cfg``, without symmetry reduction: every
    world the checker reaches lies on one of them. ``rows`` (if given) receives every row
    that decides a step of any move of the space (not only of the tree's). ``ValueError``
    beyond ``limit`` distinct worlds (pick a smaller space)."""

    def seen_row(slot: int, lane: Lane, event: spec.Event, step: spec.Step) -> None:
        if rows is not None and step.row is not None:
            rows.add(step.row)

    first = initial_world(cfg)
    seen = {plain_fingerprint(first, cfg)}
    queue: deque[tuple[World, tuple[Move, ...]]] = deque([(first, ())])
    leaves: list[list[Move]] = []
    while queue:  # bounded: each distinct world is queued once, at most ``limit``
        world, path = queue.popleft()
        grew = False
        for move in enabled(world, cfg):
            after = apply(world, move, cfg, seen_row).world
            fp = plain_fingerprint(after, cfg)
            if fp in seen:
                continue
            if len(seen) >= limit:
                raise ValueError(f"the space of {cfg} has more than {limit} worlds")
            seen.add(fp)
            grew = True
            queue.append((after, (*path, move)))
        if not grew:
            leaves.append(list(path))
    return leaves
