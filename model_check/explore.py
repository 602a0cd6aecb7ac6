"""Search: exhaustive breadth-first exploration and seeded random simulation.

Breadth-first order makes the first violation found one of the shortest (fewest moves).
Each visited class is numbered and keeps a parent pointer (the parent's number, the
move; see :class:`_Graph`), and the explored member of each class is exactly the world
reached by applying the recorded moves to the initial world, so a counterexample is a
list of concrete moves that :func:`replay` re-executes without any canonicalisation.

After an exhaustive search two graph properties are decided: ``livelock`` (a cycle of
moves that never advance time) and ``calls_end_as_specified`` (a world from which no
acceptable world is reachable without further faults, see :meth:`_Graph.doomed`). Random
mode judges the end of every walk (:func:`_check_end`).
"""

from __future__ import annotations

import random
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from model_check.canon import Canon, plain_fingerprint
from model_check.model import CONTROL_MOVES, ENDED_WRONGLY, apply, enabled, unfinished_calls
from model_check.model import initial_world as make_initial
from model_check.world import (
    CALLS_END,
    FAULT_KINDS,
    LIVELOCK,
    ModelConfig,
    Move,
    Outcome,
    Violation,
    World,
)

ProgressFn = Callable[[dict[str, float]], None]


@dataclass
class Result:
    states: int = 0
    """Generated states (successors computed, duplicates included)."""
    unique: int = 0
    depth: int = 0
    seconds: float = 0.0
    violation: Violation | None = None
    path: list[Move] = field(default_factory=list)
    truncated: bool = False
    """True when a bound stopped the search before it was exhaustive."""
    bound: str = ""
    """Which bound did: ``"max_states"``, ``"max_depth"``, ``"interrupted"`` (Ctrl-C or
    SIGTERM during the search) or ``"interrupted-graph"`` (after the search, while the
    graph properties were being decided)."""
    checked_depth: int = 0
    """When a bound stopped the search: every run of at most this many moves was checked
    for the safety properties (after ``"interrupted-graph"``: every reachable world)."""
    fallbacks: int = 0
    episodes: int = 0
    fingerprints: set[bytes] | None = None
    """Every unique fingerprint (kept only when asked, for tests)."""
    ends: tuple[int, int] = (0, 0)
    """Random mode, general liveness property: walks whose end was decided (a world where
    nothing can move, or a cut-off walk settled by its continuation without faults), and
    walks whose continuation did not settle within :func:`settle_limit` moves (undecided)."""
    settle_moves: int = 0
    """Random mode: the most moves of continuation any decided walk end took (0 when
    every walk ended where nothing could move); compare with :func:`settle_limit`."""


