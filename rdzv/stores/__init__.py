"""Store backends and :func:`open_store`, which opens one from a URL.

A URL's scheme picks the backend through a small registry. Built in: ``memory://name``
(threads of one process), ``sqlite:///abs/path.db`` (processes of one host), and, imported
on first use, ``redis://``/``rediss://`` and ``etcd://``/``etcds://`` (many hosts). Other
modules add theirs with :func:`register_scheme`, either as a callable or as a
``"module:function"`` reference that is imported on first use, so optional dependencies
(redis, httpx) load only when such a URL is opened::

    register_scheme("redis", "rdzv.stores.redis:open_redis", example="redis://host:6379/0")

An opener takes ``(url, timeout)`` and returns a :class:`~rdzv.store.Store`; it raises
``ValueError`` for a malformed URL and :class:`~rdzv.errors.RendezvousConnectionError`
when the backend cannot be reached.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from rdzv.store import DEFAULT_STORE_TIMEOUT, Store
from rdzv.stores.common import check_timeout
from rdzv.stores.memory import MemoryStore, drop_memory_store, memory_store_names
from rdzv.stores.sqlite import SQLiteStore, open_sqlite
from rdzv.stores.url import (
    StoreUrlError,
    is_valid_scheme,
    redact,
    split_query,
    split_url,
)

__all__ = [
    "MemoryStore",
    "Opener",
    "SQLiteStore",
    "StoreUrlError",
    "drop_memory_store",
    "memory_store_names",
    "open_store",
    "register_scheme",
    "supported_schemes",
    "unregister_scheme",
]

Opener = Callable[[str, timedelta], Store]


@dataclass(frozen=True)
class _Entry:
    opener: Opener | str  # a callable, or "module:function" imported on first use
    example: str


_lock = threading.Lock()
_schemes: dict[str, _Entry] = {}


def register_scheme(
    scheme: str, opener: Opener | str, *, example: str | None = None, replace: bool = False
) -> None:
    """Make :func:`open_store` open ``scheme://...`` URLs with ``opener``.

    ``opener`` is a callable ``(url, timeout) -> Store`` or a ``"module:function"``
    reference to one (imported lazily). ``example`` is shown in error messages.
    Registering a taken scheme again raises ``ValueError`` unless ``replace`` is True
    (re-registering the very same opener is a no-op).
    """
    if not isinstance(scheme, str) or not is_valid_scheme(scheme):
        raise ValueError(
            f"invalid URL scheme {scheme!r}: use letters, digits, '+', '-' or '.', "
            "starting with a letter (e.g. 'redis')"
        )
    if isinstance(opener, str):
        module, _, name = opener.partition(":")
        if not module or not name:
            raise ValueError(
                f"opener reference {opener!r} must look like 'package.module:function'"
            )
    elif not callable(opener):
        raise TypeError(f"opener must be callable or a 'module:function' string, got {opener!r}")
    scheme = scheme.lower()
    with _lock:
        old = _schemes.get(scheme)
        if old is not None and not replace:
            if old.opener != opener:
                raise ValueError(
                    f"URL scheme {scheme!r} is already registered to {old.opener!r}; "
                    "pass replace=True to override it"
                )
            if example is None:
                return  # the same registration again (e.g. a module imported twice)
        _schemes[scheme] = _Entry(opener, example or f"{scheme}://...")


def unregister_scheme(scheme: str) -> bool:
    """Remove a registration (for tests and plug-ins); returns whether it existed."""
    with _lock:
        return _schemes.pop(scheme.lower(), None) is not None


def supported_schemes() -> list[str]:
    """The registered schemes, sorted."""
    with _lock:
        return sorted(_schemes)


def _help() -> str:
    with _lock:
        items = sorted(_schemes.items())
    listed = ", ".join(f"{name} (e.g. {entry.example})" for name, entry in items)
    return f"supported schemes: {listed}"


def _resolve(scheme: str, entry: _Entry) -> Opener:
    if not isinstance(entry.opener, str):
        return entry.opener
    module_name, _, attr = entry.opener.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"the {scheme}:// store needs module {module_name}, which failed to import "
            f"({exc}); install the package it names (rdzv's extras: pip install "
            "'rdzv[redis]' or 'rdzv[etcd]')"
        ) from exc
    opener = getattr(module, attr, None)
    if not callable(opener):
        raise ImportError(f"{entry.opener!r} registered for {scheme}:// is not a callable")
    resolved: Opener = opener
    return resolved


def open_store(url: str, *, timeout: timedelta | None = None) -> Store:
    """Open the store named by ``url``; ``timeout`` is the store timeout (default 300 s).

    Raises ``ValueError`` (:class:`StoreUrlError`) for a malformed URL or an unknown
    scheme, listing the supported schemes with an example of each, and
    :class:`~rdzv.errors.RendezvousConnectionError` when the backend cannot be reached.
    """
    store_timeout = DEFAULT_STORE_TIMEOUT if timeout is None else check_timeout(timeout)
    try:
        scheme, _ = split_url(url)
    except StoreUrlError as exc:
        raise StoreUrlError(f"{exc}; {_help()}") from None
    with _lock:
        entry = _schemes.get(scheme)
    if entry is None:
        raise StoreUrlError(f"unknown store scheme {scheme!r} in {redact(url)!r}; {_help()}")
    opener = _resolve(scheme, entry)
    try:
        return opener(url, store_timeout)
    except StoreUrlError as exc:
        hint = "" if entry.example in str(exc) else f" (e.g. {entry.example})"
        raise StoreUrlError(f"{exc}{hint}") from None


def _open_memory(url: str, timeout: timedelta) -> MemoryStore:
    split_url(url)
    name, _ = split_query(
        url,
        (),
        no_userinfo="memory stores do not take; name the store without ':' before an '@' "
        "(e.g. memory://job1)",
    )
    try:
        return MemoryStore.named(name, timeout=timeout)
    except ValueError as exc:
        raise StoreUrlError(str(exc)) from None


register_scheme("memory", _open_memory, example="memory://job1")
register_scheme("sqlite", open_sqlite, example="sqlite:///var/tmp/job1.db")
# Imported on first use, so their client libraries load only when such a URL is opened.
register_scheme("redis", "rdzv.stores.redis:open_redis", example="redis://:password@host:6379/0")
register_scheme("rediss", "rdzv.stores.redis:open_redis", example="rediss://host:6380/0")
register_scheme("etcd", "rdzv.stores.etcd:open_etcd", example="etcd://host:2379")
register_scheme("etcds", "rdzv.stores.etcd:open_etcd", example="etcds://host:2379")
