"""The torch-compatible API surface, its parsing of config strings, and its messages."""

from __future__ import annotations

import inspect
import json
import logging
import random
import threading
import typing
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import rdzv
import spec
from rdzv import (
    DynamicRendezvousHandler,
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousSettings,
    RendezvousStateError,
    RendezvousStoreInfo,
    RendezvousTimeout,
    RendezvousTimeoutError,
    StoreRendezvousBackend,
    create_handler,
)
from rdzv import events as rdzv_events
from rdzv.api import DEFAULT_PROTOCOL, FALLBACK_PROTOCOL
from rdzv.backend import RendezvousBackend
from rdzv.clock import FakeClock, SteadyWallClock, SystemClock, now_of, to_millis, to_seconds
from rdzv.handler import NODE_NONCE_BITS, default_variant, new_node_id
from rdzv.stores import MemoryStore
from spec import wire
from spec.codec import encode
from spec.state import NodeId, RendezvousState
from spec.variants import TORCH_213


# -- names -------------------------------------------------------------------------------------
def test_public_names_match_torch() -> None:
    torch_names = {
        "DynamicRendezvousHandler",
        "RendezvousBackend",
        "RendezvousClosedError",
        "RendezvousConnectionError",
        "RendezvousError",
        "RendezvousGracefulExitError",
        "RendezvousHandler",
        "RendezvousInfo",
        "RendezvousParameters",
        "RendezvousSettings",
        "RendezvousStateError",
        "RendezvousStoreInfo",
        "RendezvousTimeout",
        "RendezvousTimeoutError",
        "create_handler",
    }
    assert torch_names <= set(rdzv.__all__)
    for name in rdzv.__all__:
        assert getattr(rdzv, name) is not None
    for error in (
        RendezvousClosedError,
        RendezvousTimeoutError,
        RendezvousConnectionError,
        RendezvousStateError,
        RendezvousGracefulExitError,
    ):
        assert issubclass(error, RendezvousError)
    assert issubclass(DynamicRendezvousHandler, RendezvousHandler)
    assert callable(rdzv.open_store)


def test_abstract_handler_methods_are_torch_s() -> None:
    abstract = set(RendezvousHandler.__abstractmethods__)
    assert abstract == {
        "get_backend",
        "next_rendezvous",
        "is_closed",
        "set_closed",
        "num_nodes_waiting",
        "get_run_id",
        "shutdown",
    }
    assert isinstance(RendezvousHandler.__dict__["use_agent_store"], property)


def test_from_backend_signature_is_torch_s() -> None:
    params = inspect.signature(DynamicRendezvousHandler.from_backend).parameters
    positional = [
        name for name, p in params.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    ]
    assert positional == [
        "run_id",
        "store",
        "backend",
        "min_nodes",
        "max_nodes",
        "local_addr",
        "timeout",
        "keep_alive_interval",
        "keep_alive_max_attempt",
    ]
    assert params["local_addr"].default is None
    assert params["timeout"].default is None
    assert params["keep_alive_interval"].default == 5
    assert params["keep_alive_max_attempt"].default == 3


# -- RendezvousParameters ----------------------------------------------------------------------
def params(**config: Any) -> RendezvousParameters:
    return RendezvousParameters("rdzv", "memory://api", "job", 1, 2, **config)


