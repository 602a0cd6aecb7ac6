"""z3 proofs over the decision tables, for any number of nodes.

``python -m model_check prove`` (or ``python -m model_check.prove``) checks, for every
protocol variant and every operation table:

- **totality**: in every context some row applies (no :class:`~spec.tables.NoRowMatches`);
- **exclusivity under first-match order**: the selection conditions ``guard_i and not
  guard_j for every j < i`` are pairwise disjoint, so exactly one row is selected;
- **no dead row**: each row is selected in some context whose state satisfies the
  invariants;
- **inductive invariants**: for each row whose action mutates the state, if the state
  invariants hold and the row is the one selected, the invariants hold after the action's
  effect and the step invariants hold of (before, after); the same for ``sanitize``; and
  the empty state satisfies the state invariants (the base case).

How the model works (it is defined in :mod:`model_check.prove_model`; see ``docs/proofs.md``
for the long version):

- Nodes are an *uninterpreted sort*: no bound on their number. Participants, the wait list,
  the redundancy list and the heartbeat domain are arrays ``Node -> Bool`` (sets);
  heartbeats and ranks are arrays ``Node -> Int``. The order of node ids is an
  uninterpreted strict total order.
- ``len(participants)`` is an integer ``n`` tied to the set by sound cardinality facts
  (``World.card_facts``): ``n >= 0``, a member implies ``n >= 1``, ``n >= 1`` implies a
  member, ``n == 1`` implies at most one member. Effects update ``n`` as the Python code
  updates the set (adding a non-member adds one, ...), and sanitize removes a subset whose
  size is a fresh integer with the facts a subset's size obeys.
- Ranks assigned at completion are "positions in sorted order": a fresh array ``pos``
  with ``0 <= pos[x] < n`` on members and ``x < y -> pos[x] < pos[y]``, which is exactly
  what the sorted position satisfies.
- Settings and clocks are symbolic integers constrained as :class:`~spec.settings.Settings`
  validates them; the rollback window is the variant's.
- Each atom of :mod:`spec.tables` is a formula over that state (e.g. ``at_max`` is
  ``n == max_nodes``), so the relations between atoms (``at_max`` excludes ``below_max``,
  not ``past_deadline`` implies ``in_rollback_window``) follow from arithmetic instead of
  being asserted.

The symbolic effects (``prove_model.SYMBOLIC_EFFECTS``), atoms and invariants are written
by hand next to their Python originals. ``tests/test_prove.py`` evaluates each of them on
small concrete states in the finite mode of ``prove_model.World`` and compares with the
Python definitions in ``spec/``, so the model cannot drift silently. A variant whose effect
has no symbolic model fails to prove (it is reported, never skipped).

The invariants proven are every named invariant of :mod:`spec.invariants` plus one
auxiliary lemma, ``open_round_below_max`` (an open round has fewer than ``max_nodes``
participants, because reaching ``max_nodes`` completes the round). Without it
``participants_within_max`` is true but not inductive: the join table adds a node to an
open round whatever its size. The lemma is itself proven inductive with the rest.

The answer obligations (what ``next_rendezvous`` returns, for any number of nodes, under
every fault) are built in :mod:`model_check.prove_answers` over the verdicts of these: a
write there is assumed to satisfy exactly the lemmas proven here for every row.

z3 is an optional dependency (the ``prove`` extra), imported when the proofs run.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from model_check import prove_model
from model_check.prove_answers import answer_obligations
from model_check.prove_model import (
    SYMBOLIC_EFFECTS,
    SYMBOLIC_FOLDS,
    SYMBOLIC_PRUNERS,
    SYMBOLIC_STATE_INVARIANTS,
    SYMBOLIC_STEP_INVARIANTS,
    Concrete,
    Outcome,
    Setup,
    Symbols,
    SymContext,
    SymEffect,
    SymFold,
    SymSettings,
    SymState,
    World,
    Z,
    _age_or_none,
    dead_by_wall,
    empty_state,
    fresh_settings,
    fresh_state,
    guard,
    intact_holds,
    inv_open_round_below_max,
    load_z3,
    selected,
    state_facts,
    step_complete_round_intact,
    sym_atom,
)
from model_check.world import WORLD_SIZE_AGREEMENT
from spec import effects as E
from spec.invariants import STATE_INVARIANTS, STEP_INVARIANTS, check_state, check_step
from spec.settings import Settings, SettingsError
from spec.state import NodeId, RendezvousState
from spec.tables import Atom, Context, Table
from spec.variants import KEY_BEATS, LOCAL, VARIANTS, Variant
from spec.vocabulary import Action, Op

DEFAULT_TIMEOUT_MS = 60_000
"""Bound on one solver call; a call that runs out reports ``unknown`` (which fails)."""

QUICK_TIMEOUT_MS = 5_000
"""The first attempt at each goal; then a concrete counterexample is searched for, and
only if there is none does the proof get the whole timeout."""

AUX_INVARIANT = "open_round_below_max"
AUX_DOC = "an open round has fewer than max_nodes participants (reaching max completes it)"

AUX_STEP = "complete_round_intact"


# ---------------------------------------------------------------------------------------
# Obligations
# ---------------------------------------------------------------------------------------
MAX_WITNESS_NODES = 4
"""Witnesses and counterexamples are searched with 1..this many concrete nodes."""


class MissingModel(Exception):
    """An effect of the variant has no symbolic model."""


def aux_holds(state: RendezvousState, settings: Settings) -> bool:
    """The auxiliary lemma on a concrete state (for replays)."""
    return state.complete or state.num_participants < settings.max_nodes


class Prover:
    """Builds and checks the obligations of one variant."""

    def __init__(
        self,
        variant: Variant,
        *,
        models: Mapping[E.Effect, SymEffect] | None = None,
        fold_models: Mapping[E.Fold, SymFold] | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> None:
        self.z3 = load_z3()
        self.variant = variant
        self.models = {**SYMBOLIC_EFFECTS, **(models or {})}
        self.fold_models = {**SYMBOLIC_FOLDS, **(fold_models or {})}
        self.timeout_ms = timeout_ms
        self._announcing = variant.announces
        self._key_beats = variant.heartbeats == KEY_BEATS
        self.broken: set[str] = set()
        """Invariants and lemmas some obligation failed to prove for this variant."""
        self.refuted = 0

    # -- worlds, contexts, solvers ---------------------------------------------------------
    def world(self, nodes: int | None = None) -> World:
        ids = None if nodes is None else [NodeId("n", i) for i in range(nodes)]
        return World(self.z3, ids)

    def _solver(self, w: World, hypotheses: Sequence[Z]) -> Any:
        solver = self.z3.Solver()
        solver.set("timeout", self.timeout_ms)
        solver.add(*w.axioms, *hypotheses)
        return solver

    def _settings(self, w: World) -> tuple[SymSettings, list[Z]]:
        st, facts = fresh_settings(w)
        if w.finite:  # concrete witnesses use keep_alive_max_attempt = 1
            facts.append(st.heartbeat_expiry == st.keep_alive_interval)
        return st, facts

    def _context(self, w: World) -> tuple[SymContext, list[Z]]:
        z3 = w.z3
        st, facts = self._settings(w)
        state = fresh_state(w, "before")
        ctx = SymContext(
            node=w.fresh("me", w.Node),
            state=state,
            settings=st,
            mono_now=w.fresh("mono_now", z3.IntSort()),
            wall_now=w.fresh("wall_now", z3.IntSort()),
            op_deadline=w.fresh("op_deadline", z3.IntSort()),
            rollback_window=z3.IntVal(self.variant.rollback_window),
            last_call_age=(
                w.fresh("last_call_age", z3.IntSort())
                if self.variant.liveness_clock == LOCAL
                else None
            ),
            announce_size=w.fresh("announce_size", z3.IntSort()) if self._announcing else None,
            announce_age=w.fresh("announce_age", z3.IntSort()) if self._announcing else None,
            announce_before=(
                w.fresh("announce_before", z3.IntSort()) if self._announcing else None
            ),
            beat_age=w.fresh("beat_age", z3.IntSort()) if self._key_beats else None,
            watch_age=w.fresh("watch_age", z3.IntSort()) if self._key_beats else None,
            any_dead=w.fresh("any_dead", z3.BoolSort()) if self._key_beats else None,
            job_offset=w.fresh("job_offset", z3.IntSort()),
        )
        if ctx.announce_size is not None and ctx.announce_age is not None:
            facts += [ctx.announce_size >= 0, ctx.announce_age >= 0]
        if ctx.announce_before is not None:
            facts.append(ctx.announce_before >= 0)
        if ctx.job_offset is not None:
            # A newcomer's job is one epoch above the closed run it first saw, and the
            # run is reopened one epoch at a time; a closed run is the only state of an
            # earlier epoch than a node's job.
            facts += [
                ctx.job_offset >= -1,
                z3.Implies(ctx.job_offset < 0, ctx.state.closed),
            ]
        if w.finite:
            facts.append(z3.Or(*[ctx.node == c for c in w.consts]))
        return ctx, facts + state_facts(w, state)

    def _symbols(self, w: World, ctx: SymContext, after: SymState | None) -> Symbols:
        return Symbols(
            before=ctx.state,
            after=after,
            settings=ctx.settings,
            me=ctx.node,
            clocks={
                "mono_now": ctx.mono_now,
                "wall_now": ctx.wall_now,
                "op_deadline": ctx.op_deadline,
                **({} if ctx.last_call_age is None else {"last_call_age": ctx.last_call_age}),
                **({} if ctx.announce_size is None else {"announce_size": ctx.announce_size}),
                **({} if ctx.announce_age is None else {"announce_age": ctx.announce_age}),
                **({} if ctx.announce_before is None else {"announce_before": ctx.announce_before}),
                **({} if ctx.beat_age is None else {"beat_age": ctx.beat_age}),
                **({} if ctx.watch_age is None else {"watch_age": ctx.watch_age}),
                **({} if ctx.job_offset is None else {"job_offset": ctx.job_offset}),
            },
            atoms={a.value: sym_atom(w, a, ctx) for a in Atom},
        )

    def invariants(self, w: World, s: SymState, st: SymSettings) -> dict[str, Z]:
        out = {
            name: SYMBOLIC_STATE_INVARIANTS[name](w, s, st)
            for name in sorted(SYMBOLIC_STATE_INVARIANTS)
        }
        out[AUX_INVARIANT] = inv_open_round_below_max(w, s, st)
        return out

    def _goals(self, w: World, before: SymState, after: SymState, st: SymSettings) -> dict[str, Z]:
        goals = {f"keeps {n}": g for n, g in self.invariants(w, after, st).items()}
        for name, g in self.step_invariants(w, before, after, st).items():
            goals[f"respects {name}"] = g
        return goals

    def step_invariants(
        self, w: World, before: SymState, after: SymState, st: SymSettings
    ) -> dict[str, Z]:
        """Every step invariant of spec, by name, then the lemma :data:`AUX_STEP`."""
        out = {
            name: SYMBOLIC_STEP_INVARIANTS[name](w, before, after, st)
            for name in sorted(SYMBOLIC_STEP_INVARIANTS)
        }
        out[AUX_STEP] = step_complete_round_intact(w, before, after, st)
        return out

    # -- setups ----------------------------------------------------------------------------
    def setup_row(self, w: World, op: Op, index: int) -> Setup:
        """Induction over one mutating row: invariants and selection before, effect."""
        table = self.variant.table(op)
        ctx, facts = self._context(w)
        after, replay = self._row_effect(w, table, index, ctx)
        hypotheses = [
            *facts,
            *w.side,
            *state_facts(w, after),
            *self.invariants(w, ctx.state, ctx.settings).values(),
            selected(w, table, index, ctx),
        ]
        return Setup(
            w,
            hypotheses,
            self._goals(w, ctx.state, after, ctx.settings),
            self._symbols(w, ctx, after),
            replay,
        )

    def _row_effect(
        self, w: World, table: Table, index: int, ctx: SymContext
    ) -> tuple[SymState, Callable[[Concrete], list[str]]]:
        """The state after row ``index``'s action and how to replay it on spec: an
        effect; a fold, for ANY announcement set; or a prune of watched nodes, for ANY
        set of them (which ones a watcher finds dead depends on its own clock)."""
        action = table.rows[index].then
        if action.folds:
            fold = self.variant.folds[action]
            fold_model = self.fold_models.get(fold)
            if fold_model is None:
                raise MissingModel(
                    f"fold {fold.__module__}.{fold.__qualname__} of {action.value} has no "
                    "symbolic model: add one to model_check.prove_model.SYMBOLIC_FOLDS (and to its "
                    "cross-check test)"
                )
            announced = w.node_array("announced", w.z3.BoolSort())
            after = fold_model(w, ctx.state, ctx.node, announced, ctx.settings, ctx.wall_now)
            return after, lambda c: [
                "  (a fold: the announcement set is shown above; not replayed)"
            ]
        if action is Action.PRUNE_DEAD:
            pruner = self.variant.prune
            prune_model = SYMBOLIC_PRUNERS.get(pruner)
            if prune_model is None:
                raise MissingModel(
                    f"prune {pruner.__module__}.{pruner.__qualname__} has no symbolic model: "
                    "add one to model_check.prove_model.SYMBOLIC_PRUNERS"
                )
            dead = w.node_array("dead", w.z3.BoolSort())
            after = prune_model(w, ctx.state, dead, ctx.settings)
            return after, lambda c: [
                "  (a prune of watched nodes: the dead set is shown above; not replayed)"
            ]
        effect = self.variant.effects[action]
        model = self.models.get(effect)
        if model is None:
            raise MissingModel(
                f"effect {effect.__module__}.{effect.__qualname__} of {action.value} has no "
                "symbolic model: add one to model_check.prove_model.SYMBOLIC_EFFECTS (and to its "
                "cross-check test)"
            )

        def replay(c: Concrete) -> list[str]:
            assert c.context is not None and c.node is not None
            lines = []
            chosen = table.select(c.context)
            if chosen != index:
                lines.append(
                    f"note: spec's table selects row {table.qualified(chosen)} here, not "
                    f"{table.qualified(index)}"
                )
            after_real = effect(c.before, c.node, c.settings, c.wall_now)
            lines += _replay_lines(c.before, after_real, c.settings, effect.__name__)
            return lines + self._answers_disagree(c, after_real)

        return model(w, ctx.state, ctx.node, ctx.settings, ctx.wall_now), replay

    def sanitized(self, w: World, s: SymState, st: SymSettings, wall: Z) -> SymState:
        """What a node makes of a read of ``s``: the variant's prune of the expired nodes.
        Wall clock: the nodes the wall clock ``wall`` expires. Local clock: whichever
        nodes this observer's own ages expire, i.e. ANY set of nodes (the proof covers
        them all)."""
        pruner = self.variant.prune
        model = SYMBOLIC_PRUNERS.get(pruner)
        if model is None:
            raise MissingModel(
                f"prune {pruner.__module__}.{pruner.__qualname__} has no symbolic "
                "model: add one to model_check.prove_model.SYMBOLIC_PRUNERS (and to its "
                "cross-check test)"
            )
        dead = (
            w.fresh("dead", self.z3.ArraySort(w.Node, self.z3.BoolSort()))
            if self.variant.liveness_clock == LOCAL
            else dead_by_wall(w, s, st, wall)
        )
        return model(w, s, dead, st)

    def _answers_disagree(self, c: Concrete, after: RendezvousState) -> list[str]:
        """When a complete round changed without ending, what spec's join table does for
        a member still listed: it returns the same round with another world size than a
        member that returned before the change (failure 1 of docs/findings.md)."""
        before = c.before
        if c.context is None or intact_holds(before, after) or not after.complete:
            return []
        join = self.variant.table(Op.JOIN)
        for node in after.participant_nodes():
            if before.rank_of(node) is None:
                continue
            ctx = replace(c.context, node=node, state=after)
            index = join.select(ctx)
            if join.rows[index].then is not Action.FINISH:
                continue
            return [
                f"a member that returned before this step got round {before.round} "
                f"world_size={before.num_participants}; after it, spec's join table for "
                f"{node} selects {join.qualified(index)} (finish): round {after.round} "
                f"rank {after.rank_of(node)} world_size={after.num_participants}, so "
                f"{WORLD_SIZE_AGREEMENT} is broken"
            ]
        return []

    def setup_sanitize(self, w: World) -> Setup:
        pruner = self.variant.prune
        st, facts = self._settings(w)
        before = fresh_state(w, "before")
        wall = w.fresh("wall_now", self.z3.IntSort())
        local = self.variant.liveness_clock == LOCAL
        after = self.sanitized(w, before, st, wall)
        hypotheses = [
            *facts,
            *state_facts(w, before),
            *w.side,
            *state_facts(w, after),
            *self.invariants(w, before, st).values(),
        ]

        def replay(c: Concrete) -> list[str]:
            if local:
                return ["  (local liveness clock: the dead set is shown above; not replayed)"]
            after_real = self.variant.sanitize_by_wall(c.before, c.settings, c.wall_now).state
            return _replay_lines(c.before, after_real, c.settings, pruner.__name__)

        symbols = Symbols(before=before, after=after, settings=st, clocks={"wall_now": wall})
        return Setup(w, hypotheses, self._goals(w, before, after, st), symbols, replay)

    def setup_table(self, w: World, op: Op) -> tuple[Setup, SymContext]:
        """Totality and exclusivity of one table, over every context (no invariants)."""
        table = self.variant.table(op)
        ctx, facts = self._context(w)
        z3 = w.z3
        guards = [guard(w, table, i, ctx) for i in range(len(table.rows))]
        sel = [selected(w, table, i, ctx) for i in range(len(table.rows))]
        overlaps = [z3.And(sel[i], sel[j]) for i, j in itertools.combinations(range(len(sel)), 2)]
        goals = {
            "table is total": z3.Or(*guards),
            "table selects at most one row (first match)": z3.Not(z3.Or(*overlaps))
            if overlaps
            else z3.BoolVal(True),
        }

        def replay(c: Concrete) -> list[str]:
            assert c.context is not None
            try:
                return [f"spec's table selects row {table.qualified(table.select(c.context))} here"]
            except Exception as exc:  # NoRowMatches is the expected one
                return [f"spec confirms: {type(exc).__name__}: {exc}"]

        return Setup(w, facts, goals, self._symbols(w, ctx, None), replay), ctx

    # -- checking --------------------------------------------------------------------------
    def _read_concrete(self, setup: Setup, model: Any) -> Concrete:
        w, sym = setup.world, setup.symbols
        z3 = w.z3

        def num(expr: Z) -> int:
            return int(model.eval(expr, model_completion=True).as_long())

        def truth(expr: Z) -> bool:
            return bool(z3.is_true(model.eval(expr, model_completion=True)))

        s = sym.before
        ids = dict(zip(w.consts, w.ids, strict=True))
        state = RendezvousState.build(
            round=num(s.round),
            complete=truth(s.complete),
            closed=truth(s.closed),
            deadline=num(s.deadline) if truth(s.has_deadline) else None,
            participants={ids[c]: num(s.ranks[c]) for c in w.consts if truth(s.participants[c])},
            wait_list=[ids[c] for c in w.consts if truth(s.waiting[c])],
            redundancy_list=[ids[c] for c in w.consts if truth(s.redundant[c])],
            last_heartbeats={ids[c]: num(s.beats[c]) for c in w.consts if truth(s.beating[c])},
            epoch=num(s.epoch),
        )
        st = sym.settings
        settings = Settings(
            min_nodes=num(st.min_nodes),
            max_nodes=num(st.max_nodes),
            join_timeout=num(st.join_timeout),
            last_call_timeout=num(st.last_call_timeout),
            keep_alive_interval=num(st.keep_alive_interval),
            keep_alive_max_attempt=1,
        )
        node = None
        if sym.me is not None:
            node = next(ids[c] for c in w.consts if truth(sym.me == c))
        wall = num(sym.clocks["wall_now"]) if "wall_now" in sym.clocks else 0
        ctx = None
        if node is not None:
            ctx = Context(
                node=node,
                state=state,
                settings=settings,
                mono_now=num(sym.clocks["mono_now"]),
                wall_now=wall,
                op_deadline=num(sym.clocks["op_deadline"]),
                rollback_window=self.variant.rollback_window,
                last_call_age=(
                    num(sym.clocks["last_call_age"]) if "last_call_age" in sym.clocks else None
                ),
                announce_size=(
                    num(sym.clocks["announce_size"]) or None
                    if "announce_size" in sym.clocks
                    else None
                ),
                announce_age=(
                    num(sym.clocks["announce_age"]) if "announce_age" in sym.clocks else None
                ),
                announce_before=(
                    num(sym.clocks["announce_before"]) or None
                    if "announce_before" in sym.clocks
                    else None
                ),
                beat_age=_age_or_none(num, sym.clocks.get("beat_age")),
                watch_age=_age_or_none(num, sym.clocks.get("watch_age")),
                # Which watched node is dead is not modelled, only that one is.
                dead=(node,) if truth(sym.atoms.get(Atom.MONITORED_DEAD.value, False)) else (),
                job_offset=(num(sym.clocks["job_offset"]) if "job_offset" in sym.clocks else 0),
            )
        return Concrete(state, settings, node, ctx, wall)

    def _counterexample(
        self, build: Callable[[World], Setup], goal: str, what: str
    ) -> list[str] | None:
        """A concrete counterexample with few nodes, rendered and replayed on spec."""
        for nodes in range(1, MAX_WITNESS_NODES + 1):
            setup = build(self.world(nodes))
            solver = self._solver(setup.world, setup.hypotheses)
            solver.add(self.z3.Not(setup.goals[goal]))
            if solver.check() != self.z3.sat:
                continue
            model = solver.model()
            lines = [f"{what} with {nodes} node(s):"]
            lines += render_model(setup.world, model, setup.symbols)
            if setup.replay is not None:
                try:
                    concrete = self._read_concrete(setup, model)
                except SettingsError as exc:
                    lines.append(f"  (not replayed on spec: {exc})")
                else:
                    lines += [f"  {line}" for line in setup.replay(concrete)]
            return lines
        return None

    def check_setup(
        self, label: str, build: Callable[[World], Setup], what: str, *, answers: bool = False
    ) -> Iterator[Outcome]:
        """Prove every goal of ``build`` for any number of nodes (incrementally).

        A goal that does not hold marks its invariant broken (:attr:`broken`), so the
        answer proofs do not assume it. For a variant of ``prove_model.UNSAFE_ANSWERS``, a failing
        answer goal (``answers``, or the :data:`AUX_STEP` lemma) is ``refuted``."""
        for outcome, goal in self._check_setup(label, build, what):
            if outcome.holds:
                yield outcome
                continue
            if goal.startswith(("keeps ", "respects ")):
                self.broken.add(goal.split(" ", 1)[1])
            known = prove_model.UNSAFE_ANSWERS.get(self.variant.name)
            if known and outcome.verdict == "FAILS" and (answers or goal.endswith(AUX_STEP)):
                self.refuted += 1
                outcome = replace(
                    outcome, verdict="refuted", detail=[f"expected: {known}", *outcome.detail]
                )
            yield outcome

    def _verdict(self, solver: Any) -> tuple[Any, Any, str]:
        """Check ``solver``: the verdict, a model if sat, z3's reason if unknown."""
        verdict = solver.check()
        abstract = solver.model() if verdict == self.z3.sat else None
        reason = solver.reason_unknown() if verdict == self.z3.unknown else ""
        return verdict, abstract, reason

    def _check_setup(
        self, label: str, build: Callable[[World], Setup], what: str
    ) -> Iterator[tuple[Outcome, str]]:
        try:
            setup = build(self.world())
        except MissingModel as exc:
            yield Outcome(f"{label} has a symbolic model", "FAILS", 0.0, [str(exc)]), ""
            return
        solver = self._solver(setup.world, setup.hypotheses)
        for goal, formula in setup.goals.items():
            name = f"{label} {goal}"
            started = time.perf_counter()
            solver.push()
            solver.add(self.z3.Not(formula))
            # A short attempt first: with quantifiers z3 rarely answers sat, so a goal
            # that fails would spend the whole timeout before the (fast) search for a
            # concrete counterexample; only if there is none does the proof get it all.
            solver.set("timeout", min(QUICK_TIMEOUT_MS, self.timeout_ms))
            verdict, abstract, reason = self._verdict(solver)
            solver.pop()
            solver.set("timeout", self.timeout_ms)
            lines = None
            if verdict != self.z3.unsat:
                lines = self._counterexample(build, goal, what)
            if lines is None and verdict == self.z3.unknown and self.timeout_ms > QUICK_TIMEOUT_MS:
                # No counterexample: the whole timeout, in a fresh solver (one that gave up
                # may have lost its way).
                retry = self._solver(setup.world, setup.hypotheses)
                retry.add(self.z3.Not(formula))
                verdict, abstract, reason = self._verdict(retry)
            if verdict == self.z3.unsat:
                yield Outcome(name, "holds", time.perf_counter() - started), goal
                continue
            seconds = time.perf_counter() - started
            if lines is not None:
                yield Outcome(name, "FAILS", seconds, lines), goal
            elif abstract is not None:
                yield (
                    Outcome(
                        name,
                        "FAILS",
                        seconds,
                        [
                            f"{what} in the abstraction (none found with up to "
                            f"{MAX_WITNESS_NODES} concrete nodes; the cardinality facts may be "
                            "too weak):",
                            *render_model(setup.world, abstract, setup.symbols),
                        ],
                    ),
                    goal,
                )
            else:
                yield Outcome(name, "UNKNOWN", seconds, [f"z3 gave up: {reason}"]), goal

    # -- the obligations -------------------------------------------------------------------
    def prove(self) -> Iterator[Outcome]:
        yield from self.base_case()
        for op in Op:
            yield from self.table_obligations(op)
        for op in Op:
            yield from self.induction_obligations(op)
        yield from self.check_setup(
            f"{self.variant.name}: sanitize", self.setup_sanitize, "counterexample to induction"
        )
        yield from answer_obligations(self)

    def base_case(self) -> Iterator[Outcome]:
        def build(w: World) -> Setup:
            st, facts = self._settings(w)
            s = empty_state(w)
            goals = {f"satisfies {n}": g for n, g in self.invariants(w, s, st).items()}
            return Setup(w, facts, goals, Symbols(before=s, after=None, settings=st))

        yield from self.check_setup(
            f"{self.variant.name}: empty state", build, "the empty state violates it"
        )

    def table_obligations(self, op: Op) -> Iterator[Outcome]:
        yield from self.check_setup(
            f"{self.variant.name}: {op.value}",
            lambda w: self.setup_table(w, op)[0],
            "a context where it fails",
        )
        table = self.variant.table(op)
        for index, r in enumerate(table.rows):
            yield self.liveness(op, index, f"{self.variant.name}: {table.qualified(index)} "
                                f"({r.then.value}) is live")  # fmt: skip

    def liveness(self, op: Op, index: int, name: str) -> Outcome:
        """Some state satisfying the invariants selects the row: a concrete witness
        with few nodes, confirmed by running spec's own table on it."""
        table = self.variant.table(op)
        started = time.perf_counter()
        for nodes in [*range(1, MAX_WITNESS_NODES + 1), None]:
            w = self.world(nodes)
            setup, ctx = self.setup_table(w, op)
            solver = self._solver(w, setup.hypotheses)
            solver.add(*self.invariants(w, ctx.state, ctx.settings).values())
            solver.add(selected(w, table, index, ctx))
            verdict = solver.check()
            if nodes is None:
                seconds = time.perf_counter() - started
                if verdict == self.z3.unsat:
                    return Outcome(
                        name,
                        "FAILS",
                        seconds,
                        [
                            "dead row: no state satisfying the invariants selects "
                            f"[{table.rows[index].guard_text()} -> "
                            f"{table.rows[index].then.value}], for any number of nodes"
                        ],
                    )
                return Outcome(
                    name,
                    "UNKNOWN",
                    seconds,
                    [f"no witness with up to {MAX_WITNESS_NODES} nodes; z3: {verdict}"],
                )
            if verdict != self.z3.sat:
                continue
            concrete = self._read_concrete(setup, solver.model())
            assert concrete.context is not None
            problems = check_state(concrete.before, concrete.settings)
            chosen = table.select(concrete.context)
            if chosen != index or problems:
                return Outcome(
                    name,
                    "FAILS",
                    time.perf_counter() - started,
                    [
                        "the symbolic model disagrees with spec on its witness "
                        f"(spec selects row {table.qualified(chosen)}, invariant problems "
                        f"{problems}): "
                        "model_check/prove.py has drifted from spec",
                        f"  witness: {concrete.before.describe()}",
                    ],
                )
            return Outcome(name, "holds", time.perf_counter() - started)
        raise AssertionError("unreachable")  # pragma: no cover

    def induction_obligations(self, op: Op) -> Iterator[Outcome]:
        table = self.variant.table(op)
        for index, r in enumerate(table.rows):
            if r.then.mutates:
                yield from self.check_setup(
                    f"{self.variant.name}: {table.qualified(index)} ({r.then.value})",
                    lambda w, index=index: self.setup_row(w, op, index),  # type: ignore[misc]
                    "counterexample to induction",
                )


