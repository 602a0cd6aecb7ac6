"""``python -m model_check``: explore the protocol and print a reproduction recipe.

The run's verdict is one of four results, each with its exit code (:data:`EXIT_CODES`):
``holds`` (0) no violation, and every property was decided; ``violated`` (1) a violation
was found (or a replayed trace reproduced its violation, or fired another one);
``bounded`` (3) a ``--max-states`` or ``--max-depth`` bound, or an interruption (Ctrl-C
or SIGTERM), cut the search before it was exhaustive and no violation was found in the
explored part; ``undecided`` (4) a random walk found no violation but the end of some walk
could not be judged for liveness. Exit code 2 is bad usage (or a ``--workers`` walk's
process died, so there is no verdict). A violation is always printed: if its trace file
cannot be written, the run says so on stderr and still exits 1.

``--json`` prints one document of the versioned format :data:`RESULT_FORMAT` (documented
in docs/model_checker.md, "JSON output").

``python -m model_check prove ...`` hands over to :mod:`model_check.prove` when that
module is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import resource
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import spec
from model_check import native
from model_check.explore import (
    Result,
    doomed_from,
    explore,
    on_timeless_cycle,
    replay,
    settle_limit,
)
from model_check.model import describe_proc, initial_world
from model_check.options import (
    BUDGET_LIMIT,
    BUDGET_OPTIONS,
    DEFAULT_STEPS,
    DEFAULT_TRACE,
    DESCRIPTION,
    EPILOG,
    EXHAUSTIVE_NODE_LIMIT,
    MODEL_FLAGS,
    MODEL_OPTIONS,
    NO_SYMMETRY_ASKED,
    NO_SYMMETRY_ORDER,
    PROPERTIES,
    RANDOM_NODE_LIMIT,
    REPLAY_FORMAT,
    REPLAY_OPTIONS,
    RESULT_FORMAT,
    ROUNDS_LIMIT,
    STEPS_LIMIT,
    TICK_MS_RANGE,
    TICKS_LIMIT,
    TIME_OPTIONS,
    TRACE_FORMAT,
    WORKERS_LIMIT,
    UsageError,
    _flag,
    _in_range,
    _parser,
    _variant,
    build_config,
    canonical_argv,
    progress_line,
)
from model_check.world import (
    AGENT_WORKLOAD,
    CALLS_END,
    LIVELOCK,
    MONITOR_WORKLOAD,
    TICKS_WORKLOAD,
    ModelConfig,
    Move,
    Outcome,
    Violation,
    World,
    store_state,
)

# The options live in model_check.options (shared with --workers walks); the CLI
# re-exports them under their old names.
__all__ = [
    "BUDGET_LIMIT",
    "BUDGET_OPTIONS",
    "DEFAULT_STEPS",
    "DEFAULT_TRACE",
    "DESCRIPTION",
    "EPILOG",
    "EXHAUSTIVE_NODE_LIMIT",
    "MODEL_FLAGS",
    "MODEL_OPTIONS",
    "NO_SYMMETRY_ASKED",
    "NO_SYMMETRY_ORDER",
    "PROPERTIES",
    "RANDOM_NODE_LIMIT",
    "REPLAY_FORMAT",
    "REPLAY_OPTIONS",
    "RESULT_FORMAT",
    "ROUNDS_LIMIT",
    "STEPS_LIMIT",
    "TICKS_LIMIT",
    "TICK_MS_RANGE",
    "TIME_OPTIONS",
    "TRACE_FORMAT",
    "WORKERS_LIMIT",
    "UsageError",
    "_flag",
    "_in_range",
    "_parser",
    "_variant",
    "build_config",
    "canonical_argv",
    "main",
    "progress_line",
]


def first_line(params: dict[str, Any]) -> str:
    """The parameters line: every parameter and derived knob as ``key=value``."""
    return "model_check " + " ".join(f"{k}={_fmt(v)}" for k, v in _text_params(params).items())


def _text_params(p: dict[str, Any]) -> dict[str, Any]:
    """The parameters as the text line spells them (units as suffixes: ms, t for ticks)."""
    symmetry = "on" if p["symmetry"] else "off"
    if p["symmetry_off_reason"] not in (None, NO_SYMMETRY_ASKED):
        symmetry = f"off({p['symmetry_off_reason']})"
    text: dict[str, Any] = {
        **{k: p[k] for k in ("protocol", "nodes", "min_nodes", "max_nodes", "mode", "seed")},
        "steps": "-" if p["steps"] is None else p["steps"],
        "symmetry": symmetry,
        **{k: p[k] for k in ("workers", "max_rounds", "closes", "worker_failures")},
        "workload": p["workload"],
        "faults": " ".join(f"{k}={v}" for k, v in p["faults"].items()),
        "skew": f"+{p['skew_ticks']}t@n_0_0",
        "duplicate_identity": p["duplicate_identity"],
        "late": "all" if p["late_starts"] else p["late"],
        "store": p["store"],
        "tick": f"{p['tick_ms']}ms",
        "join": f"{p['join_timeout_ticks']}t",
        "last_call": f"{p['last_call_ticks']}t",
        "close": f"{p['close_timeout_ticks']}t",
        "heartbeat": f"{p['heartbeat_timeout_ticks']}t",
        "keep_alive": f"{p['keep_alive_ticks']}t",
        "expiry": f"{p['expiry_ticks']}t",
        "rollback": f"{p['rollback_ms']}ms",
        "cache": f"{p['cache_ms']}ms",
        "max_states": p["max_states"] or "none",
    }
    if p["next_job"]:  # named only when on, like the planted bug below
        text["next_job"] = p["next_job"]
    if p["stale_queries"]:  # a planted bug: named only when on
        text["stale_queries"] = True
    if p.get("store_outage"):  # named only when on, so other runs' lines stay as they were
        text["store_outage"] = True
    if p["max_depth"]:  # only then, so that every other run's line stays as it was
        text["max_depth"] = p["max_depth"]
    if p["walks"] is not None:  # swarm mode only
        text["walks"] = p["walks"]
        text["walk_moves"] = p["walk_moves"]
    if "replay" in p:
        text["replay"] = p["replay"]
    return text


def _fmt(v: object) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    text = str(v)
    return f'"{text}"' if " " in text else text


def _summary_of(variant: spec.Variant) -> str:
    """A variant's description up to its first colon or full stop, in lower case."""
    text = re.split(r"[:.](?:\s|$)", variant.description, maxsplit=1)[0]
    return text[:1].lower() + text[1:]


