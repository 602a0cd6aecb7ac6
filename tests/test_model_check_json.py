"""``python -m model_check --json``: the documented, versioned schema, and the four results.

The tables of docs/model_checker.md ("JSON output") are the schema: every document the
runs below print is checked against them both ways (no field undocumented, no documented
field that no run prints) and every value against its documented type. The runs cover the
four results (holds, violated, bounded, undecided), a livelock's cycle, ``--keep-going``
and a replay; each is tiny (at most a few hundred states).
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from model_check.__main__ import EXIT_CODES, REPLAY_FORMAT, RESULT_FORMAT, main

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "model_checker.md"

Capsys = pytest.CaptureFixture[str]

CRASH = ["--nodes=2", "--min-nodes=2", "--max-nodes=2", "--crash=1", "--worker-failures=0"]
UNDECIDED = ["--mode", "random", "--nodes", "2", "--steps", "5", "--seed", "0"]
UNDECIDED += ["--protocol", "planted-busy-keep-alive"]
"""A walk of 5 moves whose end, continued without faults, writes heartbeats for ever without
time passing (the planted livelock): the continuation never settles, so it is undecided."""
RUNS: list[tuple[list[str], str]] = [
    (["--nodes", "2", "--protocol", "hardened"], "holds"),
    (["--mode", "random", "--nodes", "4", "--steps", "50", "--protocol", "hardened"], "holds"),
    (CRASH, "violated"),
    (["--nodes=3", "--min-nodes=2", "--max-nodes=3", "--late-starts", "--max-states=9"], "bounded"),
    (UNDECIDED, "undecided"),
    # livelock (without a worker failure, which finds world_size_agreement first)
    (
        ["--nodes", "2", "--protocol", "planted-busy-keep-alive", "--worker-failures", "0"],
        "violated",
    ),
    (["--nodes=2", "--min-nodes=2", "--max-nodes=2", "--skew=4", "--keep-going"], "violated"),
]

TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def schema() -> dict[str, dict[str, str]]:
    """Each documented format: its fields (path -> type), from the tables of the docs."""
    section = DOC.read_text(encoding="utf-8").split("\n## JSON output\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    tables: dict[str, dict[str, str]] = {}
    rows: dict[str, str] = {}
    for line in [*section.splitlines(), ""]:
        m = re.fullmatch(r"\| `([^`]+)` \| ([a-z ]+) \| (.*) \|", line)
        if m:
            rows[m[1]] = m[2]
            if m[1] == "format":
                fmt = re.fullmatch(r"`([^`]+)`", m[3])
                assert fmt, f"the format row names no format: {line}"
                name = fmt[1]
        elif rows:
            tables[name] = rows
            rows = {}
    return tables


def _fields(value: object, path: str = "") -> Iterator[tuple[str, object]]:
    if path:
        yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _fields(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for item in value:
            yield from _fields(item, f"{path}[]")


def _documented(path: str, fields: dict[str, str]) -> str | None:
    """The documented field that covers ``path``: itself, or the nearest ``x.*`` above."""
    if path in fields:
        return path
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        wildcard = ".".join(parts[:cut]) + ".*"
        if wildcard in fields:
            return wildcard
    return None


def check(doc: dict[str, Any], fields: dict[str, str], seen: set[str]) -> list[str]:
    """What in ``doc`` the documented ``fields`` do not allow; records what it used."""
    problems = []
    for path, value in _fields(doc):
        if path.endswith("[]") and isinstance(value, dict):
            continue  # an array of objects: its elements' fields are documented
        field = _documented(path, fields)
        if field is None:
            problems.append(f"{path} is not documented")
            continue
        seen.add(field)
        kinds = fields[field].split(" or ")
        if "any" in kinds:
            continue
        ok = any(
            isinstance(value, TYPES[k]) and not (k in ("integer", "number") and value is True)
            for k in kinds
        )
        if not ok or (isinstance(value, bool) and "boolean" not in kinds):
            problems.append(f"{path} = {value!r} is not {fields[field]}")
    return problems


def _run(args: list[str], capsys: Capsys) -> tuple[int, dict[str, Any]]:
    code = main([*args, "--json", "--quiet"])
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1, "one JSON document, on one line"
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return code, doc


def test_the_docs_define_both_formats() -> None:
    tables = schema()
    assert set(tables) == {RESULT_FORMAT, REPLAY_FORMAT}
    for fields in tables.values():
        for kinds in fields.values():
            assert set(kinds.split(" or ")) <= {*TYPES, "any"}, kinds


def test_every_document_matches_the_documented_schema_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capsys
) -> None:
    monkeypatch.chdir(tmp_path)  # where the default trace files go
    tables = schema()
    seen: dict[str, set[str]] = {RESULT_FORMAT: set(), REPLAY_FORMAT: set()}
    traces = []
    for index, (args, expected) in enumerate(RUNS):
        trace = tmp_path / f"t{index}.json"
        code, doc = _run([*args, "--trace-out", str(trace)], capsys)
        assert (doc["format"], doc["result"]) == (RESULT_FORMAT, expected), args
        assert code == doc["exit_code"] == EXIT_CODES[expected], args
        assert "complete" not in doc  # the word that once stood beside a violation
        assert check(doc, tables[RESULT_FORMAT], seen[RESULT_FORMAT]) == [], args
        if doc["violation"] is not None:
            assert doc["counterexample"] is not None and doc["trace"] == str(trace)
            traces.append(trace)
        else:
            assert doc["counterexample"] is None and doc["trace"] is None
    for trace in traces:
        code, doc = _run(["--replay", str(trace)], capsys)
        assert (doc["format"], doc["result"], code) == (REPLAY_FORMAT, "violated", 1)
        assert check(doc, tables[REPLAY_FORMAT], seen[REPLAY_FORMAT]) == []
    for name, fields in tables.items():
        never = sorted(set(fields) - seen[name])
        assert never == [], f"{name}: documented but printed by no run: {never}"


def test_the_counterexample_is_structured_moves_with_the_text_kept(
    tmp_path: Path, capsys: Capsys
) -> None:
    code, doc = _run([*CRASH, "--trace-out", str(tmp_path / "t.json")], capsys)
    assert code == 1 and doc["violation"]["name"] == "dead_member_unreported"
    moves = doc["counterexample"]["moves"]
    assert len(moves) == doc["violation"]["moves"] == 14
    first, second = moves[0], moves[1]
    assert (first["index"], first["kind"], first["process"], first["node"]) == (
        1,
        "start",
        0,
        "n_0_0",
    )
    assert first["rows"] == [
        {"node": "n_0_0", "table": "exit", "row": "exit.nothing_to_leave", "action": "finish"},
        {
            "node": "n_0_0",
            "table": "join",
            "row": "join.join_open_round",
            "action": "add_to_participants",
        },
    ]
    assert first["writes"] == [] and first["changes"][0]["after"] == "n_0_0 rdzv op=join/writing"
    assert second["writes"] == [
        {
            "key": "state",
            "op": "set",
            "value": "round=0 participants=[n_0_0:0] wait=[] redundant=[] heartbeats=[n_0_0@0]",
        }
    ]
    ticks = [m for m in moves if m["kind"] == "tick"]
    assert ticks and all(m["process"] is None and m["node"] is None for m in ticks)
    # The text form is kept, line for line as the text output prints it.
    assert main([*CRASH, "--quiet", "--trace-out", str(tmp_path / "u.json")]) == 1
    text = capsys.readouterr().out.splitlines()
    kept = doc["counterexample"]["text"]
    start = text.index("counterexample (14 moves):") + 1
    assert text[start : start + len(kept)] == kept
    assert kept[-1] == "final store: " + doc["counterexample"]["final_store"]
    notes = [note for m in moves for note in m["notes"]]
    assert notes and all(any(note in line for line in text) for note in notes)


def test_an_undecided_walk_is_not_a_pass(capsys: Capsys) -> None:
    assert main([*UNDECIDED, "--quiet"]) == 4
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].endswith(" result=undecided")
    assert "calls_end_as_specified: walk ends checked=0 undecided=1" in lines[-3]
    assert lines[-2].startswith("UNDECIDED: 1 of 1 walk ends did not settle within 2000 moves")


def test_random_mode_prints_progress_lines_unless_quiet(
    monkeypatch: pytest.MonkeyPatch, capsys: Capsys
) -> None:
    # A clock that advances a second at every reading: a progress line is due at every
    # check, during the walk and while its end is being judged (no real waiting).
    ticks = itertools.count()
    monkeypatch.setattr(time, "monotonic", lambda: float(next(ticks)))
    assert main(UNDECIDED) == 4
    err = capsys.readouterr().err.splitlines()
    walking = [line for line in err if line.startswith("progress walk=0 states=")]
    judging = [line for line in err if line.startswith("progress walk=0 continuation=")]
    assert walking and judging, err[:5]
    assert judging[-1].endswith(" continuation_bound=2000")
    assert main([*UNDECIDED, "--quiet"]) == 4
    assert capsys.readouterr().err == ""