def _replay_lines(
    before: RendezvousState, after: RendezvousState, settings: Settings, what: str
) -> list[str]:
    problems = check_step(before, after, settings)
    if aux_holds(before, settings) and not aux_holds(after, settings):
        problems.append((AUX_INVARIANT, "an open round reached max_nodes"))
    if not intact_holds(before, after):
        problems.append((AUX_STEP, f"complete round {before.round} changed its members or ranks"))
    lines = [f"replayed on spec ({what}): after = {after.describe()}"]
    if problems:
        lines += [f"spec confirms: {name}: {message}" for name, message in problems]
    else:
        lines.append(
            "spec shows no violation here: the symbolic model disagrees with spec "
            "(model_check/prove.py has drifted)"
        )
    return lines


def coverage_problems() -> list[str]:
    """Atoms and named invariants of spec without a symbolic encoding (and back)."""
    problems = [
        f"atom {atom.value} has no symbolic definition: add one to "
        "model_check.prove_model.ATOM_FORMULAS"
        for atom in Atom
        if atom not in prove_model.ATOM_FORMULAS
    ]
    for kind, names, encoded in (
        ("state", {i.name for i in STATE_INVARIANTS}, set(SYMBOLIC_STATE_INVARIANTS)),
        ("step", {i.name for i in STEP_INVARIANTS}, set(SYMBOLIC_STEP_INVARIANTS)),
    ):
        for name in sorted(names - encoded):
            problems.append(
                f"{kind} invariant {name} has no symbolic encoding: add one to model_check/prove.py"
            )
        for name in sorted(encoded - names):
            problems.append(f"symbolic {kind} invariant {name} is not in spec/invariants.py")
    return problems


