"""A store on etcd v3: ``etcd://[user:password@]host:port`` and ``etcds://`` (TLS).

Theory of operation:

- Transport: etcd's v3 JSON gateway (``/v3/kv/range``, ``/v3/kv/put``, ``/v3/kv/txn``,
  ``/v3/kv/deleterange``, ``/v3/watch``, ``/v3/auth/authenticate``; keys and values
  base64) over one thread-safe ``httpx.Client``. The gateway is served by every etcd
  3.4+ on its client port, so no gRPC stack or generated code is needed; ``httpx`` is a
  maintained, typed HTTP client with TLS client certificates and streaming responses.
- Keys of one store live under a namespace (URL parameter ``prefix``, default
  ``rdzv``): store key ``k`` is the etcd key ``<prefix>/k``; ``num_keys`` is one
  count-only range over the namespace.
- ``compare_set`` decides from the key's value and writes in a transaction that compares
  the key's ``mod_revision`` with the one the decision was based on (so it writes only
  if nothing changed in between); a failed transaction returns the current value and
  revision, and the decision is made again, at most ``MAX_CAS_ROUNDS`` times. The store
  remembers the last (value, mod_revision) it saw per key (at most ``SEEN_ENTRIES``), so
  a ``compare_set`` right after a read needs no read of its own. ``add`` reads, computes
  and writes the same way, and also writes a record key ``<prefix>#add/<token>`` in its
  transaction.
- Blocking calls read the key and the store's revision ``R``, then open a watch from
  ``R + 1`` (a streaming HTTP response), so any write after the read is delivered; an
  event showing a different value answers ``wait_for_change`` at once, otherwise they
  re-read, and they stop at their deadline. Nothing polls. A watch that the server (or a
  proxy) ends without events is followed by a pause, ``WATCH_PAUSE_MIN_S`` doubling to
  ``WATCH_PAUSE_MAX_S``, before the next read: an endpoint that ends every watch at once
  must not make a wait spin on read-and-watch until its deadline.
- Connections: one ``httpx`` pool, uncapped (``MAX_CONNECTIONS``): a thread holds at most
  one connection at a time (a request, or a watch for as long as it waits), so the pool
  never holds more connections than there are threads using the store at once.
- An epoch key ``<prefix>#epoch`` is created at open; every read reads it and every
  write is conditioned on it, so a wiped server is noticed at the next request.
- Multi-key calls: etcd refuses a transaction with more than ``--max-txn-ops``
  operations in any one of its lists (compares, success ops, failure ops; 128 by
  default, ``ETCD_MAX_TXN_OPS``), so a call on more keys than ``TXN_KEYS`` (127) runs in
  several transactions of at most ``TXN_KEYS`` keys each. A read (``multi_get``,
  ``check``, ``wait``, a blocking ``get``) stays one snapshot: the first transaction
  reads the epoch key and up to ``TXN_KEYS`` keys at the store's current revision ``R``,
  the others read their keys at revision ``R`` (a range's ``revision`` field); if etcd
  compacted ``R`` away in between, the whole read starts over (counted as a retry). A
  ``multi_set`` of more distinct keys than ``TXN_KEYS`` is applied ``TXN_KEYS`` keys per
  transaction, in order, each guarded by the epoch: it is atomic only up to
  ``TXN_KEYS`` keys; above that, a reader may see the first transactions' keys before
  the later ones, and a failure part-way leaves the keys already written (the puts are
  blind, so the call may simply be repeated). A key given twice keeps its last value
  (etcd refuses a transaction that puts one key twice).
- Member sets (:class:`~rdzv.store.SetStore`): member ``m`` of set ``k`` is the etcd key
  ``<prefix>#set/<n>:k/m`` (``n`` is the byte length of ``k``, so no set's key range
  contains another's), outside the ``<prefix>/`` namespace: ``get``/``check`` never see
  it and ``num_keys`` does not count it. ``add_member`` is one transaction, guarded by
  the epoch like every write: a put of the member key and a count-only range over the
  set's keys, which sees the put. ``remove_member`` is the same with a delete of the
  member key instead of the put (a set is its member keys: removing the last leaves
  none). ``members`` is one range read (keys only);
  ``try_get`` is one read, like ``get`` without the wait.
- Values are raw bytes; the store never decodes, evaluates or unpickles them.

Failures: transport errors and etcd's "unavailable" answers are retried ``retries``
times with backoff (:mod:`rdzv.stores.remote`), then raised as
:class:`~rdzv.errors.RendezvousConnectionError` naming the endpoint (password redacted).
A transaction whose reply was lost is resolved by reading: an unchanged ``mod_revision``
proves it did not apply (then it may be sent again, still conditional); for ``add``, the
record key tells. With ``user:password@`` the store authenticates and renews its token
when etcd reports it invalid. Once the epoch key is gone or different (the data
directory was wiped) or the cluster id in the replies changed, every call raises
``RendezvousConnectionError``.
"""

from __future__ import annotations

