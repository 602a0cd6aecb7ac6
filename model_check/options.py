"""The command line of ``python -m model_check``: its options, their limits, and the
model configuration they build.

Shared by the CLI (:mod:`model_check.__main__`) and the processes of ``--workers`` walks
(:mod:`model_check.parallel`), which rebuild the model from the canonical command line,
so that the walks import the options and not the CLI.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, NoReturn

import spec
from model_check.planted import PLANTED
from model_check.swarm import (
    DEFAULT_WALK_MOVES,
    DEFAULT_WALKS,
    WALK_MOVES_LIMIT,
    WALKS_LIMIT,
)
from model_check.world import AGENT_WORKLOAD, MODEL_PROPERTIES, WORKLOADS, Faults, ModelConfig

TRACE_FORMAT = "rdzv-model-check-trace/1"
RESULT_FORMAT = "rdzv-model-check-result/2"
"""The ``format`` of a run's ``--json`` document (docs/model_checker.md, "JSON output")."""
REPLAY_FORMAT = "rdzv-model-check-replay/2"
"""The ``format`` of a replay's ``--json`` document. Version 2 (with ``RESULT_FORMAT`` 2 and
``swarm.SWARM_FORMAT`` 2): a chosen row is reported by its stable name (``join.wait``), not
its index."""
DEFAULT_TRACE = "model_check_counterexample.json"
EXHAUSTIVE_NODE_LIMIT = 12
"""Largest --nodes accepted in exhaustive mode (beyond it, use --mode random)."""
RANDOM_NODE_LIMIT = 1024
"""Largest --nodes accepted in random mode and by --replay (a replay walks one path)."""
DEFAULT_STEPS = 20_000
"""Random mode's walk length when --steps is not given."""
TICK_MS_RANGE = (2, 86_400_000)
"""Allowed --tick-ms: a keep-alive interval of 2 ms to one day."""
TICKS_LIMIT = 10_000
"""Largest --join-timeout, --last-call, --close-timeout, --heartbeat-timeout and --skew,
in ticks (every stored time stays far inside the codec's 64-bit range)."""
WORKERS_LIMIT = 64
"""Largest --workers (one process each)."""
STEPS_LIMIT = 10_000_000
"""Largest --steps (random mode's total moves; the longest run documented walks 20,000)."""
ROUNDS_LIMIT = 64
"""Largest --max-rounds (every documented run uses 1 or 2)."""
BUDGET_LIMIT = 64
"""Largest --closes, --worker-failures and fault budget (--crash, --restart-new, --restart-same,
--cas-unknown, --store-down, --pause); every documented run uses at most 3."""
BUDGET_OPTIONS = (
    *("closes", "worker_failures", "crash", "restart_new", "restart_same", "cas_unknown"),
    *("store_down", "pause"),
)
"""Options counted as budgets, each in 0..BUDGET_LIMIT."""

TIME_OPTIONS = ("join_timeout", "last_call", "close_timeout", "heartbeat_timeout")
"""Options counted in ticks, each in 1..TICKS_LIMIT."""
MODEL_OPTIONS = (
    "nodes",
    "workload",
    "min_nodes",
    "max_nodes",
    "protocol",
    "max_rounds",
    "closes",
    "worker_failures",
    "crash",
    "restart_new",
    "restart_same",
    "cas_unknown",
    "store_down",
    "pause",
    "skew",
    "late",
    "next_job",
    "tick_ms",
    *TIME_OPTIONS,
)
"""Options that define the model, in the order of a trace's argv (each as --name=value)."""
MODEL_FLAGS = (
    "duplicate_identity",
    "late_starts",
    "cas_ignores_token",
    "stale_queries",
    "store_outage",
)
"""Switches that define the model (in a trace's argv only when on)."""
REPLAY_OPTIONS = frozenset({"replay", "json", "quiet"})
"""What may accompany --replay: the trace carries every other setting."""

PROPERTIES = frozenset(
    {inv.name for inv in spec.STATE_INVARIANTS}
    | {inv.name for inv in spec.STEP_INVARIANTS}
    | set(MODEL_PROPERTIES)
)
"""Every violation name a trace can carry."""


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


DESCRIPTION = """\
Explore the rendezvous protocol: many virtual nodes run the node machine of spec/
against a simulated compare-and-set store, and every interleaving (--mode exhaustive)
or seeded random walks (--mode random; --mode swarm: many short walks, each with its
own fault budgets, start order and scheduler bias) are checked for the properties listed in
docs/model_checker.md ("What is checked"). The first line says what this run checks;
the second names every parameter; a violation prints the shortest counterexample and
the command that replays it.

prove: "python -m model_check prove --help" checks the tables with z3 for any N.
validate: "python -m model_check validate LOG..." replays real handlers' event logs
(RDZV_EVENTS_DIR, or the rdzv.events logger) through the spec's machine."""