def explore(
    cfg: ModelConfig,
    *,
    symmetry: bool = True,
    max_states: int = 0,
    max_depth: int = 0,
    progress: ProgressFn | None = None,
    keep_fingerprints: bool = False,
    stop_on_violation: bool = True,
    violations_out: list[tuple[Violation, list[Move]]] | None = None,
    visit: Callable[[World], None] | None = None,
) -> Result:
    """Breadth-first search of every world reachable from the initial one.

    ``max_depth`` (0: none) bounds the search to runs of at most that many moves: every
    world they reach and every move they make is checked for the safety properties, but
    the search is then not exhaustive (``Result.truncated``, unless no world at the bound
    can move) and the graph properties (livelock, calls end as specified), which need the
    whole graph, are not decided."""
    canon = Canon(cfg)

    def plain(world: World) -> bytes:
        return plain_fingerprint(world, cfg)

    fp_of: Callable[[World], bytes] = canon.fingerprint if symmetry else plain
    start = time.monotonic()
    w0 = make_initial(cfg)
    graph = _Graph(fp_of(w0))
    queue: deque[tuple[World, int]] = deque([(w0, 0)])
    if visit is not None:
        visit(w0)
    result = Result(unique=1)
    last_report = start
    seen_violations: set[str] = set()
    depth = 0
    searching = True
    try:
        while queue:  # bounded: every distinct world is queued at most once
            world, here = queue.popleft()
            depth = graph.depth[here]
            result.depth = max(result.depth, depth)
            moves = enabled(world, cfg)
            graph.mark(here, world, moves, cfg)
            for move in moves:
                out = apply(world, move, cfg)
                result.states += 1
                calm_edge = move.kind not in FAULT_MOVES
                if out.violations:
                    if calm_edge:
                        graph.calm_dst.append(_ESCAPE)
                    path = [*graph.path(here), move]
                    for v in out.violations:
                        if v.name in seen_violations:
                            continue
                        seen_violations.add(v.name)
                        if violations_out is not None:
                            violations_out.append((v, path))
                        if result.violation is None:
                            result.violation, result.path = v, path
                    if stop_on_violation:
                        return _finish(result, start, canon, graph, keep_fingerprints)
                    continue
                child, new = graph.add(fp_of(out.world), here, move)
                if calm_edge:
                    graph.calm_dst.append(child)
                if move.kind not in _STUTTER_MOVES:
                    graph.timeless_dst.append(child)
                if not new:
                    continue
                result.unique += 1
                if visit is not None:
                    visit(out.world)
                if max_depth and depth + 1 >= max_depth and enabled(out.world, cfg):
                    # A world at the depth bound: checked when it was made, never expanded.
                    result.truncated, result.bound = True, "max_depth"
                    result.depth = max(result.depth, depth + 1)
                    result.checked_depth = max_depth
                    graph.partial = True
                else:
                    queue.append((out.world, child))
                if max_states and result.unique >= max_states:
                    result.truncated, result.bound = True, "max_states"
                    result.checked_depth = depth
                    return _finish(result, start, canon, graph, keep_fingerprints)
            graph.close_edges()
            now = time.monotonic()
            if progress is not None and now - last_report >= 1.0:
                last_report = now
                progress(
                    {
                        "states": result.states,
                        "unique": result.unique,
                        "depth": depth,
                        "queue": len(queue),
                        "states/s": result.states / max(now - start, 1e-9),
                    }
                )
        searching = False
        if result.truncated:  # a depth bound: the graph is partial, its properties undecided
            return _finish(result, start, canon, graph, keep_fingerprints)
        if result.violation is None or not stop_on_violation:
            entry = graph.cycle_entry()
            if entry is not None:
                v = Violation(
                    LIVELOCK,
                    "a cycle of moves that never advances time is reachable: the processes "
                    "keep working (e.g. conflicting writes) without anybody progressing; the "
                    "counterexample leads to a world on the cycle",
                )
                if violations_out is not None:
                    violations_out.append((v, graph.path(entry)))
                if result.violation is None:
                    result.violation, result.path = v, graph.path(entry)
            target = graph.doomed()
            if target is not None:
                path = graph.path(target)
                v = calls_end_violation(unfinished_calls(replay(cfg, path)[1], cfg))
                if violations_out is not None:
                    violations_out.append((v, path))
                if result.violation is None:
                    result.violation, result.path = v, path
        return _finish(result, start, canon, graph, keep_fingerprints)
    except KeyboardInterrupt:
        # Ctrl-C (or SIGTERM, which the command line turns into the same): what was
        # searched still counts. Every world of a depth below the one being expanded was
        # expanded, so every run of at most ``depth`` moves was checked.
        result.truncated = True
        result.bound = "interrupted" if searching else "interrupted-graph"
        result.checked_depth = depth if searching else result.depth
        return _finish(result, start, canon, graph, keep_fingerprints)


FAULT_MOVES = frozenset(
    {*FAULT_KINDS, "cas_unknown_applied", "cas_unknown_lost"} - {"cas_unknown"}
    | {CONTROL_MOVES[k] for k in ("cas_unknown_applied", "cas_unknown_lost", "store_down")}
    | {"fail_worker", "store_outage", "pause_tick"}
)
"""Move kinds that inject a fault, or a worker failure (which no call needs to end)."""

_STUTTER_MOVES = frozenset({"tick", "poll"})
"""Move kinds left out of the livelock check's graph: time passing, and an agent's poll
(what every agent does while its workers run: a cycle of polls is no livelock)."""


def calls_end_violation(problems: list[str]) -> Violation:
    return Violation(
        CALLS_END,
        "with no (further) faults, every continuation from here (all moves fair, time "
        "advancing when nobody can move) stays in worlds where some call has not ended "
        "as specified: " + "; ".join(problems),
    )


_ESCAPE = -1
"""In the graph of moves that inject no fault: the end of a move that raised a safety
violation (that run is reported by its own property, so it counts as an escape)."""

_PROBLEM, _LASTING, _QUIET = 1, 2, 4
"""Flags of an expanded world: some call has not ended as specified; one ended wrongly
(a problem that can never go away); only time can pass."""


