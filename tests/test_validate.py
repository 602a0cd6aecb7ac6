"""``python -m model_check validate``: real handlers' event logs replayed through the spec.

Every input a handler feeds its machine is recorded in full (``rdzv.events``, schema 3)
and read back through :mod:`spec.wire`; the validator replays each machine state from the
node's initial state. These tests check the round trip of every input, the command's
exit statuses and messages, that each kind of handler bug is caught at the step where it
happens, and that real processes rendezvousing through SQLite validate, also with
``--complete``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_check import validate
from model_check.__main__ import main as model_check_main
from rdzv import DynamicRendezvousHandler, StoreRendezvousBackend
from rdzv import driver as rdzv_driver
from rdzv import events as rdzv_events
from rdzv import handler as rdzv_handler
from rdzv.api import DEFAULT_PROTOCOL
from rdzv.backend import RendezvousBackend
from rdzv.stores import MemoryStore
from spec import wire
from spec.codec import encode
from spec.machine import (
    Announced,
    AnnouncedMembers,
    Beaten,
    BeatValues,
    CasResult,
    Config,
    Event,
    IoFailed,
    Known,
    Now,
    ReadResult,
    StartOp,
    Token,
    Withdrawn,
    WokeUp,
    evolve,
)
from spec.settings import Settings
from spec.state import NodeId, RendezvousState
from spec.variants import VARIANTS, get_variant
from spec.vocabulary import Op

ROOT = Path(__file__).resolve().parents[1]
SUBPROCESS_TIMEOUT_S = 120.0

A = NodeId("a", 1, 7)
B = NodeId("b", 2, 9)
VIEW = RendezvousState.build(round=3, participants={A: 0}, wait_list=[B])


def every_event() -> list[Event]:
    now = Now(1_000, 1_700_000_000_000)
    return [
        StartOp(Op.JOIN, 5_000, now),
        StartOp(Op.EXIT, 9, now, ((A, 3, 900), (B, 0, 0)), Known(VIEW, 4, 800, job=2)),
        StartOp(Op.KEEP_ALIVE, 0, now, None, Known(VIEW, b"\x00tok", 10)),
        ReadResult(None, None, now),
        ReadResult(b'{"v":1}', "v7", now),
        CasResult(b"\xff\x00", 12, True, now),
        CasResult(None, None, False, now),
        WokeUp(now),
        IoFailed("connection refused", now),
        Announced(4, now),
        AnnouncedMembers((b"a", b"\x01b"), now),
        Withdrawn(now),
        Beaten(now),
        BeatValues((b"12", None), now),
    ]


@pytest.mark.parametrize("protocol", ["hardened", "scale", "upstream"])
def test_every_input_round_trips_through_json(protocol: str) -> None:
    events = every_event()
    kinds = {type(e) for e in events}
    assert len(kinds) == 10  # every input type of spec.machine
    for event in events:
        value = wire.event_to_json(event, protocol)
        text = json.dumps(value, sort_keys=True)
        assert wire.event_from_json(json.loads(text), protocol) == event


tokens: st.SearchStrategy[Token | None] = st.none() | st.integers() | st.text() | st.binary()


@given(
    data=st.none() | st.binary(max_size=64),
    token=tokens,
    has_set=st.booleans(),
    mono=st.integers(0, 2**62),
    wall=st.integers(-(2**40), 2**62),
)
def test_store_answers_round_trip_whatever_the_bytes(
    data: bytes | None, token: Token | None, has_set: bool, mono: int, wall: int
) -> None:
    for event in (
        ReadResult(data, token, Now(mono, wall)),
        CasResult(data, token, has_set, Now(mono, wall)),
    ):
        value = json.loads(json.dumps(wire.event_to_json(event, "hardened")))
        assert wire.event_from_json(value, "hardened") == event


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "an event must be an object"),
        ({"type": "teleported", "now": [0, 0]}, "unknown event type"),
        ({"type": "woke_up", "now": [0]}, "now must be"),
        ({"type": "woke_up", "now": [True, 0]}, "must be an integer"),
        ({"type": "cas_result", "now": [0, 0], "has_set": 1}, "has_set must be"),
        ({"type": "read_result", "now": [0, 0], "data": {"b64": "@@"}}, "base64"),
        ({"type": "read_result", "now": [0, 0], "token": {"float": 1.5}}, "a token must be"),
        ({"type": "start_op", "now": [0, 0], "op": "fly", "deadline": 0}, "unknown operation"),
        (
            {"type": "start_op", "now": [0, 0], "op": "join", "deadline": 0,
             "known": {"view": {"b64": "AAAA"}, "synced_at": 0}},
            "known's view does not decode",
        ),
    ],
)  # fmt: skip
def test_malformed_inputs_are_wire_errors(value: object, message: str) -> None:
    with pytest.raises(wire.WireError, match=message):
        wire.event_from_json(value, "hardened")


@pytest.mark.parametrize("protocol", sorted(VARIANTS))
def test_configs_and_nodes_round_trip(protocol: str) -> None:
    config = Config(
        Settings(min_nodes=2, max_nodes=5, last_call_timeout=700, keep_alive_interval=900),
        get_variant(protocol),
        key="rdzv/x/state",
        beat_modulus=1000,
    )
    back = wire.config_from_json(json.loads(json.dumps(wire.config_to_json(config))))
    assert (back.settings, back.variant, back.key, back.beat_modulus) == (
        config.settings,
        config.variant,
        config.key,
        config.beat_modulus,
    )
    assert wire.node_from_json(wire.node_to_json(A)) == A
    with pytest.raises(wire.WireError, match="protocol"):
        wire.config_from_json({**wire.config_to_json(config), "protocol": "no-such"})


# -- recording real handlers --------------------------------------------------------------------
@pytest.fixture
def events_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "events"
    folder.mkdir()
    monkeypatch.setenv(rdzv_events.EVENTS_DIR_ENV, str(folder))
    yield folder
    monkeypatch.delenv(rdzv_events.EVENTS_DIR_ENV)
    rdzv_events.record_from_env()  # stop recording for the tests that follow


def rendezvous_once(backend: Callable[[MemoryStore], RendezvousBackend] | None = None) -> None:
    """One node of a run of one: join, then leave."""
    store = MemoryStore()
    made = StoreRendezvousBackend(store, "job") if backend is None else backend(store)
    handler = DynamicRendezvousHandler.from_backend("job", store, made, 1, 1, rng=random.Random(0))
    try:
        info = handler.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
    finally:
        handler.shutdown()


def records(folder: Path) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.jsonl")):
        found.extend(json.loads(line) for line in path.read_text().splitlines())
    return found


def test_a_handler_s_log_validates_and_the_command_says_so(
    events_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rendezvous_once()
    logged = records(events_dir)
    assert {r["schema"] for r in logged} == {3}
    assert {r["machine"] for r in logged} <= {"main", "control"}
    main_steps = [r for r in logged if r["machine"] == "main"]
    assert main_steps and main_steps[0]["event"]["type"] == "start_op"
    summary = validate.validate([events_dir])
    assert summary.divergence is None, summary.report()
    assert summary.steps == len(logged) and summary.nodes == 1 and summary.runs == 1
    assert model_check_main(["validate", str(events_dir), "--complete"]) == 0
    out = capsys.readouterr().out
    assert f"validated {len(logged)} step(s)" in out


def _main_steps(folder: Path) -> list[dict[str, Any]]:
    return [r for r in records(folder) if r["machine"] == "main"]


def test_a_handler_that_edits_its_machine_state_is_caught_at_that_step(
    events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fed = rdzv_handler.NodeDriver._feed
    calls = {"main": 0}

    def meddling(self: rdzv_handler.NodeDriver, event: Event) -> None:
        if self.machine == "main":
            calls["main"] += 1
            if calls["main"] == 3:  # a bug: the handler forgets when it last synced
                self.local = evolve(self.local, synced_at=None, deadline=self.local.deadline + 1)
        fed(self, event)

    monkeypatch.setattr(rdzv_handler.NodeDriver, "_feed", meddling)
    rendezvous_once()
    summary = validate.validate([events_dir])
    found = summary.divergence
    assert found is not None and found.stream.machine == "main"
    assert found.index == 2  # the third step, the first fed the edited state
    assert "something other than the machine changed the node's state" in found.reason
    steps = _main_steps(events_dir)
    assert found.where.line == 1 + records(events_dir).index(steps[2])


class RewritingBackend(StoreRendezvousBackend):
    """A store bug: an applied compare-and-set is answered with the bytes re-spaced (the
    same state, other bytes), and the store keeps those."""

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        respaced = json.dumps(json.loads(state), sort_keys=True).encode("ascii")
        return super().set_state(respaced, token)


def test_a_store_that_answers_a_write_with_other_bytes_is_caught(events_dir: Path) -> None:
    rendezvous_once(lambda store: RewritingBackend(store, "job"))
    summary = validate.validate([events_dir])
    found = summary.divergence
    assert found is not None, summary.report()
    first_cas = next(
        i for i, r in enumerate(_main_steps(events_dir)) if r["event"]["type"] == "cas_result"
    )
    assert (found.stream.machine, found.index) == ("main", first_cas)
    assert "answered a compare-and-set as applied with other bytes" in found.reason


def test_a_handler_whose_machine_is_not_the_spec_s_is_caught(
    events_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_step = getattr(rdzv_driver, "step")  # noqa: B009  (not re-exported)
    calls = [0]

    def other_step(local: Any, event: Event, config: Config) -> Any:
        result = real_step(local, event, config)
        calls[0] += 1
        if result.row is not None and calls[0] > 1:  # a bug: the decision is misnamed
            calls[0] = -(10**9)
            return dataclasses.replace(result, row="join.a_row_the_spec_does_not_have")
        return result

    monkeypatch.setattr(rdzv_driver, "step", other_step)  # the drivers step through it
    rendezvous_once()
    summary = validate.validate([events_dir])
    found = summary.divergence
    assert found is not None, summary.report()
    decided = [i for i, r in enumerate(_main_steps(events_dir)) if r["row"] is not None]
    wrong = [
        i
        for i, r in enumerate(_main_steps(events_dir))
        if r["row"] == "join.a_row_the_spec_does_not_have"
    ]
    assert found.stream.machine == "main" and [found.index] == wrong and wrong[0] in decided
    assert "recorded row 'join.a_row_the_spec_does_not_have'" in found.reason


def test_complete_requires_every_state_read_to_be_a_logged_write(events_dir: Path) -> None:
    store = MemoryStore()
    # A writer that logs nothing: the state exists before the handler comes.
    foreign = StoreRendezvousBackend(store, "job")
    assert foreign.set_state(encode(RendezvousState.build(), DEFAULT_PROTOCOL)) is not None
    handler = DynamicRendezvousHandler.from_backend(
        "job", store, StoreRendezvousBackend(store, "job"), 1, 1, rng=random.Random(0)
    )
    try:
        handler.next_rendezvous()
    finally:
        handler.shutdown()
    assert validate.validate([events_dir]).divergence is None
    found = validate.validate([events_dir], complete=True).divergence
    assert found is not None
    assert "no logged compare-and-set of run 'job' wrote" in found.reason
    assert found.index == next(
        i for i, r in enumerate(_main_steps(events_dir)) if r["event"].get("data") is not None
    )


def test_a_log_that_starts_in_the_middle_is_a_divergence(events_dir: Path) -> None:
    rendezvous_once()
    (path,) = sorted(events_dir.glob("*.jsonl"))
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[2:]))
    found = validate.validate([events_dir]).divergence
    assert found is not None and found.index == 0
    assert "the log starts in the middle" in found.reason


def test_a_step_missing_from_the_log_is_caught_at_the_step_after_it(events_dir: Path) -> None:
    rendezvous_once()
    (path,) = sorted(events_dir.glob("*.jsonl"))
    lines = path.read_text().splitlines(keepends=True)
    main_lines = [i for i, line in enumerate(lines) if '"machine":"main"' in line]
    dropped = main_lines[2]
    path.write_text("".join(lines[:dropped] + lines[dropped + 1 :]))
    found = validate.validate([events_dir]).divergence
    assert found is not None and found.stream.machine == "main" and found.index == 2
    assert "not the one the previous step left" in found.reason


def test_an_answer_to_a_request_the_node_did_not_make_is_caught(events_dir: Path) -> None:
    rendezvous_once()
    (path,) = sorted(events_dir.glob("*.jsonl"))
    lines = path.read_text().splitlines(keepends=True)
    records_ = [json.loads(line) for line in lines]
    # The step after the first compare-and-set was requested: answer it with a wake-up.
    at = next(
        i
        for i, r in enumerate(records_)
        if r["machine"] == "main" and r["event"]["type"] == "cas_result"
    )
    records_[at]["event"] = {"type": "woke_up", "now": records_[at]["event"]["now"]}
    lines[at] = json.dumps(records_[at], sort_keys=True) + "\n"
    path.write_text("".join(lines))
    found = validate.validate([events_dir]).divergence
    assert found is not None and found.where.line == at + 1
    assert "the machine cannot take this input" in found.reason


def test_lines_that_are_not_events_and_a_torn_last_line_are_skipped(events_dir: Path) -> None:
    rendezvous_once()
    (path,) = sorted(events_dir.glob("*.jsonl"))
    text = path.read_text()
    path.write_text("INFO some other output\n" + text + '{"schema":3,"run_id":"jo')
    summary = validate.validate([events_dir])
    assert summary.divergence is None and summary.skipped_lines == 2
    assert "2 line(s) that are not events skipped" in summary.report()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"schema":2,"run_id":"job"}\n', "an event of schema 2, not 3"),
        ('{"schema":3,"run_id":"job"}\n', "the event has no node"),
        ("{not json\n{}\n", "not JSON"),
    ],
)
def test_bad_logs_exit_2_with_what_is_wrong(
    tmp_path: Path, content: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "events.jsonl"
    log.write_text(content)
    assert model_check_main(["validate", str(log)]) == 2
    err = capsys.readouterr().err
    assert message in err and f"{log}:1" in err


def test_missing_or_empty_places_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert model_check_main(["validate", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert model_check_main(["validate", str(tmp_path)]) == 2
    assert "holds no *.jsonl event log" in capsys.readouterr().err
    (tmp_path / "other.jsonl").write_text("plain text\n")
    assert model_check_main(["validate", str(tmp_path)]) == 2
    assert "hold no transition event" in capsys.readouterr().err


def test_a_divergence_exits_1_naming_file_line_and_reason(
    events_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rendezvous_once()
    (path,) = sorted(events_dir.glob("*.jsonl"))
    lines = path.read_text().splitlines(keepends=True)
    record = json.loads(lines[1])
    record["after"] = "0" * 16
    lines[1] = json.dumps(record) + "\n"
    path.write_text("".join(lines))
    assert model_check_main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"divergence at {path}:2" in out and "recorded after" in out


def test_an_unwritable_events_dir_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(rdzv_events.EVENTS_DIR_ENV, str(tmp_path / "missing"))
    try:
        with pytest.raises(ValueError, match="is not a writable directory"):
            rdzv_events.record_from_env()
    finally:
        monkeypatch.delenv(rdzv_events.EVENTS_DIR_ENV)
        rdzv_events.record_from_env()


# -- real processes -----------------------------------------------------------------------------
NODE_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from rdzv import RendezvousParameters, create_handler

    params = RendezvousParameters("rdzv", sys.argv[1], "job", 3, 3, join_timeout=60)
    handler = create_handler(params)
    try:
        info = handler.next_rendezvous()
        print(info.rank, info.world_size, flush=True)
        # shutdown() closes the rendezvous: wait (bounded) until every node has returned,
        # or a slow one would find its round closed before it returned.
        returned = Path(sys.argv[2])
        (returned / str(os.getpid())).touch()
        for _ in range(600):
            if len(list(returned.iterdir())) >= 3:
                break
            time.sleep(0.1)
    finally:
        handler.shutdown()
    """
)


def test_processes_rendezvousing_through_sqlite_validate_completely(tmp_path: Path) -> None:
    folder = tmp_path / "events"
    folder.mkdir()
    env = {**os.environ, rdzv_events.EVENTS_DIR_ENV: str(folder), "PYTHONPATH": str(ROOT)}
    url = f"sqlite://{tmp_path / 'rdzv.db'}"
    returned = tmp_path / "returned"
    returned.mkdir()
    nodes = [
        subprocess.Popen(
            [sys.executable, "-c", NODE_SCRIPT, url, str(returned)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = []
    try:
        for node in nodes:
            out, err = node.communicate(timeout=SUBPROCESS_TIMEOUT_S)
            assert node.returncode == 0, err
            outputs.append(out.split())
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait(timeout=SUBPROCESS_TIMEOUT_S)
    assert sorted(outputs) == [["0", "3"], ["1", "3"], ["2", "3"]]
    assert len(list(folder.glob("events-*.jsonl"))) == 3
    checked = subprocess.run(
        [sys.executable, "-m", "model_check", "validate", str(folder), "--complete"],
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "(3 node(s), 1 run(s)) in 3 file(s)" in checked.stdout
