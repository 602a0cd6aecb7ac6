"""``python -m model_check`` on bad input: one line on stderr, exit 2, no result lost.

Each run here is tiny (upstream at N = 2 with a crash: 149 states), so the file takes a
few seconds.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import spec
from model_check import world
from model_check.__main__ import (
    BUDGET_LIMIT,
    BUDGET_OPTIONS,
    DEFAULT_STEPS,
    DEFAULT_TRACE,
    PROPERTIES,
    ROUNDS_LIMIT,
    STEPS_LIMIT,
    TICK_MS_RANGE,
    TICKS_LIMIT,
    WORKERS_LIMIT,
    _parser,
    build_config,
    main,
)
from model_check.world import CALLS_END, MODEL_PROPERTIES

ROOT = Path(__file__).resolve().parent.parent
CRASH = [
    "--nodes=2",
    "--min-nodes=2",
    "--max-nodes=2",
    "--crash=1",
    "--worker-failures=0",
    "--quiet",
]
"""Upstream's weakness 2: dead_member_unreported after 14 moves."""
CRASH_NAME = "dead_member_unreported"

Capsys = pytest.CaptureFixture[str]


def _usage_error(args: list[str], capsys: Capsys) -> str:
    """Run ``args``; require exit 2, nothing on stdout and one error line; return it."""
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("model_check: error:"), err
    return lines[0]


def _good_trace(tmp_path: Path, capsys: Capsys) -> Path:
    trace = tmp_path / "good.json"
    assert main([*CRASH, "--trace-out", str(trace)]) == 1
    capsys.readouterr()
    return trace


# -- 1. --trace-out -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("where", "message"),
    [
        (lambda tmp: tmp / "missing" / "t.json", "is not an existing directory"),
        (lambda tmp: tmp, "is a directory"),
        (lambda tmp: tmp / "plain-file" / "t.json", "is not an existing directory"),
        (lambda tmp: Path("/proc/model-check-trace.json"), "cannot be written"),
    ],
    ids=["missing-directory", "a-directory", "under-a-file", "proc"],
)
def test_an_unwritable_trace_out_is_rejected_before_the_search(
    where: Callable[[Path], Path], message: str, tmp_path: Path, capsys: Capsys
) -> None:
    (tmp_path / "plain-file").write_text("not a directory\n")
    line = _usage_error([*CRASH, "--trace-out", str(where(tmp_path))], capsys)
    assert message in line and "pass --trace-out FILE" in line


def test_checking_the_trace_path_leaves_no_file_behind(tmp_path: Path, capsys: Capsys) -> None:
    fresh, kept = tmp_path / "fresh.json", tmp_path / "kept.json"
    kept.write_text("earlier trace\n")
    for path in (fresh, kept):
        assert (
            main(["--nodes", "2", "--protocol", "hardened", "--quiet", "--trace-out", str(path)])
            == 0
        )
    assert "result=holds" in capsys.readouterr().out
    assert not fresh.exists()
    assert kept.read_text() == "earlier trace\n"


def test_a_trace_that_cannot_be_written_still_reports_the_violation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys
) -> None:
    # The default trace path is only tried after the search (a run that finds nothing
    # needs no trace); here it is a directory, so the write fails after the violation.
    monkeypatch.chdir(tmp_path)
    (tmp_path / DEFAULT_TRACE).mkdir()
    assert main(CRASH) == 1
    out, err = capsys.readouterr()
    assert f"VIOLATION {CRASH_NAME}:" in out
    assert "counterexample (14 moves):" in out and re.search(r"^\s+14\. ", out, re.M)
    assert f"trace: not written (could not write the trace file {DEFAULT_TRACE}" in out
    assert "replay:" not in out
    assert out.strip().splitlines()[-1].endswith("result=violated")
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("model_check: error: could not write")

    assert main([*CRASH, "--json"]) == 1
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["violation"]["name"] == CRASH_NAME
    assert len(doc["counterexample"]["moves"]) == 14 and len(doc["counterexample"]["text"]) > 14
    assert doc["trace"] is None and doc["replay"] is None
    assert doc["trace_error"].startswith("could not write the trace file")
    assert len(err.strip().splitlines()) == 1


