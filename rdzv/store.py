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

Member sets (:class:`SetStore`, an rdzv extension that torch's stores lack): every rdzv
backend also keeps named sets of byte strings, so that many nodes can announce
themselves without contending for one key:

- ``add_member(key, member)`` puts ``member`` into the set ``key`` (an absent set is an
  empty one) and returns how many members the set holds right after; it is one atomic
  step on the server, so concurrent callers never redo each other's work, and each of
  ``k`` concurrent callers adding distinct members to an empty set gets a different size
  in ``1..k``. Adding a member that is already there is a no-op that returns the current
  size. (A network store that retries after losing the reply returns the size at the
  retry, which may count members added in between.)
- ``remove_member(key, member)`` takes ``member`` out of the set ``key`` and returns how
  many members the set holds right after, in one atomic step on the server: each of
  ``k`` concurrent callers removing distinct members of a ``k``-member set gets a
  different size in ``0..k-1``. Removing a member that is not there, or from a set
  never added to, is a no-op that returns the current size (0 for an absent set), so
  the call is idempotent and a network store may send it again after losing the reply
  (the size is then the one at the retry, which may miss members removed, or count
  members added, in between). Removing the last member leaves an empty set:
  ``members`` returns ``[]`` and ``add_member`` starts it again at 1.
- ``members(key)`` lists the members in bytewise order, ``[]`` for a set never added to;
- ``try_get(key)`` returns a plain key's value, or ``None`` at once when it is absent
  (unlike ``get``, it never waits).

Sets are a namespace of their own: a set named ``k`` and a plain key ``k`` are unrelated,
``get``/``check``/``wait`` never see sets, and ``num_keys`` does not count them. A member
is 1 to :data:`MAX_MEMBER_BYTES` bytes (``str`` members are UTF-8 encoded) and a set holds
at most :data:`MAX_SET_MEMBERS` members; beyond either bound ``add_member`` raises
``ValueError``; ``remove_member`` rejects a member or set name exactly as ``add_member``
does (a member longer than the bound cannot be in a set, so it is an error, not a
no-op). :func:`require_set_store` turns a store without member sets into a clear
``TypeError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol, runtime_checkable

DEFAULT_STORE_TIMEOUT = timedelta(seconds=300)
MAX_MEMBER_BYTES = 1_024
"""Largest member of a member set, in bytes."""
MAX_SET_MEMBERS = 1_000_000
"""Most members one member set may hold."""


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


SET_STORE_METHODS = ("add_member", "remove_member", "members", "try_get")
"""The methods a :class:`SetStore` has beyond :class:`Store`."""


@runtime_checkable
class SetStore(Store, Protocol):
    """A :class:`Store` that also keeps member sets and answers ``try_get`` (see the
    module docstring for the contract)."""

    def add_member(self, key: str, member: bytes | str) -> int:
        """Put ``member`` into the set ``key`` in one atomic step; return the set's size
        right after (unchanged when ``member`` was already there)."""
        ...

    def remove_member(self, key: str, member: bytes | str) -> int:
        """Take ``member`` out of the set ``key`` in one atomic step; return the set's
        size right after (a member that is not there, or a set never added to, is a
        no-op that returns the current size, 0 for an absent set)."""
        ...

    def members(self, key: str) -> list[bytes]:
        """The members of the set ``key`` in bytewise order; ``[]`` when it has none."""
        ...

    def try_get(self, key: str) -> bytes | None:
        """The value of the plain key ``key``, or ``None`` without waiting when absent."""
        ...


def require_set_store(store: Store, why: str) -> SetStore:
    """Return ``store`` as a :class:`SetStore`, or raise a ``TypeError`` that names its
    type, what needs member sets (``why``) and which stores have them. A
    :class:`PrefixStore` passes when the store under it does."""
    if isinstance(store, PrefixStore):
        require_set_store(store.underlying_store, why)
        return store
    if isinstance(store, SetStore):
        return store
    lacking = [m for m in SET_STORE_METHODS if not hasattr(store, m)]
    raise TypeError(
        f"{why} needs a store with member sets ({', '.join(SET_STORE_METHODS)}), but "
        f"{type(store).__module__}.{type(store).__qualname__} lacks {', '.join(lacking)}; "
        "use an rdzv store (open_store with a memory://, sqlite://, redis:// or etcd:// "
        "URL), or add these methods to your store and check it with "
        "rdzv.testing.check_store"
    )


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
        _wait(self.underlying_store, [self._key(k) for k in keys], timeout)

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

    # Member sets and try_get: forwarded (prefixed) when the underlying store has them,
    # else the same TypeError as require_set_store.

    def _sets(self, what: str) -> SetStore:
        return require_set_store(self.underlying_store, f"PrefixStore.{what}")

    def add_member(self, key: str, member: bytes | str) -> int:
        return self._sets("add_member").add_member(self._key(key), member)

    def remove_member(self, key: str, member: bytes | str) -> int:
        return self._sets("remove_member").remove_member(self._key(key), member)

    def members(self, key: str) -> list[bytes]:
        return self._sets("members").members(self._key(key))

    def try_get(self, key: str) -> bytes | None:
        return self._sets("try_get").try_get(self._key(key))

    def wait_get(self, keys: Sequence[str], timeout: timedelta | None = None) -> list[bytes]:
        """``wait`` then ``multi_get``; in one step where the store under it has
        ``wait_get`` (the network stores: the wait's own read returns the values)."""
        prefixed = [self._key(k) for k in keys]
        wait_get = getattr(self.underlying_store, "wait_get", None)
        if callable(wait_get):
            return list(wait_get(prefixed, timeout))
        _wait(self.underlying_store, prefixed, timeout)
        return self.underlying_store.multi_get(prefixed)


def _wait(store: Store, keys: Sequence[str], timeout: timedelta | None) -> None:
    """``store.wait(keys, timeout)``, leaving out a None timeout (torch's stores take
    ``wait(keys)`` or ``wait(keys, timeout)``, never None)."""
    if timeout is None:
        store.wait(keys)
    else:
        store.wait(keys, timeout)
