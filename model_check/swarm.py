"""Swarm mode: many short seeded random walks, each with its own knobs, and their coverage.

Exhaustive search with every fault grows about 35x per process (N = 4 is ~10^8 worlds), so
N = 8 is sampled, not searched. One long random walk (``--mode random``) samples it with one
configuration and a uniform scheduler: every fault enabled all the time, and every walk
alike. Swarm testing (Groce et al., "Swarm Testing", ISSTA 2012) instead runs many short
walks that each *leave things out*: walk ``i`` draws, from the seed alone, its own fault
budgets (each fault kind off in about half of the walks, else 1 up to the budget given on
the command line), its shutdowns, worker failures, clock skew and late starters, the order
in which its processes start, and a scheduler bias (a weight per class of move). A walk
that crashes nobody and rarely polls gets deep into the second round; one that loses
every compare-and-set reply it can stays near the start. Together they reach states that
neither the uniform walk nor a breadth-first search at that N reaches.

Every walk is :func:`model_check.explore.simulate` (the one walk implementation), under a
:class:`ModelConfig` that carries the walk's budgets and with :class:`Scheduler` as its
chooser. A violation found by walk ``i`` is a plain list of moves under that walk's model,
so its trace file (the command line's own format) carries the walk's budgets in its
``argv`` and replays exactly with ``--replay``. Nothing here depends on Python's salted
``hash``, dict or set order, or wall time: the knobs come from ``random.Random`` seeded
with strings, fingerprints are blake2b digests (:mod:`model_check.canon`) and every
listing is sorted.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from model_check.canon import Canon, plain_fingerprint
from model_check.explore import Result, simulate
from model_check.world import (
    CALLS_END,
    FAULT_KINDS,
    LIVELOCK,
    MODEL_PROPERTIES,
    Faults,
    ModelConfig,
    Move,
    Outcome,
    Violation,
    World,
)

SWARM_FORMAT = "rdzv-model-check-swarm/2"
"""The ``format`` of a swarm run's ``--json`` document (docs/model_checker.md, "Swarm mode")."""

DEFAULT_WALKS = 200
DEFAULT_WALK_MOVES = 400
WALKS_LIMIT = 1_000_000
WALK_MOVES_LIMIT = 100_000

MOVE_CLASSES = ("progress", "start", "poll", "tick", "workload", "fault")
"""The scheduler's classes of moves, each with its own weight per walk: serving a
process's store operation or wake-up (``io``, ``wake``, ``ctl_io``); starting a process;
an agent's poll; time passing; the workload's own events (a worker failure, a shutdown);
an injected fault."""
CLASS_OF = {
    "io": 0,
    "wake": 0,
    "ctl_io": 0,
    "start": 1,
    "poll": 2,
    "tick": 3,
    "fail_worker": 4,
    "shutdown": 4,
}
"""Every other move kind is a fault (class 5)."""
WEIGHTS = (1, 2, 4, 8)
"""The weights a class may draw (uniformly, per walk)."""


@dataclass(frozen=True)
class Caps:
    """The most each walk may draw: the command line's budgets."""

    faults: Faults
    closes: int
    worker_failures: int
    skew: int
    late: int
    """The most processes (the last slots) that may start late; ignored when every process
    may (``--late-starts``)."""


@dataclass(frozen=True)
class Knobs:
    """What walk ``index`` drew from the seed."""

    index: int
    seed: str
    """The walk's own seed string (its moves)."""
    faults: Faults
    closes: int
    worker_failures: int
    skew: int
    late: int
    start_order: tuple[int, ...]
    """The processes in the order they start (the first one not started yet is the only
    one the scheduler may start)."""
    weights: tuple[int, ...]
    """One weight per :data:`MOVE_CLASSES` entry."""

    def describe(self) -> str:
        faults = " ".join(f"{k}={v}" for k, v in dataclasses.asdict(self.faults).items())
        bias = ",".join(f"{c}:{w}" for c, w in zip(MOVE_CLASSES, self.weights, strict=True))
        order = ",".join(map(str, self.start_order))
        return (
            f"{faults} closes={self.closes} worker_failures={self.worker_failures} "
            f"skew={self.skew}t late={self.late} start_order={order} bias={bias}"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "seed": self.seed,
            "faults": dataclasses.asdict(self.faults),
            "closes": self.closes,
            "worker_failures": self.worker_failures,
            "skew_ticks": self.skew,
            "late": self.late,
            "start_order": list(self.start_order),
            "bias": dict(zip(MOVE_CLASSES, self.weights, strict=True)),
        }


