"""Helpers shared by the store backends (and useful to anyone writing one).

Every backend validates keys and amounts, encodes counters, applies torch's
``compare_set`` rule and reports timeouts the same way, so
the conformance kit (:mod:`rdzv.testing`) sees one behaviour and users see one set of
messages.
"""

from __future__ import annotations

import importlib
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import timedelta
from types import ModuleType

from rdzv.errors import StoreTimeoutError
from rdzv.store import MAX_MEMBER_BYTES, MAX_SET_MEMBERS, as_bytes

# ``add`` stores its counter as optional minus sign + decimal ASCII digits, like torch.
# ``int()`` alone would also accept spaces, underscores and non-ASCII digits.
_COUNTER = re.compile(rb"-?[0-9]+")


class MissingExtraError(ModuleNotFoundError):
    """A store's client library is not installed; the message names the extra to install.

    A ``ModuleNotFoundError`` (so ``except ImportError`` still catches it) whose message is
    one line with the fix, raised without the chained import error."""


def import_client(module: str, *, extra: str, scheme: str) -> ModuleType:
    """Import the optional client library ``module`` that the ``scheme``:// store needs.

    When ``module`` itself is missing, raises :class:`MissingExtraError` naming rdzv's
    extra that installs it (``pip install 'rdzv[<extra>]'``). Any other import failure
    (the library is there but broken, or one of its own dependencies is missing) is raised
    unchanged, since installing the extra would not fix it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module.partition(".")[0]:
            raise
        raise MissingExtraError(
            f"the {scheme}:// store needs the {exc.name!r} package, which is not installed; "
            f"install it with: pip install 'rdzv[{extra}]'",
            name=exc.name,
        ) from None


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


def check_amount(amount: object) -> int:
    """Return ``amount`` if it is an ``int`` (a ``bool`` is not); raise a ``TypeError``."""
    if not isinstance(amount, int) or isinstance(amount, bool):
        raise TypeError(f"add() needs an int amount, got {type(amount).__name__}")
    return amount


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


def cas_refusal(current: bytes | None, expected: bytes) -> bytes | None:
    """torch's ``compare_set`` rule, given the key's value (None when absent): None when
    ``desired`` is to be written (the key holds ``expected``, or is absent and
    ``expected`` is empty); otherwise the value to return without writing: the current
    value, or ``expected`` itself for an absent key and a non-empty ``expected``."""
    if current is None:
        return expected if expected else None
    return None if current == expected else current


def check_pairs(keys: Sequence[str], values: Sequence[bytes | str]) -> None:
    """``multi_set`` needs one value per key."""
    if len(keys) != len(values):
        raise ValueError(
            f"multi_set got {len(keys)} keys but {len(values)} values; pass one value per key"
        )


def check_member(member: object) -> bytes:
    """A member-set member as bytes (``str`` is UTF-8 encoded), 1 to ``MAX_MEMBER_BYTES``
    bytes long; raise ``TypeError``/``ValueError`` otherwise."""
    if not isinstance(member, bytes | str):
        raise TypeError(f"set members must be bytes or str, got {type(member).__name__}")
    data = as_bytes(member)
    if not data or len(data) > MAX_MEMBER_BYTES:
        raise ValueError(
            f"a set member must be 1 to {MAX_MEMBER_BYTES} bytes, got {len(data)} bytes "
            f"({data[:40]!r}{'...' if len(data) > 40 else ''}); announce a short id (e.g. "
            "the node id) and keep bulky data under a plain key"
        )
    return data


def set_full_error(key: str, endpoint: str, limit: int = MAX_SET_MEMBERS) -> ValueError:
    """The error of ``add_member`` when the set already holds ``limit`` members."""
    return ValueError(
        f"the member set {key!r} in {endpoint} already holds {limit} members, the "
        "most a set may hold; use a fresh set per round (e.g. a set name that "
        "includes the round number)"
    )


def timeout_error(endpoint: str, keys: Sequence[str], waited: float) -> StoreTimeoutError:
    """The error raised when ``get``/``wait``/``multi_get`` ran out of time."""
    shown = ", ".join(repr(k) for k in keys[:5]) + (", ..." if len(keys) > 5 else "")
    return StoreTimeoutError(
        f"timed out after {waited:.3g} s waiting for key(s) [{shown}] in {endpoint}; the peer "
        "that writes them may be slow or gone: check it, or raise the store timeout "
        "(set_timeout, or the timeout argument of open_store)"
    )


class BaseStore(ABC):
    """What every backend shares beyond the helpers above: the store-wide ``timeout``
    (checked by :func:`check_timeout`) and ``get`` as a one-key ``multi_get``."""

    def __init__(self, timeout: timedelta) -> None:
        self._timeout = check_timeout(timeout)

    @property
    def timeout(self) -> timedelta:
        return self._timeout

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = check_timeout(timeout)

    def get(self, key: str) -> bytes:
        return self.multi_get([key])[0]

    @abstractmethod
    def multi_get(self, keys: Sequence[str]) -> list[bytes]: ...
