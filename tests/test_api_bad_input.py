"""Bad input to the public API gets a clear error naming the value and the fix, never a
raw exception from deep inside (``OverflowError`` from ``timedelta``, ``AttributeError``
on a string given as a backend) and never a silently ignored setting."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from rdzv import (
    DynamicRendezvousHandler,
    FakeClock,
    RendezvousParameters,
    RendezvousSettings,
    RendezvousTimeout,
    StoreRendezvousBackend,
    create_handler,
)
from rdzv.api import MAX_DURATION
from rdzv.handler import (
    HANDLER_CONFIG_KEYS,
    TORCHRUN_CONFIG_KEYS,
    _failure_error,
    new_node_id,
)
from rdzv.stores import MemoryStore, drop_memory_store
from rdzv.torch_plugin import CONFIG_KEYS, rdzv_parameters
from spec.machine import Fail
from spec.state import MAX_ADDR_LEN
from spec.variants import HARDENED
from spec.vocabulary import FailKind, Op

ROOT = Path(__file__).resolve().parent.parent

DURATION_KEYS = (
    "cache_duration",
    "close_timeout",
    "heartbeat_timeout",
    "join_timeout",
    "keep_alive_interval",
    "last_call_timeout",
    "timeout",
)
"""The config keys whose values are durations in seconds."""


def _params(**config: Any) -> RendezvousParameters:
    return RendezvousParameters("rdzv", "memory://bad-input", "job", 1, 2, **config)


def _plugin_params(**config: Any) -> RendezvousParameters:
    """Parameters the torchrun plug-in takes with a memory store: one agent only."""
    return RendezvousParameters("rdzv", "memory://bad-input", "job", 1, 1, **config)


def _handler(**config: Any) -> DynamicRendezvousHandler:
    """A handler over a private store (torch's three-argument form: no named store)."""
    store = MemoryStore()
    return create_handler(store, StoreRendezvousBackend(store, "job"), _params(**config))


@pytest.fixture(autouse=True)
def _no_named_store_left() -> Any:
    yield
    drop_memory_store("bad-input")


# -- 1. durations: an upper bound, and the 1 ms resolution -------------------------------------
@pytest.mark.parametrize("key", DURATION_KEYS)
@pytest.mark.parametrize("value", ["1e30", 1e20, 10**30], ids=["str", "float", "int"])
def test_a_huge_duration_in_the_config_is_a_clear_error(key: str, value: object) -> None:
    with pytest.raises(ValueError) as raised:
        create_handler(_params(**{key: value}))
    message = str(raised.value)
    assert f"config option {key!r} is {value!r}" in message
    assert "longer than 315360000 s (10 years)" in message


@pytest.mark.parametrize("key", DURATION_KEYS)
def test_an_int_beyond_floats_range_in_the_config_is_a_clear_error(key: str) -> None:
    with pytest.raises(ValueError, match=rf"config option '{key}' is 10000.* which is too large"):
        create_handler(_params(**{key: 10**400}))


@pytest.mark.parametrize("name", ["join", "last_call", "close", "heartbeat"])
@pytest.mark.parametrize(
    "value", [1e30, 10**400, MAX_DURATION + timedelta(microseconds=1)], ids=["float", "int", "td"]
)
def test_a_huge_timeout_is_a_clear_error(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"the {name} timeout is .* longer than 315360000 s"):
        RendezvousTimeout(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keep_alive_interval": 1e20}, r"keep_alive_interval is 1e\+20 s, which is longer"),
        ({"keep_alive_interval": timedelta.max}, r"keep_alive_interval is .* which is longer"),
        ({"cache_duration": 1e30}, r"cache_duration is 1e\+30 s, which is longer"),
        ({"keep_alive_interval": -1e30}, r"keep_alive_interval is -1e\+30 s, which is negative"),
    ],
)
def test_from_backend_bounds_its_durations(kwargs: dict[str, Any], message: str) -> None:
    store = MemoryStore()
    with pytest.raises(ValueError, match=message):
        DynamicRendezvousHandler.from_backend(
            "job", store, StoreRendezvousBackend(store, "job"), 1, 1, **kwargs
        )


def test_the_longest_duration_is_accepted_everywhere() -> None:
    longest = MAX_DURATION.total_seconds()
    handler = _handler(
        **{key: str(longest) for key in DURATION_KEYS if key != "timeout"},
    )
    assert handler.settings.timeout.join == MAX_DURATION
    assert handler.settings.keep_alive_interval == MAX_DURATION
    assert handler.driver.config.settings.cache_duration == int(longest) * 1000


