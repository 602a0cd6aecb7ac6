"""How much could partial-order reduction save? Commuting moves, measured on the model.

Partial-order reduction explores, at a world, only a subset of the enabled moves (an
*ample* set) when the others commute with it. Whatever else it needs, a move can only be
left out if it commutes with the moves kept. This script walks the model (seeded random
walks, the same moves the checker explores) and, at every world where moves of at least
two processes are enabled and time cannot advance, tries every pair of enabled moves of
two different processes both ways: the pair *commutes* when each move stays enabled
after the other, neither order violates a property, and both orders reach the same world
(the same reduced fingerprint). It prints, per kind of move pair, how many commute, and
the share of worlds where a reduction could even start:

- *one process*: some process's enabled moves each commute with every enabled move of
  every other process (necessary for an ample set made of one process's moves, which
  preserves properties of runs, such as the safety properties and ``livelock``);
- *one move*: some single move commutes with every other enabled move (necessary for a
  singleton ample set, the only kind that preserves branching properties such as
  ``calls_end_as_specified``: from every world an acceptable end stays reachable).

Both are upper bounds: a real ample set must also commute with every move the other
processes can make *later*, before it is taken. Model options follow ``--``:

    python3 benchmarks/bench_commutation.py                       # hardened, N = 3 and 8
    python3 benchmarks/bench_commutation.py --walks 5 -- --protocol scale --nodes 3 --crash 1
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from model_check.__main__ import UsageError, _parser, build_config  # noqa: E402
from model_check.canon import Canon  # noqa: E402
from model_check.model import apply, enabled, initial_world  # noqa: E402
from model_check.world import ModelConfig, Move, World  # noqa: E402

EVERY_FAULT = ["--crash", "1", "--restart-new", "1", "--cas-unknown", "1", "--store-down", "1"]
DEFAULT_RUNS = (
    ["--protocol", "hardened", "--nodes", "3", *EVERY_FAULT, "--skew", "4"],
    ["--protocol", "hardened", "--nodes", "8", *EVERY_FAULT, "--skew", "4"],
)
"""Without model options: ``hardened`` with every fault at N = 3 and at N = 8."""
WALK_LIMIT = 10_000
"""Bound on ``--walks`` and on ``--moves``."""
KINDS = {"io": "store op", "wake": "wake", "start": "start", "shutdown": "shutdown"}
"""Move kinds by name; every other kind injects a fault."""


def kind_of(move: Move) -> str:
    return KINDS.get(move.kind, "fault")


@dataclass
class Tally:
    worlds: int = 0
    one_process: int = 0
    one_move: int = 0
    pairs: Counter[tuple[str, str]] = field(default_factory=Counter)
    commuting: Counter[tuple[str, str]] = field(default_factory=Counter)


def commute(world: World, a: Move, b: Move, cfg: ModelConfig, canon: Canon) -> bool:
    """Whether ``a`` then ``b`` and ``b`` then ``a`` are both possible, violate nothing
    and reach the same world (up to renaming)."""
    first, second = apply(world, a, cfg), apply(world, b, cfg)
    if first.violations or second.violations:
        return False
    if b not in enabled(first.world, cfg) or a not in enabled(second.world, cfg):
        return False
    ab, ba = apply(first.world, b, cfg), apply(second.world, a, cfg)
    if ab.violations or ba.violations:
        return False
    return canon.fingerprint(ab.world) == canon.fingerprint(ba.world)


def measure(cfg: ModelConfig, walks: int, moves: int, seed: int) -> Tally:
    canon = Canon(cfg)
    rng = random.Random(seed)
    tally = Tally()
    for _ in range(walks):
        world = initial_world(cfg)
        for _ in range(moves):
            options = enabled(world, cfg)
            if not options:
                break
            slots = {m.slot for m in options}
            if len(slots - {-1}) >= 2 and -1 not in slots:
                tally.worlds += 1
                clash: set[Move] = set()
                for i, a in enumerate(options):
                    for b in options[i + 1 :]:
                        if a.slot == b.slot:
                            continue
                        key = (min(kind_of(a), kind_of(b)), max(kind_of(a), kind_of(b)))
                        tally.pairs[key] += 1
                        if commute(world, a, b, cfg, canon):
                            tally.commuting[key] += 1
                        else:
                            clash.update((a, b))
                free_slots = {m.slot for m in options} - {m.slot for m in clash}
                tally.one_process += bool(free_slots)
                tally.one_move += any(m not in clash for m in options)
            world = apply(world, rng.choice(options), cfg).world
    return tally


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def report(argv: list[str], tally: Tally) -> None:
    print(f"model: {' '.join(argv)}")
    print(
        f"  worlds with moves of >= 2 processes: {tally.worlds}; where a reduction could "
        f"start: one process {_share(tally.one_process, tally.worlds)}, "
        f"one move {_share(tally.one_move, tally.worlds)}"
    )
    print(f"  {'pair of moves':<22} {'pairs':>7} {'commute':>8} {'share':>6}")
    for key in sorted(tally.pairs):
        n, k = tally.pairs[key], tally.commuting[key]
        print(f"  {key[0] + ' x ' + key[1]:<22} {n:>7} {k:>8} {_share(k, n):>6}")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    split = args.index("--") if "--" in args else len(args)
    own, model = args[:split], args[split + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--walks", type=int, default=30, help="random walks per model")
    parser.add_argument("--moves", type=int, default=200, help="moves per walk at most")
    parser.add_argument("--seed", type=int, default=1)
    ns = parser.parse_args(own)
    for name in ("walks", "moves"):
        if not 1 <= getattr(ns, name) <= WALK_LIMIT:
            parser.error(f"--{name} must be between 1 and {WALK_LIMIT}, got {getattr(ns, name)}")
    runs = [model] if model else [list(r) for r in DEFAULT_RUNS]
    for run in runs:
        try:
            cfg, _ = build_config(_parser().parse_args([*run, "--mode", "random"]))
        except UsageError as exc:
            parser.error(f"model options {' '.join(run)}: {exc}")
        report(run, measure(cfg, ns.walks, ns.moves, ns.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