def test_a_written_trace_is_named_in_the_json(tmp_path: Path, capsys: Capsys) -> None:
    trace = tmp_path / "t.json"
    assert main([*CRASH, "--json", "--trace-out", str(trace)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["trace"], doc["trace_error"]) == (str(trace), None)
    assert json.loads(trace.read_text())["violation"]["name"] == CRASH_NAME


# -- 2. the shape of a trace ------------------------------------------------------------------
Edit = Callable[[dict[str, Any]], object]


def _edited_trace(tmp_path: Path, capsys: Capsys, edit: Edit) -> Path:
    """A good trace with ``edit`` applied to its document, in a file of its own."""
    doc = json.loads(_good_trace(tmp_path, capsys).read_text())
    edit(doc)
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc))
    return edited


MALFORMED: list[tuple[str, Edit, str]] = [
    ("no moves", lambda d: d.pop("moves"), "'moves'"),
    ("no argv", lambda d: d.pop("argv"), "'argv'"),
    ("no violation", lambda d: d.pop("violation"), "'violation'"),
    ("violation a string", lambda d: d.update(violation="weird"), "'violation'"),
    ("moves null", lambda d: d.update(moves=None), "'moves'"),
    ("slot not a number", lambda d: d.update(moves=[["start", "x"]]), "'moves'"),
    ("move without slot", lambda d: d.update(moves=[["start"]]), "'moves'"),
    ("slot a bool", lambda d: d.update(moves=[["start", True]]), "'moves'"),
    ("argv a string", lambda d: d.update(argv="--nodes=2"), "'argv'"),
    ("argv not a model option", lambda d: d["argv"].append("--mode=random"), "--mode"),
    ("argv unknown option", lambda d: d["argv"].append("--bogus"), "'argv'"),
    ("argv out of range", lambda d: d["argv"].append("--tick-ms=1"), "--tick-ms"),
]


