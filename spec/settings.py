"""Rendezvous settings: node bounds, timeouts and keep-alive parameters.

All durations are integer milliseconds. Defaults are PyTorch's: join 600 s, last call
30 s, close 30 s, heartbeat 5 s, keep-alive every 5 s, a node expires after 3 missed
keep-alives. Construction validates every field and raises :class:`SettingsError`
(a ``ValueError``) whose message names the value and how to fix it.
"""

from __future__ import annotations

from dataclasses import dataclass

from spec.state import Millis

SECOND: Millis = 1000


class SettingsError(ValueError):
    """A setting has a value the protocol cannot run with."""


def seconds_to_millis(seconds: float, name: str = "a duration") -> Millis:
    """``seconds`` (an int or float) as integer milliseconds, rounded to nearest; a
    :class:`SettingsError` naming ``name`` if it is not a finite number. The one
    conversion both spec's settings and the handler's clocks use."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise SettingsError(f"{name} must be a number of seconds, got {seconds!r}; pass e.g. 30")
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise SettingsError(f"{name} ({seconds}) must be a finite number of seconds")
    return round(seconds * SECOND)


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(
            f"{name} must be an integer, got {value!r} ({type(value).__name__}); "
            f"pass a whole number"
        )
    return value


@dataclass(frozen=True)
class Settings:
    """Everything a node needs to know to run the protocol besides the shared state."""

    min_nodes: int = 1
    max_nodes: int = 1
    join_timeout: Millis = 600 * SECOND
    last_call_timeout: Millis = 30 * SECOND
    close_timeout: Millis = 30 * SECOND
    heartbeat_timeout: Millis = 5 * SECOND
    keep_alive_interval: Millis = 5 * SECOND
    keep_alive_max_attempt: int = 3
    cache_duration: Millis = 1 * SECOND
    """A node reuses its last read of the state for this long instead of reading again."""

    def __post_init__(self) -> None:
        min_nodes = _check_int("min_nodes", self.min_nodes)
        max_nodes = _check_int("max_nodes", self.max_nodes)
        if min_nodes < 1:
            raise SettingsError(
                f"min_nodes ({min_nodes}) must be >= 1; a rendezvous needs at least one node"
            )
        if max_nodes < min_nodes:
            raise SettingsError(
                f"max_nodes ({max_nodes}) must be >= min_nodes ({min_nodes}); "
                f"raise max_nodes or lower min_nodes"
            )
        for name in (
            "join_timeout",
            "last_call_timeout",
            "close_timeout",
            "heartbeat_timeout",
            "keep_alive_interval",
        ):
            value = _check_int(name, getattr(self, name))
            if value <= 0:
                raise SettingsError(
                    f"{name} ({value} ms) must be positive; use a duration above zero"
                )
        attempts = _check_int("keep_alive_max_attempt", self.keep_alive_max_attempt)
        if attempts < 1:
            raise SettingsError(
                f"keep_alive_max_attempt ({attempts}) must be >= 1; a node is declared "
                f"dead after this many missed keep-alives"
            )
        cache = _check_int("cache_duration", self.cache_duration)
        if cache < 0:
            raise SettingsError(
                f"cache_duration ({cache} ms) must be >= 0; use 0 to always read the store"
            )

    @property
    def heartbeat_expiry(self) -> Millis:
        """A node whose last heartbeat is older than this is pruned as dead."""
        return self.keep_alive_interval * self.keep_alive_max_attempt

    @classmethod
    def from_seconds(
        cls,
        min_nodes: int = 1,
        max_nodes: int = 1,
        *,
        join: float = 600.0,
        last_call: float = 30.0,
        close: float = 30.0,
        heartbeat: float = 5.0,
        keep_alive_interval: float = 5.0,
        keep_alive_max_attempt: int = 3,
        cache_duration: float = 1.0,
    ) -> Settings:
        """Build settings from durations in (possibly fractional) seconds."""

        def ms(name: str, seconds: float) -> Millis:
            millis = seconds_to_millis(seconds, name)
            if seconds > 0 and millis == 0:
                raise SettingsError(
                    f"{name} ({seconds} s) rounds to 0 ms, below the settings' 1 ms "
                    "resolution; use at least 0.001 s"
                )
            return millis

        return cls(
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            join_timeout=ms("join timeout", join),
            last_call_timeout=ms("last_call timeout", last_call),
            close_timeout=ms("close timeout", close),
            heartbeat_timeout=ms("heartbeat timeout", heartbeat),
            keep_alive_interval=ms("keep_alive_interval", keep_alive_interval),
            keep_alive_max_attempt=keep_alive_max_attempt,
            cache_duration=ms("cache_duration", cache_duration),
        )
