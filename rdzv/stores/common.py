"""Helpers shared by the store backends (and useful to anyone writing one).

Every backend validates keys, encodes counters and reports timeouts the same way, so
the conformance kit (:mod:`rdzv.testing`) sees one behaviour and users see one set of
messages.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta

from rdzv.errors import StoreTimeoutError

# ``add`` stores its counter as optional minus sign + decimal ASCII digits, like torch.
# ``int()`` alone would also accept spaces, underscores and non-ASCII digits.
_COUNTER = re.compile(rb"-?[0-9]+")


def check_key(key: object) -> str:
    """Return ``key`` if it is a ``str``; raise a ``TypeError`` naming its type otherwise."""
    if not isinstance(key, str):
        raise TypeError(f"store keys must be str, got {type(key).__name__} ({key!r})")
    return key


def check_keys(keys: Sequence[str]) -> list[str]:
    """Validate a sequence of keys (a bare ``str`` is rejected: it is not a list of keys)."""
    if isinstance(keys, str | bytes):
        raise TypeError(f"expected a sequence of keys, got a single {type(keys).__name__} {keys!r}")
    return [check_key(k) for k in keys]


def check_timeout(timeout: object, what: str = "timeout") -> timedelta:
    """Return ``timeout`` if it is a non-negative ``timedelta``; raise otherwise."""
    if not isinstance(timeout, timedelta):
        raise TypeError(f"{what} must be a datetime.timedelta, got {type(timeout).__name__}")
    if timeout < timedelta(0):
        raise ValueError(f"{what} must be >= 0, got {timeout}; pass timedelta(0) to not wait")
    return timeout


def wait_seconds(timeout: timedelta) -> float:
    """Seconds to wait for ``timeout``; a negative timeout means "check once, do not wait"."""
    if not isinstance(timeout, timedelta):
        raise TypeError(f"timeout must be a datetime.timedelta, got {type(timeout).__name__}")
    return max(0.0, timeout.total_seconds())


def parse_counter(key: str, value: bytes) -> int:
    """Decode a counter written by ``add`` (decimal ASCII digits)."""
    if not _COUNTER.fullmatch(value):
        raise ValueError(
            f"key {key!r} holds {value[:40]!r}, which is not a decimal integer; add() only "
            "works on keys created by add() or set to ASCII digits such as b'42'"
        )
    return int(value)


def encode_counter(value: int) -> bytes:
    """Encode a counter as decimal ASCII digits, as torch's stores do."""
    return str(value).encode("ascii")


def check_pairs(keys: Sequence[str], values: Sequence[bytes | str]) -> None:
    """``multi_set`` needs one value per key."""
    if len(keys) != len(values):
        raise ValueError(
            f"multi_set got {len(keys)} keys but {len(values)} values; pass one value per key"
        )


def timeout_error(endpoint: str, keys: Sequence[str], waited: float) -> StoreTimeoutError:
    """The error raised when ``get``/``wait``/``multi_get`` ran out of time."""
    shown = ", ".join(repr(k) for k in keys[:5]) + (", ..." if len(keys) > 5 else "")
    return StoreTimeoutError(
        f"timed out after {waited:.3g} s waiting for key(s) [{shown}] in {endpoint}; the peer "
        "that writes them may be slow or gone: check it, or raise the store timeout "
        "(set_timeout, or the timeout argument of open_store)"
    )
