"""``python -m model_check validate LOG...``: check real handlers' event logs against the
spec.

A handler records every step of its machines on the ``rdzv.events`` logger (schema 3:
:mod:`rdzv.events`), with the input it fed in full and digests of the machine state
before and after and of the request issued. This module replays each machine state's
steps (one node's ``main`` or ``control`` machine state) through
:func:`spec.machine.step` from the node's initial state and requires, at every step:

- the state the input was fed to is the state the previous step left (the handler
  changes its machine state only by feeding it: nothing else edits it);
- the machine accepts the input in that state (the handler answered the request it was
  given, and only that);
- the spec's step decides the same table row and action, prunes the same nodes, issues
  the same request and reaches the same state as the recorded one;
- the store kept its word: a compare-and-set answered as applied returns the bytes it
  was asked to write.

With ``--complete`` (the logs hold every node that ever wrote the run's state, since it
was created), every state a node read must be bytes some logged compare-and-set wrote.

The first step that fails any of these is printed with its file and line, and the exit
status is 1; 0 when every step holds; 2 for a log that cannot be read (not schema 3,
malformed JSON, a config or an event that does not decode). Nothing here depends on
dict or set order: machine states are checked in sorted order of (run, node, machine),
and of their divergences the one earliest in the logs (file order as given, then line)
is reported.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spec import wire
from spec.machine import (
    CasResult,
    CompareAndSet,
    Config,
    InvalidTransition,
    Local,
    ReadResult,
    Request,
    adopt_job,
    step,
)

SCHEMA = wire.EVENT_SCHEMA
"""The event schema this validator reads (the handler records it: ``rdzv.events``)."""

MAX_SHOWN = 200
"""Characters of a recorded value shown in a report."""


class LogError(ValueError):
    """A log that cannot be validated (not an event log of schema 3, or malformed)."""


@dataclass(frozen=True)
class Where:
    """A recorded step: its file and line."""

    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class Stream:
    """The recorded steps of one machine state of one node, in log order."""

    run_id: str
    node: str
    machine: str
    steps: list[tuple[Where, dict[str, Any]]] = field(default_factory=list)


@dataclass(frozen=True)
class Divergence:
    """The first step of a machine state that the spec does not take as recorded."""

    where: Where
    stream: Stream
    index: int
    """0-based position of the step in its machine state's steps."""
    reason: str

    def report(self) -> str:
        s = self.stream
        return (
            f"divergence at {self.where}: run {s.run_id!r}, node {s.node} ({s.machine} "
            f"machine state), its step {self.index + 1} of {len(s.steps)}: {self.reason}"
        )


@dataclass(frozen=True)
class Summary:
    steps: int
    streams: int
    nodes: int
    runs: int
    files: int
    skipped_lines: int
    divergence: Divergence | None

    def report(self) -> str:
        if self.divergence is not None:
            return self.divergence.report()
        skipped = (
            f"; {self.skipped_lines} line(s) that are not events skipped"
            if self.skipped_lines
            else ""
        )
        return (
            f"validated {self.steps} step(s) of {self.streams} machine state(s) "
            f"({self.nodes} node(s), {self.runs} run(s)) in {self.files} file(s): every step "
            f"is the step spec.machine.step takes from its recorded input{skipped}"
        )


