"""The rendezvous backend: one compare-and-set register holding the shared state.

:class:`RendezvousBackend` is torch's interface (``get_state`` / ``set_state`` with an
opaque fencing token) plus :meth:`RendezvousBackend.wait_for_change`, which lets a node
that cannot progress sleep until the state changes. :class:`StoreRendezvousBackend` is
the one implementation, built on any object with the :class:`~rdzv.store.Store` methods.

The fencing-token contract of :meth:`RendezvousBackend.set_state`:

- the token matches the stored state: write, return ``(state, token, True)``;
- the token is stale: no write, return the current ``(state, token, False)``;
- the token is ``None``: write only if no state exists yet;
- the token is not one this backend hands out: no write, return the current state.

:class:`StoreRendezvousBackend` uses the stored bytes themselves as the token (as torch's
c10d backend does): a write succeeds exactly when the register still holds the bytes the
writer last saw. Since the register holds the whole state, "same bytes" is "same state",
so a write computed from those bytes is correct even if the register changed and
changed back in between.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from rdzv.clock import SystemClock
from rdzv.store import Store, as_bytes

Token = Any
"""An opaque fencing token; only the backend that handed it out interprets it."""

POLL_BACKOFF_START = 0.001
"""Seconds before the first re-read in the default :meth:`~RendezvousBackend.wait_for_change`."""
POLL_BACKOFF_MAX = 0.05
"""Upper bound (seconds) on the delay between two re-reads of that default."""


def poll_until(changed: Callable[[], bool], timeout: float) -> bool:
    """Call ``changed()`` until it returns True (then True) or ``timeout`` seconds passed
    (then False), sleeping from :data:`POLL_BACKOFF_START` to :data:`POLL_BACKOFF_MAX`
    seconds between calls: the wait of a store or backend that cannot notify."""
    clock = SystemClock()
    end = clock.monotonic() + max(0.0, timeout)
    delay = POLL_BACKOFF_START
    while True:  # bounded: ends by ``end``, each pass sleeps at least ``delay``
        if changed():
            return True
        remaining = end - clock.monotonic()
        if remaining <= 0:
            return False
        clock.sleep(min(delay, remaining))
        delay = min(delay * 2, POLL_BACKOFF_MAX)


class RendezvousBackend(ABC):
    """A compare-and-set register for the state of one run (torch's interface)."""

    @property
    @abstractmethod
    def name(self) -> str:
        """The backend's name (what ``get_backend()`` reports)."""

    @abstractmethod
    def get_state(self) -> tuple[bytes, Token] | None:
        """The stored state and its fencing token, or None if there is no state yet."""

    @abstractmethod
    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        """Write ``state`` if ``token`` is current (see the module docstring).

        Returns the state stored afterwards, its token and whether this write happened;
        None if there is still no state."""

    @property
    def state_expiry(self) -> float | None:
        """Seconds after its last write that the stored state disappears by itself (a
        key expiry of the store, such as Redis's ``ttl``); None (this default) when it
        never does. The handler refuses protocol settings under which the state could go
        unwritten that long while nodes still use it."""
        return None

    @property
    def keeps_sets_and_beats(self) -> bool:
        """True when this backend keeps announcement sets and heartbeat keys (what
        ``scale``, the default protocol, needs). This default says so when the subclass
        overrides all five methods below; :class:`StoreRendezvousBackend` asks its store."""
        cls = type(self)
        return all(
            getattr(cls, name) is not getattr(RendezvousBackend, name)
            for name in ("announce", "announced", "withdraw", "beat", "beats")
        )

    def _cannot(self, what: str) -> NotImplementedError:
        return NotImplementedError(
            f"the {self.name!r} backend keeps no {what}, which the chosen protocol variant "
            f"needs; use protocol=hardened, or an rdzv store (memory://, sqlite://, "
            f"redis://, etcd://)"
        )

    def announce(self, round_: int, member: bytes) -> int:
        """Add ``member`` to round ``round_``'s announcement set; return the set's size.

        Only announcing protocol variants (``scale``) call this; backends that cannot
        keep such sets leave this default, which says so."""
        raise self._cannot("announcement sets")

    def announced(self, round_: int) -> list[bytes]:
        """The members of round ``round_``'s announcement set (see :meth:`announce`)."""
        raise self._cannot("announcement sets")

    def announcement_set_name(self, round_: int) -> str:
        """Where round ``round_``'s announcement set lives, for messages."""
        return f"round {round_}'s announcement set"

    def withdraw(self, round_: int, member: bytes) -> None:
        """Take ``member`` out of round ``round_``'s announcement set (a member that is
        not there is no error; see :meth:`announce`)."""
        raise self._cannot("announcement sets")

    def beat(self, node: str, value: bytes) -> None:
        """Write ``node``'s heartbeat key (variants with heartbeats under keys)."""
        raise self._cannot("heartbeat keys")

    def beats(self, nodes: Sequence[str]) -> list[bytes | None]:
        """The heartbeat values of ``nodes`` (None where absent), without waiting."""
        raise self._cannot("heartbeat keys")

    def wait_for_change(self, token: Token | None, timeout: float) -> bool:
        """Block until the stored state's token is no longer ``token`` (True) or
        ``timeout`` seconds passed (False). Waking early is allowed only on a change.

        This default polls :meth:`get_state` (:func:`poll_until`); backends that can
        watch the store override it.
        """

        def changed() -> bool:
            current = self.get_state()
            return (None if current is None else current[1]) != token

        return poll_until(changed, timeout)


class StoreRendezvousBackend(RendezvousBackend):
    """The state of run ``run_id`` under the key ``rdzv/<run_id>/state`` of ``store``.

    ``store`` may be any object with the :class:`~rdzv.store.Store` methods; this class
    uses ``check``, ``get``, ``compare_set`` and ``wait_for_change``. A
    ``torch.distributed.Store`` (``TCPStore``, ``FileStore``, ``HashStore``,
    ``PrefixStore``) is served through :class:`rdzv.torch_compat.TorchStoreView`, which
    polls for changes (torch's stores cannot notify).
    """

    def __init__(self, store: Store, run_id: str) -> None:
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(
                f"run_id must be a non-empty string, got {run_id!r}; pass the job's id"
            )
        from rdzv.torch_compat import as_rdzv_store

        store = as_rdzv_store(store)
        missing = [
            method
            for method in ("check", "get", "compare_set", "wait_for_change")
            if not callable(getattr(store, method, None))
        ]
        if missing:
            raise TypeError(
                f"{type(store).__name__} is not a store: it lacks {', '.join(missing)}; "
                f"pass an object with the rdzv.store.Store methods (see rdzv.stores.open_store)"
            )
        self._store = store
        self._run_id = run_id
        self._key = f"rdzv/{run_id}/state"
        self._last: bytes | None = None
        """The bytes this backend last read or wrote: a store with ``unchanged`` (Redis,
        etcd) confirms them with a few bytes instead of sending the state again."""
        self._moved_from: bytes | None = None
        """The bytes a :meth:`wait_for_change` just saw replaced: the next read does not
        ask whether they are still there (one round trip saved per wake-up)."""

    @property
    def name(self) -> str:
        return "rdzv"

    @property
    def store(self) -> Store:
        return self._store

    @property
    def key(self) -> str:
        """The store key holding the state."""
        return self._key

    @property
    def state_expiry(self) -> float | None:
        """The store's key expiry (its ``ttl`` attribute, seconds), if it has one."""
        ttl = getattr(self._store, "ttl", None)
        if isinstance(ttl, bool) or not isinstance(ttl, int | float):
            return None
        return float(ttl)

    def get_state(self) -> tuple[bytes, Token] | None:
        """One read of the state, as cheap as the store allows:

        - a store with ``unchanged`` (Redis, etcd) is first asked to confirm, in a few
          bytes, the newest value this node already holds: the value a change
          notification delivered (``seen``, Redis and etcd send it with the
          notification), else the bytes last read or written (unless a wait just saw
          those replaced);
        - otherwise one ``try_get`` (rdzv stores), or ``check`` then ``get`` (``get`` of
          a missing key would block for the store's timeout).
        """
        moved, self._moved_from = self._moved_from, None
        last = self._last
        unchanged = getattr(self._store, "unchanged", None)
        if callable(unchanged):
            seen = getattr(self._store, "seen", None)
            candidate = seen(self._key) if callable(seen) else None
            if candidate is None or candidate == moved:
                candidate = None if last == moved else last
            if candidate is not None and unchanged(self._key, candidate):
                self._last = candidate
                return candidate, candidate
        try_get = getattr(self._store, "try_get", None)
        if callable(try_get):
            value = try_get(self._key)
            if value is None:
                return None
            data = as_bytes(value)
        else:
            if not self._store.check([self._key]):
                return None
            data = as_bytes(self._store.get(self._key))
        self._last = data
        return data, data

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        state = as_bytes(state)
        if token is not None and not isinstance(token, bytes):
            # Not a token we hand out: never write.
            return self._current(written=False)
        if token is not None and token == state:
            # Writing the bytes already there is a no-op; it "succeeds" iff they still are.
            current = self.get_state()
            if current is None:
                return None
            return current[0], current[1], current[1] == token
        expected = b"" if token is None else token
        result = as_bytes(self._store.compare_set(self._key, expected, state))
        self._last = result
        if result == state:
            return state, state, True
        if token is not None and result == token:
            # The store returns ``expected`` only for an absent key (a deleted state).
            return self._current(written=False)
        return result, result, False

    @property
    def keeps_sets_and_beats(self) -> bool:
        """True when the store has member sets and ``try_get`` (every rdzv store; a torch
        ``Store`` has neither)."""
        return all(
            callable(getattr(self._store, name, None))
            for name in ("add_member", "members", "remove_member", "try_get")
        )

    def _announce_key(self, round_: int) -> str:
        return f"rdzv/{self._run_id}/announce/{round_}"

    def announcement_set_name(self, round_: int) -> str:
        return f"round {round_}'s announcement set (store set {self._announce_key(round_)!r})"

    def announce(self, round_: int, member: bytes) -> int:
        add_member = getattr(self._store, "add_member", None)
        if not callable(add_member):
            return super().announce(round_, member)
        return int(add_member(self._announce_key(round_), member))

    def announced(self, round_: int) -> list[bytes]:
        members = getattr(self._store, "members", None)
        if not callable(members):
            return super().announced(round_)
        return [as_bytes(m) for m in members(self._announce_key(round_))]

    def withdraw(self, round_: int, member: bytes) -> None:
        remove_member = getattr(self._store, "remove_member", None)
        if not callable(remove_member):
            super().withdraw(round_, member)
            return
        remove_member(self._announce_key(round_), member)

    def beat(self, node: str, value: bytes) -> None:
        self._store.set(f"rdzv/{self._run_id}/beat/{node}", value)

    def beats(self, nodes: Sequence[str]) -> list[bytes | None]:
        try_get = getattr(self._store, "try_get", None)
        if not callable(try_get):
            return super().beats(nodes)
        out: list[bytes | None] = []
        for node in nodes:
            value = try_get(f"rdzv/{self._run_id}/beat/{node}")
            out.append(None if value is None else as_bytes(value))
        return out

    def _current(self, written: bool) -> tuple[bytes, Token, bool] | None:
        current = self.get_state()
        return None if current is None else (current[0], current[1], written)

    def wait_for_change(self, token: Token | None, timeout: float) -> bool:
        current = token if isinstance(token, bytes) else None
        changed = self._store.wait_for_change(
            self._key, current, timedelta(seconds=max(0.0, timeout))
        )
        if changed and current is not None:
            self._moved_from = current
        return changed
