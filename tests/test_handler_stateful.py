"""Hypothesis drives several real handlers over one memory store with a fake clock.

Each rule does at most one store operation of one node (start an operation, carry out a
node's pending request, move the clock, crash a node), in an order Hypothesis chooses.
After every rule the stored state is decoded and checked against spec's named
invariants (:func:`spec.invariants.check_step` against the previous stored state), and
every finished operation is checked against what the protocol promises:

- a node that finishes a join holds the rank the completing write gave it, in a complete
  round, and no two nodes report the same rank for one round;
- a timeout is reported only after the operation's deadline on the node's clock;
- closed / graceful-exit errors only when the stored rendezvous is closed;
- no connection or corrupt-state error ever (the store is healthy).
"""

from __future__ import annotations

import random

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rdzv import DynamicRendezvousHandler, FakeClock, RendezvousTimeout, StoreRendezvousBackend
from rdzv.clock import now_of
from rdzv.stores import MemoryStore
from spec.codec import decode
from spec.invariants import check_step
from spec.machine import CompareAndSet, Done, Fail
from spec.state import EMPTY_STATE, NodeId, RendezvousState
from spec.vocabulary import FailKind, Op

KEY = "rdzv/job/state"
OPS = {
    "rendezvous": (Op.EXIT, Op.JOIN),
    "close": (Op.CLOSE,),
    "keep_alive": (Op.KEEP_ALIVE,),
    "query": (Op.QUERY,),
}

KINDS = ["rendezvous", "rendezvous", "rendezvous", "close", "keep_alive", "query"]
"""Operations a rule starts (repeats weight the choice: closing ends the story)."""
SETTLE_PASSES = 100
"""Most round-robin passes of one settle step."""
POLL_BURST = 20
"""Most requests one node carries out in one macro step."""


