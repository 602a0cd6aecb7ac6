"""Working with PyTorch: torch's stores and backends under rdzv, rdzv's stores under torch.

Whether rdzv works with torch is decided once, when rdzv is imported (the rule is in
:mod:`rdzv._torch`; the answer is :data:`rdzv.errors.TORCH_ERRORS`). This module serves
both directions, and imports torch only where torch is loaded already:

- **torch objects given to rdzv.** A ``torch.distributed.Store`` (``TCPStore``,
  ``FileStore``, ``HashStore``, ``PrefixStore``, or a Python subclass) given as a
  handler's store or to :class:`~rdzv.backend.StoreRendezvousBackend` is used through a
  :class:`TorchStoreView`; a torch ``RendezvousBackend`` (``C10dRendezvousBackend``, or
  your own subclass of torch's) given to a handler is used through a
  :class:`TorchBackend`. Such objects exist only in a process that imported torch, so
  they are recognised whatever the decision (by asking ``sys.modules``).
- **rdzv stores given to torch.** :class:`TorchStore` is a ``torch.distributed.Store``
  implemented over an rdzv store (made at run time: it needs torch's base class), and
  :func:`round_store` is what the handler hands out as ``RendezvousInfo.store``.

"Not yet" versus "failed". When keys do not appear in time, torch's ``TCPStore`` and
``HashStore`` raise ``DistStoreError`` and ``FileStore`` a plain ``RuntimeError``. The
view's rule, for every torch store: a ``get`` or ``wait`` that failed while the store
still answers ``check`` timed out (:class:`~rdzv.errors.StoreTimeoutError`, which the
handler's waits treat as "not yet": the caller looks again, and finds the keys if they
appeared just after the wait gave up); a failure after which ``check`` fails too, and a
failure of any other call, is a :class:`~rdzv.errors.RendezvousConnectionError`.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from rdzv.backend import RendezvousBackend, Token, poll_until
from rdzv.errors import (
    TORCH_ERRORS,
    RendezvousConnectionError,
    RendezvousStateError,
    StoreTimeoutError,
)
from rdzv.store import PrefixStore, Store, as_bytes

__all__ = [
    "TorchBackend",
    "TorchStore",
    "TorchStoreView",
    "as_rdzv_backend",
    "as_rdzv_store",
    "is_torch_backend",
    "is_torch_store",
    "kept_torch_store",
    "release_torch_store",
    "round_store",
    "store_timeouts",
    "torch_store",
]

_C10D = "torch._C._distributed_c10d"
_DYNAMIC = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
_API = "torch.distributed.elastic.rendezvous.api"
_STORE_FAILURES = (RuntimeError, ValueError, TimeoutError, OSError)
"""What a torch store raises when it fails (``DistError`` is a ``RuntimeError``); other
exceptions (a ``TypeError`` from a wrong argument) are bugs and pass unchanged."""


def _torch_base_store() -> type | None:
    """``torch.distributed.Store`` if torch is loaded, else None (never imports it)."""
    c10d = sys.modules.get(_C10D)
    store = getattr(c10d, "Store", None)
    return store if isinstance(store, type) else None


def is_torch_store(value: object) -> bool:
    """Whether ``value`` is a ``torch.distributed.Store``."""
    base = _torch_base_store()
    return base is not None and isinstance(value, base)


def is_torch_backend(value: object) -> bool:
    """Whether ``value`` is a torch ``RendezvousBackend`` (``C10dRendezvousBackend``...)."""
    dynamic = sys.modules.get(_DYNAMIC)
    base = getattr(dynamic, "RendezvousBackend", None)
    return isinstance(base, type) and isinstance(value, base)


def store_timeouts() -> tuple[type[BaseException], ...]:
    """The exceptions of a store wait that mean "the keys are not there yet": rdzv's
    :class:`~rdzv.errors.StoreTimeoutError`, ``TimeoutError``, and torch's
    ``DistStoreError`` once torch is loaded (torch's stores raise it when a wait runs
    past its timeout: torch itself waits on)."""
    found: tuple[type[BaseException], ...] = (StoreTimeoutError, TimeoutError)
    dist = sys.modules.get("torch.distributed")
    dist_store_error = getattr(dist, "DistStoreError", None)
    if isinstance(dist_store_error, type) and issubclass(dist_store_error, BaseException):
        found += (dist_store_error,)
    return found


# -- a torch store seen as an rdzv store ----------------------------------------------------


class TorchStoreView:
    """A ``torch.distributed.Store`` with the methods and errors of
    :class:`rdzv.store.Store` (no member sets: ``protocol=scale`` needs an rdzv store).

    Timeouts follow the module's rule; ``wait_for_change`` and ``try_get`` are built from
    ``check`` and ``get`` (torch's stores cannot notify, so a change is polled for with
    :func:`rdzv.backend.poll_until`)."""

    def __init__(self, store: Any) -> None:
        self._store = store

    @property
    def torch_store(self) -> Any:
        """The torch store behind this view."""
        return self._store

    def __repr__(self) -> str:
        return f"TorchStoreView({type(self._store).__module__}.{type(self._store).__name__})"

    def _failed(self, exc: BaseException, keys: Sequence[str] | None) -> Exception:
        name = type(self._store).__name__
        if keys is not None and self._answers(keys):
            return StoreTimeoutError(
                f"the key(s) {list(keys)} did not appear in the torch {name} in time "
                f"({type(exc).__name__}: {exc})"
            )
        return RendezvousConnectionError(
            f"the torch {name} failed: {type(exc).__name__}: {exc}; check that its server "
            f"is running and reachable"
        )

    def _answers(self, keys: Sequence[str]) -> bool:
        """Whether the store still answers (a ``check`` of ``keys`` works)."""
        try:
            self._store.check(list(keys))
        except _STORE_FAILURES:
            return False
        return True

    def _call(self, method: str, *args: Any, waits_for: Sequence[str] | None = None) -> Any:
        try:
            return getattr(self._store, method)(*args)
        except _STORE_FAILURES as exc:
            raise self._failed(exc, waits_for) from exc

    @property
    def timeout(self) -> timedelta:
        value: timedelta = self._store.timeout
        return value

    def set_timeout(self, timeout: timedelta) -> None:
        self._store.set_timeout(timeout)

    def set(self, key: str, value: bytes | str) -> None:
        self._call("set", key, as_bytes(value))

    def get(self, key: str) -> bytes:
        return bytes(self._call("get", key, waits_for=[key]))

    def add(self, key: str, amount: int) -> int:
        return int(self._call("add", key, amount))

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        return bytes(self._call("compare_set", key, as_bytes(expected), as_bytes(desired)))

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        listed = list(keys)
        if timeout is None:
            self._call("wait", listed, waits_for=listed)
        else:
            self._call("wait", listed, timeout, waits_for=listed)

    def check(self, keys: Sequence[str]) -> bool:
        return bool(self._call("check", list(keys)))

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        listed = list(keys)
        if not hasattr(self._store, "multi_get"):  # an older torch: one get per key
            return [self.get(key) for key in listed]
        return [bytes(v) for v in self._call("multi_get", listed, waits_for=listed)]

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        if not hasattr(self._store, "multi_set"):  # an older torch: one set per key
            for key, value in zip(keys, values, strict=True):
                self.set(key, value)
            return
        self._call("multi_set", list(keys), [as_bytes(v) for v in values])

    def delete_key(self, key: str) -> bool:
        return bool(self._call("delete_key", key))

    def num_keys(self) -> int:
        return int(self._call("num_keys"))

    def try_get(self, key: str) -> bytes | None:
        """The value of ``key``, or None at once when it is absent."""
        return self.get(key) if self.check([key]) else None

    def wait_for_change(self, key: str, current: bytes | None, timeout: timedelta) -> bool:
        return poll_until(lambda: self.try_get(key) != current, timeout.total_seconds())


def as_rdzv_store(store: Any) -> Any:
    """What rdzv uses of ``store``: a :class:`TorchStoreView` of a torch store, the rdzv
    store inside a :class:`TorchStore`, else ``store`` itself."""
    if isinstance(store, TorchStore):
        return store.underlying_store
    if is_torch_store(store):
        return TorchStoreView(store)
    return store


# -- an rdzv store seen as a torch store -----------------------------------------------------


def _store_error(error: Exception) -> Exception:
    """torch's store errors for ours: a store timeout is a ``DistStoreError``, an
    unreachable store a ``DistNetworkError``."""
    import torch.distributed as dist

    if isinstance(error, StoreTimeoutError):
        translated: Exception = dist.DistStoreError(str(error))
    elif isinstance(error, RendezvousConnectionError):
        translated = dist.DistNetworkError(str(error))
    else:
        return error
    translated.__cause__ = error
    return translated


class TorchStore:
    """An rdzv store with the methods and errors of ``torch.distributed.Store``.

    A store timeout raises ``torch.distributed.DistStoreError`` (what torch's store
    utilities and process groups catch), an unreachable store
    ``torch.distributed.DistNetworkError``. :func:`torch_store` makes one that is also a
    ``torch.distributed.Store`` (its class needs torch, so it is made at run time).
    """

    def __init__(self, store: Store) -> None:
        super().__init__()  # torch's Store, when this is mixed into it
        self._store = store

    @property
    def underlying_store(self) -> Store:
        return self._store

    def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        try:
            return method(*args)
        except (StoreTimeoutError, RendezvousConnectionError) as exc:
            raise _store_error(exc) from exc

    @property
    def timeout(self) -> timedelta:
        return self._store.timeout

    def set_timeout(self, timeout: timedelta) -> None:
        self._store.set_timeout(timeout)

    def set(self, key: str, value: bytes | str) -> None:
        self._call(self._store.set, key, value)

    def get(self, key: str) -> bytes:
        value: bytes = self._call(self._store.get, key)
        return value

    def add(self, key: str, amount: int) -> int:
        value: int = self._call(self._store.add, key, amount)
        return value

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        value: bytes = self._call(self._store.compare_set, key, expected, desired)
        return value

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        self._call(self._store.wait, list(keys), timeout)

    def check(self, keys: Sequence[str]) -> bool:
        found: bool = self._call(self._store.check, list(keys))
        return found

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        values: list[bytes] = self._call(self._store.multi_get, list(keys))
        return values

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        self._call(self._store.multi_set, list(keys), list(values))

    def delete_key(self, key: str) -> bool:
        deleted: bool = self._call(self._store.delete_key, key)
        return deleted

    def num_keys(self) -> int:
        count: int = self._call(self._store.num_keys)
        return count


@functools.cache
def _torch_store_class() -> type[TorchStore]:
    """:class:`TorchStore` that is also a ``torch.distributed.Store``."""
    from torch._C._distributed_c10d import Store as TorchBaseStore

    class RdzvTorchStore(TorchStore, TorchBaseStore):
        """An rdzv store as a ``torch.distributed.Store``."""

    RdzvTorchStore.__module__ = __name__
    return RdzvTorchStore


def torch_store(store: Store) -> TorchStore:
    """``store`` as a ``torch.distributed.Store`` (an instance of :class:`TorchStore`).

    torch's Python code calls its methods directly. torch's C++ wrappers (e.g.
    ``torch.distributed.PrefixStore`` around it, and the process groups) reach ``set``,
    ``get``, ``add``, ``compare_set``, ``check``, ``wait``, ``multi_get`` and
    ``multi_set``; torch does not forward ``delete_key`` and ``num_keys`` of Python
    stores. torch's C++ side holds the C++ half only: once the Python object is gone,
    those calls fail ("Not implemented"), so whoever hands it to torch must keep it (see
    :func:`kept_torch_store`).
    """
    return _torch_store_class()(store)


_kept: dict[int, tuple[Store, TorchStore]] = {}
_kept_lock = threading.Lock()


def kept_torch_store(store: Store) -> TorchStore:
    """The one :class:`TorchStore` of ``store`` in this process, kept alive until
    :func:`release_torch_store`: the handler's round stores (torch ``PrefixStore``
    objects) may be held by torch (a process group) after every Python reference to them
    and to the handler is gone. One per store object, so the number kept is bounded by
    the stores this process gives its handlers."""
    with _kept_lock:
        entry = _kept.get(id(store))
        if entry is None or entry[0] is not store:
            entry = (store, torch_store(store))
            _kept[id(store)] = entry
        return entry[1]


def release_torch_store(store: Store) -> None:
    """Stop keeping :func:`kept_torch_store`'s view of ``store`` (the handler calls it
    when it closes a store it opened: nothing can use that store any more)."""
    with _kept_lock:
        entry = _kept.get(id(store))
        if entry is not None and entry[0] is store:
            del _kept[id(store)]


def round_store(prefix: str, store: Store, given: object) -> Any:
    """What ``RendezvousInfo.store`` is for the namespace ``prefix`` of the handler's
    store: ``store`` is what the handler uses (an rdzv store, or the view of a torch
    store), ``given`` what its caller passed.

    Without torch: an rdzv :class:`~rdzv.store.PrefixStore`. With torch: a
    ``torch.distributed.PrefixStore`` over ``given`` if that is a torch store (as torch's
    handler does), else over :func:`kept_torch_store` of ``store``. Either way the keys
    are the same as those of ``PrefixStore(prefix, store)`` (both put ``prefix + "/"``
    before every key)."""
    if not TORCH_ERRORS:
        return PrefixStore(prefix, store)
    from torch._C._distributed_c10d import PrefixStore as TorchPrefixStore

    base: Any = given if is_torch_store(given) else kept_torch_store(store)
    return TorchPrefixStore(prefix, base)


# -- a torch rendezvous backend seen as an rdzv backend ----------------------------------------


class TorchBackend(RendezvousBackend):
    """A torch ``RendezvousBackend`` (``C10dRendezvousBackend`` over a ``TCPStore`` or
    ``FileStore``, or your own subclass of torch's) as an rdzv backend.

    ``get_state`` and ``set_state`` are torch's (same token contract); torch's
    ``RendezvousStateError`` and ``RendezvousConnectionError`` leave as rdzv's. torch's
    backends cannot notify, so a waiting node polls ``get_state``
    (:meth:`RendezvousBackend.wait_for_change`'s default, at most every 50 ms). They keep
    no announcement sets or heartbeat keys, so ``protocol=scale`` is refused with a
    message that says so. The state is rdzv's JSON, never a pickle, in whatever form the
    backend stores bytes (the c10d backend: base64 under ``torch.rendezvous.<run_id>``).
    """

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    @property
    def torch_backend(self) -> Any:
        """The torch backend behind this one."""
        return self._backend

    @property
    def name(self) -> str:
        return str(self._backend.name)

    def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        api = sys.modules.get(_API)
        try:
            return method(*args)
        except Exception as exc:
            ours: type[Exception] | None = None
            if api is not None and isinstance(exc, api.RendezvousStateError):
                ours = RendezvousStateError
            elif api is not None and isinstance(exc, api.RendezvousConnectionError):
                ours = RendezvousConnectionError
            if ours is None or isinstance(exc, ours):
                raise
            cause = f": {exc.__cause__}" if exc.__cause__ is not None else ""
            raise ours(f"torch's {self.name!r} backend: {exc}{cause}") from exc

    def get_state(self) -> tuple[bytes, Token] | None:
        result: tuple[bytes, Token] | None = self._call(self._backend.get_state)
        return result

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        result: tuple[bytes, Token, bool] | None = self._call(self._backend.set_state, state, token)
        return result


def as_rdzv_backend(backend: Any) -> Any:
    """What a handler uses of ``backend``: a :class:`TorchBackend` of a torch backend,
    else ``backend`` itself (the handler says what is wrong with anything else)."""
    if not isinstance(backend, RendezvousBackend) and is_torch_backend(backend):
        return TorchBackend(backend)
    return backend