class _Graph:
    """The explored graph, numbered and flat, so that a distinct world costs a few dozen
    bytes besides its fingerprint.

    World ``k`` is the ``k``-th distinct world found; breadth-first search expands worlds
    in that order, so the successors of world ``k`` are the ``k``-th slice of each edge
    list (``*_off`` holds the slice starts). Two edge lists: moves that do not advance time
    (for the livelock check) and moves that inject no fault (for the general liveness
    property, :meth:`doomed`).

    A parent pointer (world, move) per world makes the explored member of each class
    exactly the world reached by applying the recorded moves to the initial world, so a
    path is a list of concrete moves that :func:`replay` re-executes.
    """

    def __init__(self, fp0: bytes) -> None:
        self.partial = False
        """Some world was left unexpanded (a depth bound): the edge lists and flags are
        then not kept (the graph properties are not decided on a partial graph)."""
        self.ids: dict[bytes, int] = {fp0: 0}
        self.fps: list[bytes] = [fp0]
        self.parent = array("i", [-1])
        self.via = array("H", [0])
        """Index into :attr:`moves` of the move that first reached each world (world 0:
        none)."""
        self.moves: list[Move] = []
        self.move_index: dict[Move, int] = {}
        self.depth = array("I", [0])
        self.flags = bytearray()
        """One byte per expanded world (:data:`_PROBLEM`, :data:`_LASTING`, :data:`_QUIET`)."""
        self.calm_off = array("q", [0])
        self.calm_dst = array("i")
        self.timeless_off = array("q", [0])
        self.timeless_dst = array("i")

    def add(self, fp: bytes, parent: int, move: Move) -> tuple[int, bool]:
        """The number of the world with fingerprint ``fp``, and whether it is new."""
        known = self.ids.get(fp)
        if known is not None:
            return known, False
        new = len(self.fps)
        self.ids[fp] = new
        self.fps.append(fp)
        self.parent.append(parent)
        index = self.move_index.get(move)
        if index is None:
            index = self.move_index[move] = len(self.moves)
            self.moves.append(move)
        self.via.append(index)
        self.depth.append(self.depth[parent] + 1)
        return new, True

    def mark(self, here: int, world: World, moves: list[Move], cfg: ModelConfig) -> None:
        """Record the general liveness property's view of expanded world ``here``."""
        if self.partial:
            return
        assert here == len(self.flags), "worlds are expanded in the order they are numbered"
        problems = unfinished_calls(world, cfg)
        flags = 0
        if problems:
            flags = _PROBLEM
            if any(p.startswith(ENDED_WRONGLY) for p in problems):
                flags |= _LASTING
            if all(m.kind == "tick" for m in moves):
                flags |= _QUIET
        self.flags.append(flags)

    def close_edges(self) -> None:
        """End the edge slices of the world just expanded."""
        if self.partial:
            self.calm_dst, self.timeless_dst = array("i"), array("i")
            return
        self.calm_off.append(len(self.calm_dst))
        self.timeless_off.append(len(self.timeless_dst))

    def path(self, k: int) -> list[Move]:
        moves: list[Move] = []
        while k > 0:  # bounded: each step goes one breadth-first level up
            moves.append(self.moves[self.via[k]])
            k = self.parent[k]
        moves.reverse()
        return moves

    def cycle_entry(self) -> int | None:
        """A world on some cycle of timeless moves (iterative three-colour depth-first
        search, roots in fingerprint order), or None."""
        off, dst = self.timeless_off, self.timeless_dst
        expanded = len(off) - 1
        colour = bytearray(len(self.fps))  # 1 on the stack, 2 done
        roots = sorted(
            (k for k in range(expanded) if off[k + 1] > off[k]), key=self.fps.__getitem__
        )
        for root in roots:
            if colour[root]:
                continue
            stack: list[tuple[int, int]] = [(root, off[root])]
            colour[root] = 1
            while stack:  # bounded: every world is pushed once
                node, index = stack[-1]
                if node < expanded and index < off[node + 1]:
                    stack[-1] = (node, index + 1)
                    child = dst[index]
                    if colour[child] == 1:
                        return child
                    if not colour[child]:
                        colour[child] = 1
                        stack.append((child, off[child] if child < expanded else 0))
                else:
                    colour[node] = 2
                    stack.pop()
        return None

    def doomed(self) -> int | None:
        """A doomed world (None if there is none): one with a problem from which no
        sequence of moves that inject no fault reaches a world without one. Among them
        the shortest path (then the smallest fingerprint) of those where a call ended
        wrongly (visible at once), else of those where only time can pass (the stuck call
        is plain to see), else of all."""
        off, dst, flags = self.calm_off, self.calm_dst, self.flags
        expanded = len(off) - 1
        n = len(self.fps)
        alive = bytearray(n)
        stack = [k for k in range(expanded) if not flags[k] & _PROBLEM]
        start = array("q", bytes(8 * (n + 1)))  # reverse edges, grouped by target
        for target in dst:
            if target != _ESCAPE:
                start[target + 1] += 1
        for k in range(n):
            start[k + 1] += start[k]
        fill = array("q", start)
        sources = array("i", bytes(4 * start[n]))
        for k in range(expanded):
            for index in range(off[k], off[k + 1]):
                target = dst[index]
                if target == _ESCAPE:
                    stack.append(k)
                else:
                    sources[fill[target]] = k
                    fill[target] += 1
        for k in stack:
            alive[k] = 1
        while stack:  # bounded: every world is pushed at most once
            node = stack.pop()
            for index in range(start[node], start[node + 1]):
                source = sources[index]
                if not alive[source]:
                    alive[source] = 1
                    stack.append(source)
        bad = [k for k in range(expanded) if flags[k] & _PROBLEM and not alive[k]]
        if not bad:
            return None
        lasting = [k for k in bad if flags[k] & _LASTING]
        quiet = [k for k in bad if flags[k] & _QUIET]
        return min(lasting or quiet or bad, key=lambda k: (self.depth[k], self.fps[k]))