# ---------------------------------------------------------------------------------------
# Reading a model back as a state
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelState:
    """A symbolic state evaluated in a z3 model: plain values."""

    round: int
    complete: bool
    closed: bool
    deadline: int | None
    participants: dict[str, int]
    n_participants: int
    waiting: list[str]
    redundant: list[str]
    heartbeats: dict[str, int]

    def describe(self) -> str:
        parts = ", ".join(f"{n}:{r}" for n, r in self.participants.items())
        beats = ", ".join(f"{n}@{t}" for n, t in self.heartbeats.items())
        flags = [f"round={self.round}"]
        if self.complete:
            flags.append("complete")
        if self.closed:
            flags.append("closed")
        if self.deadline is not None:
            flags.append(f"last_call_until={self.deadline}")
        count = (
            ""
            if self.n_participants == len(self.participants)
            else f" (count={self.n_participants})"
        )
        return (
            f"{' '.join(flags)} participants=[{parts}]{count} wait=[{', '.join(self.waiting)}] "
            f"redundant=[{', '.join(self.redundant)}] heartbeats=[{beats}]"
        )


def _universe(w: World, model: Any) -> list[Z]:
    elements = model.get_universe(w.Node) or []
    if w.finite:
        return list(w.consts)

    def before(a: Z, b: Z) -> bool:
        return bool(w.z3.is_true(model.eval(w.lt(a, b), model_completion=True)))

    ordered: list[Z] = []
    for e in elements:  # insertion sort by the model's order (a handful of elements)
        at = len(ordered)
        for k, o in enumerate(ordered):
            if before(e, o):
                at = k
                break
        ordered.insert(at, e)
    return ordered