def test_parameters_keep_torch_s_fields() -> None:
    p = RendezvousParameters("rdzv", "memory://x", "run", 2, 4, local_addr="h1", foo="bar")
    assert (p.backend, p.endpoint, p.run_id, p.min_nodes, p.max_nodes) == (
        "rdzv",
        "memory://x",
        "run",
        2,
        4,
    )
    assert p.local_addr == "h1"
    assert p.config == {"foo": "bar"}
    assert p.get("foo") == "bar"
    assert p.get("missing", 7) == 7
    assert "foo" in repr(p)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", "memory://x", "r", 1, 1), r"backend must be a non-empty string, got ''"),
        (("rdzv", 5, "r", 1, 1), r"endpoint must be a string, got 5 \(int\)"),
        (("rdzv", "memory://x", None, 1, 1), r"run_id must be a string"),
        (("rdzv", "memory://x", "r", 0, 1), r"min_nodes \(0\) must be >= 1"),
        (("rdzv", "memory://x", "r", 3, 2), r"max_nodes \(2\) must be >= min_nodes \(3\)"),
        (("rdzv", "memory://x", "r", "2", 3), r"min_nodes must be an integer, got '2'"),
    ],
)
def test_parameters_validation_messages(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RendezvousParameters(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", True),
        ("true", True),
        ("T", True),
        ("yes", True),
        ("Y", True),
        ("0", False),
        ("False", False),
        ("f", False),
        ("no", False),
        ("n", False),
        (1, True),
        (0, False),
        (True, True),
        (None, None),
    ],
)
def test_get_as_bool(value: object, expected: bool | None) -> None:
    assert params(flag=value).get_as_bool("flag") is expected


def test_get_as_bool_default_and_error() -> None:
    assert params().get_as_bool("flag", True) is True
    with pytest.raises(ValueError, match=r"config option 'flag' is 'maybe' \(str\).*true/false"):
        params(flag="maybe").get_as_bool("flag")
    with pytest.raises(ValueError, match="not a boolean"):
        params(flag=2).get_as_bool("flag")


def test_get_as_int_and_float_parse_strings() -> None:
    p = params(a="42", b=" 7 ", c="0.25", d="30", e=3)
    assert p.get_as_int("a") == 42
    assert p.get_as_int("b") == 7
    assert p.get_as_int("e") == 3
    assert p.get_as_int("missing") is None
    assert p.get_as_int("missing", 5) == 5
    assert p.get_as_float("c") == 0.25
    assert p.get_as_float("d") == 30.0
    with pytest.raises(
        ValueError, match=r"config option 'c' is '0.25' \(str\), which is not an int"
    ):
        p.get_as_int("c")
    with pytest.raises(ValueError, match=r"config option 'x' is 'soon'.*number of seconds"):
        params(x="soon").get_as_float("x")
    with pytest.raises(ValueError, match="not a finite number"):
        params(x="inf").get_as_float("x")
    with pytest.raises(ValueError, match="not an integer"):
        params(x=True).get_as_int("x")


# -- timeouts, settings, info ------------------------------------------------------------------
def test_timeout_defaults_are_torch_s() -> None:
    t = RendezvousTimeout()
    assert (t.join, t.last_call, t.close, t.heartbeat) == (
        timedelta(seconds=600),
        timedelta(seconds=30),
        timedelta(seconds=30),
        timedelta(seconds=5),
    )
    custom = RendezvousTimeout(join=timedelta(seconds=5), heartbeat=0.5)
    assert custom.join == timedelta(seconds=5)
    assert custom.heartbeat == timedelta(seconds=0.5)
    assert custom.close == timedelta(seconds=30)


@pytest.mark.parametrize("name", ["join", "last_call", "close", "heartbeat"])
@pytest.mark.parametrize("value", [timedelta(0), timedelta(seconds=-1), 0, -2.5])
def test_non_positive_timeouts_are_rejected(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"the {name} timeout is .* s, which is not a positive"):
        RendezvousTimeout(**{name: value})  # type: ignore[arg-type]


def test_timeout_of_the_wrong_type_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"join timeout must be a number of seconds or a time"):
        RendezvousTimeout(join="600")  # type: ignore[arg-type]


def test_rendezvous_info_takes_torch_s_four_arguments() -> None:
    store = MemoryStore()
    boot = RendezvousStoreInfo("host", 29500)
    info = RendezvousInfo(store, 1, 4, boot)
    assert (info.store, info.rank, info.world_size, info.bootstrap_store_info) == (
        store,
        1,
        4,
        boot,
    )
    assert info.round is None
    assert RendezvousInfo(store, 0, 1, boot, round=3).round == 3


