"""Search: exhaustive breadth-first exploration and seeded random simulation.

Breadth-first order makes the first violation found one of the shortest (fewest moves).
Each visited class keeps a parent pointer (fingerprint of the parent, move), and the
explored member of each class is exactly the world reached by applying the recorded
moves to the initial world, so a counterexample is a list of concrete moves that
:func:`replay` re-executes without any canonicalisation.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from model_check.canon import Canon, plain_fingerprint
from model_check.model import ModelConfig, Move, Outcome, Violation, World, apply, enabled
from model_check.model import initial_world as make_initial

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
    """True when --max-states stopped the search before it was exhaustive."""
    fallbacks: int = 0
    episodes: int = 0
    fingerprints: set[bytes] | None = None
    """Every unique fingerprint (kept only when asked, for tests)."""


def explore(
    cfg: ModelConfig,
    *,
    symmetry: bool = True,
    max_states: int = 0,
    progress: ProgressFn | None = None,
    keep_fingerprints: bool = False,
    stop_on_violation: bool = True,
    violations_out: list[tuple[Violation, list[Move]]] | None = None,
    visit: Callable[[World], None] | None = None,
) -> Result:
    """Breadth-first search of every world reachable from the initial one."""
    canon = Canon(cfg)

    def plain(world: World) -> bytes:
        return plain_fingerprint(world, cfg)

    fp_of: Callable[[World], bytes] = canon.fingerprint if symmetry else plain
    start = time.monotonic()
    w0 = make_initial(cfg)
    fp0 = fp_of(w0)
    parents: dict[bytes, tuple[bytes, Move] | None] = {fp0: None}
    queue: deque[tuple[World, bytes, int]] = deque([(w0, fp0, 0)])
    if visit is not None:
        visit(w0)
    result = Result(unique=1)
    last_report = start
    seen_violations: set[str] = set()
    timeless: dict[bytes, list[bytes]] = {}
    """Edges of moves that do not advance time (for the livelock check)."""
    while queue:
        world, fp, depth = queue.popleft()
        result.depth = max(result.depth, depth)
        for move in enabled(world, cfg):
            out = apply(world, move, cfg)
            result.states += 1
            if out.violations:
                path = [*_path(parents, fp), move]
                for v in out.violations:
                    if v.name in seen_violations:
                        continue
                    seen_violations.add(v.name)
                    if violations_out is not None:
                        violations_out.append((v, path))
                    if result.violation is None:
                        result.violation, result.path = v, path
                if stop_on_violation:
                    return _finish(result, start, canon, parents, keep_fingerprints)
                continue
            child = fp_of(out.world)
            if move.kind != "tick":
                timeless.setdefault(fp, []).append(child)
            if child in parents:
                continue
            parents[child] = (fp, move)
            result.unique += 1
            if visit is not None:
                visit(out.world)
            queue.append((out.world, child, depth + 1))
            if max_states and result.unique >= max_states:
                result.truncated = True
                return _finish(result, start, canon, parents, keep_fingerprints)
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
    if result.violation is None or not stop_on_violation:
        entry = _cycle_entry(timeless)
        if entry is not None:
            v = Violation(
                "livelock",
                "a cycle of moves that never advances time is reachable: the processes "
                "keep working (e.g. conflicting writes) without anybody progressing; the "
                "counterexample leads to a world on the cycle",
            )
            if violations_out is not None:
                violations_out.append((v, _path(parents, entry)))
            if result.violation is None:
                result.violation, result.path = v, _path(parents, entry)
    return _finish(result, start, canon, parents, keep_fingerprints)


def _cycle_entry(edges: dict[bytes, list[bytes]]) -> bytes | None:
    """A node on some cycle of ``edges`` (iterative three-colour DFS), or None."""
    colour: dict[bytes, int] = {}  # 1 on the stack, 2 done
    for root in sorted(edges):
        if root in colour:
            continue
        stack: list[tuple[bytes, int]] = [(root, 0)]
        colour[root] = 1
        while stack:  # bounded: every node is pushed once
            node, index = stack[-1]
            children = edges.get(node, [])
            if index < len(children):
                stack[-1] = (node, index + 1)
                child = children[index]
                state = colour.get(child)
                if state == 1:
                    return child
                if state is None:
                    colour[child] = 1
                    stack.append((child, 0))
            else:
                colour[node] = 2
                stack.pop()
    return None


def _finish(
    result: Result,
    start: float,
    canon: Canon,
    parents: dict[bytes, tuple[bytes, Move] | None],
    keep: bool,
) -> Result:
    result.seconds = time.monotonic() - start
    result.fallbacks = canon.fallbacks
    if keep:
        result.fingerprints = set(parents)
    return result


def _path(parents: dict[bytes, tuple[bytes, Move] | None], fp: bytes) -> list[Move]:
    moves: list[Move] = []
    cursor = parents[fp]
    while cursor is not None:  # bounded: each step goes one BFS level up
        parent, move = cursor
        moves.append(move)
        cursor = parents[parent]
    moves.reverse()
    return moves


def simulate(
    cfg: ModelConfig,
    *,
    seed: str,
    steps: int,
    progress: ProgressFn | None = None,
) -> Result:
    """Random walks: ``steps`` moves in total, restarting from the initial world whenever
    nothing is enabled any more. Deterministic for a given seed string."""
    rng = random.Random(seed)
    start = time.monotonic()
    result = Result()
    seen: set[bytes] = set()
    world = make_initial(cfg)
    path: list[Move] = []
    result.episodes = 1
    last_report = start
    for _ in range(steps):
        moves = enabled(world, cfg)
        if not moves:
            world, path = make_initial(cfg), []
            result.episodes += 1
            continue
        move = moves[rng.randrange(len(moves))]
        out: Outcome = apply(world, move, cfg)
        path.append(move)
        result.states += 1
        result.depth = max(result.depth, len(path))
        if out.violations:
            result.violation, result.path = out.violations[0], list(path)
            break
        world = out.world
        seen.add(plain_fingerprint(world, cfg))
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
    result.unique = len(seen)
    result.seconds = time.monotonic() - start
    return result


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
            if move.kind == "tick":
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