def headline(params: dict[str, Any], given: set[str]) -> str:
    """What this run checks and why, in plain words (line one, after ``model_check
    checks``): the protocol and whether the handler runs it, the faults, the search and
    its bounds. ``given``: the options spelled out, so that a default can say it is one."""
    name = params["protocol"]
    default = (
        " (the default of --protocol: torch's own protocol, to show what the checker finds in it)"
        if "protocol" not in given
        else ""
    )
    handler = (
        "the protocol rdzv's handler runs by default"
        if name == spec.variants.DEFAULT_PROTOCOL
        else f"rdzv's handler runs {spec.variants.DEFAULT_PROTOCOL} by default"
    )
    protocol = f"protocol {name}{default}: {_summary_of(_variant(name))}; {handler}"
    faults = [f"{k.replace('_', '-')} {v}" for k, v in params["faults"].items() if v]
    if params["skew_ticks"]:
        faults.append(f"process 0's clock {params['skew_ticks']} ticks ahead")
    if params["duplicate_identity"]:
        faults.append("process 1 reuses process 0's identity")
    if params["store"] != "linearizable-cas":
        faults.append(f"a {params['store']} store")
    if params.get("store_outage"):
        faults.append("store-down as instants of a store-wide outage")
    if params["stale_queries"]:
        faults.append("queries that ignore the newer view (a planted handler bug)")
    if faults and params["mode"] == "swarm":
        fault_text = "faults, at most (each walk draws its own): " + ", ".join(faults)
    elif faults:
        fault_text = "faults: " + ", ".join(faults)
    elif given & set(BUDGET_OPTIONS) - {"closes", "worker_failures"}:
        fault_text = "faults: none"
    else:
        fault_text = "faults: none (the default; add one with --crash 1, --cas-unknown 1, ...)"
    world = (
        f"{params['nodes']} processes (min_nodes {params['min_nodes']}, max_nodes "
        f"{params['max_nodes']}), {params['max_rounds']} rounds, {params['closes']} "
        f"shutdown{'s' if params['closes'] != 1 else ''}, "
        f"{params['worker_failures']} worker failure{'s' if params['worker_failures'] != 1 else ''}"
        f" ({WORKLOAD_TEXT[params['workload']]})"
    )
    if params["late_starts"]:
        world += ", every agent may start late"
    elif params["late"]:
        world += f", {params['late']} agents may start late"
    if params["next_job"]:
        world += (
            f", {params['next_job']} of them of the next job under the same run id (they "
            "start once a shutdown was called)"
        )
    mode = params["mode"]
    if mode == "exhaustive":
        bounds = []
        if params["max_depth"]:
            bounds.append(f"runs of at most {params['max_depth']} moves")
        if params["max_states"]:
            bounds.append(f"at most {params['max_states']} distinct worlds")
        bound = "stopping at " + " and ".join(bounds) if bounds else "no bound"
        search = f"search: every interleaving of {world} ({bound})"
    elif mode == "random":
        walks = params["workers"]
        search = (
            f"search: {walks} random walk{'s' if walks != 1 else ''} of {params['steps']} "
            f"moves in all, seed {params['seed']}, over {world} (a sample, not every run)"
        )
    elif mode == "swarm":
        walks = params["walks"]
        search = (
            f"search: a swarm of {walks} random walk{'s' if walks != 1 else ''} of at most "
            f"{params['walk_moves']} moves each, seed {params['seed']}, each drawing its own "
            "fault budgets (up to the ones given), shutdowns, worker failures, skew, late "
            f"starters, start order and scheduler bias, over {world} (a sample, not every run)"
        )
    else:
        search = f"replay of {params['replay']} over {world}, without reduction"
    return f"{protocol} | {fault_text} | {search}"