def test_store_info_is_published_by_rank_zero_and_read_by_others() -> None:
    store = MemoryStore()
    leader = RendezvousStoreInfo.build(0, store, "leader-host")
    follower = RendezvousStoreInfo.build(1, store, "other-host", timeout=timedelta(seconds=1))
    assert leader == follower
    assert leader.master_addr == "leader-host" and 0 < leader.master_port < 65536
    assert RendezvousStoreInfo.build(0, MemoryStore(), "h", server_port=1234).master_port == 1234


def test_store_info_waits_bounded_for_rank_zero() -> None:
    with pytest.raises(RendezvousTimeoutError):
        RendezvousStoreInfo.build(1, MemoryStore(), "h", timeout=timedelta(milliseconds=20))


def test_handler_settings_and_identity() -> None:
    store = MemoryStore()
    handler = DynamicRendezvousHandler.from_backend(
        "run-7", store, StoreRendezvousBackend(store, "run-7"), 2, 3, local_addr="node-a"
    )
    s = handler.settings
    assert isinstance(s, RendezvousSettings)
    assert (s.run_id, s.min_nodes, s.max_nodes) == ("run-7", 2, 3)
    assert s.keep_alive_interval == timedelta(seconds=5)
    assert s.keep_alive_max_attempt == 3
    assert s.timeout.join == timedelta(seconds=600)
    assert handler.get_run_id() == "run-7"
    assert handler.get_backend() == "rdzv"
    assert handler.use_agent_store is False
    assert handler.node.addr == "node-a"
    other = DynamicRendezvousHandler.from_backend(
        "run-7", store, StoreRendezvousBackend(store, "run-7"), 2, 3, local_addr="node-a"
    )
    # A per-process counter (high bits) tells two handlers of one process apart, as in
    # torch; random low bits tell apart processes that share an address and a pid.
    assert other.node.pid == handler.node.pid
    assert other.node.local_id >> NODE_NONCE_BITS == (handler.node.local_id >> NODE_NONCE_BITS) + 1
    nonces = {new_node_id("node-a").local_id % (1 << NODE_NONCE_BITS) for _ in range(50)}
    assert len(nonces) == 50


THREAD_JOIN_S = 60.0
"""Bound on waiting for one thread a test started."""


@contextmanager
def stopped(*handlers: DynamicRendezvousHandler) -> Iterator[list[threading.Thread]]:
    """Yield a list for the threads the block starts (add each before starting it). When
    the block ends, also by an exception, every thread is joined (each bounded by
    THREAD_JOIN_S) and then every handler is shut down, each even if another raised, so
    no keep-alive thread outlives the test. A handler the test shut down already is shut
    down again: closing a closed rendezvous changes nothing."""
    threads: list[threading.Thread] = []
    with ExitStack() as stack:
        for handler in handlers:
            stack.callback(handler.shutdown)
        stack.callback(_join_all, threads)  # first: a running operation holds the lock
        yield threads