def read_state(w: World, model: Any, s: SymState, names: Mapping[str, str]) -> ModelState:
    z3 = w.z3
    universe = _universe(w, model)

    def val(expr: Z) -> Any:
        v = model.eval(expr, model_completion=True)
        if z3.is_true(v):
            return True
        if z3.is_false(v):
            return False
        return v.as_long()

    def name(e: Z) -> str:
        return names[str(e)]

    members = [e for e in universe if val(s.participants[e])]
    return ModelState(
        round=val(s.round),
        complete=val(s.complete),
        closed=val(s.closed),
        deadline=val(s.deadline) if val(s.has_deadline) else None,
        participants={name(e): val(s.ranks[e]) for e in members},
        n_participants=val(s.n_participants),
        waiting=[name(e) for e in universe if val(s.waiting[e])],
        redundant=[name(e) for e in universe if val(s.redundant[e])],
        heartbeats={name(e): val(s.beats[e]) for e in universe if val(s.beating[e])},
    )


def render_model(w: World, model: Any, sym: Symbols) -> list[str]:
    """A counterexample as readable lines: settings, clocks, atoms, before, after."""
    z3 = w.z3
    universe = _universe(w, model)
    names: dict[str, str] = {}
    me = "(none)"
    for i, e in enumerate(universe):
        names[str(e)] = str(w.ids[i]) if w.finite else f"n{i}"
        if sym.me is not None and z3.is_true(model.eval(sym.me == e, model_completion=True)):
            if not w.finite:
                names[str(e)] = "me"
            me = names[str(e)]

    def val(expr: Z) -> str:
        v = model.eval(expr, model_completion=True)
        return str(v)

    settings = ", ".join(
        f"{f}={val(getattr(sym.settings, f))}" for f in SymSettings.__dataclass_fields__
    )
    lines = [f"  settings: {settings}"]
    if sym.clocks:
        lines.append("  clocks: " + ", ".join(f"{k}={val(v)}" for k, v in sym.clocks.items()))
    if sym.atoms:
        true_atoms = [k for k, v in sym.atoms.items() if z3.is_true(model.eval(v, True))]
        lines.append(f"  atoms true for the acting node: {', '.join(true_atoms) or '(none)'}")
    lines.append(f"  before: {read_state(w, model, sym.before, names).describe()}")
    if sym.after is not None:
        lines.append(f"  after:  {read_state(w, model, sym.after, names).describe()}")
    for label, view in sym.views.items():
        lines.append(f"  {label}: {read_state(w, model, view, names).describe()}")
    if sym.values:
        lines.append("  " + ", ".join(f"{k}={val(v)}" for k, v in sym.values.items()))
    lines.append(f"  nodes (in id order): {', '.join(names[str(e)] for e in universe)}")
    if sym.me is not None:
        lines.append(f"  acting node (me): {me}")
    return lines


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------
def prove_all(
    variants: Sequence[Variant],
    *,
    models: Mapping[E.Effect, SymEffect] | None = None,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> Iterator[Outcome]:
    """Every obligation of every variant, in a fixed order."""
    problems = coverage_problems()
    if problems:  # a formula for a missing atom or invariant cannot even be built
        yield Outcome("coverage of spec's atoms and invariants", "FAILS", 0.0, problems)
        return
    for variant in variants:
        yield from Prover(variant, models=models, timeout_ms=timeout_ms).prove()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m model_check prove",
        description=(
            "Prove with z3, for any number of nodes, that every decision table is total, "
            "selects one row and has no dead row, that the invariants are inductive, and "
            "that every node returned by next_rendezvous is a member with the round's world "
            "size and a distinct rank in 0..W-1."
        ),
    )
    parser.add_argument(
        "--protocol",
        "--variant",
        dest="protocol",
        action="append",
        metavar="NAME",
        help=f"prove only this protocol (repeatable; default all of {', '.join(VARIANTS)}; "
        "--variant is the same option)",
    )
    parser.add_argument(
        "--timeout-ms",
        type=int,
        default=DEFAULT_TIMEOUT_MS,
        help="bound on each solver call, in ms (default %(default)s); running out fails",
    )
    parser.add_argument(
        "--no-times",
        action="store_true",
        help="omit timings, so the output is deterministic (default off)",
    )
    parser.add_argument(
        "--failures-only",
        action="store_true",
        help="print only failing obligations (default off: every obligation)",
    )
    args = parser.parse_args(argv)
    names = args.protocol or sorted(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        print(
            f"error: unknown protocol {', '.join(unknown)}; choose from {', '.join(VARIANTS)}",
            file=sys.stderr,
        )
        return 2
    if args.timeout_ms <= 0:
        print(f"error: --timeout-ms ({args.timeout_ms}) must be positive", file=sys.stderr)
        return 2
    z3 = load_z3()
    print(
        f"prove: protocols={','.join(names)} nodes=any (uninterpreted sort) "
        f"timeout_ms={args.timeout_ms} z3={z3.get_version_string()}"
    )
    return report(
        prove_all([VARIANTS[n] for n in names], timeout_ms=args.timeout_ms),
        times=not args.no_times,
        failures_only=args.failures_only,
    )


def report(outcomes: Iterator[Outcome], *, times: bool = True, failures_only: bool = False) -> int:
    """Print each outcome as it comes; return the exit code (0 only if all hold)."""
    counts = {"holds": 0, "refuted": 0, "FAILS": 0, "UNKNOWN": 0}
    total = 0.0
    for outcome in outcomes:
        counts[outcome.verdict] += 1
        total += outcome.seconds
        if failures_only and not outcome.failed:
            continue
        timing = f"{outcome.seconds * 1000:8.1f} ms  " if times else ""
        print(f"{outcome.verdict:<7} {timing}{outcome.name}", flush=True)
        for line in outcome.detail:
            print(f"    {line}")
    n = sum(counts.values())
    summary = (
        f"obligations={n} hold={counts['holds']} refuted={counts['refuted']} "
        f"fail={counts['FAILS']} unknown={counts['UNKNOWN']}"
    )
    if times:
        summary += f" solver_sec={total:.2f}"
    print(summary)
    return 0 if counts["FAILS"] == counts["UNKNOWN"] == 0 else 1


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except SettingsError as exc:  # pragma: no cover - settings are symbolic here
        raise SystemExit(str(exc)) from None