import base64
import contextlib
import enum
import json
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from rdzv.errors import RendezvousConnectionError
from rdzv.store import DEFAULT_STORE_TIMEOUT, MAX_SET_MEMBERS, as_bytes
from rdzv.stores.common import (
    cas_refusal,
    check_amount,
    check_key,
    check_keys,
    check_member,
    check_pairs,
    encode_counter,
    import_client,
    parse_counter,
    set_full_error,
    wait_seconds,
)
from rdzv.stores.remote import (
    OutcomeUnknown,
    RemoteStore,
    backoff_delays,
    parse_remote_url,
    prefix_param,
    retries_param,
    timeout_param,
    tls_params,
    with_retries,
)
from rdzv.stores.url import StoreUrlError

DEFAULT_PORT = 2379
DEFAULT_PREFIX = "rdzv"
DEFAULT_REQUEST_TIMEOUT_S = 10.0
"""Bound on one request's round trip (URL parameter ``request_timeout``)."""
DEFAULT_CONNECT_TIMEOUT_S = 5.0
"""Bound on opening one connection (URL parameter ``connect_timeout``)."""
SEEN_ENTRIES = 1_024
"""Bound on the per-store cache of (value, mod_revision) used by ``compare_set``."""
MAX_CAS_ROUNDS = 1_000
"""Bound on read-then-transaction rounds of one ``compare_set``/``add`` under contention."""
WATCH_PAUSE_MIN_S = 0.01
"""First pause before reading again after a watch that ended without events."""
WATCH_PAUSE_MAX_S = 0.2
"""Upper bound of that pause (it doubles from ``WATCH_PAUSE_MIN_S`` while watches keep
ending without events, and is never longer than what is left of the wait)."""
MAX_CONNECTIONS: int | None = None
"""The HTTP pool's cap on open connections: none. The bound is the number of threads
using the store at once: a thread holds at most one connection at a time (a request, or
a watch stream for as long as it waits). A cap would make a thread's request queue
behind other threads' watches, so a write that would wake them could not be sent until a
wait ended: with as many waiters as the cap, every wait would last its full timeout."""
MAX_KEEPALIVE_CONNECTIONS = 32
"""Idle connections the pool keeps open for reuse; more are closed when released."""
ETCD_MAX_TXN_OPS = 128
"""etcd's default ``--max-txn-ops``: it refuses ("too many operations in txn request") a
transaction whose longest list (compares, success ops or failure ops; it does not add
them up) holds more operations."""
TXN_KEYS = ETCD_MAX_TXN_OPS - 1
"""Most keys in one transaction of a multi-key call; more keys take several
transactions (see the module docstring). A read's success list holds one range per key
plus the range of the epoch key, so 127; a ``multi_set`` transaction holds one put per
key in its success list and the epoch guard, one compare, in its compare list, so 128
would fit, but one bound serves both."""
_PARAMS = (
    "prefix",
    "retries",
    "request_timeout",
    "connect_timeout",
    "ca",
    "cert",
    "key",
    "check_hostname",
)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return b"" if not text else base64.b64decode(text)


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix``."""
    raw = bytearray(prefix)
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\0"


class _Transient(Exception):
    """An answer worth retrying (etcd unavailable, token expired)."""


class _Watched(enum.Enum):
    """How one watch ended."""

    EVENTS = "events"
    """Events arrived: the key was written after the watch's start revision."""
    ENDED = "ended"
    """The stream ended (or etcd canceled the watch) without events: read again, after a
    pause (:class:`_WatchPause`)."""
    EXPIRED = "expired"
    """The caller's deadline passed."""


class _WatchPause:
    """The pause between a watch that ended without events and the next read of one
    wait: ``WATCH_PAUSE_MIN_S``, doubling up to ``WATCH_PAUSE_MAX_S``, cut to what is
    left before the deadline; a watch that delivered events starts it over."""

    def __init__(self) -> None:
        self._next = WATCH_PAUSE_MIN_S

    def after(self, watched: _Watched, deadline: float) -> None:
        if watched is not _Watched.ENDED:
            self._next = WATCH_PAUSE_MIN_S
            return
        time.sleep(max(0.0, min(self._next, deadline - time.monotonic())))
        self._next = min(self._next * 2, WATCH_PAUSE_MAX_S)


