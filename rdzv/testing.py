"""Test kit: the store conformance suite, and a fake clock.

:func:`check_store` is the one conformance suite every :class:`~rdzv.store.Store` must
pass; backends in this package run it, and so can yours::

    from rdzv.testing import check_store

    def test_my_store_conforms(tmp_path):
        check_store(lambda: MyStore(...))                   # threads of one process
        check_store(lambda: MyStore(...), url="my://...")   # ... and spawned processes
        check_store(MyStore, only=["compare_set contract"])  # one property (see PROPERTY_NAMES)

``factory()`` must return a fresh, empty store each time (the suite calls it once per
property, and closes the store afterwards if it has a ``close`` method). The first
broken property raises ``AssertionError`` naming the property, the store and what was
expected versus what happened; an unexpected exception from the store is reported the
same way.

Bounds: every thread and process the kit starts is joined (or terminated) before it
returns. ``wake_within`` bounds how long a blocking call may take to notice a write made
by another thread or process (default 5 s; a correct store needs milliseconds). Timeout
checks use a store timeout of ``SHORT_TIMEOUT`` (50 ms), so no check sleeps long.

:class:`FakeClock` (from :mod:`rdzv.clock`) is re-exported for tests that drive time, with
:class:`FakeClockStalled`, what a sleep on it raises when nobody advances it.
"""

from __future__ import annotations

import importlib
import multiprocessing
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Collection
from datetime import timedelta

from rdzv.clock import FakeClock, FakeClockStalled
from rdzv.store import PrefixStore, SetStore, Store
from rdzv.stores import open_store

__all__ = [
    "PROPERTY_NAMES",
    "SHORT_TIMEOUT",
    "FakeClock",
    "FakeClockStalled",
    "check_store",
    "check_store_across_processes",
]

from rdzv.conformance.common import (
    LIVENESS_CHECK_S,
    PROCESS_STOP_S,
    SHORT_TIMEOUT,
    Broken,
    Config,
    close_store,
    expect,
    expect_eq,
)
from rdzv.conformance.keys import KEY_PROPERTIES as _KEY_PROPERTIES
from rdzv.conformance.keys import cas_increment, count_of
from rdzv.conformance.requests import KEY_REQUEST_PROPERTIES, SET_REQUEST_PROPERTIES
from rdzv.conformance.sets import SET_PROPERTIES as _SET_PROPERTIES

StoreFactory = Callable[[], Store]


KEY_PROPERTIES = _KEY_PROPERTIES + KEY_REQUEST_PROPERTIES
"""Every store's properties: the key-value ones, then the machine's register requests
answering as :mod:`spec.storage` defines (:mod:`rdzv.conformance.requests`)."""
SET_PROPERTIES = SET_REQUEST_PROPERTIES + _SET_PROPERTIES
"""A :class:`~rdzv.store.SetStore`'s properties: every machine request answering as
:mod:`spec.storage` defines, then the member-set ones (single-threaded first)."""

PROPERTY_NAMES: tuple[str, ...] = tuple(name for name, _ in KEY_PROPERTIES + SET_PROPERTIES)
"""The names of :func:`check_store`'s properties, in the order it runs them (the names
its failure messages quote, and the values ``only=`` takes)."""


def _selected(only: Collection[str] | None) -> frozenset[str] | None:
    if only is None:
        return None
    if isinstance(only, str):
        raise ValueError(
            f"only={only!r} is one string; pass a list of property names, e.g. only=[{only!r}]"
        )
    unknown = sorted(set(only) - set(PROPERTY_NAMES))
    if unknown or not only:
        raise ValueError(
            f"only={sorted(only)!r}: "
            + (f"unknown property name(s) {unknown!r}" if unknown else "no property named")
            + f"; pick from rdzv.testing.PROPERTY_NAMES: {list(PROPERTY_NAMES)!r}"
        )
    return frozenset(only)