def _budget(rng: random.Random, cap: int) -> int:
    """Off in about half of the walks (swarm testing's feature omission), else 1..cap."""
    if cap <= 0 or rng.random() < 0.5:
        return 0
    return rng.randint(1, cap)


def draw_knobs(caps: Caps, nodes: int, seed: int, index: int) -> Knobs:
    """Walk ``index``'s knobs: a function of the seed, the index and the caps only."""
    rng = random.Random(f"swarm/{seed}/{index}/knobs")
    faults = Faults(*(_budget(rng, getattr(caps.faults, kind)) for kind in FAULT_KINDS))
    closes = rng.randint(0, caps.closes)
    worker_failures = rng.randint(0, caps.worker_failures)
    skew = _budget(rng, caps.skew)
    late = rng.randint(0, caps.late)
    order = list(range(nodes))
    rng.shuffle(order)
    weights = tuple(rng.choice(WEIGHTS) for _ in MOVE_CLASSES)
    return Knobs(
        index,
        f"swarm/{seed}/{index}",
        faults,
        closes,
        worker_failures,
        skew,
        late,
        tuple(order),
        weights,
    )


def walk_config(base: ModelConfig, knobs: Knobs) -> ModelConfig:
    """The model walk ``knobs.index`` explores: ``base`` with the walk's budgets."""
    return dataclasses.replace(
        base,
        faults=knobs.faults,
        closes=knobs.closes,
        worker_failures=knobs.worker_failures,
        skew_ticks=knobs.skew,
        late=0 if base.late_starts else knobs.late,
    )


def knob_options(knobs: Knobs, late_starts: bool) -> dict[str, int]:
    """The walk's budgets as command-line options (destination names), for its trace."""
    options = {kind: getattr(knobs.faults, kind) for kind in FAULT_KINDS}
    options.update(
        closes=knobs.closes,
        worker_failures=knobs.worker_failures,
        skew=knobs.skew,
        late=0 if late_starts else knobs.late,
    )
    return options


class Scheduler:
    """A walk's chooser: starts processes in the walk's order, and picks among the other
    enabled moves with the walk's weight for each move's class (integer arithmetic on the
    walk's own generator, so every platform picks the same)."""

    def __init__(self, knobs: Knobs) -> None:
        self.position = {slot: i for i, slot in enumerate(knobs.start_order)}
        self.weights = knobs.weights

    def __call__(self, moves: list[Move], rng: random.Random) -> Move:
        starts = [m for m in moves if m.kind == "start"]
        if len(starts) > 1:
            first = min(starts, key=lambda m: self.position[m.slot])
            moves = [m for m in moves if m.kind != "start" or m is first]
        weights = [self.weights[CLASS_OF.get(m.kind, 5)] for m in moves]
        pick = rng.randrange(sum(weights))
        for move, weight in zip(moves, weights, strict=True):
            pick -= weight
            if pick < 0:
                return move
        raise AssertionError("unreachable: pick < sum(weights)")


@dataclass(frozen=True)
class TableRow:
    table: str
    row: str
    """The row's stable name, ``<op>.<name>`` (:meth:`spec.tables.Table.qualified`)."""
    action: str

    def __str__(self) -> str:
        return f"{self.row} -> {self.action}"


def table_rows(base: ModelConfig) -> list[TableRow]:
    """Every row of every table of the protocol, in table then row order."""
    variant = base.variant
    return [
        TableRow(op.value, table.qualified(index), r.then.value)
        for op, table in sorted(variant.tables.items(), key=lambda item: item[0].value)
        for index, r in enumerate(table.rows)
    ]