def _finish(result: Result, start: float, canon: Canon, graph: _Graph, keep: bool) -> Result:
    result.seconds = time.monotonic() - start
    result.fallbacks = canon.fallbacks
    if keep:
        result.fingerprints = set(graph.ids)
    return result


ChooseFn = Callable[[list[Move], random.Random], Move]
"""A scheduler for :func:`simulate`: picks one of the enabled moves (never an empty list),
drawing only from the walk's own random generator."""
ObserveFn = Callable[[Outcome], None]
"""Called with the outcome of every move a walk applies (its continuation's included)."""


def uniform_choice(moves: list[Move], rng: random.Random) -> Move:
    """Random mode's scheduler: every enabled move equally likely."""
    return moves[rng.randrange(len(moves))]


def simulate(
    cfg: ModelConfig,
    *,
    seed: str,
    steps: int,
    progress: ProgressFn | None = None,
    choose: ChooseFn = uniform_choice,
    observe: ObserveFn | None = None,
    fingerprint: Callable[[World], bytes] | None = None,
    seen: set[bytes] | None = None,
) -> Result:
    """Random walks: ``steps`` moves in total, restarting from the initial world whenever
    nothing is enabled any more. Deterministic for a given seed string.

    Swarm mode (:mod:`model_check.swarm`) walks with this same function: its own
    scheduler ``choose``, an ``observe`` hook for coverage, the canonical ``fingerprint``
    (default: :func:`plain_fingerprint`) and a ``seen`` set shared by many walks
    (``Result.unique`` is then the size of that set)."""
    rng = random.Random(seed)
    start = time.monotonic()
    result = Result()
    seen = set() if seen is None else seen
    fp_of = fingerprint or (lambda w: plain_fingerprint(w, cfg))
    world = make_initial(cfg)
    path: list[Move] = []
    result.episodes = 1
    last_report = start
    ends = [0, 0]
    for _ in range(steps):
        moves = enabled(world, cfg)
        if not moves:
            if _check_end(world, path, cfg, result, ends, progress, observe):
                break
            world, path = make_initial(cfg), []
            result.episodes += 1
            continue
        move = choose(moves, rng)
        out: Outcome = apply(world, move, cfg)
        if observe is not None:
            observe(out)
        path.append(move)
        result.states += 1
        result.depth = max(result.depth, len(path))
        if out.violations:
            result.violation, result.path = out.violations[0], list(path)
            break
        world = out.world
        seen.add(fp_of(world))
        now = time.monotonic()
        if progress is not None and now - last_report >= 1.0:
            last_report = now
            progress(
                {
                    "states": result.states,
                    "unique": len(seen),
                    "depth": len(path),
                    "queue": 0,
                    "states/s": result.states / max(now - start, 1e-9),
                }
            )
    else:
        _check_end(world, path, cfg, result, ends, progress, observe)
    result.ends = (ends[0], ends[1])
    result.unique = len(seen)
    result.seconds = time.monotonic() - start
    return result


