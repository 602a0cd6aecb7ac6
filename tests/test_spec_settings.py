"""Settings: PyTorch's defaults, validation messages that name the value and the fix."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from spec.settings import SECOND, Settings, SettingsError


def test_defaults_are_pytorchs() -> None:
    s = Settings()
    assert s.join_timeout == 600 * SECOND
    assert s.last_call_timeout == 30 * SECOND
    assert s.close_timeout == 30 * SECOND
    assert s.heartbeat_timeout == 5 * SECOND
    assert s.keep_alive_interval == 5 * SECOND
    assert s.keep_alive_max_attempt == 3
    assert s.heartbeat_expiry == 15 * SECOND


def test_settings_are_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().min_nodes = 3  # type: ignore[misc]


def test_settings_error_is_a_value_error() -> None:
    assert issubclass(SettingsError, ValueError)


# fmt: off
# (kwargs, fragments the message must contain: the value and the fix)
REJECTIONS: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("min-zero", {"min_nodes": 0}, ("min_nodes (0)", ">= 1")),
    ("min-negative", {"min_nodes": -2, "max_nodes": 1}, ("min_nodes (-2)", ">= 1")),
    ("max-below-min", {"min_nodes": 3, "max_nodes": 2},
     ("max_nodes (2)", "min_nodes (3)", "raise max_nodes or lower min_nodes")),
    ("join-zero", {"join_timeout": 0}, ("join_timeout (0 ms)", "positive")),
    ("last-call-negative", {"last_call_timeout": -1}, ("last_call_timeout (-1 ms)", "above zero")),
    ("close-zero", {"close_timeout": 0}, ("close_timeout (0 ms)", "above zero")),
    ("heartbeat-zero", {"heartbeat_timeout": 0}, ("heartbeat_timeout (0 ms)", "above zero")),
    ("interval-zero", {"keep_alive_interval": 0}, ("keep_alive_interval (0 ms)", "above zero")),
    ("attempt-zero", {"keep_alive_max_attempt": 0}, ("keep_alive_max_attempt (0)", ">= 1")),
    ("cache-negative", {"cache_duration": -1}, ("cache_duration (-1 ms)", "use 0")),
    ("bool-min", {"min_nodes": True}, ("min_nodes", "True", "bool", "whole number")),
    ("bool-max", {"max_nodes": False}, ("max_nodes", "False", "bool", "whole number")),
    ("float-join", {"join_timeout": 1.5}, ("join_timeout", "1.5", "float", "whole number")),
    ("float-min", {"min_nodes": 2.0}, ("min_nodes", "2.0", "float", "whole number")),
    ("str-interval", {"keep_alive_interval": "5"}, ("keep_alive_interval", "'5'", "str")),
    ("bool-attempt", {"keep_alive_max_attempt": True}, ("keep_alive_max_attempt", "True")),
    ("float-cache", {"cache_duration": 0.5}, ("cache_duration", "0.5", "float")),
    ("none-close", {"close_timeout": None}, ("close_timeout", "None")),
]
# fmt: on


@pytest.mark.parametrize(
    ("kwargs", "fragments"), [(k, f) for _, k, f in REJECTIONS], ids=[n for n, _, _ in REJECTIONS]
)
def test_rejections_name_the_value_and_the_fix(
    kwargs: dict[str, Any], fragments: tuple[str, ...]
) -> None:
    with pytest.raises(SettingsError) as info:
        Settings(**kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_boundaries_that_are_accepted() -> None:
    s = Settings(
        min_nodes=1,
        max_nodes=1,
        join_timeout=1,
        last_call_timeout=1,
        close_timeout=1,
        heartbeat_timeout=1,
        keep_alive_interval=1,
        keep_alive_max_attempt=1,
        cache_duration=0,
    )
    assert s.heartbeat_expiry == 1
    assert Settings(min_nodes=4, max_nodes=4).max_nodes == 4


def test_from_seconds() -> None:
    s = Settings.from_seconds(
        2,
        8,
        join=1.5,
        last_call=0.25,
        close=3,
        heartbeat=7,
        keep_alive_interval=2,
        keep_alive_max_attempt=4,
        cache_duration=0,
    )
    assert s == Settings(
        min_nodes=2,
        max_nodes=8,
        join_timeout=1500,
        last_call_timeout=250,
        close_timeout=3000,
        heartbeat_timeout=7000,
        keep_alive_interval=2000,
        keep_alive_max_attempt=4,
        cache_duration=0,
    )
    assert s.heartbeat_expiry == 8000


def test_from_seconds_defaults_equal_the_millisecond_defaults() -> None:
    assert Settings.from_seconds() == Settings()


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        pytest.param({"join": float("nan")}, ("join timeout", "finite"), id="nan"),
        pytest.param({"close": float("inf")}, ("close timeout", "finite"), id="inf"),
        pytest.param({"last_call": True}, ("last_call timeout", "True", "e.g. 30"), id="bool"),
        pytest.param({"heartbeat": "5"}, ("heartbeat timeout", "'5'"), id="str"),
        pytest.param(
            {"join": 0.0004}, ("join timeout (0.0004 s)", "at least 0.001 s"), id="rounds-to-zero"
        ),
        pytest.param({"join": 0.0}, ("join_timeout (0 ms)", "positive"), id="zero"),
        pytest.param({"cache_duration": -1.0}, ("cache_duration (-1000 ms)",), id="neg-cache"),
    ],
)
def test_from_seconds_rejections(kwargs: dict[str, Any], fragments: tuple[str, ...]) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_seconds(**kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_from_seconds_validates_node_bounds() -> None:
    with pytest.raises(SettingsError, match="max_nodes"):
        Settings.from_seconds(3, 2)