class HandlersOverOneStore(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.store = MemoryStore()
        self.handlers: list[DynamicRendezvousHandler] = []
        self.alive: list[bool] = []
        self.plans: list[list[Op]] = []
        self.deadlines: list[int] = []
        self.stored: RendezvousState = EMPTY_STATE
        self.completions: dict[int, dict[NodeId, int]] = {}
        self.reported: dict[int, dict[NodeId, int]] = {}
        self.finished_joins = 0

    @initialize(
        n=st.integers(2, 4),
        min_nodes=st.integers(1, 3),
        extra=st.integers(0, 2),
        variant=st.sampled_from(["upstream", "torch-2.13", "hardened", "scale"]),
        cache=st.sampled_from([0.0, 1.0]),
        seed=st.integers(0, 1000),
    )
    def setup(
        self, n: int, min_nodes: int, extra: int, variant: str, cache: float, seed: int
    ) -> None:
        timeout = RendezvousTimeout(join=30, last_call=2, close=10, heartbeat=1)
        for i in range(n):
            self.handlers.append(
                DynamicRendezvousHandler.from_backend(
                    "job",
                    self.store,
                    StoreRendezvousBackend(self.store, "job"),
                    min(min_nodes, n),
                    min(min_nodes, n) + extra,
                    local_addr=f"node{i}",
                    timeout=timeout,
                    keep_alive_interval=1,
                    keep_alive_max_attempt=3,
                    protocol=variant,
                    cache_duration=cache,
                    clock=self.clock,
                    rng=random.Random(seed + i),
                )
            )
            self.alive.append(True)
            self.plans.append([])
            self.deadlines.append(0)

    # -- rules ----------------------------------------------------------------------------------
    def _idle(self, i: int) -> bool:
        return self.alive[i] and not self.plans[i]

    @precondition(lambda self: bool(self.handlers))
    @rule(data=st.data(), kind=st.sampled_from(KINDS))
    def start(self, data: st.DataObject, kind: str) -> None:
        idle = [i for i in range(len(self.handlers)) if self._idle(i)]
        if not idle:
            return
        i = data.draw(st.sampled_from(idle), label="node")
        driver = self.handlers[i].driver
        spec_settings = driver.config.settings
        timeout = {
            "rendezvous": spec_settings.join_timeout,
            "close": spec_settings.close_timeout,
            "keep_alive": spec_settings.heartbeat_timeout,
            "query": spec_settings.close_timeout,
        }[kind]
        self.plans[i] = list(OPS[kind])
        self.deadlines[i] = driver.deadline_after(timeout)
        driver.start(self.plans[i][0], self.deadlines[i])
        self._after(i)

    @precondition(lambda self: bool(self.handlers))
    @rule(data=st.data())
    def poll(self, data: st.DataObject) -> None:
        busy = [i for i in range(len(self.handlers)) if self.alive[i] and self.plans[i]]
        if not busy:
            return
        i = data.draw(st.sampled_from(busy), label="node")
        self._step(i)

    @precondition(lambda self: bool(self.handlers))
    @rule(data=st.data())
    def poll_until_blocked(self, data: st.DataObject) -> None:
        """A macro step: one node runs until it must wait (at most POLL_BURST requests)."""
        busy = [i for i in range(len(self.handlers)) if self.alive[i] and self.plans[i]]
        if not busy:
            return
        i = data.draw(st.sampled_from(busy), label="node")
        for _ in range(POLL_BURST):
            if not self.plans[i] or not self._step(i):
                break

    @precondition(lambda self: bool(self.handlers))
    @rule()
    def everybody_rendezvous(self) -> None:
        """Every idle live node starts next_rendezvous (what agents do after a failure)."""
        for i in range(len(self.handlers)):
            if self._idle(i):
                driver = self.handlers[i].driver
                self.plans[i] = list(OPS["rendezvous"])
                self.deadlines[i] = driver.deadline_after(driver.config.settings.join_timeout)
                driver.start(self.plans[i][0], self.deadlines[i])
                self._after(i)

    @precondition(lambda self: bool(self.handlers))
    @rule()
    def settle(self) -> None:
        """Round-robin over busy nodes until every one must wait (at most SETTLE_PASSES)."""
        for _ in range(SETTLE_PASSES):
            progressed = False
            for i in range(len(self.handlers)):
                if self.alive[i] and self.plans[i] and self._step(i):
                    progressed = True
            if not progressed:
                return

    @rule(seconds=st.sampled_from([0.001, 0.01, 0.3, 0.3, 1.0, 1.0, 2.5, 6.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @precondition(lambda self: sum(self.alive) > 1)
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from([i for i, a in enumerate(self.alive) if a]), label="node")
        self.alive[i] = False

    def _raw(self) -> bytes | None:
        return self.store.get(KEY) if self.store.check([KEY]) else None

    def _step(self, i: int) -> bool:
        """Carry out node i's pending request; check the write it made, if any."""
        driver = self.handlers[i].driver
        request = driver.request
        before = self._raw()
        progressed = driver.poll()
        after = self._raw()
        if after != before:
            # Only a compare-and-set may change the state, only over the very bytes it
            # was computed from (the fencing token), and only to the bytes it carried.
            assert isinstance(request, CompareAndSet), request
            assert request.token == before, "a write not fenced by the state it read"
            assert after == request.data
        self.stored_state_keeps_the_invariants()
        self._after(i)
        return progressed

    # -- checks ----------------------------------------------------------------------------------
    def _after(self, i: int) -> None:
        """Check a finished operation; chain exit -> join under one deadline."""
        driver = self.handlers[i].driver
        request = driver.request
        node = driver.local.node
        if isinstance(request, Done):
            op = self.plans[i].pop(0)
            assert request.op is op
            if op is Op.JOIN:
                self._check_join(node, driver.local.view)
            if self.plans[i]:
                driver.start(self.plans[i][0], self.deadlines[i])
        elif isinstance(request, Fail):
            self.plans[i] = []
            self._check_failure(request, self.deadlines[i], driver.local.job)

    def _check_join(self, node: NodeId, view: RendezvousState) -> None:
        rank = view.rank_of(node)
        assert view.complete and rank is not None, view.describe()
        completion = self.completions.get(view.round)
        assert completion is not None, f"round {view.round} finished but never completed"
        assert completion.get(node) == rank, (node, rank, completion)
        assert view.num_participants <= len(completion)
        ranks = self.reported.setdefault(view.round, {})
        assert rank not in [r for n, r in ranks.items() if n != node], (node, rank, ranks)
        ranks[node] = rank
        self.finished_joins += 1

    def _check_failure(self, fail: Fail, deadline: int, job: int | None) -> None:
        assert fail.kind not in (FailKind.CONNECTION, FailKind.CORRUPT_STATE), fail
        if fail.kind is FailKind.TIMEOUT:
            assert now_of(self.clock).mono > deadline, (fail, deadline)
        if fail.kind in (FailKind.CLOSED, FailKind.GRACEFUL_EXIT):
            # Closed: the node's job closed the run, or a new job has reopened it since
            # (a later epoch than the node's own).
            stored = self.stored
            assert stored.closed or (job is not None and stored.epoch > job), (fail, job)

    @invariant()
    def stored_state_keeps_the_invariants(self) -> None:
        if not self.handlers or not self.store.check([KEY]):
            return
        after = decode(self.store.get(KEY))
        if after == self.stored:
            return
        spec_settings = self.handlers[0].driver.config.settings
        violations = check_step(self.stored, after, spec_settings)
        assert not violations, (violations, self.stored.describe(), after.describe())
        if after.complete and (not self.stored.complete or after.round != self.stored.round):
            assert after.round not in self.completions, f"round {after.round} completed twice"
            self.completions[after.round] = after.participant_map()
        self.stored = after


TestHandlersOverOneStore = HandlersOverOneStore.TestCase
TestHandlersOverOneStore.settings = settings(
    max_examples=100, stateful_step_count=80, deadline=None
)


def test_the_machine_reaches_finished_joins_so_the_join_checks_run() -> None:
    # The random runs count finished joins but cannot promise one; this scripted run of
    # the same rules shows a join finishes and passes _check_join under every variant.
    for variant in ("upstream", "torch-2.13", "hardened", "scale"):
        machine = HandlersOverOneStore()
        machine.setup(n=3, min_nodes=3, extra=0, variant=variant, cache=0.0, seed=0)
        machine.everybody_rendezvous()
        # Bounded: 10 settles; between two, 0.1 s ends any backoff after a lost write
        # (BACKOFF_CAP is 32 ms), and 1 s in all stays below the 3 s heartbeat expiry.
        for _ in range(10):
            machine.settle()
            if machine.finished_joins == 3:
                break
            machine.advance(0.1)
        assert machine.finished_joins == 3, (variant, machine.finished_joins)
        assert machine.reported == {0: machine.completions[0]}