SETTLE_MOVES = 2000
"""Least number of moves of continuation (without faults) tried at the end of a cut-off
random walk."""
SETTLE_MOVES_PER_PROCESS = 250
"""More continuation for more processes: every process needs a few moves per tick to keep
going, and a round needs a few ticks to settle (hardened with every fault, 3,000 moves:
about 7 per process at N = 64 and 16 at N = 256 with :data:`RUN_MOVES`; 130 per process
at N = 64 when each process got one move per turn)."""
SETTLE_MOVES_MAX = 20_000
"""Most moves of continuation, whatever the processes: at N = 256 a move costs tens of
milliseconds."""

RUN_MOVES = 64
"""Most consecutive moves the continuation gives one process before serving the next.
Serving each process until it waits, instead of one move per process in turn, keeps its
compare-and-sets from all losing to each other: round-robin by single moves lets every
process read before any writes, so only one write per pass wins and a tick costs O(N^2)
moves (hardened, N = 64 with every fault, 3,000 moves: 8,440 moves of continuation
against 465; N = 256 did not settle within 64,000)."""

_SETTLE_KINDS = ("io", "ctl_io", "wake", "start", "poll", "tick")
"""Moves of the continuation, in order of preference: serve processes (either machine
state) before starting new ones, let each member poll once between ticks (the agent's
monitor loop), and let time pass only when nobody can move (no shutdown: a close would
end every call legitimately and hide a stuck one; no worker failure: it is a fault of
the workload)."""


def _check_end(
    world: World,
    path: list[Move],
    cfg: ModelConfig,
    result: Result,
    ends: list[int],
    progress: ProgressFn | None = None,
    observe: ObserveFn | None = None,
) -> bool:
    """The general liveness property at the end of a random walk; True on a violation.

    A world where nothing can move is checked as it is. A walk cut off by ``--steps`` is
    continued without further faults by a fair round-robin scheduler (every process served in
    turn until it waits, at most :data:`RUN_MOVES` moves at a time; time advancing only when
    nobody can move) until it reaches an acceptable world,
    a world where nothing can move, a world it has already visited (then
    :func:`doomed_from` decides) or :func:`settle_limit` moves (then undecided).
    """
    extra: list[Move] = []
    turn = run = 0
    ticked = False
    polled: set[int] = set()
    """Members that polled since the last tick (each polls once per tick)."""
    visited: set[tuple[bytes, int]] = set()
    """Worlds right after a tick (a cycle of the continuation passes one, unless it is a
    livelock, which then runs into the bound)."""
    limit = settle_limit(len(world.procs))
    last_report = time.monotonic()

    def decided() -> None:
        ends[0] += 1
        result.settle_moves = max(result.settle_moves, len(extra))

    for _ in range(limit + 1):  # bounded by limit
        problems = unfinished_calls(world, cfg)
        if not problems:
            decided()
            return False
        key = (plain_fingerprint(world, cfg), turn) if not extra or ticked else None
        if key is not None and key in visited:
            # The continuation cycles among unacceptable worlds: decide exactly (bounded).
            problems_here = doomed_from(world, cfg)
            if problems_here is None:
                ends[1] += 1  # an acceptable world is reachable, or the bound was hit
                return False
            decided()
            result.violation = calls_end_violation(problems_here)
            result.path = [*path, *extra]
            return True
        if key is not None:
            visited.add(key)
        moves = [
            m
            for m in enabled(world, cfg)
            if m.kind in _SETTLE_KINDS and not (m.kind == "poll" and m.slot in polled)
        ]
        if not moves:
            decided()
            result.violation = calls_end_violation(problems)
            result.path = [*path, *extra]
            return True
        if len(extra) == limit:
            break
        move = _round_robin(moves, turn, len(world.procs))
        # Stay with this process until it waits or has had its run; after a tick, start
        # again from slot 0, so the scheduler's state right after a tick is fixed.
        if move.kind == "tick":
            turn, run = 0, 0
            polled.clear()
        else:
            if move.kind == "poll":
                polled.add(move.slot)
            run = run + 1 if move.slot == turn else 1
            turn = move.slot
            if run >= RUN_MOVES:
                turn, run = move.slot + 1, 0
        out = apply(world, move, cfg)
        if observe is not None:
            observe(out)
        extra.append(move)
        if out.violations:
            result.violation, result.path = out.violations[0], [*path, *extra]
            return True
        now = time.monotonic()
        if progress is not None and now - last_report >= 1.0:
            last_report = now  # a continuation at N = 1024 runs for minutes
            progress({"continuation": len(extra), "continuation_bound": limit})
        world = out.world
        ticked = move.kind == "tick"
    ends[1] += 1
    return False