INTERRUPTED_EXIT = 130
"""Exit code of a random walk or replay stopped by Ctrl-C (128 + SIGINT, as shells report
it). SIGTERM is caught only during an exhaustive search; elsewhere it keeps its default."""

BROKEN_PIPE_EXIT = 141
"""Exit code when stdout was closed before the output ended (128 + SIGPIPE, as shells
report a process that SIGPIPE ended)."""

UNDECIDED = "livelock and calls_end_as_specified need the whole space and were not decided"


def bound_line(r: Result, params: dict[str, Any]) -> str:
    """What a search cut short did check (a bound, or an interruption)."""
    if r.bound == "interrupted-graph":
        return (
            "BOUND REACHED: interrupted after the search, while deciding the graph "
            f"properties: every reachable world ({r.unique} distinct) was checked for the "
            f"safety properties, with no violation; {UNDECIDED}"
        )
    runs = f"every run of at most {r.checked_depth} moves was checked"
    if r.bound == "interrupted":
        return (
            f"BOUND REACHED: interrupted (Ctrl-C or SIGTERM) after {r.seconds:.0f} s: {runs}, "
            f"with no violation ({r.unique} distinct worlds seen); {UNDECIDED}"
        )
    if r.bound == "max_states":
        return (
            f"BOUND REACHED: --max-states={params['max_states']} stopped the search before "
            f"it was exhaustive ({runs}); no violation in the explored part"
        )
    return (
        f"BOUND REACHED: --max-depth={params['max_depth']} stopped the search before it "
        f"was exhaustive ({runs}; {UNDECIDED}); no violation in the explored part"
    )


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """While searching, SIGTERM stops the search like Ctrl-C, so that ``timeout`` or a job
    scheduler gets the partial result too (in the main thread only: elsewhere signal
    handlers cannot be set, and SIGTERM keeps its default)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


HOLDS, VIOLATED, BOUNDED, UNDECIDED_RESULT = "holds", "violated", "bounded", "undecided"
EXIT_CODES = {HOLDS: 0, VIOLATED: 1, BOUNDED: 3, UNDECIDED_RESULT: 4}
"""Each result and its exit code (2 is bad usage, 130 an interrupted random walk)."""


def verdict(r: Result) -> str:
    """The run's result: a violation; a search cut short; a random walk whose end could
    not be judged for liveness; or else every property held where it was checked."""
    if r.violation is not None:
        return VIOLATED
    if r.truncated:
        return BOUNDED
    if r.ends[1]:
        return UNDECIDED_RESULT
    return HOLDS


def summary_line(r: Result, result: str) -> str:
    return (
        f"states={r.states} unique={r.unique} depth={r.depth} sec={r.seconds:.2f} result={result}"
    )


def undecided_line(r: Result, cfg: ModelConfig) -> str:
    checked, undecided = r.ends
    return (
        f"UNDECIDED: {undecided} of {checked + undecided} walk ends did not settle within "
        f"{settle_limit(cfg.nodes)} moves of fault-free continuation, so {CALLS_END} is "
        "not decided for them (no violation found; exit 4). Other seeds, a smaller "
        "--nodes, or an exhaustive search at small N can decide it"
    )


def render_steps(cfg: ModelConfig, steps: list[tuple[Move, Outcome]]) -> list[str]:
    """Numbered moves, each with what happened and which processes changed."""
    lines: list[str] = []
    world: World = initial_world(cfg)
    for index, (move, out) in enumerate(steps, 1):
        lines.append(f"{index:3d}. {_move_text(world, move)}")
        for note in out.notes:
            lines.append(f"       {note}")
        for before, after in zip(world.procs, out.world.procs, strict=True):
            if describe_proc(before) != describe_proc(after):
                lines.append(f"       {describe_proc(before)}  =>  {describe_proc(after)}")
        for v in out.violations:
            lines.append(f"       !! {v.name}: {v.message}")
        world = out.world
    lines.append("final store: " + store_state(world).describe())
    return lines


def _move_text(world: World, move: Move) -> str:
    if move.slot < 0:
        return str(move)
    return f"{move} [{world.procs[move.slot].ident}]"


def structured_moves(cfg: ModelConfig, steps: list[tuple[Move, Outcome]]) -> list[dict[str, Any]]:
    """The counterexample as data (``--json``): for each move its kind and process, the
    table rows chosen, the store writes, the processes that changed and the violations;
    ``notes`` keeps the move's readable lines as :func:`render_steps` prints them."""
    moves: list[dict[str, Any]] = []
    world: World = initial_world(cfg)
    for index, (move, out) in enumerate(steps, 1):
        changes = [
            {"process": slot, "before": describe_proc(before), "after": describe_proc(after)}
            for slot, (before, after) in enumerate(zip(world.procs, out.world.procs, strict=True))
            if describe_proc(before) != describe_proc(after)
        ]
        moves.append(
            {
                "index": index,
                "kind": move.kind,
                "process": None if move.slot < 0 else move.slot,
                "node": None if move.slot < 0 else str(world.procs[move.slot].ident),
                "rows": [
                    {"node": node, "table": table, "row": row, "action": action}
                    for node, table, row, action in out.rows
                ],
                "writes": [{"key": key, "op": op, "value": value} for key, op, value in out.writes],
                "changes": changes,
                "violations": [{"name": v.name, "message": v.message} for v in out.violations],
                "notes": list(out.notes),
            }
        )
        world = out.world
    return moves