def _join_all(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(THREAD_JOIN_S)


# -- create_handler ----------------------------------------------------------------------------
def test_create_handler_parses_config_strings() -> None:
    p = RendezvousParameters(
        "rdzv",
        "memory://create",
        "job",
        2,
        4,
        join_timeout="120",
        last_call_timeout="2.5",
        close_timeout="10",
        heartbeat_timeout="3",
        keep_alive_interval="0.5",
        keep_alive_max_attempt="4",
        protocol="torch-2.13",
    )
    handler = create_handler(p)
    s = handler.settings
    assert s.timeout.join == timedelta(seconds=120)
    assert s.timeout.last_call == timedelta(seconds=2.5)
    assert s.timeout.close == timedelta(seconds=10)
    assert s.timeout.heartbeat == timedelta(seconds=3)
    assert s.keep_alive_interval == timedelta(seconds=0.5)
    assert s.keep_alive_max_attempt == 4
    assert handler.variant is TORCH_213


@pytest.mark.parametrize("keywords", [False, True], ids=["positional", "keywords"])
def test_create_handler_with_store_and_backend(keywords: bool) -> None:
    store = MemoryStore()
    backend = StoreRendezvousBackend(store, "job")
    p = RendezvousParameters("rdzv", "", "job", 1, 1)
    if keywords:
        handler = create_handler(store=store, backend=backend, params=p)
    else:
        handler = create_handler(store, backend, p)
    with stopped(handler):
        info = handler.next_rendezvous()
        assert (info.rank, info.world_size, info.round) == (0, 1, 0)
        assert store.check(["rdzv/job/state"])
        assert handler.shutdown()


def test_create_handler_takes_params_as_a_keyword() -> None:
    handler = create_handler(params=RendezvousParameters("rdzv", "memory://kw", "job", 1, 1))
    with stopped(handler):
        assert handler.next_rendezvous().world_size == 1
        assert handler.shutdown()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"join_timeout": "-1"}, r"'join_timeout' is '-1', which is not a positive number"),
        ({"keep_alive_interval": "soon"}, r"'keep_alive_interval' is 'soon'"),
        ({"keep_alive_max_attempt": "2.5"}, r"'keep_alive_max_attempt' is '2.5'"),
        ({"protocol": "fastest"}, r"unknown protocol variant 'fastest'; choose one of: "),
        ({"cache_duration": "-1"}, r"'cache_duration' is '-1', which is negative; pass 0"),
    ],
)
def test_create_handler_rejects_bad_config(config: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create_handler(params(**config))


def test_create_handler_rejects_unknown_schemes_and_wrong_arity() -> None:
    bad = RendezvousParameters("rdzv", "carrier-pigeon://coop", "job", 1, 1)
    with pytest.raises(ValueError, match=r"unknown store scheme.*memory.*sqlite"):
        create_handler(bad)
    with pytest.raises(TypeError, match=r"\(params\) or \(store, backend, params\)"):
        create_handler(MemoryStore(), params())
    with pytest.raises(TypeError, match="got a store but no backend"):
        create_handler(store=MemoryStore(), params=params())
    with pytest.raises(TypeError, match="got a backend but no store"):
        create_handler(backend=StoreRendezvousBackend(MemoryStore(), "job"), params=params())
    with pytest.raises(TypeError, match="needs RendezvousParameters"):
        create_handler("memory://x")


# -- backend fencing tokens --------------------------------------------------------------------
def test_store_backend_fencing_contract() -> None:
    store = MemoryStore()
    backend = StoreRendezvousBackend(store, "job")
    assert backend.get_state() is None
    a, b, c = b"state-a", b"state-b", b"state-c"
    # None token: write only if no state exists.
    assert backend.set_state(a) == (a, a, True)
    assert backend.set_state(b) == (a, a, False)
    # Matching token: write.
    state, _, written = backend.set_state(b, a) or (b"", None, False)
    assert (state, written) == (b, True)
    # Stale token: no write, the current state is returned.
    assert backend.set_state(c, a) == (b, b, False)
    # A token this backend never hands out: no write.
    assert backend.set_state(c, 12345) == (b, b, False)
    assert backend.get_state() == (b, b)
    # Writing the bytes already stored succeeds only while they are current.
    assert backend.set_state(b, b) == (b, b, True)
    assert store.get("rdzv/job/state") == b


def test_store_backend_refuses_things_that_are_not_stores() -> None:
    with pytest.raises(TypeError, match=r"object is not a store: it lacks check, get, compare_set"):
        StoreRendezvousBackend(object(), "job")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="run_id must be a non-empty string"):
        StoreRendezvousBackend(MemoryStore(), "")