def settle_limit(processes: int) -> int:
    """Most continuation moves :func:`_check_end` tries for a world of ``processes``."""
    return min(SETTLE_MOVES_MAX, max(SETTLE_MOVES, SETTLE_MOVES_PER_PROCESS * processes))


def _round_robin(moves: list[Move], turn: int, nodes: int) -> Move:
    """The first process move at or after slot ``turn`` (wrapping), preferring io and wake
    (of either machine state) over start, and start over a poll; a tick only if nothing
    else is enabled."""
    for kinds in (("io", "ctl_io", "wake"), ("start",), ("poll",)):
        picks = [m for m in moves if m.kind in kinds]
        if picks:
            return min(picks, key=lambda m: (m.slot - turn) % nodes)
    return moves[0]


def doomed_from(world: World, cfg: ModelConfig) -> list[str] | None:
    """The problems of ``world`` if no sequence of moves that inject no fault leads from
    it to a world acceptable for the general liveness property (searched over at most
    :data:`LIVELOCK_REPLAY_LIMIT` worlds; None if one is found or the bound is hit)."""
    canon = Canon(cfg)
    problems = unfinished_calls(world, cfg)
    if not problems:
        return None
    seen = {canon.fingerprint(world)}
    queue: deque[World] = deque([world])
    while queue:
        if len(seen) > LIVELOCK_REPLAY_LIMIT:
            return None
        current = queue.popleft()
        for move in enabled(current, cfg):
            if move.kind in FAULT_MOVES:
                continue
            out = apply(current, move, cfg)
            if out.violations or not unfinished_calls(out.world, cfg):
                return None
            child = canon.fingerprint(out.world)
            if child not in seen:
                seen.add(child)
                queue.append(out.world)
    return problems


def replay(cfg: ModelConfig, moves: list[Move]) -> tuple[list[tuple[Move, Outcome]], World]:
    """Re-execute ``moves`` from the initial world; stops after the first violation.

    Raises ``ValueError`` if a move is not enabled where the trace says it was.
    """
    world = make_initial(cfg)
    steps: list[tuple[Move, Outcome]] = []
    for index, move in enumerate(moves, 1):
        if move not in enabled(world, cfg):
            raise ValueError(
                f"move {index} ({move}) is not enabled in the replayed world; the trace "
                "does not match this checker version or its parameters"
            )
        out = apply(world, move, cfg)
        steps.append((move, out))
        world = out.world
        if out.violations:
            break
    return steps, world


LIVELOCK_REPLAY_LIMIT = 50_000
"""Worlds searched when a replay re-checks that its final world lies on a timeless cycle."""


def on_timeless_cycle(world: World, cfg: ModelConfig) -> list[Move] | None:
    """Moves (none of them a tick) that lead from ``world`` back to an equivalent world, or
    None if there are none within :data:`LIVELOCK_REPLAY_LIMIT` worlds."""
    canon = Canon(cfg)
    target = canon.fingerprint(world)
    parents: dict[bytes, tuple[bytes | None, Move]] = {}
    queue: deque[tuple[World, bytes | None]] = deque([(world, None)])
    seen = 0
    while queue and seen < LIVELOCK_REPLAY_LIMIT:
        current, fp = queue.popleft()
        seen += 1
        for move in enabled(current, cfg):
            if move.kind in _STUTTER_MOVES:
                continue
            out = apply(current, move, cfg)
            child = canon.fingerprint(out.world)
            if child == target:
                moves = [move]
                cursor = fp
                while cursor is not None:  # bounded: one step back per BFS level
                    cursor, back = parents[cursor]
                    moves.append(back)
                moves.reverse()
                return moves
            if child in parents:
                continue
            parents[child] = (fp, move)
            queue.append((out.world, child))
    return None