def counterexample_doc(
    cfg: ModelConfig, steps: list[tuple[Move, Outcome]], lines: list[str]
) -> dict[str, Any]:
    """``--json``'s counterexample: the structured moves, the final store, the text."""
    world = steps[-1][1].world if steps else initial_world(cfg)
    return {
        "moves": structured_moves(cfg, steps),
        "final_store": store_state(world).describe(),
        "text": lines,
    }


def _given(args: list[str]) -> set[str]:
    """The options ``args`` spells out (whatever their values), by destination name."""
    p = _parser()
    for action in p._actions:
        action.default = argparse.SUPPRESS
    return set(vars(p.parse_args(args)))


def check_trace_path(path: Path) -> None:
    """Fail now, before any search, if a trace could not be written to ``path``.

    Opens the file for appending (which changes nothing in an existing file) and removes
    it again if the check created it.
    """
    hint = f"pass --trace-out FILE in an existing, writable directory (e.g. ./{DEFAULT_TRACE})"
    if path.is_dir():
        raise UsageError(f"--trace-out {path} is a directory; {hint}")
    if not path.parent.is_dir():
        raise UsageError(f"--trace-out {path}: {path.parent} is not an existing directory; {hint}")
    existed = os.path.lexists(path)
    try:
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UsageError(f"--trace-out {path} cannot be written ({exc.strerror}); {hint}") from None
    if not existed:
        path.unlink(missing_ok=True)


def _write_trace(path: Path, argv: list[str], result: Result, lines: list[str]) -> str | None:
    """Write the trace file; returns why it could not be written, or None."""
    assert result.violation is not None
    doc = {
        "format": TRACE_FORMAT,
        "argv": argv,
        "violation": {"name": result.violation.name, "message": result.violation.message},
        "moves": [[m.kind, m.slot] for m in result.path],
        "rendered": lines,
    }
    try:
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    except OSError as exc:
        return f"could not write the trace file {path} ({exc.strerror or exc})"
    return None