class EtcdStore(RemoteStore):
    """A store in the etcd cluster named by ``url`` (see the module docstring)."""

    _KIND = "etcd"
    _HINT = (
        "check that etcd runs and serves clients there (etcd --listen-client-urls), that no "
        "firewall blocks the port, and the credentials/TLS settings in the URL"
    )

    def __init__(self, url: str, *, timeout: timedelta = DEFAULT_STORE_TIMEOUT) -> None:
        httpx = import_client("httpx", extra="etcd", scheme="etcd")
        self._httpx = httpx
        parsed = parse_remote_url(url, DEFAULT_PORT, _PARAMS)
        if parsed.scheme not in ("etcd", "etcds"):
            raise StoreUrlError(f"{parsed.shown!r} is not an etcd:// or etcds:// URL")
        if parsed.path.strip("/"):
            raise StoreUrlError(
                f"{parsed.shown!r} has a path; etcd URLs are etcd://host:port "
                "(choose the namespace with ?prefix=...)"
            )
        if (parsed.username is None) != (parsed.password is None):
            raise StoreUrlError(f"{parsed.shown!r}: give both user and password (user:pw@host)")
        prefix = prefix_param(parsed, DEFAULT_PREFIX, "#")
        retries = retries_param(parsed)
        request_timeout = timeout_param(parsed, "request_timeout", DEFAULT_REQUEST_TIMEOUT_S)
        connect_timeout = timeout_param(parsed, "connect_timeout", DEFAULT_CONNECT_TIMEOUT_S)
        tls = tls_params(parsed, parsed.scheme == "etcds")
        super().__init__(parsed, prefix, retries, timeout)
        self._ns = f"{prefix}/".encode()
        self._connect_timeout = connect_timeout
        self._request_timeout = request_timeout
        self._user = parsed.username
        self._password = parsed.password
        self._token: str | None = None
        self._auth_lock = threading.Lock()
        self._cluster_id: str | None = None
        self._seen: dict[bytes, tuple[bytes, int]] = {}
        self._absent: dict[bytes, int] = {}
        """Keys this store last saw absent, with a revision at which they were: a wait
        for such a key to appear watches from there without reading it first."""
        scheme = "https" if tls is not None else "http"
        self._http = httpx.Client(
            base_url=f"{scheme}://{parsed.host}:{parsed.port}",
            timeout=httpx.Timeout(request_timeout, connect=connect_timeout),
            verify=True if tls is None else tls.context(),
            limits=httpx.Limits(
                max_connections=MAX_CONNECTIONS,
                max_keepalive_connections=MAX_KEEPALIVE_CONNECTIONS,
            ),
            trust_env=False,
        )
        self._epoch_key = f"{prefix}#epoch".encode()
        self._sets_ns = f"{prefix}#set/".encode()
        self._open_epoch()

    # -- plumbing --------------------------------------------------------------------

    def _close_client(self) -> None:
        self._http.close()

    def _k(self, key: str) -> bytes:
        return self._ns + check_key(key).encode("utf-8")

    def _set_prefix(self, key: str) -> bytes:
        """The common start of the etcd keys of set ``key``'s members."""
        name = check_key(key).encode("utf-8")
        return self._sets_ns + str(len(name)).encode("ascii") + b":" + name + b"/"

    def _headers(self) -> dict[str, str]:
        if self._user is None:
            return {}
        with self._auth_lock:
            if self._token is None:
                self._token = self._authenticate()
            return {"Authorization": self._token}

    def _authenticate(self) -> str:
        body = {"name": self._user, "password": self._password}
        reply = self._http.post("/v3/auth/authenticate", json=body)
        data = self._decode(reply, "authenticating", authenticating=True)
        token = data.get("token")
        if not isinstance(token, str):
            raise RendezvousConnectionError(
                f"etcd at {self._shown} answered authenticate without a token; is auth "
                "enabled on the server (etcdctl auth enable)?"
            )
        return token

    def _init_epoch(self) -> bytes:
        key = _b64(self._epoch_key)
        body = {
            "compare": [
                {"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
            ],
            "success": [{"request_put": {"key": key, "value": _b64(uuid.uuid4().hex.encode())}}],
        }
        self._post("/v3/kv/txn", body, "connecting")
        kvs, _ = self._range_raw([self._epoch_key])
        if kvs[0] is None:  # deleted in between: try again
            raise _Transient("the epoch key vanished right after it was created")
        return _unb64(kvs[0].get("value"))

    def _data_lost(self, seen: bytes | None) -> RendezvousConnectionError:
        return self._lose(
            f"etcd at {self._shown} lost this store's data (its epoch key "
            f"{self._epoch_key.decode()!r} holds {seen!r}, not {self._epoch!r}): its data "
            "directory was wiped, or the endpoint now names another cluster. The rendezvous "
            "state is gone: restart the job"
        )

    def _epoch_guard(self) -> list[dict[str, Any]]:
        """A transaction compare that holds only while the epoch token is ours."""
        if self._epoch is None:
            return []
        return [
            {
                "key": _b64(self._epoch_key),
                "target": "VALUE",
                "result": "EQUAL",
                "value": _b64(self._epoch),
            }
        ]

    def _decode(self, reply: Any, doing: str, authenticating: bool = False) -> dict[str, Any]:
        """The JSON body of a gateway reply, or the error it reports."""
        try:
            data = reply.json()
        except ValueError:
            data = None
        if reply.status_code == 200 and isinstance(data, dict):
            self._check_cluster(data.get("header"))
            return data
        message = ""
        if isinstance(data, dict):
            message = str(data.get("message") or data.get("error") or "")
        if not message:
            message = f"HTTP {reply.status_code}: {reply.text[:200]!r}"
        self._raise_for(message, doing, authenticating)
        raise AssertionError("unreachable")  # pragma: no cover

    def _raise_for(self, message: str, doing: str, authenticating: bool = False) -> None:
        low = message.lower()
        if "invalid auth token" in low or ("user name is empty" in low and self._user):
            with self._auth_lock:
                self._token = None  # renew on the next attempt
            if not authenticating:
                raise _Transient(message)
        if "authentication failed" in low or "user name is empty" in low:
            raise RendezvousConnectionError(
                f"etcd at {self._shown} refused the credentials while {doing} ({message}); "
                "check the user and password in the URL (etcd://user:password@host:port) "
                "against the server's users (etcdctl user list)"
            )
        if "permission denied" in low:
            raise RendezvousConnectionError(
                f"the etcd user of {self._shown} may not do what {doing} needs ({message}); "
                f"grant it readwrite on the key prefix {self._prefix!r} and "
                f"'{self._prefix}#' (etcdctl role grant-permission --prefix)"
            )
        if any(w in low for w in ("unavailable", "leader", "too many requests", "timed out")):
            raise _Transient(message)
        if "required revision has been compacted" in low:
            # Only a read of a later chunk names a past revision (``_range_raw``): etcd
            # compacted it away after the first chunk; read everything again. (A watch
            # from a compacted revision is canceled in its stream instead, see _watch.)
            raise _Transient(message)
        if "too many operations in txn" in low:
            raise RendezvousConnectionError(
                f"etcd at {self._shown} refused a transaction while {doing} ({message}): "
                f"this store puts up to {TXN_KEYS} keys in one transaction (one operation "
                "each, plus one for the epoch key), and this server allows fewer; start "
                f"etcd with --max-txn-ops={ETCD_MAX_TXN_OPS} or more (etcd's default)"
            )
        raise RendezvousConnectionError(
            f"etcd at {self._shown} failed while {doing}: {message}; check the server's log"
        )

    def _check_cluster(self, header: Any) -> None:
        if not isinstance(header, dict) or "cluster_id" not in header:
            return
        cluster = str(header["cluster_id"])
        if self._cluster_id is None:
            self._cluster_id = cluster
        elif cluster != self._cluster_id:
            raise self._lose(
                f"etcd at {self._shown} now serves cluster {cluster}, not {self._cluster_id}: "
                "its data directory was wiped or the endpoint moved, so the rendezvous state "
                "is gone; restart the job"
            )

    def _transient(self, exc: BaseException) -> bool:
        return isinstance(exc, self._httpx.TransportError | _Transient | OutcomeUnknown)

    def _post(self, path: str, body: dict[str, Any], doing: str) -> dict[str, Any]:
        """One request (no retry here; callers wrap it in :meth:`_call`)."""
        self._check_not_lost()
        reply = self._http.post(path, json=body, headers=self._headers())
        return self._decode(reply, doing)

    # -- gateway operations ---------------------------------------------------------

    def _ranges(self, ops: list[dict[str, Any]]) -> tuple[list[dict[str, Any] | None], int]:
        """Run the range ``ops`` in one transaction: each one's first kv (None if none),
        and the store's revision when it ran."""
        data = self._post("/v3/kv/txn", {"success": ops}, "reading")
        responses = data.get("responses", [])
        if len(responses) != len(ops):
            raise RendezvousConnectionError(
                f"etcd at {self._shown} answered a transaction of {len(ops)} reads with "
                f"{len(responses)} responses; check that the server is etcd 3.4 or later"
            )
        found: list[dict[str, Any] | None] = []
        for response in responses:
            kvs = response.get("response_range", {}).get("kvs", [])
            found.append(kvs[0] if kvs else None)
        return found, int(data.get("header", {}).get("revision", 0))

    def _range_raw(self, keys: Sequence[bytes]) -> tuple[list[dict[str, Any] | None], int]:
        """Read ``keys`` in one snapshot: their kvs (None when absent) and the revision.

        The first transaction reads up to ``TXN_KEYS`` keys and the epoch key at the
        store's current revision; further ones read the other keys, ``TXN_KEYS`` at a
        time, at that same revision, so the answer is one snapshot however many keys
        there are. A revision compacted away in between raises :class:`_Transient`
        (see :meth:`_raise_for`): the caller's retry reads everything again."""
        # Every read also reads the epoch token: data loss is noticed on the next read.
        first = [{"request_range": {"key": _b64(k)}} for k in (*keys[:TXN_KEYS], self._epoch_key)]
        found, revision = self._ranges(first)
        epoch = found.pop()
        seen = None if epoch is None else _unb64(epoch.get("value"))
        if self._epoch is not None and seen != self._epoch:
            raise self._data_lost(seen)
        if len(keys) > TXN_KEYS and revision < 1:
            raise RendezvousConnectionError(
                f"etcd at {self._shown} answered a read without its revision, so the rest "
                f"of a read of {len(keys)} keys cannot be read at the same revision; check "
                "that the server is etcd 3.4 or later"
            )
        at = {"revision": str(revision)}
        for start in range(TXN_KEYS, len(keys), TXN_KEYS):
            part = keys[start : start + TXN_KEYS]
            later, _ = self._ranges([{"request_range": {"key": _b64(k), **at}} for k in part])
            found += later
        for key, kv in zip(keys, found, strict=True):
            if kv is None:
                self._remember(key, None, revision)
            else:
                self._remember(key, _unb64(kv.get("value")), int(kv.get("mod_revision", 0)))
        return found, revision

    def _read(self, keys: Sequence[bytes], doing: str) -> tuple[list[bytes | None], int]:
        kvs, revision = self._call(doing, lambda: self._range_raw(keys))
        return [None if kv is None else _unb64(kv.get("value")) for kv in kvs], revision

    def _read_one(self, key: bytes, doing: str) -> tuple[bytes | None, int]:
        """The value of ``key`` (None when absent) and its ``mod_revision`` (0 then)."""
        kvs, _ = self._call(doing, lambda: self._range_raw([key]))
        kv = kvs[0]
        if kv is None:
            return None, 0
        return _unb64(kv.get("value")), int(kv.get("mod_revision", 0))

    def _txn_if_unchanged(
        self, key: bytes, mod_revision: int, puts: list[tuple[bytes, bytes]], doing: str
    ) -> tuple[bool, bytes | None, int]:
        """Write ``puts`` if ``key``'s mod_revision is still ``mod_revision``.

        Returns whether it did, and ``key``'s value (None when absent) and mod_revision
        afterwards (read in the same transaction when it did not write). Raises
        :class:`OutcomeUnknown` when the reply was lost."""
        body = {
            "compare": [
                {
                    "key": _b64(key),
                    "target": "MOD",
                    "result": "EQUAL",
                    "mod_revision": str(mod_revision),
                },
                *self._epoch_guard(),
            ],
            "success": [{"request_put": {"key": _b64(k), "value": _b64(v)}} for k, v in puts],
            "failure": [
                {"request_range": {"key": _b64(key)}},
                {"request_range": {"key": _b64(self._epoch_key)}},
            ],
        }
        try:
            data = self._post("/v3/kv/txn", body, doing)
        except (self._httpx.ConnectError, self._httpx.ConnectTimeout):
            raise  # never sent: an ordinary retry is safe
        except self._httpx.TransportError as exc:
            raise OutcomeUnknown(f"{doing}: the reply of a transaction was lost ({exc})") from exc
        if data.get("succeeded", False):
            revision = int(data.get("header", {}).get("revision", 0))
            self._remember(key, puts[0][1] if puts[0][0] == key else None, revision)
            return True, puts[0][1], revision
        kvs = [
            (r.get("response_range", {}).get("kvs") or [None])[0] for r in data.get("responses", [])
        ]
        if len(kvs) != 2:
            raise _Transient(f"{doing}: a transaction answered {len(kvs)} ranges, not 2")
        epoch = None if kvs[1] is None else _unb64(kvs[1].get("value"))
        if self._epoch is not None and epoch != self._epoch:
            raise self._data_lost(epoch)
        if kvs[0] is None:
            return False, None, 0
        value, mod = _unb64(kvs[0].get("value")), int(kvs[0].get("mod_revision", 0))
        self._remember(key, value, mod)
        return False, value, mod

    def _remember(self, key: bytes, value: bytes | None, mod_revision: int) -> None:
        """Cache the last value seen for ``key`` with its mod_revision: a compare_set
        whose expected value matches can skip its read (its transaction still compares
        the mod_revision, so a stale entry costs a failed attempt, never a wrong write)."""
        if value is None:
            self._seen.pop(key, None)
            if mod_revision > 0:
                if len(self._absent) >= SEEN_ENTRIES:
                    self._absent.clear()
                self._absent[key] = mod_revision
            return
        self._absent.pop(key, None)
        if len(self._seen) >= SEEN_ENTRIES:
            self._seen.clear()
        self._seen[key] = (value, mod_revision)

    # -- writes ----------------------------------------------------------------------

    def _guarded_write(self, ops: list[dict[str, Any]], doing: str) -> dict[str, Any]:
        """Run ``ops`` in a transaction that applies only while the epoch is ours."""
        body = {"compare": self._epoch_guard(), "success": ops}
        data = self._call(doing, lambda: self._post("/v3/kv/txn", body, doing))
        if not data.get("succeeded", False):
            self._call(doing, lambda: self._range_raw([]))  # raises the data-loss error
            raise self._data_lost(None)
        return data

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        """Set every pair: one transaction (all or nothing) for up to ``TXN_KEYS``
        distinct keys; more are written ``TXN_KEYS`` at a time in that many
        transactions, in order, each guarded by the epoch. Above ``TXN_KEYS`` keys the
        call is not atomic: a reader may see the first transactions' keys before the
        later ones, and an error part-way leaves the keys already written (the puts are
        blind: repeating the call is safe). A key given twice keeps its last value."""
        names = check_keys(keys)
        check_pairs(names, values)
        # One put per key (etcd refuses a transaction that puts a key twice); the last
        # value given wins, as if the pairs were set one after another.
        pairs = list({self._k(k): as_bytes(v) for k, v in zip(names, values, strict=True)}.items())
        for start in range(0, len(pairs), TXN_KEYS):
            ops = [
                {"request_put": {"key": _b64(k), "value": _b64(v)}}
                for k, v in pairs[start : start + TXN_KEYS]
            ]
            self._guarded_write(ops, "set")

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        full, want, new = self._k(key), as_bytes(expected), as_bytes(desired)
        # Start from what this store last saw of the key when it matches ``expected``
        # (one round trip), or from "absent" for an empty expectation; else read it.
        cached = self._seen.get(full)
        current: bytes | None
        if cached is not None and cached[0] == want:
            current, mod = cached
        elif not want:
            current, mod = None, 0
        else:
            current, mod = self._read_one(full, "compare_set")
        unknown = 0
        for _ in range(MAX_CAS_ROUNDS):
            refused = cas_refusal(current, want)
            if refused is not None:
                return refused
            try:
                written, current, mod = self._call_once_then_resolve(
                    full, mod, [(full, new)], "compare_set"
                )
            except OutcomeUnknown:
                # The reply was lost: read what happened instead of writing again.
                after, after_mod = self._read_one(full, "compare_set")
                if after_mod == mod:
                    unknown += 1
                    self._after_unknown(unknown, "compare_set")
                    current = after
                    continue  # provably not applied: decide again from the same state
                if after == new:
                    return new
                return want if after is None else after
            if written:
                return new
            # Not written: ``current``/``mod`` are the key as the transaction found it.
        raise RendezvousConnectionError(
            f"compare_set on {key!r} at {self._shown} lost {MAX_CAS_ROUNDS} races in a row "
            "to concurrent writers; something rewrites this key continuously"
        )

    def _call_once_then_resolve(
        self, key: bytes, mod: int, puts: list[tuple[bytes, bytes]], doing: str
    ) -> tuple[bool, bytes | None, int]:
        """Run the conditional transaction, retrying only errors that prove it was not
        sent; :class:`OutcomeUnknown` propagates to the caller, which resolves it by reading."""

        def transient(exc: BaseException) -> bool:
            return isinstance(exc, self._httpx.ConnectError | self._httpx.ConnectTimeout)

        def once() -> tuple[bool, bytes | None, int]:
            try:
                return self._txn_if_unchanged(key, mod, puts, doing)
            except _Transient as exc:
                # etcd answered "retry" (unavailable, timed out, token expired): a timed
                # out proposal may still commit, so this too is resolved by reading.
                raise OutcomeUnknown(str(exc)) from exc

        return with_retries(
            once, retries=self._retries, transient=transient, fail=self._fail(doing)
        )

    def _after_unknown(self, unknown: int, doing: str) -> None:
        """Back off before resending a transaction that provably did not apply; give up
        after ``retries`` unknown outcomes in one call."""
        delays = backoff_delays(self._retries)
        if unknown > len(delays):
            raise RendezvousConnectionError(
                f"the etcd store at {self._shown} failed while {doing}: {unknown} transactions "
                f"in a row got no usable answer; {self._HINT}"
            )
        time.sleep(delays[unknown - 1])

    def add(self, key: str, amount: int) -> int:
        full, amount = self._k(key), check_amount(amount)
        record = f"{self._prefix}#add/{uuid.uuid4().hex}".encode()
        unknown = 0
        # Only an add that returns deletes its record. An add that raises wrote none,
        # except when the server stopped answering between a lost reply and the read
        # that would resolve it: that record stays (it lies outside the namespace, so it
        # is harmless), as deleting it would wait through another full round of retries
        # on a server that just did not answer.
        for _ in range(MAX_CAS_ROUNDS):
            current, mod = self._read_one(full, "add")
            new = (0 if current is None else parse_counter(key, current)) + amount
            data = encode_counter(new)
            puts = [(full, data), (record, data)]
            try:
                written, _, _ = self._call_once_then_resolve(full, mod, puts, "add")
                if written:
                    self._forget(record)
                    return new
            except OutcomeUnknown:
                done, _ = self._read_one(record, "add")
                if done is not None:
                    self._forget(record)
                    return int(done)  # it happened: its result was recorded with it
                # Not applied (the record is written in the same transaction).
                unknown += 1
                self._after_unknown(unknown, "add")
        raise RendezvousConnectionError(
            f"add on {key!r} at {self._shown} lost {MAX_CAS_ROUNDS} races in a row"
        )

    def _forget(self, record: bytes) -> None:
        """Delete an applied ``add``'s record (retried; a failure is ignored: a leftover
        record is harmless, it lies outside the namespace)."""
        body = {"key": _b64(record)}
        with contextlib.suppress(RendezvousConnectionError):
            self._call("add", lambda: self._post("/v3/kv/deleterange", body, "add"))

    def delete_key(self, key: str) -> bool:
        ops = [{"request_delete_range": {"key": _b64(self._k(key))}}]
        data = self._guarded_write(ops, "delete_key")
        deleted = data.get("responses", [{}])[0].get("response_delete_range", {})
        return int(deleted.get("deleted", 0)) > 0

    def _member_write(self, start: bytes, first: dict[str, Any], what: str) -> list[Any]:
        """One transaction guarded like every write: ``first`` (the put or delete of a
        member's key), then a count of the set's keys, which sees it; both responses."""
        count = {
            "request_range": {
                "key": _b64(start),
                "range_end": _b64(_prefix_end(start)),
                "count_only": True,
            }
        }
        responses: list[Any] = self._guarded_write([first, count], what).get("responses", [])
        if len(responses) != 2:
            raise RendezvousConnectionError(
                f"etcd at {self._shown} answered {what} with {len(responses)} responses, "
                "not 2; check that the server is etcd 3.4 or later"
            )
        return responses

    def add_member(self, key: str, member: bytes | str) -> int:
        start, data = self._set_prefix(key), check_member(member)
        # The put is idempotent, so _guarded_write's retries may resend the transaction
        # after an unknown outcome (a lost reply, etcd "timed out"): the member is there
        # once either way. The size is then the one at the resend, which may count
        # members other callers added in between.
        put = {"request_put": {"key": _b64(start + data), "value": "", "prev_kv": True}}
        responses = self._member_write(start, put, "add_member")
        existed = bool(responses[0].get("response_put", {}).get("prev_kv"))
        size = int(responses[1].get("response_range", {}).get("count", 0))
        if size > MAX_SET_MEMBERS and not existed:
            # etcd cannot compare a count inside a transaction: take the new member out
            # again, so the set exceeds the bound only for this moment.
            undo = [{"request_delete_range": {"key": _b64(start + data)}}]
            self._guarded_write(undo, "add_member")
            raise set_full_error(key, self._shown, MAX_SET_MEMBERS)
        return size

    def remove_member(self, key: str, member: bytes | str) -> int:
        start, data = self._set_prefix(key), check_member(member)
        # The delete is idempotent, so _guarded_write's retries may resend the
        # transaction after an unknown outcome: the member is gone either way, and the
        # size is the one at the resend.
        delete = {"request_delete_range": {"key": _b64(start + data)}}
        responses = self._member_write(start, delete, "remove_member")
        return int(responses[1].get("response_range", {}).get("count", 0))

    # -- reads -----------------------------------------------------------------------

    def members(self, key: str) -> list[bytes]:
        start = self._set_prefix(key)
        ops = [
            {
                "request_range": {
                    "key": _b64(start),
                    "range_end": _b64(_prefix_end(start)),
                    "keys_only": True,
                }
            },
            {"request_range": {"key": _b64(self._epoch_key)}},
        ]
        reply = self._call("members", lambda: self._post("/v3/kv/txn", {"success": ops}, "members"))
        responses = reply.get("responses", [])
        if len(responses) != 2:
            raise RendezvousConnectionError(
                f"etcd at {self._shown} answered a members read with {len(responses)} "
                "responses, not 2; check that the server is etcd 3.4 or later"
            )
        epoch = responses[1].get("response_range", {}).get("kvs") or [None]
        seen = None if epoch[0] is None else _unb64(epoch[0].get("value"))
        if self._epoch is not None and seen != self._epoch:
            raise self._data_lost(seen)
        kvs = responses[0].get("response_range", {}).get("kvs") or []
        return sorted(_unb64(kv.get("key"))[len(start) :] for kv in kvs)

    def try_get(self, key: str) -> bytes | None:
        values, _ = self._read([self._k(key)], "try_get")
        return values[0]

    def check(self, keys: Sequence[str]) -> bool:
        full = [self._k(k) for k in check_keys(keys)]
        if not full:
            return True
        values, _ = self._read(full, "check")
        return all(v is not None for v in values)

    def num_keys(self) -> int:
        ops = [
            {
                "request_range": {
                    "key": _b64(self._ns),
                    "range_end": _b64(_prefix_end(self._ns)),
                    "count_only": True,
                }
            }
        ]
        data = self._guarded_write(ops, "num_keys")  # guarded: a wiped server is reported
        counted = data.get("responses", [{}])[0].get("response_range", {})
        return int(counted.get("count", 0))

    def _await_values(self, names: list[str], seconds: float) -> list[bytes] | None:
        return self._await_present([self._k(k) for k in names], seconds, "get")

    def _await_keys(self, names: list[str], seconds: float) -> bool:
        return self._await_present(sorted({self._k(k) for k in names}), seconds, "wait") is not None

    def _await_present(self, full: list[bytes], seconds: float, doing: str) -> list[bytes] | None:
        """The values of ``full`` once all exist, None after ``seconds``; between reads
        it watches the first missing key."""
        deadline = time.monotonic() + seconds
        pause = _WatchPause()
        while True:  # bounded by the deadline: each pass watches or pauses
            values, revision = self._read(full, doing)
            missing = [k for k, v in zip(full, values, strict=True) if v is None]
            if not missing:
                return [v for v in values if v is not None]
            watched = self._watch(missing[0], revision, deadline, doing)
            if watched is _Watched.EXPIRED:
                return None
            pause.after(watched, deadline)

    def seen(self, key: str) -> bytes | None:
        """The latest value of ``key`` this store saw (read, written, or delivered by a
        watch while waiting); it may have changed since: confirm it with
        :meth:`unchanged`. None if none. An rdzv extension that saves the re-read after
        a wake-up."""
        cached = self._seen.get(self._k(check_key(key)))
        return None if cached is None else cached[0]

    def unchanged(self, key: str, current: bytes) -> bool:
        """True if ``key`` still holds ``current``: when this client last saw ``current``
        at some revision, one keys-only read compares the revision (the value does not
        cross the network); otherwise False (the caller reads the value)."""
        full = self._k(check_key(key))
        cached = self._seen.get(full)
        if cached is None or cached[0] != current:
            return False
        ops = [
            {"request_range": {"key": _b64(k), "keys_only": True}} for k in (full, self._epoch_key)
        ]
        data = self._call(
            "unchanged", lambda: self._post("/v3/kv/txn", {"success": ops}, "unchanged")
        )
        found = [
            (r.get("response_range", {}).get("kvs") or [None])[0] for r in data.get("responses", [])
        ]
        if len(found) != 2 or found[1] is None:
            return False  # let a full read report what happened (e.g. a wiped server)
        kv = found[0]
        return kv is not None and int(kv.get("mod_revision", 0)) == cached[1]

    def wait_for_change(self, key: str, current: bytes | None, timeout: timedelta) -> bool:
        full = self._k(key)
        deadline = time.monotonic() + wait_seconds(timeout)
        cached = self._seen.get(full)
        # The value after the last event a watch delivered: an event that shows a
        # different value answers without another read.
        last: list[bytes | None] = []
        # When the key held ``current`` at revision cached[1] (or, for ``current`` None,
        # was absent at a known revision), a watch from just after it replays any later
        # change, so the first read can be skipped.
        since = None
        if current is not None and cached is not None and cached[0] == current:
            since = cached[1]
        elif current is None and cached is None:
            since = self._absent.get(full)
        pause = _WatchPause()
        if since is not None:
            watched = self._watch(full, since, deadline, "wait_for_change", last)
            if watched is _Watched.EXPIRED:
                return False
            if last and last[0] != current:
                return True
            pause.after(watched, deadline)
        while True:  # bounded by the deadline: each pass watches or pauses
            values, revision = self._read([full], "wait_for_change")
            if values[0] != current:
                return True
            last.clear()
            watched = self._watch(full, revision, deadline, "wait_for_change", last)
            if watched is _Watched.EXPIRED:
                return False
            if last and last[0] != current:
                return True
            pause.after(watched, deadline)

    def _watch(
        self,
        key: bytes,
        revision: int,
        deadline: float,
        doing: str,
        last: list[bytes | None] | None = None,
    ) -> _Watched:
        """Sleep until ``key`` is written after ``revision`` (``EVENTS``), the stream
        ends without events (``ENDED``: the server or a proxy closed it, or etcd canceled
        the watch for a compacted history; look again), or the deadline passes
        (``EXPIRED``). When events arrived and ``last`` is given, it receives the key's
        value after the last one (None for a delete)."""
        if time.monotonic() >= deadline:
            return _Watched.EXPIRED
        body = {"create_request": {"key": _b64(key), "start_revision": str(revision + 1)}}

        def once() -> _Watched:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return _Watched.EXPIRED
            timeout = self._httpx.Timeout(
                self._request_timeout, connect=self._connect_timeout, read=remaining
            )
            try:
                with self._http.stream(
                    "POST", "/v3/watch", json=body, headers=self._headers(), timeout=timeout
                ) as reply:
                    if reply.status_code != 200:
                        reply.read()
                        self._decode(reply, doing)
                    for line in reply.iter_lines():  # ends by an event or the read timeout
                        if not line.strip():
                            continue
                        message = json.loads(line)
                        if "error" in message:
                            error = message["error"]
                            self._raise_for(str(error.get("message", error)), doing)
                        result = message.get("result", {})
                        self._check_cluster(result.get("header"))
                        events = result.get("events")
                        if events and last is not None:
                            final = events[-1]
                            deleted = final.get("type") == "DELETE"
                            kv = final.get("kv", {})
                            last[:] = [None if deleted else _unb64(kv.get("value"))]
                            self._remember(key, last[0], int(kv.get("mod_revision", 0)))
                        if events:
                            return _Watched.EVENTS
                        if result.get("canceled"):
                            return _Watched.ENDED
                        if time.monotonic() >= deadline:
                            return _Watched.EXPIRED
            except self._httpx.ReadTimeout:
                if time.monotonic() >= deadline - 0.001:
                    return _Watched.EXPIRED
                raise
            # The server (or a proxy) ended the stream without events: look again.
            return _Watched.ENDED

        return self._call(doing, once, deadline, expired=lambda: _Watched.EXPIRED)


def open_etcd(url: str, timeout: timedelta) -> EtcdStore:
    """Opener for ``etcd://`` and ``etcds://`` (see :func:`rdzv.stores.open_store`)."""
    return EtcdStore(url, timeout=timeout)