@pytest.mark.parametrize("key", DURATION_KEYS)
@pytest.mark.parametrize("value", ["1e-9", "0.0004"])
def test_a_duration_below_1_ms_names_the_value_given(key: str, value: str) -> None:
    with pytest.raises(ValueError) as raised:
        create_handler(_params(**{key: value}))
    message = str(raised.value)
    assert f"config option {key!r} is {value!r}" in message
    assert "below the 1 ms resolution" in message and "pass at least 0.001 s" in message
    assert "0.0 s" not in message


def test_a_timeout_number_below_1_ms_names_the_value_given() -> None:
    with pytest.raises(ValueError) as raised:
        RendezvousTimeout(join=1e-9)
    assert "the join timeout is 1e-09 s, which is below the 1 ms resolution" in str(raised.value)


def test_one_millisecond_is_the_shortest_duration() -> None:
    handler = _handler(join_timeout="0.001", cache_duration="0")
    assert handler.driver.config.settings.join_timeout == 1
    assert handler.driver.config.settings.cache_duration == 0


# -- 2. config keys: one list for both entry points ---------------------------------------------
def test_a_misspelt_config_key_is_an_error_that_suggests_the_right_one() -> None:
    with pytest.raises(ValueError) as raised:
        create_handler(_params(jion_timeout="5"))
    message = str(raised.value)
    assert "['jion_timeout'] are not options of the rdzv handler" in message
    assert "did you mean 'join_timeout' for 'jion_timeout'?" in message
    for key in HANDLER_CONFIG_KEYS:
        assert repr(key) in message


def test_an_unknown_key_without_a_close_match_lists_the_valid_keys() -> None:
    with pytest.raises(ValueError) as raised:
        create_handler(_params(read_timeout="60", is_host="1"))
    message = str(raised.value)
    assert "['is_host', 'read_timeout'] are not options" in message
    assert "use one of ['cache_duration'," in message


def test_plugin_keys_given_to_the_handler_point_to_the_plugin() -> None:
    with pytest.raises(ValueError, match=r"'use_agent_store' only mean something under torch"):
        create_handler(_params(use_agent_store="false"))


def test_timeout_is_the_join_timeout_in_both_entry_points() -> None:
    assert _handler(timeout="5").settings.timeout.join == timedelta(seconds=5)
    ours, _ = rdzv_parameters(_plugin_params(timeout="5"))
    store = MemoryStore()
    handler = create_handler(store, StoreRendezvousBackend(store, "job"), ours)
    assert handler.settings.timeout.join == timedelta(seconds=5)


@pytest.mark.parametrize("both", [{"timeout": "5", "join_timeout": "7"}])
def test_join_timeout_wins_over_timeout_in_both_entry_points(both: dict[str, str]) -> None:
    # torch's launcher puts ``timeout`` into every config: a join_timeout must win.
    assert _handler(**both).settings.timeout.join == timedelta(seconds=7)
    ours, _ = rdzv_parameters(_plugin_params(**both))
    store = MemoryStore()
    handler = create_handler(store, StoreRendezvousBackend(store, "job"), ours)
    assert handler.settings.timeout.join == timedelta(seconds=7)


def test_a_bad_timeout_is_an_error_even_when_join_timeout_wins() -> None:
    with pytest.raises(ValueError, match=r"'timeout' is '0', which is not a positive number"):
        create_handler(_params(timeout="0", join_timeout="7"))


@pytest.mark.parametrize("key", HANDLER_CONFIG_KEYS)
def test_every_handler_key_is_read(key: str) -> None:
    value = {"protocol": "upstream", "keep_alive_max_attempt": "7"}.get(key, "2.5")
    handler = _handler(**{key: value})
    s = handler.settings
    read = {
        "cache_duration": handler.driver.config.settings.cache_duration == 2500,
        "close_timeout": s.timeout.close == timedelta(seconds=2.5),
        "heartbeat_timeout": s.timeout.heartbeat == timedelta(seconds=2.5),
        "join_timeout": s.timeout.join == timedelta(seconds=2.5),
        "keep_alive_interval": s.keep_alive_interval == timedelta(seconds=2.5),
        "keep_alive_max_attempt": s.keep_alive_max_attempt == 7,
        "last_call_timeout": s.timeout.last_call == timedelta(seconds=2.5),
        "protocol": handler.variant.name == "upstream",
        "timeout": s.timeout.join == timedelta(seconds=2.5),
    }
    assert set(read) == set(HANDLER_CONFIG_KEYS)
    assert read[key]