def log_files(paths: Iterable[str | Path]) -> list[Path]:
    """The files named, with a directory standing for its ``*.jsonl`` files (sorted)."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(path.glob("*.jsonl"))
            if not found:
                raise LogError(f"{path} holds no *.jsonl event log; pass the log files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise LogError(f"{path} does not exist; pass event log files or directories")
    return files


REQUIRED = ("run_id", "node", "node_id", "machine", "event", "config", "before", "after")


def read_streams(files: Sequence[Path]) -> tuple[dict[tuple[str, str, str], Stream], int]:
    """Every recorded step, grouped by machine state; and how many lines were not
    events (lines not starting with ``{``, e.g. other log output)."""
    streams: dict[tuple[str, str, str], Stream] = {}
    skipped = 0
    for path in files:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        for number, line in enumerate(lines, 1):  # bounded by the file
            text = line.strip()
            if not text.startswith("{"):
                skipped += 1
                continue
            where = Where(str(path), number)
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                if number == len(lines) and not line.endswith("\n"):
                    # The process was killed while writing its last line.
                    skipped += 1
                    continue
                raise LogError(f"{where}: not JSON ({exc}); pass logs of rdzv.events") from None
            if not isinstance(record, dict) or record.get("schema") != SCHEMA:
                found = record.get("schema") if isinstance(record, dict) else None
                raise LogError(
                    f"{where}: an event of schema {found!r}, not {SCHEMA}; record the "
                    f"log with this version of rdzv (schema {SCHEMA} carries the inputs "
                    f"a replay needs)"
                )
            missing = [name for name in REQUIRED if record.get(name) is None]
            if missing:
                raise LogError(f"{where}: the event has no {', '.join(missing)}")
            key = (str(record["run_id"]), str(record["node"]), str(record["machine"]))
            stream = streams.setdefault(key, Stream(*key))
            stream.steps.append((where, record))
    return streams, skipped


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "..."


def _check_stream(
    stream: Stream, written: set[bytes], reads: list[tuple[Where, int, bytes]]
) -> Divergence | None:
    first_where, first = stream.steps[0]
    try:
        config: Config = wire.config_from_json(first["config"])
        node = wire.node_from_json(first["node_id"])
    except wire.WireError as exc:
        raise LogError(f"{first_where}: {exc}") from None
    local = Local(node)
    pending: Request | None = None
    for index, (where, record) in enumerate(stream.steps):

        def diverged(reason: str, where: Where = where, index: int = index) -> Divergence:
            return Divergence(where, stream, index, reason)

        if record["config"] != first["config"]:
            return diverged(f"the node's configuration changed: {_shown(record['config'])}")
        job = record.get("job")
        before = adopt_job(local, job if isinstance(job, int) else None)
        if wire.digest(before) != record["before"]:
            if index == 0:
                return diverged(
                    "the machine state this step started from is not the node's initial "
                    "state: the log starts in the middle of this machine state's life "
                    "(record the events from before the handler is created)"
                )
            return diverged(
                "the machine state this step started from is not the one the previous step "
                "left: something other than the machine changed the node's state between "
                f"steps (the previous step left phase {local.phase.value}, op "
                f"{None if local.op is None else local.op.value})"
            )
        try:
            event = wire.event_from_json(record["event"], config.variant.name)
        except wire.WireError as exc:
            raise LogError(f"{where}: {exc}") from None
        if isinstance(pending, CompareAndSet) and isinstance(event, CasResult) and event.has_set:
            if event.data != pending.data:
                return diverged(
                    "the store answered a compare-and-set as applied with other bytes than "
                    f"it was asked to write: wrote {_shown(pending.data)}, answered "
                    f"{_shown(event.data)}"
                )
            written.add(pending.data)
        if isinstance(event, ReadResult | CasResult) and event.data is not None:
            reads.append((where, index, event.data))
        try:
            result = step(before, event, config)
        except InvalidTransition as exc:
            return diverged(f"the machine cannot take this input: {exc}")
        expected = {
            "row": result.row,
            "action": None if result.action is None else result.action.value,
            "pruned": [str(n) for n in result.pruned],
            "request_digest": wire.digest(result.request),
            "after": wire.digest(result.local),
        }
        for name, value in expected.items():
            if record.get(name) != value:
                return diverged(
                    f"recorded {name} {_shown(record.get(name))}, the spec's step gives "
                    f"{_shown(value)} (request {_shown(result.request)}; input "
                    f"{_shown(record.get('input'))})"
                )
        local = result.local
        pending = result.request
    return None


def _order(found: Divergence, files: Sequence[Path]) -> tuple[int, int]:
    """Where a divergence stands in the logs as given: the first one reported is the
    earliest in file order, whichever machine state it belongs to."""
    return (files.index(Path(found.where.path)), found.where.line)


def validate(paths: Iterable[str | Path], complete: bool = False) -> Summary:
    """Validate the event logs under ``paths`` (see the module docstring)."""
    files = log_files(paths)
    streams, skipped = read_streams(files)
    if not streams:
        raise LogError(
            "the logs hold no transition event; record them with RDZV_EVENTS_DIR=<dir> or "
            "the rdzv.events logger at DEBUG"
        )
    written: dict[str, set[bytes]] = {}
    first: Divergence | None = None
    steps = 0
    reads: dict[str, list[tuple[Where, Stream, int, bytes]]] = {}
    for key in sorted(streams):
        stream = streams[key]
        steps += len(stream.steps)
        seen: list[tuple[Where, int, bytes]] = []
        found = _check_stream(stream, written.setdefault(stream.run_id, set()), seen)
        reads.setdefault(stream.run_id, []).extend((w, stream, i, d) for w, i, d in seen)
        if found is not None and (first is None or _order(found, files) < _order(first, files)):
            first = found
    if first is None and complete:
        for run_id in sorted(reads):
            for where, stream, index, data in reads[run_id]:
                if data not in written[run_id]:
                    first = Divergence(
                        where,
                        stream,
                        index,
                        f"the node read a state no logged compare-and-set of run {run_id!r} "
                        f"wrote ({_shown(data)}); with --complete every writer must be logged",
                    )
                    break
            if first is not None:
                break
    return Summary(
        steps=steps,
        streams=len(streams),
        nodes=len({(k[0], k[1]) for k in streams}),
        runs=len({k[0] for k in streams}),
        files=len(files),
        skipped_lines=skipped,
        divergence=first,
    )


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m model_check validate",
        description="Replay real handlers' transition events (rdzv.events, schema 3) "
        "through the spec's machine; report the first step it would not take.",
    )
    parser.add_argument(
        "logs", nargs="+", help="event log files (JSON lines) or directories of *.jsonl files"
    )
    parser.add_argument(
        "--complete",
        action="store_true",
        help="the logs hold every writer of each run: every state read must be one a "
        "logged compare-and-set wrote",
    )
    args = parser.parse_args(list(argv))
    try:
        summary = validate(args.logs, complete=args.complete)
    except LogError as exc:
        print(f"model_check validate: error: {exc}", file=sys.stderr)
        return 2
    print(summary.report())
    return 0 if summary.divergence is None else 1