EPILOG = """\
results and exit codes:
  holds      0  no violation, every property decided (exhaustive: in the whole space;
                random: on the walks taken)
  violated   1  a violation (printed as numbered moves, with a trace file to replay)
  bad usage  2  one line on stderr (also when a --workers walk's process died)
  bounded    3  --max-states, --max-depth or Ctrl-C/SIGTERM cut the search short; no
                violation in the part searched
  undecided  4  random mode: no violation, but some walk end could not be judged for
                liveness (calls_end_as_specified) within its continuation bound

examples:
  python -m model_check --nodes 8
  python -m model_check --nodes 2 --min-nodes 2 --max-nodes 2 --crash 1
  python -m model_check --replay model_check_counterexample.json
  python -m model_check --mode random --nodes 64 --steps 3000 --seed 1 --crash 3
  python -m model_check swarm --protocol hardened --nodes 8 --crash 3 --cas-unknown 2 \\
      --walks 200 --walk-moves 1500 --seed 1"""


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m model_check",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nodes", type=int, default=8, help="processes launched (default 8)")
    p.add_argument(
        "--min-nodes",
        type=int,
        default=None,
        help="min_nodes of the rendezvous (default nodes - 1, at least 1)",
    )
    p.add_argument(
        "--max-nodes", type=int, default=None, help="max_nodes of the rendezvous (default nodes)"
    )
    p.add_argument(
        "--protocol",
        "--variant",
        dest="protocol",
        default="upstream",
        metavar="NAME",
        help="the protocol to check: upstream, torch-2.13, hardened, scale or a planted-* "
        "bug (default upstream; --variant is the same option, as in prove)",
    )
    p.add_argument(
        "--mode",
        choices=("exhaustive", "random", "swarm"),
        default="exhaustive",
        help="every interleaving, seeded random walks, or a swarm of short walks with "
        "knobs drawn per walk (also 'python -m model_check swarm ...'; default exhaustive)",
    )
    p.add_argument(
        "--walks",
        type=int,
        default=None,
        help=f"swarm mode: walks (1..{WALKS_LIMIT}; default {DEFAULT_WALKS})",
    )
    p.add_argument(
        "--walk-moves",
        type=int,
        default=None,
        help=f"swarm mode: most moves per walk (1..{WALK_MOVES_LIMIT}; default "
        f"{DEFAULT_WALK_MOVES})",
    )
    p.add_argument("--seed", type=int, default=0, help="random mode's seed (default 0)")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"random mode: total moves (1..{STEPS_LIMIT}; default {DEFAULT_STEPS})",
    )
    p.add_argument(
        "--max-rounds",
        type=int,
        default=2,
        help=f"rendezvous rounds in the model (1..{ROUNDS_LIMIT}; default 2)",
    )
    budget = f"0..{BUDGET_LIMIT}; default 0"
    p.add_argument(
        "--closes",
        type=int,
        default=1,
        help=f"shutdown calls allowed in all (0..{BUDGET_LIMIT}; default 1)",
    )
    p.add_argument(
        "--worker-failures",
        type=int,
        default=1,
        help="times a member's workers fail, in all, so that it calls next_rendezvous "
        f"again at once (0..{BUDGET_LIMIT}; default 1)",
    )
    p.add_argument("--crash", type=int, default=0, help=f"crash budget ({budget})")
    p.add_argument(
        "--restart-new", type=int, default=0, help=f"restarts with a new identity ({budget})"
    )
    p.add_argument(
        "--restart-same", type=int, default=0, help=f"restarts with the same identity ({budget})"
    )
    p.add_argument(
        "--cas-unknown", type=int, default=0, help=f"CAS with unknown outcome ({budget})"
    )
    p.add_argument(
        "--store-down", type=int, default=0, help=f"store unreachable for one call ({budget})"
    )
    p.add_argument(
        "--pause",
        type=int,
        default=0,
        help="ticks that may pass while store requests are in flight: a process paused "
        f"between a read and the write it decided on it ({budget})",
    )
    p.add_argument(
        "--skew",
        type=int,
        default=0,
        help=f"process 0's wall clock runs ahead by this many ticks (0..{TICKS_LIMIT}; default 0)",
    )
    p.add_argument(
        "--duplicate-identity",
        action="store_true",
        help="process 1 reuses process 0's identity (default off)",
    )
    p.add_argument(
        "--late-starts",
        action="store_true",
        help="every agent may start after t=0 (default off: all start before time advances)",
    )
    p.add_argument(
        "--late",
        type=int,
        default=0,
        help="this many agents (the last ones, at most --nodes) may start after t=0 (default 0)",
    )
    p.add_argument(
        "--next-job",
        type=int,
        default=0,
        help=(
            "this many agents (the last ones, at most --nodes) belong to the next job under "
            "the same run id: each may call next_rendezvous once a shutdown was called "
            "(default 0)"
        ),
    )
    p.add_argument(
        "--cas-ignores-token",
        action="store_true",
        help="planted store bug: compare-and-set writes whatever the token (default off)",
    )
    p.add_argument(
        "--workload",
        choices=WORKLOADS,
        default=AGENT_WORKLOAD,
        help="agent: members poll num_nodes_waiting() at any moment, as torch's agent does; "
        "monitor: the same, but every member polls at least once per tick, as torch's "
        "monitor loop does (for liveness: no agent skips polls for a whole join timeout); "
        "ticks: once per tick, after their keep-alive (fewer interleavings, for large N) "
        "(default agent)",
    )
    p.add_argument(
        "--stale-queries",
        action="store_true",
        help="planted handler bug: a query or close does not start from the newer view the "
        "process's other machine state holds, as in rdzv before that fix (default off)",
    )
    p.add_argument(
        "--store-outage",
        action="store_true",
        help="--store-down counts instants of a store-wide outage: each fails every pending "
        "store call at once, so consecutive ones keep every heartbeat out for longer than the "
        "expiry (default off: each fails one call of one process)",
    )
    p.add_argument(
        "--tick-ms",
        type=int,
        default=5000,
        help=f"one tick = the keep-alive interval, in ms ({TICK_MS_RANGE[0]}..{TICK_MS_RANGE[1]}; "
        "default 5000)",
    )
    ticks = f"in ticks (1..{TICKS_LIMIT}; default %(default)s)"
    p.add_argument("--join-timeout", type=int, default=4, help=f"join timeout {ticks}")
    p.add_argument("--last-call", type=int, default=1, help=f"last-call timeout {ticks}")
    p.add_argument("--close-timeout", type=int, default=2, help=f"close timeout {ticks}")
    p.add_argument(
        "--heartbeat-timeout", type=int, default=1, help=f"heartbeat (keep-alive) timeout {ticks}"
    )
    p.add_argument(
        "--max-states",
        type=int,
        default=None,
        help="exhaustive: unique-state bound (default none; 0 also means no bound)",
    )
    p.add_argument(
        "--max-depth",
        type=int,
        default=None,
        help="exhaustive: check every run of at most this many moves (bounded model "
        "checking; default none: the whole space; 0 also means no bound)",
    )
    p.add_argument(
        "--no-symmetry",
        action="store_true",
        help="exhaustive: search without the symmetry reduction (default off: reduced)",
    )
    p.add_argument(
        "--keep-going",
        action="store_true",
        help="exhaustive: explore everything and list every property violated (default "
        "off: stop at the first)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help=f"random mode: parallel walks, one process each (1..{WORKERS_LIMIT}; default 1)",
    )
    p.add_argument(
        "--replay",
        metavar="FILE",
        help="re-run a trace file under its own settings; only --json and --quiet may be "
        "added (default: no replay)",
    )
    p.add_argument(
        "--trace-out",
        metavar="FILE",
        help=f"where a counterexample's trace is written (default {DEFAULT_TRACE})",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help=f"print one JSON document ({RESULT_FORMAT}) instead of text (default off)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr (default off)")
    p.add_argument(
        "--native",
        action="store_true",
        help="run the same checker compiled with mypyc (built once per source tree, a few "
        "minutes; same output, faster; needs mypy and a C compiler; default off)",
    )
    return p