class _Wrapped:
    """A user's own store: forwards to a memory store (the backend is duck-typed)."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.calls = 0

    def __getattr__(self, name: str) -> object:
        self.calls += 1
        return getattr(self.inner, name)


def test_backend_works_on_any_duck_typed_store() -> None:
    store = _Wrapped()
    backend = StoreRendezvousBackend(store, "job")  # type: ignore[arg-type]
    handler = DynamicRendezvousHandler.from_backend("job", store, backend, 1, 1)
    with stopped(handler):
        assert handler.next_rendezvous().world_size == 1
        assert store.calls > 0
        assert handler.shutdown()


# -- clocks and units --------------------------------------------------------------------------
def test_unit_conversion() -> None:
    assert to_millis(1.5) == 1500
    assert to_millis(timedelta(seconds=2, milliseconds=1)) == 2001
    assert to_seconds(2500) == 2.5
    with pytest.raises(ValueError, match="finite number of seconds"):
        to_millis(float("nan"))


def test_fake_clock_moves_only_when_told() -> None:
    clock = FakeClock(mono_start=10.0, wall_start=100.0)
    assert now_of(clock).mono == 10_000 and now_of(clock).wall == 100_000
    clock.advance(1.25)
    assert (clock.monotonic(), clock.time()) == (11.25, 101.25)
    clock.skew_wall(-1.0)
    assert (clock.monotonic(), clock.time()) == (11.25, 100.25)
    with pytest.raises(ValueError, match="only moves forward"):
        clock.advance(-1)
    assert isinstance(SystemClock().monotonic(), float)


def test_a_steady_wall_clock_ignores_steps_of_the_wall_clock_it_reads() -> None:
    inner = FakeClock(mono_start=10.0, wall_start=100.0)
    inner.skew_wall(5.0)  # read once at the start: the offset is 105 - 10
    steady = SteadyWallClock(inner)
    assert steady.inner is inner and (steady.monotonic(), steady.time()) == (10.0, 105.0)
    inner.skew_wall(-3600.0)  # set back an hour afterwards: not seen
    inner.advance(2.5)  # time passing is seen, at the monotonic clock's rate
    assert (steady.monotonic(), steady.time()) == (12.5, 107.5)
    assert steady.max_real_wait(3.0) == inner.max_real_wait(3.0)
    assert steady.sleep(0.0) is False


# -- events ------------------------------------------------------------------------------------
def test_every_transition_is_logged_as_json(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    handler = DynamicRendezvousHandler.from_backend(
        "job", store, StoreRendezvousBackend(store, "job"), 1, 1, rng=random.Random(0)
    )
    with stopped(handler):
        with caplog.at_level(logging.DEBUG, logger="rdzv.events"):
            handler.next_rendezvous()
        lines = [r.getMessage() for r in caplog.records if r.name == "rdzv.events"]
        records = [rdzv_events.parse(line) for line in lines]
        assert records, "no transition events"
        assert {r["node"] for r in records} == {str(handler.node)}
        assert [r["op"] for r in records if r["input"] == "start_op"] == ["exit", "join"]
        actions = [r["action"] for r in records if r["action"]]
        # The default protocol (scale) joins through the announcement set and a fold.
        assert handler.variant.name == DEFAULT_PROTOCOL
        joined = "fold_announcements" if handler.variant.announces else "add_to_participants"
        assert joined in actions and actions[-1] == "finish"
        # Each decision names its table row by its stable name (schema 3).
        rows = [r["row"] for r in records if r["action"]]
        assert {r["schema"] for r in records} == {rdzv_events.SCHEMA} == {3}
        assert (
            f"join.{'fold_announcements' if handler.variant.announces else 'join_open_round'}"
            in rows
        )
        assert rows[-1] == "join.complete_with_us"
        last = records[-1]
        assert last["request"] == "done" and last["complete"] is True and last["round"] == 0
        assert last["version"] == rdzv_events.state_version(store.get("rdzv/job/state"))
        # Each line is plain JSON: a reader without rdzv gets what parse() returns.
        assert [json.loads(line) for line in lines] == records


def test_event_parse_rejects_foreign_lines() -> None:
    with pytest.raises(ValueError, match="not an rdzv transition event"):
        rdzv_events.parse('{"hello": 1}')
    assert rdzv_events.state_version(None) is None
    digest = rdzv_events.state_version(encode(RendezvousState.build(round=2), "hardened"))
    assert digest is not None and len(digest) == 12
    assert NodeId("h", 1, 2).__str__() == "h_1_2"


ANSWERS = {
    "read": "read_result",
    "compare_and_set": "cas_result",
    "wait": "woke_up",
    # The requests outside the state register (scale, the default protocol).
    "announce": "announced",
    "read_announced": "announced_members",
    "withdraw": "withdrawn",
    "beat": "beaten",
    "read_beats": "beat_values",
}


def test_event_traces_pair_every_request_with_its_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What a trace checker relies on: per node, each request is answered by the matching
    # input (or io_failed), and every operation starts with start_op and ends in done/fail.
    store = MemoryStore()
    # The join timeout bounds how long a shut-down at the end waits for a hung operation.
    timeout = RendezvousTimeout(join=timedelta(seconds=THREAD_JOIN_S))
    handlers = [
        DynamicRendezvousHandler.from_backend(
            "job",
            store,
            StoreRendezvousBackend(store, "job"),
            4,
            4,
            cache_duration=0,
            timeout=timeout,
        )
        for _ in range(4)
    ]
    with stopped(*handlers) as threads:
        with caplog.at_level(logging.DEBUG, logger="rdzv.events"):
            for h in handlers:
                threads.append(threading.Thread(target=h.next_rendezvous, daemon=True))
                threads[-1].start()
            for t in threads:
                t.join(THREAD_JOIN_S)
        assert not any(t.is_alive() for t in threads)
        lines = [r.getMessage() for r in caplog.records if r.name == "rdzv.events"]
        records = [rdzv_events.parse(line) for line in lines]
        for h in handlers:
            trace = [r for r in records if r["node"] == str(h.node)]
            ops = [r["op"] for r in trace if r["input"] == "start_op"]
            assert ops == ["exit", "join"]
            expected: str | None = None
            for r in trace:
                if expected is None:
                    assert r["input"] == "start_op", r
                else:
                    assert r["input"] in (expected, "io_failed"), r
                expected = ANSWERS.get(r["request"])
            assert expected is None and trace[-1]["request"] == "done"


def test_every_event_and_request_of_the_machine_has_a_name() -> None:
    assert set(wire.EVENT_TYPES) == set(typing.get_args(spec.Event))
    assert set(rdzv_events._REQUEST_NAMES) == set(typing.get_args(spec.Request))


def test_handler_docs_name_every_event_input_and_request() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "handler.md").read_text("utf-8")
    section = text[text.index("## Events") : text.index("## Performance")]
    names = [*wire.EVENT_TYPES.values(), *rdzv_events._REQUEST_NAMES.values()]
    missing = [name for name in names if f"`{name}`" not in section]
    assert not missing, f"docs/handler.md#events does not list {missing}"


def test_the_default_protocol_is_scale_where_the_backend_can_carry_it() -> None:
    # scale needs announcement sets and heartbeat keys and a state that never expires;
    # where one is missing, a handler given no protocol runs hardened (same guarantees).
    assert DEFAULT_PROTOCOL == "scale" and FALLBACK_PROTOCOL == "hardened"
    assert default_variant(StoreRendezvousBackend(MemoryStore(), "job")).name == "scale"

    class Expiring(MemoryStore):
        ttl = 3600  # as Redis's ?ttl=: the state would expire while a steady job runs

    expiring = StoreRendezvousBackend(Expiring(), "job")
    assert expiring.keeps_sets_and_beats and default_variant(expiring).name == "hardened"

    class OwnBackend(RendezvousBackend):  # a user's backend with only torch's two calls
        name = "own"

        def get_state(self) -> Any:
            return None

        def set_state(self, state: bytes, token: Any = None) -> Any:
            return None

    assert not OwnBackend().keeps_sets_and_beats
    assert default_variant(OwnBackend()).name == "hardened"
    store = MemoryStore()
    handler = DynamicRendezvousHandler.from_backend(
        "job", store, StoreRendezvousBackend(store, "job"), 1, 1
    )
    with stopped(handler):
        assert handler.variant.name == "scale"
        assert handler.next_rendezvous().world_size == 1  # N = 1 works under the default
    named = DynamicRendezvousHandler.from_backend(
        "job2", store, StoreRendezvousBackend(store, "job2"), 1, 1, protocol="hardened"
    )
    with stopped(named):
        assert named.variant.name == "hardened"  # hardened stays selectable
