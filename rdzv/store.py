"""The key-value store interface every backend implements, and :class:`PrefixStore`.

The interface is the part of ``torch.distributed.Store`` that the rendezvous and torch's
elastic agent use, plus :meth:`Store.wait_for_change`, which lets a waiting node sleep
until the state changes instead of polling on a fixed period.

Contract, for every backend (checked by :func:`rdzv.testing.check_store`):

- keys are ``str``; values are ``bytes`` (``str`` values are stored UTF-8 encoded);
- ``get`` of a missing key waits up to the store's timeout, then raises
  :class:`~rdzv.errors.StoreTimeoutError`;
- ``compare_set(key, expected, desired)`` is atomic: when the key holds ``expected``, or
  the key is absent and ``expected`` is empty, it stores ``desired``; it returns the value
  stored afterwards (``desired`` on success, the current value otherwise; for an absent
  key and a non-empty ``expected``, it returns ``expected`` and stores nothing, as torch
  does);
- ``add`` creates a missing key at 0 and returns the new value; it stores the number as
  its decimal ASCII digits;
- ``wait_for_change(key, current, timeout)`` returns True as soon as the key's value is
  not ``current`` (``None`` meaning absent), False once ``timeout`` passed without that;
  waking early with True is allowed only if the value really differs;
- an unreachable backend raises :class:`~rdzv.errors.RendezvousConnectionError` saying
  which endpoint (password redacted) and what to check.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol, runtime_checkable

DEFAULT_STORE_TIMEOUT = timedelta(seconds=300)


def as_bytes(value: bytes | str) -> bytes:
    """Store values are bytes; strings are stored UTF-8 encoded."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"store values must be bytes or str, got {type(value).__name__}")


@runtime_checkable
class Store(Protocol):
    """A key-value store shared by the nodes of a job."""

    @property
    def timeout(self) -> timedelta: ...

    def set_timeout(self, timeout: timedelta) -> None: ...

    def set(self, key: str, value: bytes | str) -> None: ...

    def get(self, key: str) -> bytes: ...

    def add(self, key: str, amount: int) -> int: ...

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes: ...

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None: ...

    def check(self, keys: Sequence[str]) -> bool: ...

    def multi_get(self, keys: Sequence[str]) -> list[bytes]: ...

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None: ...

    def delete_key(self, key: str) -> bool: ...

    def num_keys(self) -> int: ...

    def wait_for_change(self, key: str, current: bytes | None, timeout: timedelta) -> bool: ...


class PrefixStore:
    """A view of ``store`` in which every key is prefixed with ``prefix + "/"``.

    As in torch, ``num_keys`` reports the underlying store's count (a prefix store
    cannot count its own keys without a scan that not every backend supports).
    """

    def __init__(self, prefix: str, store: Store) -> None:
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"the prefix must be a non-empty string, got {prefix!r}")
        self.prefix = prefix
        self.underlying_store = store

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    @property
    def timeout(self) -> timedelta:
        return self.underlying_store.timeout

    def set_timeout(self, timeout: timedelta) -> None:
        self.underlying_store.set_timeout(timeout)

    def set(self, key: str, value: bytes | str) -> None:
        self.underlying_store.set(self._key(key), value)

    def get(self, key: str) -> bytes:
        return self.underlying_store.get(self._key(key))

    def add(self, key: str, amount: int) -> int:
        return self.underlying_store.add(self._key(key), amount)

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        return self.underlying_store.compare_set(self._key(key), expected, desired)

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        self.underlying_store.wait([self._key(k) for k in keys], timeout)

    def check(self, keys: Sequence[str]) -> bool:
        return self.underlying_store.check([self._key(k) for k in keys])

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        return self.underlying_store.multi_get([self._key(k) for k in keys])

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        self.underlying_store.multi_set([self._key(k) for k in keys], values)

    def delete_key(self, key: str) -> bool:
        return self.underlying_store.delete_key(self._key(key))

    def num_keys(self) -> int:
        return self.underlying_store.num_keys()

    def wait_for_change(self, key: str, current: bytes | None, timeout: timedelta) -> bool:
        return self.underlying_store.wait_for_change(self._key(key), current, timeout)