def _variant(name: str) -> spec.Variant:
    if name in PLANTED:
        return PLANTED[name]
    try:
        return spec.get_variant(name)
    except ValueError as exc:
        raise UsageError(f"{exc} (or a planted bug: {', '.join(sorted(PLANTED))})") from None


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _in_range(name: str, value: int, low: int, high: int, unit: str = "") -> None:
    if not low <= value <= high:
        raise UsageError(f"{_flag(name)} must be in {low}..{high}{unit}, got {value}")


def build_config(
    ns: argparse.Namespace, *, replaying: bool = False
) -> tuple[ModelConfig, dict[str, Any]]:
    """Validate the options; returns the model and every derived knob (for line one).

    ``replaying``: the options come from a trace file, whose single path is walked
    whatever its size (random mode's node limit applies) and whose mode is ``replay``.
    """
    n = ns.nodes
    exhaustive = ns.mode == "exhaustive"
    swarm = ns.mode == "swarm"
    walk_mode = "swarm mode (a swarm of walks)" if swarm else "random mode"
    limit = EXHAUSTIVE_NODE_LIMIT if exhaustive and not replaying else RANDOM_NODE_LIMIT
    if not 1 <= n <= limit:
        mode = "--replay" if replaying else f"--mode {ns.mode}"
        raise UsageError(f"--nodes {n} must be in 1..{limit} for {mode}")
    min_nodes = ns.min_nodes if ns.min_nodes is not None else max(1, n - 1)
    max_nodes = ns.max_nodes if ns.max_nodes is not None else n
    _in_range("max_rounds", ns.max_rounds, 1, ROUNDS_LIMIT)
    if ns.late < 0:
        raise UsageError(f"--late must be >= 0, got {ns.late}")
    for name in BUDGET_OPTIONS:
        _in_range(name, getattr(ns, name), 0, BUDGET_LIMIT)
    _in_range("tick_ms", ns.tick_ms, *TICK_MS_RANGE, " ms")
    for name in TIME_OPTIONS:
        _in_range(name, getattr(ns, name), 1, TICKS_LIMIT, " ticks")
    _in_range("skew", ns.skew, 0, TICKS_LIMIT, " ticks")
    _in_range("workers", ns.workers, 1, WORKERS_LIMIT)
    if ns.late > n:
        raise UsageError(
            f"--late {ns.late} must be <= --nodes {n} (the last K processes start late)"
        )
    if not 0 <= ns.next_job <= n:
        raise UsageError(
            f"--next-job {ns.next_job} must be in 0..--nodes {n} (the last K processes "
            "belong to the next job)"
        )
    if ns.next_job and not ns.closes:
        raise UsageError(
            "--next-job needs --closes >= 1: the next job starts once the first one shut down"
        )
    if ns.late_starts and ns.late:
        raise UsageError(
            "--late-starts already lets every process start late; pass it or --late K, not both"
        )
    if ns.duplicate_identity and n < 2:
        raise UsageError("--duplicate-identity needs --nodes >= 2")
    if exhaustive and ns.steps is not None:
        raise UsageError(
            "--steps sets the length of a random walk (--mode random); the exhaustive "
            "search is bounded by --max-states or --max-depth"
        )
    if swarm and ns.steps is not None:
        raise UsageError(
            "--steps sets random mode's total moves; a swarm's walks are bounded by "
            "--walks and --walk-moves"
        )
    if not swarm and (ns.walks is not None or ns.walk_moves is not None):
        given = "--walks" if ns.walks is not None else "--walk-moves"
        raise UsageError(
            f"{given} applies to --mode swarm (python -m model_check swarm ...); "
            + (
                "random mode uses --steps"
                if ns.mode == "random"
                else "the exhaustive search is bounded by --max-states or --max-depth"
            )
        )
    walks = DEFAULT_WALKS if ns.walks is None else ns.walks
    walk_moves = DEFAULT_WALK_MOVES if ns.walk_moves is None else ns.walk_moves
    _in_range("walks", walks, 1, WALKS_LIMIT)
    _in_range("walk_moves", walk_moves, 1, WALK_MOVES_LIMIT)
    if swarm and ns.workers != 1:
        raise UsageError(
            "--workers applies to --mode random; a swarm runs its walks in one process "
            "(use --workers 1, or split the walks over several runs with different --seed)"
        )
    steps = DEFAULT_STEPS if ns.steps is None else ns.steps
    _in_range("steps", steps, 1, STEPS_LIMIT)
    max_states = ns.max_states
    if max_states is None:
        max_states = 0
    if max_states < 0:
        raise UsageError(f"--max-states must be >= 0, got {max_states}")
    if ns.max_states is not None and not exhaustive:
        raise UsageError(
            f"--max-states bounds the exhaustive search; {walk_mode} uses "
            + ("--walks and --walk-moves" if swarm else "--steps")
        )
    max_depth = ns.max_depth if ns.max_depth is not None else 0
    if max_depth < 0:
        raise UsageError(f"--max-depth must be >= 0, got {max_depth}")
    if ns.max_depth is not None and not exhaustive:
        raise UsageError(
            f"--max-depth bounds the exhaustive search; {walk_mode} uses "
            + ("--walks and --walk-moves" if swarm else "--steps")
        )
    if ns.keep_going and not exhaustive:
        raise UsageError(
            "--keep-going applies to the exhaustive search; a random walk stops at its "
            "first violation (drop --keep-going, or use --mode exhaustive)"
        )
    variant = _variant(ns.protocol)
    try:
        cfg = ModelConfig(
            nodes=n,
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            variant=variant,
            tick_ms=ns.tick_ms,
            join_ticks=ns.join_timeout,
            last_call_ticks=ns.last_call,
            close_ticks=ns.close_timeout,
            heartbeat_ticks=ns.heartbeat_timeout,
            max_rounds=ns.max_rounds,
            closes=ns.closes,
            worker_failures=ns.worker_failures,
            faults=Faults(
                ns.crash, ns.restart_new, ns.restart_same, ns.cas_unknown, ns.store_down, ns.pause
            ),
            skew_ticks=ns.skew,
            duplicate_identity=ns.duplicate_identity,
            late_starts=ns.late_starts,
            late=ns.late,
            next_job=ns.next_job,
            cas_ignores_token=ns.cas_ignores_token,
            share_views=not ns.stale_queries,
            store_outage=ns.store_outage,
            workload=ns.workload,
        )
        settings = cfg.settings
    except spec.SettingsError as exc:
        raise UsageError(str(exc)) from None
    # Heartbeats under keys: who watches whom follows the sorted order of the identities,
    # so renaming identities can change a world's future and the reduction is unsound.
    order_dependent = variant.heartbeats == spec.KEY_BEATS
    symmetry = not ns.no_symmetry and not order_dependent
    reason = None if symmetry else NO_SYMMETRY_ASKED if ns.no_symmetry else NO_SYMMETRY_ORDER
    params: dict[str, Any] = {
        "protocol": variant.name,
        "nodes": n,
        "min_nodes": min_nodes,
        "max_nodes": max_nodes,
        "mode": "replay" if replaying else ns.mode,
        "seed": ns.seed,
        "steps": steps if ns.mode == "random" else None,
        "walks": walks if swarm else None,
        "walk_moves": walk_moves if swarm else None,
        "symmetry": symmetry,
        "symmetry_off_reason": reason,
        "workers": ns.workers,
        "max_rounds": ns.max_rounds,
        "closes": ns.closes,
        "worker_failures": ns.worker_failures,
        "faults": dataclasses.asdict(cfg.faults),
        "skew_ticks": ns.skew,
        "duplicate_identity": ns.duplicate_identity,
        "late": ns.late,
        "next_job": ns.next_job,
        "late_starts": ns.late_starts,
        "store": "cas-ignores-token" if ns.cas_ignores_token else "linearizable-cas",
        "stale_queries": ns.stale_queries,
        "store_outage": ns.store_outage,
        "workload": ns.workload,
        "tick_ms": ns.tick_ms,
        "join_timeout_ticks": ns.join_timeout,
        "last_call_ticks": ns.last_call,
        "close_timeout_ticks": ns.close_timeout,
        "heartbeat_timeout_ticks": ns.heartbeat_timeout,
        "keep_alive_ticks": 1,
        "expiry_ticks": settings.keep_alive_max_attempt,
        "rollback_ms": variant.rollback_window,
        "cache_ms": settings.cache_duration,
        "max_states": max_states or None,
        "max_depth": max_depth or None,
    }
    return cfg, params


NO_SYMMETRY_ASKED = "--no-symmetry"
NO_SYMMETRY_ORDER = "decisions-depend-on-identity-order"
"""Why a search runs without the symmetry reduction (``symmetry_off_reason``)."""


def canonical_argv(ns: argparse.Namespace, params: dict[str, Any]) -> list[str]:
    """Every option spelled out, so a trace file replays under the same model."""
    derived = {name: params[name] for name in ("min_nodes", "max_nodes", "protocol")}
    argv = [f"{_flag(name)}={derived.get(name, getattr(ns, name))}" for name in MODEL_OPTIONS]
    argv.extend(_flag(flag) for flag in MODEL_FLAGS if getattr(ns, flag))
    return argv


def progress_line(stats: dict[str, float]) -> None:
    """One progress line on stderr (``progress key=value ...``, all whole numbers)."""
    print(
        "progress " + " ".join(f"{k}={v:.0f}" for k, v in stats.items()),
        file=sys.stderr,
        flush=True,
    )