@pytest.mark.parametrize(
    ("edit", "field"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_a_malformed_trace_is_a_usage_error_naming_the_field(
    edit: Edit, field: str, tmp_path: Path, capsys: Capsys
) -> None:
    bad = _edited_trace(tmp_path, capsys, edit)
    line = _usage_error(["--replay", str(bad)], capsys)
    assert f"trace {bad}" in line and field in line


def test_a_move_that_is_not_enabled_is_a_usage_error(tmp_path: Path, capsys: Capsys) -> None:
    bad = _edited_trace(tmp_path, capsys, lambda d: d.update(moves=[["start", 7]]))
    assert main(["--replay", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "move 1 (start(7)) is not enabled" in err[0]


# -- 3. the violation a trace names -------------------------------------------------------------
def test_an_unknown_property_is_rejected_with_the_valid_names(
    tmp_path: Path, capsys: Capsys
) -> None:
    trace = _edited_trace(
        tmp_path, capsys, lambda d: d["violation"].update(name="no_such_property")
    )
    line = _usage_error(["--replay", str(trace)], capsys)
    assert "'no_such_property'" in line
    assert all(name in line for name in (CRASH_NAME, CALLS_END, "livelock", "lists_disjoint"))


def test_a_replay_that_fires_another_violation_exits_1_and_names_it(
    tmp_path: Path, capsys: Capsys
) -> None:
    trace = _edited_trace(
        tmp_path, capsys, lambda d: d["violation"].update(name="world_size_agreement")
    )
    assert main(["--replay", str(trace)]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (
        "did NOT reproduce world_size_agreement: a different violation fired instead at "
        f"move 14 of 14: {CRASH_NAME}"
    )


def test_a_replay_without_any_violation_exits_0(tmp_path: Path, capsys: Capsys) -> None:
    trace = _edited_trace(tmp_path, capsys, lambda d: d.update(moves=d["moves"][:3]))
    assert main(["--replay", str(trace)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"did NOT reproduce {CRASH_NAME}: no violation after 3 moves"


def _reported_names() -> list[tuple[str, ast.expr]]:
    """The first argument of every ``violate(...)`` and ``Violation(...)`` call in the
    model checker's source, with where it is (file:line)."""
    found = []
    for path in sorted((ROOT / "model_check").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            callee = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if callee in ("violate", "Violation"):
                found.append((f"{path.name}:{node.lineno}", node.args[0]))
    return found


def test_every_property_the_checker_reports_is_a_listed_trace_name() -> None:
    # Each violate()/Violation() names a constant of MODEL_PROPERTIES, or passes on a name
    # it was given (violate's own parameter; the spec's check_step names; a trace's JSON).
    passed_on = {"name", "*"}
    used = set()
    for where, arg in _reported_names():
        if isinstance(arg, ast.Starred):
            used_name = "*"
        elif isinstance(arg, ast.Name):
            used_name = arg.id
        else:
            pytest.fail(f"{where}: name the property with a constant of world.MODEL_PROPERTIES")
        if used_name in passed_on:
            continue
        value = getattr(world, used_name, None)
        assert value in MODEL_PROPERTIES, f"{where}: {used_name} is not in MODEL_PROPERTIES"
        used.add(value)
    assert len(used) > 10
    assert used == set(MODEL_PROPERTIES)  # and each listed property is reported somewhere
    assert len(set(MODEL_PROPERTIES)) == len(MODEL_PROPERTIES)
    invariants = {inv.name for inv in spec.STATE_INVARIANTS} | {
        inv.name for inv in spec.STEP_INVARIANTS
    }
    assert not invariants & used  # one name, one meaning
    assert set(PROPERTIES) == invariants | used
    assert CALLS_END in PROPERTIES


# -- 4. options given with --replay ---------------------------------------------------------
@pytest.mark.parametrize(
    "extra",
    [
        ["--protocol", "hardened", "--nodes", "5"],
        ["--nodes", "2"],  # even the trace's own value
        ["--seed", "0"],
        ["--trace-out", "x.json"],
        ["--mode", "random"],
        ["--keep-going"],
    ],
)
def test_replay_rejects_options_the_trace_carries(
    extra: list[str], tmp_path: Path, capsys: Capsys
) -> None:
    trace = _good_trace(tmp_path, capsys)
    line = _usage_error(["--replay", str(trace), *extra], capsys)
    assert "the trace carries its own configuration" in line
    assert extra[0] in line


def test_replay_takes_json_and_quiet(tmp_path: Path, capsys: Capsys) -> None:
    trace = _good_trace(tmp_path, capsys)
    assert main(["--replay", str(trace), "--json", "--quiet"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["reproduced"] is True and doc["fired"] == [CRASH_NAME]
    assert doc["expected"] == CRASH_NAME and doc["moves"] == doc["trace_moves"] == 14
    assert doc["params"]["replay"] == str(trace) and doc["params"]["mode"] == "replay"
    assert doc["verdict"] == f"reproduced {CRASH_NAME} after 14 moves"
    assert doc["counterexample"]["text"][-1].startswith("final store:")
    assert doc["result"] == "violated" and doc["exit_code"] == 1
    assert main(["--replay", str(trace), "--quiet"]) == 1
    assert f"reproduced {CRASH_NAME} after 14 moves" in capsys.readouterr().out


def test_a_random_walk_trace_beyond_the_exhaustive_node_limit_replays(
    tmp_path: Path, capsys: Capsys
) -> None:
    trace = tmp_path / "walk.json"
    args = ["--mode", "random", "--nodes", "16", "--min-nodes", "2", "--skew", "4"]
    assert main([*args, "--steps", "300", "--quiet", "--trace-out", str(trace)]) == 1
    name = json.loads(trace.read_text())["violation"]["name"]
    capsys.readouterr()
    assert main(["--replay", str(trace)]) == 1
    assert f"reproduced {name}" in capsys.readouterr().out


# -- 5. to 7. options that were accepted and ignored, or out of range -----------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "random", "--steps", "50", "--max-states", "10"], "--max-states bounds"),
        (["--mode", "random", "--max-states", "0"], "--max-states bounds"),
        (["--late", "3"], "--late 3 must be <= --nodes 2"),
        (["--late-starts", "--late", "1"], "--late-starts already"),
        (["--steps", "10"], "--steps sets the length of a random walk"),
        (["--mode", "random", "--keep-going"], "--keep-going applies to the exhaustive"),
        (["--tick-ms", "100000000000000000000"], f"--tick-ms must be in 2..{TICK_MS_RANGE[1]}"),
        (["--tick-ms", "1"], "--tick-ms must be in 2.."),
        (["--join-timeout", str(TICKS_LIMIT + 1)], f"--join-timeout must be in 1..{TICKS_LIMIT}"),
        (["--last-call", "0"], "--last-call must be in 1.."),
        (["--close-timeout", "10" * 12], "--close-timeout must be in 1.."),
        (["--heartbeat-timeout", "-1"], "--heartbeat-timeout must be in 1.."),
        (["--skew", str(TICKS_LIMIT + 1)], f"--skew must be in 0..{TICKS_LIMIT}"),
        (["--mode", "random", "--workers", str(WORKERS_LIMIT + 1)], "--workers must be in 1.."),
        (["--mode", "random", "--steps", "0"], f"--steps must be in 1..{STEPS_LIMIT}, got 0"),
        (
            ["--mode", "random", "--steps", str(STEPS_LIMIT + 1)],
            f"--steps must be in 1..{STEPS_LIMIT}",
        ),
        (["--max-rounds", "0"], f"--max-rounds must be in 1..{ROUNDS_LIMIT}, got 0"),
        (["--max-rounds", str(ROUNDS_LIMIT + 1)], f"--max-rounds must be in 1..{ROUNDS_LIMIT}"),
        (["--late", "-1"], "--late must be >= 0, got -1"),
    ],
)
def test_ignored_or_out_of_range_options_are_usage_errors(
    args: list[str], message: str, capsys: Capsys
) -> None:
    assert message in _usage_error(["--nodes", "2", *args], capsys)


@pytest.mark.parametrize("name", BUDGET_OPTIONS)
@pytest.mark.parametrize("value", [-1, BUDGET_LIMIT + 1, 10**30])
def test_a_budget_out_of_range_is_a_usage_error_naming_the_range(
    name: str, value: int, capsys: Capsys
) -> None:
    flag = "--" + name.replace("_", "-")
    line = _usage_error(["--nodes", "2", f"{flag}={value}"], capsys)
    assert line == f"model_check: error: {flag} must be in 0..{BUDGET_LIMIT}, got {value}"


def test_the_largest_budgets_rounds_and_steps_are_accepted() -> None:
    # build_config only: a search with these budgets would be far too large to run here.
    budgets = [f"--{name.replace('_', '-')}={BUDGET_LIMIT}" for name in BUDGET_OPTIONS]
    args = ["--nodes", "2", f"--max-rounds={ROUNDS_LIMIT}", *budgets]
    cfg, _ = build_config(_parser().parse_args(args))
    assert (cfg.max_rounds, cfg.closes) == (ROUNDS_LIMIT, BUDGET_LIMIT)
    assert cfg.faults.describe() == " ".join(
        f"{name}={BUDGET_LIMIT}"
        for name in BUDGET_OPTIONS
        if name not in ("closes", "worker_failures")
    )
    _, walk = build_config(_parser().parse_args([*args, "--mode=random", f"--steps={STEPS_LIMIT}"]))
    assert walk["steps"] == STEPS_LIMIT


def test_the_option_limits_cover_every_documented_and_tested_use() -> None:
    # Every value passed to these options in the docs, tests, benchmarks and scripts
    # (as "--name N", "--name=N" or ["--name", "N"]) must stay accepted.
    limits = {name: BUDGET_LIMIT for name in BUDGET_OPTIONS}
    limits |= {"max_rounds": ROUNDS_LIMIT, "steps": STEPS_LIMIT}
    flags = "|".join(re.escape(n.replace("_", "-")) for n in limits)
    use = re.compile(rf"--({flags})\b[\"']?(?:=|,?\s*[\"']?\s*|\s+)(\d[\d_,]*)")
    seen: dict[str, int] = {}
    for folder in ("docs", "tests", "benchmarks", "scripts", ".ci"):
        for path in sorted((ROOT / folder).rglob("*")):
            if not path.is_file() or path.suffix not in {".md", ".py", ".sh", ""}:
                continue
            for flag, number in use.findall(path.read_text(errors="replace")):
                name = flag.replace("-", "_")
                value = int(number.replace("_", "").replace(",", ""))
                seen[name] = max(seen.get(name, 0), value)
                assert value <= limits[name], (path, flag, value)
    assert {"steps", "crash", "max_rounds", "closes"} <= set(seen)  # the scan finds them


def test_help_names_every_option_range(capsys: Capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"(1..{STEPS_LIMIT};" in text and f"(1..{ROUNDS_LIMIT};" in text
    assert text.count(f"(0..{BUDGET_LIMIT}; default ") == len(BUDGET_OPTIONS)


def test_the_bounds_that_remain_accepted(capsys: Capsys) -> None:
    # --late equal to --nodes (everybody may start late), the largest time values, and a
    # bound of 0 (no bound, as the benchmark passes it) still run.
    ok = [
        ["--nodes", "2", "--late", "2", "--max-rounds", "1", "--closes", "0"],
        ["--nodes", "2", "--tick-ms", str(TICK_MS_RANGE[1]), "--join-timeout", str(TICKS_LIMIT)],
        ["--nodes", "2", "--max-states", "0", "--max-depth", "0"],
    ]
    for args in ok:
        assert main([*args, "--protocol", "hardened", "--quiet"]) == 0, args
        assert "result=holds" in capsys.readouterr().out


def test_steps_default_only_in_random_mode() -> None:
    _, walk = build_config(_parser().parse_args(["--mode", "random", "--nodes", "2"]))
    _, search = build_config(_parser().parse_args(["--nodes", "2"]))
    assert (walk["steps"], search["steps"]) == (DEFAULT_STEPS, None)


def test_help_says_that_a_bound_of_zero_is_no_bound(capsys: Capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert text.count("0 also means no bound") == 2  # --max-states and --max-depth


# -- 8. prove without z3 ---------------------------------------------------------------------
def test_prove_without_z3_is_a_setup_error(monkeypatch: pytest.MonkeyPatch, capsys: Capsys) -> None:
    monkeypatch.setitem(sys.modules, "z3", None)  # `import z3` now fails
    assert main(["prove", "--variant", "upstream"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("model_check: error: the proofs need z3")
    assert "pip install" in lines[0]


def test_an_empty_replay_path_is_not_a_search(capsys: Capsys) -> None:
    assert "cannot read trace" in _usage_error(["--replay", ""], capsys)


def test_an_interrupted_random_walk_says_so_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: Capsys
) -> None:
    import model_check.parallel

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(model_check.parallel, "run_random", interrupted)
    assert main(["--mode", "random", "--nodes", "4", "--quiet"]) == 130
    out, err = capsys.readouterr()
    assert err == "model_check: interrupted; no result\n"
    assert out.splitlines()[1].startswith("model_check protocol=")
    assert not any(line.startswith("states=") for line in out.splitlines())  # no summary


def test_help_shows_every_default_without_rest_markup(capsys: Capsys) -> None:
    for argv, parser in (([], _parser()), (["prove"], None)):
        with pytest.raises(SystemExit) as done:
            main([*argv, "--help"])
        assert done.value.code == 0
        text = capsys.readouterr().out
        for markup in ("``", ":mod:", ":class:", ":func:", ":data:", "**"):
            assert markup not in text, (argv, markup)
        if parser is None:
            continue
        for action in parser._actions:
            if action.dest != "help":
                assert "default" in (action.help or ""), action.option_strings
        assert "undecided  4" in text and "bounded    3" in text  # the results, with codes


def test_variant_is_the_same_option_as_protocol() -> None:
    # One name for one thing: --protocol, as the handler says; prove's --variant is an alias.
    by_protocol = _parser().parse_args(["--protocol", "hardened"])
    by_variant = _parser().parse_args(["--variant", "hardened"])
    assert by_protocol.protocol == by_variant.protocol == "hardened"
    _, params = build_config(by_variant)
    assert params["protocol"] == "hardened"


def test_a_closed_stdout_ends_the_run_without_a_traceback() -> None:
    # `python -m model_check ... | head -1`: the reader is gone before the output ends.
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read: the first line written fails
    try:
        done = subprocess.run(
            [sys.executable, "-m", "model_check", "--nodes", "2", "--quiet"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=120,  # guards against a hang only; the run takes a second
            check=False,
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")


def test_the_checker_imports_neither_the_handler_nor_torch(tmp_path: Path) -> None:
    # The main job must start in well under a second: importing rdzv imports torch when torch
    # is installed (seconds), and the checker needs nothing of either.
    code = (
        "import sys\n"
        "from model_check.__main__ import main\n"
        "code = main(['--nodes', '2', '--quiet', '--trace-out', sys.argv[1]])\n"
        "print(sorted(m for m in ('rdzv', 'torch') if m in sys.modules), code)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "trace.json")],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.splitlines()[-1]
    assert out == "[] 1"