@dataclass
class WalkResult:
    knobs: Knobs
    result: Result


@dataclass
class SwarmResult:
    walks: list[WalkResult] = field(default_factory=list)
    unique: int = 0
    """Distinct worlds over every walk (canonical fingerprints)."""
    moves: int = 0
    """Every move applied, the continuations that judged the walk ends included."""
    hits: dict[tuple[str, str], int] = field(default_factory=dict)
    """Times each (table, row) was chosen."""
    seconds: float = 0.0
    interrupted: bool = False

    @property
    def states(self) -> int:
        return sum(w.result.states for w in self.walks)

    @property
    def depth(self) -> int:
        return max((w.result.depth for w in self.walks), default=0)

    @property
    def ends(self) -> tuple[int, int]:
        return (
            sum(w.result.ends[0] for w in self.walks),
            sum(w.result.ends[1] for w in self.walks),
        )

    @property
    def settle_moves(self) -> int:
        return max((w.result.settle_moves for w in self.walks), default=0)

    def violating(self) -> list[WalkResult]:
        return [w for w in self.walks if w.result.violation is not None]

    def first(self) -> WalkResult | None:
        """The shortest counterexample (then the lowest walk index)."""
        found = self.violating()
        return min(found, key=lambda w: (len(w.result.path), w.knobs.index)) if found else None

    def as_result(self) -> Result:
        """The run as one :class:`Result` (the summary line and the verdict)."""
        r = Result(states=self.states, unique=self.unique, depth=self.depth)
        r.seconds = self.seconds
        r.ends = self.ends
        r.settle_moves = self.settle_moves
        r.episodes = sum(w.result.episodes for w in self.walks)
        first = self.first()
        if first is not None:
            r.violation, r.path = first.result.violation, first.result.path
        return r


ProgressFn = Callable[[dict[str, float]], None]


def run_swarm(
    base: ModelConfig,
    caps: Caps,
    *,
    walks: int,
    walk_moves: int,
    seed: int,
    symmetry: bool = True,
    progress: ProgressFn | None = None,
) -> SwarmResult:
    """Walk ``walks`` walks of at most ``walk_moves`` moves each (a walk that ends early
    starts a new episode from the initial world, as random mode does). Ctrl-C stops it
    after the walks done so far (``interrupted``)."""
    out = SwarmResult()
    seen: set[bytes] = set()
    hits: dict[tuple[str, str], int] = {}
    moves = 0

    def observe(outcome: Outcome) -> None:
        nonlocal moves
        moves += 1
        for _, table, name, _ in outcome.rows:
            key = (table, name)
            hits[key] = hits.get(key, 0) + 1

    start = last = time.monotonic()
    try:
        for index in range(walks):
            knobs = draw_knobs(caps, base.nodes, seed, index)
            cfg = walk_config(base, knobs)
            fingerprint: Callable[[World], bytes]
            if symmetry:
                fingerprint = Canon(cfg).fingerprint
            else:

                def fingerprint(world: World, cfg: ModelConfig = cfg) -> bytes:
                    return plain_fingerprint(world, cfg)

            r = simulate(
                cfg,
                seed=knobs.seed,
                steps=walk_moves,
                choose=Scheduler(knobs),
                observe=observe,
                fingerprint=fingerprint,
                seen=seen,
            )
            out.walks.append(WalkResult(knobs, r))
            now = time.monotonic()
            if progress is not None and now - last >= 1.0:
                last = now
                progress(
                    {
                        "walks": index + 1,
                        "of": walks,
                        "unique": len(seen),
                        "moves": moves,
                        "violations": len(out.violating()),
                    }
                )
    except KeyboardInterrupt:
        out.interrupted = True
    out.unique = len(seen)
    out.moves = moves
    out.hits = hits
    out.seconds = time.monotonic() - start
    return out


SAFETY_NOTE = "checked on every move"


