"""An in-process store (``memory://name``) for threads of one process and for tests.

Theory of operation: one dict guarded by one :class:`threading.Condition`. Every write
notifies all waiters; every blocking call (``get``/``wait``/``multi_get`` of missing keys,
``wait_for_change``) is ``Condition.wait_for`` with the caller's deadline, so a waiter
wakes on the write it is waiting for and never polls.

Stores opened with the same name (``open_store("memory://job1")`` or
:meth:`MemoryStore.named`) in one process share their data through a process-wide
registry; :func:`drop_memory_store` forgets a name (handles already open keep the old
data). Member sets (:class:`~rdzv.store.SetStore`) are a second dict, of Python sets,
under the same lock; a set whose last member is removed is dropped from it. Different
processes never share a memory store: use ``sqlite://`` for that.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import timedelta

from rdzv.store import DEFAULT_STORE_TIMEOUT, MAX_SET_MEMBERS, as_bytes
from rdzv.stores.common import (
    BaseStore,
    cas_refusal,
    check_amount,
    check_key,
    check_keys,
    check_member,
    check_pairs,
    encode_counter,
    parse_counter,
    set_full_error,
    timeout_error,
    wait_seconds,
)

SCHEME = "memory"


class _Shared:
    """The data behind one or more :class:`MemoryStore` handles."""

    __slots__ = ("cond", "data", "sets")

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.sets: dict[str, set[bytes]] = {}
        self.cond = threading.Condition(threading.Lock())


_registry_lock = threading.Lock()
_registry: dict[str, _Shared] = {}


def drop_memory_store(name: str) -> bool:
    """Forget the named store; the next open of ``memory://name`` starts empty.

    Returns whether the name was known. Handles opened before keep working on the data
    they already share with each other.
    """
    with _registry_lock:
        return _registry.pop(name, None) is not None


def memory_store_names() -> list[str]:
    """The names currently in the process-wide registry, sorted."""
    with _registry_lock:
        return sorted(_registry)


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"a memory store needs a non-empty name, got {name!r}; use e.g. memory://job1"
        )
    if any(c in name for c in "?#") or any(c.isspace() for c in name):
        raise ValueError(
            f"memory store name {name!r} must not contain '?', '#' or whitespace; "
            "use e.g. memory://job1"
        )
    return name


class MemoryStore(BaseStore):
    """A thread-safe in-process store. ``MemoryStore()`` is private and starts empty."""

    def __init__(
        self,
        *,
        timeout: timedelta = DEFAULT_STORE_TIMEOUT,
        _shared: _Shared | None = None,
        _name: str | None = None,
    ) -> None:
        super().__init__(timeout)
        self._shared = _shared if _shared is not None else _Shared()
        self._name = _name

    @classmethod
    def named(cls, name: str, *, timeout: timedelta = DEFAULT_STORE_TIMEOUT) -> MemoryStore:
        """A handle on the process-wide store called ``name`` (created empty if new)."""
        name = _check_name(name)
        with _registry_lock:
            shared = _registry.setdefault(name, _Shared())
        return cls(timeout=timeout, _shared=shared, _name=name)

    @property
    def endpoint(self) -> str:
        """The URL naming this store (``memory://<private>`` for an unnamed one)."""
        return f"{SCHEME}://{self._name}" if self._name is not None else f"{SCHEME}://<private>"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.endpoint!r})"

    def close(self) -> None:
        """Nothing to release; present so every backend can be closed the same way."""

    # -- writes (each notifies every waiter) ----------------------------------------

    def set(self, key: str, value: bytes | str) -> None:
        key, data = check_key(key), as_bytes(value)
        with self._shared.cond:
            self._shared.data[key] = data
            self._shared.cond.notify_all()

    def add(self, key: str, amount: int) -> int:
        key, amount = check_key(key), check_amount(amount)
        with self._shared.cond:
            old = self._shared.data.get(key)
            new = (0 if old is None else parse_counter(key, old)) + amount
            self._shared.data[key] = encode_counter(new)
            self._shared.cond.notify_all()
            return new

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        key, want, new = check_key(key), as_bytes(expected), as_bytes(desired)
        with self._shared.cond:
            refused = cas_refusal(self._shared.data.get(key), want)
            if refused is not None:
                return refused
            self._shared.data[key] = new
            self._shared.cond.notify_all()
            return new

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        names = check_keys(keys)
        check_pairs(names, values)
        datas = [as_bytes(v) for v in values]
        with self._shared.cond:
            self._shared.data.update(zip(names, datas, strict=True))
            self._shared.cond.notify_all()

    def delete_key(self, key: str) -> bool:
        key = check_key(key)
        with self._shared.cond:
            found = self._shared.data.pop(key, None) is not None
            if found:
                self._shared.cond.notify_all()
            return found

    def add_member(self, key: str, member: bytes | str) -> int:
        key, data = check_key(key), check_member(member)
        with self._shared.cond:
            members = self._shared.sets.get(key)
            if members is None:
                members = self._shared.sets[key] = set()
            if data not in members:
                if len(members) >= MAX_SET_MEMBERS:
                    raise set_full_error(key, self.endpoint, MAX_SET_MEMBERS)
                members.add(data)
            return len(members)

    def remove_member(self, key: str, member: bytes | str) -> int:
        key, data = check_key(key), check_member(member)
        with self._shared.cond:
            members = self._shared.sets.get(key)
            if members is None:
                return 0
            members.discard(data)
            if not members:  # an empty set and an absent one are the same: keep no entry
                del self._shared.sets[key]
            return len(members)

    # -- reads ---------------------------------------------------------------------

    def members(self, key: str) -> list[bytes]:
        key = check_key(key)
        with self._shared.cond:
            return sorted(self._shared.sets.get(key, ()))

    def try_get(self, key: str) -> bytes | None:
        key = check_key(key)
        with self._shared.cond:
            return self._shared.data.get(key)

    def check(self, keys: Sequence[str]) -> bool:
        names = check_keys(keys)
        with self._shared.cond:
            return all(k in self._shared.data for k in names)

    def num_keys(self) -> int:
        with self._shared.cond:
            return len(self._shared.data)

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        names = check_keys(keys)
        with self._shared.cond:
            self._wait_locked(names, self._timeout)
            return [self._shared.data[k] for k in names]

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        names = check_keys(keys)
        with self._shared.cond:
            self._wait_locked(names, self._timeout if timeout is None else timeout)

    def _wait_locked(self, names: list[str], timeout: timedelta) -> None:
        data = self._shared.data
        seconds = wait_seconds(timeout)
        # Bounded by ``seconds``: wait_for re-checks after every notify and gives up at
        # its deadline.
        if not self._shared.cond.wait_for(lambda: all(k in data for k in names), seconds):
            raise timeout_error(self.endpoint, [k for k in names if k not in data], seconds)

    def wait_for_change(self, key: str, current: bytes | None, timeout: timedelta) -> bool:
        key = check_key(key)
        if current is not None:
            current = as_bytes(current)
        data = self._shared.data
        with self._shared.cond:
            return self._shared.cond.wait_for(
                lambda: data.get(key) != current, wait_seconds(timeout)
            )