def test_the_plugin_accepts_exactly_the_handler_keys_and_its_own() -> None:
    assert set(CONFIG_KEYS) == set(HANDLER_CONFIG_KEYS) | set(TORCHRUN_CONFIG_KEYS)
    assert not set(HANDLER_CONFIG_KEYS) & set(TORCHRUN_CONFIG_KEYS)


@pytest.mark.parametrize("rdzv_timeout", [-1, 42])
def test_every_key_torchs_launcher_adds_is_accepted(rdzv_timeout: int) -> None:
    from torch.distributed.launcher.api import LaunchConfig

    # What torch's launcher passes as RendezvousParameters' config (torchrun and
    # elastic_launch), with torchrun's default and with the legacy rdzv_timeout.
    launched = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, rdzv_timeout=rdzv_timeout)
    assert launched.rdzv_configs  # torch always adds ``timeout``
    handler = _handler(**launched.rdzv_configs)
    expected = 900 if rdzv_timeout == -1 else rdzv_timeout
    assert handler.settings.timeout.join == timedelta(seconds=expected)


def test_the_docs_list_every_handler_key() -> None:
    handler_md = (ROOT / "docs" / "handler.md").read_text(encoding="utf-8")
    torchrun_md = (ROOT / "docs" / "torchrun.md").read_text(encoding="utf-8")
    for key in HANDLER_CONFIG_KEYS:
        assert f"| `{key}` |" in handler_md
    for key in CONFIG_KEYS:
        assert f"| `{key}` |" in torchrun_md


# -- 3. argument types --------------------------------------------------------------------------
def test_strings_for_store_and_backend_are_type_errors() -> None:
    with pytest.raises(TypeError, match=r"store must be a store .* got str 'notastore'"):
        create_handler("notastore", "notabackend", _params())
    store = MemoryStore()
    with pytest.raises(
        TypeError, match=r"backend must be an rdzv.RendezvousBackend, got str 'rdzv'; pass e.g."
    ):
        DynamicRendezvousHandler.from_backend("r", store, "rdzv", 1, 1)


def test_no_store_is_refused_before_any_round_is_joined() -> None:
    state_store = MemoryStore()
    backend = StoreRendezvousBackend(state_store, "r")
    with pytest.raises(TypeError, match=r"got None, which lacks multi_get, multi_set, wait"):
        DynamicRendezvousHandler.from_backend("r", None, backend, 1, 1)
    assert not state_store.check(["rdzv/r/state"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"clock": 5}, r"clock must be an rdzv.Clock .* got int 5; pass SystemClock"),
        ({"rng": "seed"}, r"rng must be a random.Random or None, got str 'seed'; pass e.g."),
        (
            {"protocol": 3},
            r"protocol must be a variant name, .* or None, got int 3",
        ),
        ({"local_addr": 3}, r"local_addr must be a string or None, got int 3"),
    ],
)
def test_from_backend_names_the_argument_of_the_wrong_type(
    kwargs: dict[str, Any], message: str
) -> None:
    store = MemoryStore()
    with pytest.raises(TypeError, match=message):
        DynamicRendezvousHandler.from_backend(
            "job", store, StoreRendezvousBackend(store, "job"), 1, 1, **kwargs
        )


@pytest.mark.parametrize(
    ("addr", "why"),
    [
        ("", "is empty"),
        (" ", "holds whitespace"),
        ("node 1", "holds whitespace"),
        ("node1\n", "holds whitespace"),
        ("h" * (MAX_ADDR_LEN + 1), f"is longer than {MAX_ADDR_LEN} characters"),
        ("\udc80", f"is longer than {MAX_ADDR_LEN} characters or not valid Unicode text"),
    ],
)
def test_a_local_addr_that_is_no_address_is_refused_alike_by_both_entries(
    addr: str, why: str
) -> None:
    # One check serves torchrun's parameters and from_backend: same words for both.
    says = rf"local_addr must be a host name, an IP address or None, got .*, which {why}"
    with pytest.raises(ValueError, match=says):
        RendezvousParameters("rdzv", "memory://x", "job", 1, 1, local_addr=addr)
    store = MemoryStore()
    with pytest.raises(ValueError, match=says):
        DynamicRendezvousHandler.from_backend(
            "job", store, StoreRendezvousBackend(store, "job"), 1, 1, local_addr=addr
        )
    assert not store.check(["rdzv/job/state"])