def property_checks(sw: SwarmResult, safety: list[str]) -> list[dict[str, object]]:
    """Per property: how often it was checked, and how many walks violated it. The safety
    properties (the spec's invariants and the checker's own) are checked on every move
    and every next_rendezvous return or poll it makes; ``calls_end_as_specified`` at the
    end of every walk (and episode); ``livelock`` needs the whole graph and is not checked
    by walks."""
    violated: dict[str, int] = {}
    for w in sw.walks:
        v = w.result.violation
        if v is not None:
            violated[v.name] = violated.get(v.name, 0) + 1
    checked, undecided = sw.ends
    rows: list[dict[str, object]] = []
    for name in sorted(set(safety) | set(MODEL_PROPERTIES)):
        if name == LIVELOCK:
            entry: dict[str, object] = {"checks": 0, "how": "not checked (needs the whole graph)"}
        elif name == CALLS_END:
            entry = {"checks": checked, "undecided": undecided, "how": "at every walk end"}
        else:
            entry = {"checks": sw.moves, "how": SAFETY_NOTE}
        rows.append({"name": name, **entry, "violated_walks": violated.get(name, 0)})
    return rows


def violation_summary(sw: SwarmResult) -> list[dict[str, object]]:
    """Per property violated: how many walks, and the shortest (walk, moves)."""
    by_name: dict[str, list[WalkResult]] = {}
    for w in sw.violating():
        assert w.result.violation is not None
        by_name.setdefault(w.result.violation.name, []).append(w)
    out: list[dict[str, object]] = []
    for name in sorted(by_name):
        found = by_name[name]
        best = min(found, key=lambda w: (len(w.result.path), w.knobs.index))
        out.append(
            {
                "name": name,
                "walks": len(found),
                "shortest_moves": len(best.result.path),
                "walk": best.knobs.index,
            }
        )
    return out


def row_hits(sw: SwarmResult, base: ModelConfig) -> list[tuple[TableRow, int]]:
    """Every row of the protocol's tables with the times the walks chose it."""
    return [(r, sw.hits.get((r.table, r.row), 0)) for r in table_rows(base)]


def coverage_doc(sw: SwarmResult, base: ModelConfig) -> dict[str, object]:
    """``--json``'s coverage: the rows with their hits, the rows never hit."""
    hits = row_hits(sw, base)
    listed = {(r.table, r.row) for r, _ in hits}
    return {
        "rows": [{"table": r.table, "row": r.row, "action": r.action, "hits": n} for r, n in hits],
        "rows_hit": sum(1 for _, n in hits if n),
        "rows_total": len(hits),
        "never_hit": [str(r) for r, n in hits if not n],
        "unlisted_hits": sorted([t, k, n] for (t, k), n in sw.hits.items() if (t, k) not in listed),
    }


def coverage_lines(sw: SwarmResult, base: ModelConfig, symmetry: bool) -> list[str]:
    """The text report's coverage: distinct worlds, one line of hits per table (``row:hits``),
    and the rows never hit."""
    hits = row_hits(sw, base)
    reduction = "canonical fingerprints, symmetry on" if symmetry else "plain fingerprints"
    lines = [
        f"coverage: distinct worlds={sw.unique} ({reduction}) in {sw.moves} moves; "
        f"table rows hit={sum(1 for _, n in hits if n)} of {len(hits)}"
    ]
    by_table: dict[str, list[str]] = {}
    for r, n in hits:
        by_table.setdefault(r.table, []).append(f"{r.row.removeprefix(r.table + '.')}:{n}")
    for table, cells in by_table.items():
        lines.append(f"rows {table}: " + " ".join(cells))
    never = [str(r) for r, n in hits if not n]
    lines.append(f"rows never hit ({len(never)}): " + (", ".join(never) if never else "none"))
    return lines


def first_violation(sw: SwarmResult) -> tuple[Knobs, Violation, list[Move]] | None:
    first = sw.first()
    if first is None:
        return None
    assert first.result.violation is not None
    return first.knobs, first.result.violation, first.result.path