def check_store(
    factory: StoreFactory,
    *,
    url: str | None = None,
    opener: str | None = None,
    threads: int = 4,
    increments: int = 50,
    processes: int = 3,
    wake_within: timedelta = timedelta(seconds=5),
    sets: bool | None = None,
    only: Collection[str] | None = None,
) -> None:
    """Run the conformance suite on stores made by ``factory``; raise on the first failure.

    ``threads`` threads each do ``increments`` ``add``, CAS increments, ``add_member``
    and ``remove_member`` calls. When ``url`` is given,
    :func:`check_store_across_processes` also runs on it (``opener`` and ``processes``
    are passed on).

    ``sets`` picks the member-set properties (:class:`~rdzv.store.SetStore`): ``True``
    requires them (a store without ``add_member``/``remove_member``/``members``/
    ``try_get`` fails), ``False`` skips them, ``None`` runs them when the store has these
    methods.

    ``only`` (names from :data:`PROPERTY_NAMES`) runs just those properties, e.g. to
    check that one property catches a store with a known bug without the other
    properties' bounds in the way; ``None`` (the default) runs them all. ``sets`` still
    applies to the member-set properties named, and the check across processes still
    runs when ``url`` is given. An unknown name raises ``ValueError``.
    """
    if threads < 2 or increments < 1:
        raise ValueError(f"need threads >= 2 and increments >= 1, got {threads}, {increments}")
    chosen = _selected(only)
    cfg = Config(threads=threads, increments=increments, wake_within=wake_within)
    properties = [(name, prop, False) for name, prop in KEY_PROPERTIES]
    if sets is not False:
        properties += [(name, prop, sets is None) for name, prop in SET_PROPERTIES]
    if chosen is not None:
        properties = [p for p in properties if p[0] in chosen]
    for name, prop, optional in properties:
        store = factory()
        if optional and not isinstance(store, SetStore):
            close_store(store)
            continue
        try:
            expect(
                isinstance(store, Store),
                f"factory() returned {type(store).__name__}, which lacks Store methods",
            )
            expect_eq(store.num_keys(), 0, "num_keys() of a store from factory() (must be empty)")
            prop(store, cfg)
        except AssertionError as exc:
            raise AssertionError(f"store conformance: {name!r} failed for {store!r}: {exc}") from (
                None if isinstance(exc, Broken) else exc
            )
        except Exception as exc:
            raise AssertionError(
                f"store conformance: {name!r}: {store!r} raised {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            close_store(store)
    if url is not None:
        check_store_across_processes(
            url, opener=opener, processes=processes, increments=increments, wake_within=wake_within
        )


# -- processes ---------------------------------------------------------------------------


def _open(url: str, opener: str | None, timeout: timedelta) -> Store:
    if opener is None:
        return open_store(url, timeout=timeout)
    module, _, name = opener.partition(":")
    fn = getattr(importlib.import_module(module), name)
    store = fn(url, timeout)
    expect(isinstance(store, Store), f"opener {opener!r} returned {store!r}, not a Store")
    return store  # type: ignore[no-any-return]


def _child_main(
    url: str, opener: str | None, prefix: str, index: int, increments: int, wait_s: float
) -> None:
    """A child process of :func:`check_store_across_processes` (spawned; args are str/int).

    Announces itself (``add("ready", 1)``), blocks until the parent writes ``go`` (a
    wake-up across processes), joins the member set ``joined`` and leaves the member set
    ``leaving`` when the store has member sets (recording the sizes it got under
    ``size/<index>`` and ``left/<index>``), then increments; reports ``ok`` or the error
    under ``done/<index>`` and exits 0 or 1.
    """
    base = _open(url, opener, timedelta(seconds=wait_s))
    store = PrefixStore(prefix, base)
    try:
        store.add("ready", 1)
        store.wait(["go"])
        if isinstance(base, SetStore):
            store.set(f"size/{index}", str(store.add_member("joined", f"p{index}")))
            store.set(f"left/{index}", str(store.remove_member("leaving", f"p{index}")))
        for j in range(increments):
            store.add("added", 1)
            cas_increment(store, "counter", f"p{index}.{j}")
        store.set(f"done/{index}", b"ok")
    except BaseException as exc:
        traceback.print_exc()
        try:
            store.set(f"done/{index}", f"{type(exc).__name__}: {exc}")
        finally:
            sys.exit(1)
    finally:
        close_store(base)


class _ProcessCheckFailed(AssertionError):
    pass


def check_store_across_processes(
    url: str,
    *,
    opener: str | None = None,
    processes: int = 3,
    increments: int = 20,
    wake_within: timedelta = timedelta(seconds=5),
    start_within: timedelta = timedelta(seconds=60),
) -> None:
    """Spawn ``processes`` children that reopen ``url``; check wake-ups and lost updates.

    Each child announces itself, waits for the parent's ``go`` (the parent sleeps in
    ``wait_for_change`` until every child announced, and each child in ``wait``: both
    are wake-ups across processes), then does ``increments`` ``add(1)`` and CAS
    increments on shared counters; no update may be lost. When the store has member sets
    (:class:`~rdzv.store.SetStore`), each child also joins one set and leaves another
    (filled by the parent with every child's member) at the same moment: the sizes
    ``add_member`` returned must be ``1..processes`` and those ``remove_member`` returned
    ``0..processes-1``, each once.

    The store is opened with :func:`rdzv.stores.open_store`, or with ``opener``, a
    ``"module:function"`` reference to a ``(url, timeout) -> Store`` callable importable
    in a fresh interpreter. Keys live under a fresh prefix, so ``url`` may name a shared
    server; they are deleted afterwards, and the member sets emptied with
    ``remove_member``. Children are started with the ``spawn``
    context and receive only strings and ints. Bounds: children must announce
    themselves within ``start_within`` (interpreter start-up) and finish within
    ``wake_within`` per increment after that; the kit terminates any child left.
    """
    if processes < 2 or increments < 1:
        raise ValueError(f"need processes >= 2 and increments >= 1, got {processes}, {increments}")
    if opener is None and url.lower().startswith("memory:"):
        raise ValueError(
            f"{url!r}: a memory:// store is private to its process, so child processes "
            "cannot share it; use a store that processes share (e.g. sqlite:///path.db)"
        )
    start_s = start_within.total_seconds()
    work_s = wake_within.total_seconds() * (increments + 2)
    base = _open(url, opener, timedelta(seconds=start_s + work_s))
    prefix = f"rdzv-conformance/{uuid.uuid4().hex}"
    store = PrefixStore(prefix, base)
    keys = ["ready", "go", "counter", "added"]
    keys += [f"{kind}/{i}" for kind in ("done", "size", "left") for i in range(processes)]
    sets = base if isinstance(base, SetStore) else None
    everyone = [f"p{i}" for i in range(processes)]
    ctx = multiprocessing.get_context("spawn")
    children = [
        ctx.Process(
            target=_child_main,
            args=(url, opener, prefix, i, increments, start_s + work_s),
            name=f"rdzv-conformance-{i}",
            daemon=True,
        )
        for i in range(processes)
    ]

    def fail(what: str) -> _ProcessCheckFailed:
        return _ProcessCheckFailed(f"store conformance across processes ({url}): {what}")

    def exited_early() -> None:
        for i, child in enumerate(children):
            if not child.is_alive():
                report = store.get(f"done/{i}") if store.check([f"done/{i}"]) else None
                raise fail(
                    f"child {i} exited with code {child.exitcode} before the others were "
                    f"ready, reporting {report!r} (its traceback is on stderr)"
                )

    try:
        store.set("counter", b"0:init")
        if sets is not None:
            for member in everyone:
                store.add_member("leaving", member)
        for child in children:
            child.start()
        # Wait for every child to announce itself; bounded by start_within, in slices of
        # LIVENESS_CHECK_S so a child that dies is reported at once.
        deadline = time.monotonic() + start_s
        while True:
            ready = store.get("ready") if store.check(["ready"]) else None
            if ready is not None and int(ready) >= processes:
                break
            exited_early()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise fail(
                    f"only {int(ready or 0)} of {processes} children announced themselves within "
                    f"{start_s:.3g} s (slow start-up, or a write that other processes never see)"
                )
            step = timedelta(seconds=min(remaining, LIVENESS_CHECK_S))
            store.wait_for_change("ready", ready, step)
        store.set("go", b"1")
        deadline = time.monotonic() + work_s
        # Bounded by the deadline. join() blocks until the child is reaped; a loop over
        # is_alive() and sentinels can see a sentinel ready before the child is reaped.
        for child in children:
            child.join(max(0.0, deadline - time.monotonic()))
        stuck = [c.name for c in children if c.is_alive()]
        if stuck:
            raise fail(
                f"children {stuck} did not finish within {work_s:.3g} s after 'go' (a lost "
                "wake-up across processes, or a lock that is never released?)"
            )
        for i, child in enumerate(children):
            report = store.get(f"done/{i}") if store.check([f"done/{i}"]) else None
            if child.exitcode != 0 or report != b"ok":
                raise fail(
                    f"child {i} exited with code {child.exitcode}, reporting {report!r} "
                    "(its traceback is on stderr)"
                )
        total = processes * increments
        added = store.get("added")
        if added != str(total).encode():
            raise fail(f"{processes}x{increments} add(1) left {added!r}, expected {total}")
        counter = count_of(store.get("counter"))
        if counter != total:
            raise fail(
                f"{processes}x{increments} CAS increments reached {counter}, expected {total} "
                "(lost updates: compare_set is not atomic across processes)"
            )
        if sets is not None:
            sizes = sorted(int(v) for v in store.multi_get([f"size/{i}" for i in range(processes)]))
            if sizes != list(range(1, processes + 1)):
                raise fail(
                    f"{processes} processes joining one member set got sizes {sizes}, expected "
                    f"each of 1..{processes} once (add_member is not atomic across processes)"
                )
            joined = store.members("joined")
            expected = sorted(m.encode() for m in everyone)
            if joined != expected:
                raise fail(f"the member set holds {joined!r}, expected {expected!r}")
            left = sorted(int(v) for v in store.multi_get([f"left/{i}" for i in range(processes)]))
            if left != list(range(processes)):
                raise fail(
                    f"{processes} processes leaving one member set got sizes {left}, expected "
                    f"each of 0..{processes - 1} once (remove_member is not atomic across "
                    "processes)"
                )
            stayed = store.members("leaving")
            if stayed:
                raise fail(f"the member set every child left still holds {stayed!r}")
    except Broken as exc:
        raise fail(str(exc)) from None
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
                child.join(PROCESS_STOP_S)
            if child.is_alive():
                child.kill()
            if child.pid is not None:
                child.join(PROCESS_STOP_S)
        try:
            for key in keys:
                store.delete_key(key)
            if sets is not None:
                for name in ("joined", "leaving"):
                    for member in everyone:
                        store.remove_member(name, member)
        finally:
            close_store(base)