class _ExpiringBackend(StoreRendezvousBackend):
    """A backend whose state disappears ``expiry`` seconds after its last write."""

    def __init__(self, store: MemoryStore, expiry: float) -> None:
        super().__init__(store, "job")
        self._expiry = expiry

    @property
    def state_expiry(self) -> float | None:
        return self._expiry


@pytest.mark.parametrize(
    ("expiry", "config", "says"),
    [
        (3600.0, {"protocol": "scale"}, "writes the rendezvous state only when the membership"),
        (14.0, {}, r"keep_alive_interval x keep_alive_max_attempt = 15 s"),
        (5.0, {"keep_alive_interval": 2.0, "keep_alive_max_attempt": 3}, r"= 6 s"),
    ],
)
def test_a_state_that_could_expire_while_in_use_is_refused(
    expiry: float, config: dict[str, Any], says: str
) -> None:
    store = MemoryStore()
    with pytest.raises(ValueError, match=says):
        DynamicRendezvousHandler.from_backend(
            "job", store, _ExpiringBackend(store, expiry), 1, 1, **config
        )
    # At the bound, and under hardened, it is taken.
    handler = DynamicRendezvousHandler.from_backend(
        "job", store, _ExpiringBackend(store, 15.0), 1, 1
    )
    assert handler.shutdown() is True


class _Index:
    """An integer type of another library (numpy's int64 has ``__index__``)."""

    def __index__(self) -> int:
        return 12


@pytest.mark.parametrize(
    ("value", "parsed"), [("42", 42), (" 7 ", 7), (3, 3), (3.0, 3), ("-2", -2), (_Index(), 12)]
)
def test_get_as_int_takes_whole_numbers(value: object, parsed: int) -> None:
    assert RendezvousParameters("rdzv", "memory://x", "j", 1, 1, n=value).get_as_int("n") == parsed


@pytest.mark.parametrize(
    "value", [2.7, float("inf"), float("nan"), "2.7", "inf", "", "3 nodes", True, b"3", [3], None]
)
def test_get_as_int_refuses_what_is_not_a_whole_number(value: object) -> None:
    # Never truncated (2.7 is not 2) and never a raw OverflowError (inf).
    p = RendezvousParameters("rdzv", "memory://x", "j", 1, 1, n=value)
    if value is None:
        assert p.get_as_int("n") is None  # an option given as None is absent
        return
    with pytest.raises(ValueError, match=r"config option 'n' is .*which is not an integer"):
        p.get_as_int("n")


def test_the_constructor_checks_its_parts_too() -> None:
    store = MemoryStore()
    settings = RendezvousSettings("job", 1, 1, RendezvousTimeout(), timedelta(seconds=5), 3)
    with pytest.raises(TypeError, match=r"backend must be an rdzv.RendezvousBackend, got None"):
        DynamicRendezvousHandler(
            new_node_id(),
            settings,
            "rdzv",
            store,
            None,  # type: ignore[arg-type]
            variant=HARDENED,
            cache_duration=1.0,
            clock=FakeClock(),
            rng=random.Random(1),
        )


# -- 4. the join timeout's advice ---------------------------------------------------------------
def test_a_join_timeout_says_every_node_needs_the_same_settings() -> None:
    error = _failure_error(
        Fail(Op.JOIN, FailKind.TIMEOUT, "the join deadline passed"),
        None,
        new_node_id("h"),
        "job-42",
        "rdzv/job-42/state",
        lambda r: f"round {r}'s announcement set",
    )
    message = str(error)
    assert "start more nodes, lower min_nodes or raise join_timeout" in message
    assert "every node of run 'job-42' uses the same min_nodes, max_nodes and protocol" in message


def test_parameters_repr_masks_a_password_in_the_endpoint() -> None:
    params = RendezvousParameters(
        backend="rdzv",
        endpoint="redis://user:s3cret@127.0.0.1:6379/0",
        run_id="r",
        min_nodes=1,
        max_nodes=1,
    )
    shown = repr(params)
    assert "s3cret" not in shown
    assert "redis://user:***@127.0.0.1:6379/0" in shown