def _trace_field(path: Path, field: str, expected: str) -> UsageError:
    return UsageError(f"trace {path}: field {field!r} must be {expected}; re-create the trace")


def load_trace(path: Path) -> tuple[list[str], str, list[Move]]:
    """A trace file's argv, violation name and moves, each checked for shape."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read trace {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != TRACE_FORMAT:
        raise UsageError(f"{path} is not a {TRACE_FORMAT} trace file")
    argv = doc.get("argv")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise _trace_field(path, "argv", 'a list of option strings such as ["--nodes=2"]')
    try:
        extra = sorted(_given(argv) - set(MODEL_OPTIONS) - set(MODEL_FLAGS))
    except UsageError as exc:
        raise UsageError(f"trace {path}: field 'argv' is invalid: {exc}") from None
    if extra:
        raise _trace_field(path, "argv", f"model options only, not {', '.join(map(_flag, extra))}")
    violation = doc.get("violation")
    name = violation.get("name") if isinstance(violation, dict) else None
    if not isinstance(name, str):
        raise _trace_field(path, "violation", 'an object with a "name" (a property name)')
    if name not in PROPERTIES:
        raise _trace_field(
            path, "violation.name", f"one of {', '.join(sorted(PROPERTIES))}, not {name!r}"
        )
    raw = doc.get("moves")
    if not isinstance(raw, list) or not all(
        isinstance(m, list)
        and len(m) == 2
        and isinstance(m[0], str)
        and type(m[1]) is int  # not a bool
        for m in raw
    ):
        raise _trace_field(
            path, "moves", 'a list of [kind, process] pairs such as [["start", 0], ["tick", -1]]'
        )
    return argv, name, [Move(kind, slot) for kind, slot in raw]


WORKLOAD_TEXT = {
    AGENT_WORKLOAD: "the agents poll num_nodes_waiting() and restart as torch's do",
    MONITOR_WORKLOAD: "the agents poll num_nodes_waiting() at least once per tick and "
    "restart as torch's do",
    TICKS_WORKLOAD: "each member polls num_nodes_waiting() once per tick, after its "
    "keep-alive, and restarts as torch's agent does",
}
"""How the first line of a run describes each workload."""


def _replay_main(path_text: str, as_json: bool) -> int:
    path = Path(path_text)
    argv, expected, moves = load_trace(path)
    try:
        cfg, params = build_config(_parser().parse_args(argv), replaying=True)
    except UsageError as exc:
        raise UsageError(f"trace {path}: field 'argv' is invalid: {exc}") from None
    params = {**params, "replay": str(path)}
    if not as_json:
        print(f"model_check checks {headline(params, set(MODEL_OPTIONS))}")
        print(first_line(params))
    try:
        steps, _ = replay(cfg, moves)
    except ValueError as exc:
        raise UsageError(f"trace {path}: {exc}") from None
    lines = render_steps(cfg, steps)
    got = [v.name for v in steps[-1][1].violations] if steps else []
    world = steps[-1][1].world if steps else initial_world(cfg)
    explanation: list[str] = []
    if expected == CALLS_END:
        problems = doomed_from(world, cfg)
        if problems is not None:
            explanation.append("from here no continuation without faults reaches a world where")
            explanation.append("every call ended as specified: " + "; ".join(problems))
            got.append(CALLS_END)
    if expected == LIVELOCK:
        cycle = on_timeless_cycle(world, cfg)
        if cycle is not None:
            explanation.append(
                f"from here these {len(cycle)} moves return to an equivalent world without"
            )
            explanation.append("time advancing: " + ", ".join(map(str, cycle)))
            got.append(LIVELOCK)
    reproduced = expected in got
    where = f"move {len(steps)} of {len(moves)}"
    if reproduced:
        verdict_text = f"reproduced {expected} after {len(steps)} moves"
    elif got:
        verdict_text = (
            f"did NOT reproduce {expected}: a different violation fired instead at {where}: "
            + ", ".join(got)
        )
    else:
        verdict_text = f"did NOT reproduce {expected}: no violation after {len(steps)} moves"
    result = VIOLATED if got else HOLDS
    if as_json:
        doc = {
            "format": REPLAY_FORMAT,
            "result": result,
            "exit_code": EXIT_CODES[result],
            "checks": headline(params, set(MODEL_OPTIONS)),
            "params": params,
            "argv": argv,
            "expected": expected,
            "reproduced": reproduced,
            "fired": got,
            "moves": len(steps),
            "trace_moves": len(moves),
            "counterexample": counterexample_doc(cfg, steps, lines),
            "explanation": explanation,
            "verdict": verdict_text,
        }
        print(json.dumps(doc, sort_keys=True))
    else:
        for line in [*lines, *explanation, verdict_text]:
            print(line)
    return EXIT_CODES[result]


def _ends(result: Result, cfg: ModelConfig) -> dict[str, int]:
    checked, undecided = result.ends
    return {
        "checked": checked,
        "undecided": undecided,
        "longest_continuation_moves": result.settle_moves,
        "continuation_bound_moves": settle_limit(cfg.nodes),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "prove":
        try:
            prove = importlib.import_module("model_check.prove")
        except ModuleNotFoundError as exc:
            if exc.name != "model_check.prove":
                raise
            print(
                "model_check: error: 'prove' is not available (model_check/prove.py is not "
                "installed)",
                file=sys.stderr,
            )
            return 2
        try:
            return int(prove.main(args[1:]))
        except SystemExit as exc:
            if not isinstance(exc.code, str):
                raise
            # prove.load_z3 exits with how to install z3: a setup problem, not a failed proof.
            print(f"model_check: error: {exc.code}", file=sys.stderr)
            return 2
    if args and args[0] == "validate":
        from model_check import validate

        return validate.main(args[1:])
    if args and args[0] == "swarm":
        if any(a == "--mode" or a.startswith("--mode=") for a in args[1:]):
            print(
                "model_check: error: 'swarm' is --mode swarm; pass one of them, not --mode too",
                file=sys.stderr,
            )
            return 2
        args = ["--mode=swarm", *args[1:]]
    if "--native" in args or os.environ.get(native.NATIVE_ENV):
        try:
            native.check_child()
            if "--native" in args:
                return native.run([a for a in args if a != "--native"])
        except native.NativeBuildError as exc:
            print(f"model_check: error: {exc}", file=sys.stderr)
            return 2
    try:
        return _main(args)
    except UsageError as exc:
        print(f"model_check: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # An exhaustive search reports its partial result itself (exit 3); a random walk
        # or a replay has nothing to report until it ends.
        print("model_check: interrupted; no result", file=sys.stderr)
        return INTERRUPTED_EXIT
    except BrokenPipeError:
        # The reader of stdout went away (`| head -2`): no traceback, and no more output
        # (the interpreter's final flush would fail again).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_EXIT


def _main(args: list[str]) -> int:
    ns = _parser().parse_args(args)
    if ns.replay is not None:
        extra = sorted(_given(args) - REPLAY_OPTIONS)
        if extra:
            raise UsageError(
                f"--replay takes no {', '.join(map(_flag, extra))}: the trace carries its own "
                "configuration (only --json and --quiet may be added)"
            )
        return _replay_main(ns.replay, ns.json)
    cfg, params = build_config(ns)
    argv = canonical_argv(ns, params)
    if ns.mode == "exhaustive" and ns.workers != 1:
        raise UsageError(
            "--workers applies to --mode random (independent seeded walks in parallel "
            "processes); exhaustive search runs in one process, use --workers 1"
        )
    if ns.trace_out is not None:
        check_trace_path(Path(ns.trace_out))
    checks = headline(params, _given(args))
    if not ns.json:
        print(f"model_check checks {checks}")
        print(first_line(params), flush=True)
    progress = None if ns.quiet else progress_line
    if ns.mode == "swarm":
        return _swarm_main(ns, cfg, params, argv, checks)
    found: list[tuple[Violation, list[Move]]] = []
    if ns.mode == "exhaustive":
        with _terminate_as_interrupt():
            result = explore(
                cfg,
                symmetry=params["symmetry"],
                stop_on_violation=not ns.keep_going,
                violations_out=found,
                max_states=params["max_states"] or 0,
                max_depth=params["max_depth"] or 0,
                progress=progress,
            )
    else:
        from model_check.parallel import run_random

        result = run_random(params["steps"], ns.workers, ns.seed, argv, quiet=ns.quiet)
    outcome = verdict(result)
    lines: list[str] = []
    steps: list[tuple[Move, Outcome]] = []
    cycle: list[Move] | None = None
    trace_path: Path | None = None
    trace_error: str | None = None
    replay_cmd = ""
    if result.violation is not None:
        steps, _ = replay(cfg, result.path)
        lines = render_steps(cfg, steps)
        if result.violation.name == LIVELOCK:
            world = steps[-1][1].world if steps else initial_world(cfg)
            cycle = on_timeless_cycle(world, cfg) or []
        trace_path = Path(ns.trace_out or DEFAULT_TRACE)
        trace_error = _write_trace(trace_path, argv, result, lines)
        if trace_error is None:
            replay_cmd = f"python -m model_check --replay {trace_path}"
    if ns.json:
        doc = {
            "format": RESULT_FORMAT,
            "result": outcome,
            "exit_code": EXIT_CODES[outcome],
            "exhaustive": ns.mode == "exhaustive" and not result.truncated,
            "checks": checks,
            "params": params,
            "argv": argv,
            "violation": None
            if result.violation is None
            else {
                "name": result.violation.name,
                "message": result.violation.message,
                "moves": len(result.path),
            },
            "counterexample": None if not steps else counterexample_doc(cfg, steps, lines),
            "cycle": None if cycle is None else [str(m) for m in cycle],
            "also_violated": [
                {"name": v.name, "moves": len(p), "message": v.message} for v, p in found[1:]
            ],
            "trace": str(trace_path) if trace_path and trace_error is None else None,
            "trace_error": trace_error,
            "replay": replay_cmd or None,
            "states": result.states,
            "unique": result.unique,
            "depth": result.depth,
            "wall_seconds": round(result.seconds, 3),
            "bound": result.bound or None,
            "checked_depth": result.checked_depth if result.truncated else None,
            "walk_ends": None if ns.mode == "exhaustive" else _ends(result, cfg),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
        print(json.dumps(doc, sort_keys=True))
    else:
        if result.violation is not None:
            print(f"VIOLATION {result.violation.name}: {result.violation.message}")
            print(f"counterexample ({len(result.path)} moves):")
            for line in lines:
                print(line)
            if cycle is not None:
                print("cycle (no tick): " + ", ".join(map(str, cycle)))
            for other, path in found[1:]:
                print(f"also violated: {other.name} ({len(path)} moves): {other.message}")
            if trace_error is None:
                print(f"trace: {trace_path}")
                print(f"replay: {replay_cmd}")
            else:
                print(f"trace: not written ({trace_error})")
        elif result.truncated:
            print(bound_line(result, params))
        if ns.mode == "random":
            ends = _ends(result, cfg)
            print(
                f"{CALLS_END}: walk ends checked={ends['checked']} "
                f"undecided={ends['undecided']} (longest continuation "
                f"{ends['longest_continuation_moves']} of {ends['continuation_bound_moves']} "
                "moves)"
            )
            if outcome == UNDECIDED_RESULT:
                print(undecided_line(result, cfg))
        print(summary_line(result, outcome))
    if trace_error is not None:
        sys.stdout.flush()
        print(
            f"model_check: error: {trace_error}; the violation and its counterexample are on "
            "stdout (exit 1); rerun with --trace-out FILE in a writable directory for a trace",
            file=sys.stderr,
        )
    return EXIT_CODES[outcome]


def _swarm_main(
    ns: argparse.Namespace,
    cfg: ModelConfig,
    params: dict[str, Any],
    argv: list[str],
    checks: str,
) -> int:
    """Swarm mode (:mod:`model_check.swarm`): run the walks, print the report.

    Every line on stdout (and the ``--json`` document) is a function of the options: the
    wall time goes to stderr, on its own line, unless ``--quiet``."""
    from model_check import swarm

    caps = swarm.Caps(
        cfg.faults, ns.closes, ns.worker_failures, ns.skew, 0 if ns.late_starts else ns.late
    )
    with _terminate_as_interrupt():
        sw = swarm.run_swarm(
            cfg,
            caps,
            walks=params["walks"],
            walk_moves=params["walk_moves"],
            seed=ns.seed,
            symmetry=params["symmetry"],
            progress=None if ns.quiet else progress_line,
        )
    result = sw.as_result()
    outcome = verdict(result)
    if sw.interrupted and outcome != VIOLATED:
        outcome = BOUNDED
    first = sw.first()
    lines: list[str] = []
    steps: list[tuple[Move, Outcome]] = []
    trace_path: Path | None = None
    trace_error: str | None = None
    replay_cmd = ""
    walk_argv: list[str] = []
    if first is not None:
        walk_cfg = swarm.walk_config(cfg, first.knobs)
        steps, _ = replay(walk_cfg, first.result.path)
        lines = render_steps(walk_cfg, steps)
        walk_ns = argparse.Namespace(**vars(ns))
        for name, value in swarm.knob_options(first.knobs, ns.late_starts).items():
            setattr(walk_ns, name, value)
        walk_argv = canonical_argv(walk_ns, params)
        trace_path = Path(ns.trace_out or DEFAULT_TRACE)
        trace_error = _write_trace(trace_path, walk_argv, result, lines)
        if trace_error is None:
            replay_cmd = f"python -m model_check --replay {trace_path}"
    violations = swarm.violation_summary(sw)
    props = swarm.property_checks(sw, sorted(PROPERTIES))
    ends = _ends(result, cfg)
    walked = len(sw.walks)
    if ns.json:
        doc = {
            "format": swarm.SWARM_FORMAT,
            "result": outcome,
            "exit_code": EXIT_CODES[outcome],
            "checks": checks,
            "params": params,
            "argv": argv,
            "walks_run": walked,
            "interrupted": sw.interrupted,
            "episodes": result.episodes,
            "violations": violations,
            "violation": None
            if first is None or result.violation is None
            else {
                "name": result.violation.name,
                "message": result.violation.message,
                "moves": len(result.path),
                "walk": first.knobs.as_dict(),
                "argv": walk_argv,
            },
            "counterexample": None
            if first is None
            else counterexample_doc(swarm.walk_config(cfg, first.knobs), steps, lines),
            "trace": str(trace_path) if trace_path and trace_error is None else None,
            "trace_error": trace_error,
            "replay": replay_cmd or None,
            "coverage": {"distinct_worlds": sw.unique, "moves": sw.moves}
            | swarm.coverage_doc(sw, cfg),
            "properties": props,
            "walk_ends": ends,
            "states": result.states,
            "unique": result.unique,
            "depth": result.depth,
        }
        print(json.dumps(doc, sort_keys=True))
    else:
        print(
            f"swarm: walks={walked} of {params['walks']} episodes={result.episodes} "
            f"moves={sw.moves} violations={len(sw.violating())} (walks that found one)"
            + (" INTERRUPTED (Ctrl-C or SIGTERM): the walks done so far" if sw.interrupted else "")
        )
        for v in violations:
            print(
                f"violated: {v['name']} in {v['walks']} walk{'s' if v['walks'] != 1 else ''} "
                f"(shortest {v['shortest_moves']} moves, walk {v['walk']})"
            )
        if first is not None and result.violation is not None:
            print(f"VIOLATION {result.violation.name}: {result.violation.message}")
            print(
                f'found by walk {first.knobs.index} (seed "{first.knobs.seed}"): '
                + first.knobs.describe()
            )
            print("walk model: " + " ".join(walk_argv))
            print(f"counterexample ({len(result.path)} moves):")
            for line in lines:
                print(line)
            if trace_error is None:
                print(f"trace: {trace_path}")
                print(f"replay: {replay_cmd}")
            else:
                print(f"trace: not written ({trace_error})")
        for line in swarm.coverage_lines(sw, cfg, params["symmetry"]):
            print(line)
        print(
            "properties: "
            + " ".join(
                f"{p['name']}={p['checks']}"
                + (f"!{p['violated_walks']}" if p["violated_walks"] else "")
                for p in props
            )
            + " (checks; !k: violated in k walks; safety properties are checked on every "
            "move, calls_end_as_specified at every walk end, livelock needs the whole graph)"
        )
        print(
            f"{CALLS_END}: walk ends checked={ends['checked']} "
            f"undecided={ends['undecided']} (longest continuation "
            f"{ends['longest_continuation_moves']} of {ends['continuation_bound_moves']} moves)"
        )
        if outcome == UNDECIDED_RESULT:
            print(undecided_line(result, cfg))
        print(
            f"states={result.states} unique={result.unique} depth={result.depth} result={outcome}"
        )
    if not ns.quiet:
        sys.stdout.flush()
        print(f"model_check: swarm wall time {sw.seconds:.2f} s", file=sys.stderr)
    if trace_error is not None:
        sys.stdout.flush()
        print(
            f"model_check: error: {trace_error}; the violation and its counterexample are on "
            "stdout (exit 1); rerun with --trace-out FILE in a writable directory for a trace",
            file=sys.stderr,
        )
    return EXIT_CODES[outcome]


if __name__ == "__main__":
    raise SystemExit(main())
