"""A store on a Redis server: ``redis://[user:password@]host:port/db`` and ``rediss://``.

Theory of operation:

- Keys of one store live under a namespace (URL parameter ``prefix``, default ``rdzv``):
  store key ``k`` is the Redis key ``<prefix>:k``. A Redis set ``<prefix>#index`` lists
  the namespace's keys, so ``num_keys`` is one ``SCARD`` rather than a scan.
- Every write is a Lua script that writes the value(s), maintains the index, optionally
  sets an expiry (``ttl``), and ``PUBLISH``\\ es on the key's change channel
  ``__rdzv__:<db>:<redis key>`` in the same atomic step. Blocking calls (``get`` and
  ``wait`` of missing keys, ``wait_for_change``) subscribe to the channels of their keys,
  then read, then sleep in ``get_message`` until a publication or their deadline, and
  re-read: a write after the read is always published after the subscription, so no
  wake-up is lost and nothing polls.
- A wait unsubscribes before it returns and reads up to the server's confirmation: the
  server queues every publication for a subscribed connection, and nobody reads one
  between waits, so a subscription that outlived its wait would pile up every later
  write's publication in the server's memory (until ``client-output-buffer-limit
  pubsub`` dropped the connection). The connection itself is kept for the thread's next
  wait, and closed once its thread has ended (at another thread's next wait) or by
  ``close``.
- ``compare_set`` is one Lua script (read, compare, write, publish). ``add`` is one Lua
  script that ``INCRBY``\\ s and records its result under a per-call token for
  ``ADD_RECORD_S`` seconds.
- Member sets (:class:`~rdzv.store.SetStore`): set ``k`` is the Redis set
  ``<prefix>#set:k``, outside the ``<prefix>:`` key namespace and its index, so
  ``get``/``check`` never see it and ``num_keys`` does not count it. ``add_member`` is one
  Lua script (bound check, ``SADD``, ``SCARD``, expiry); ``remove_member`` is one Lua
  script (``SREM``, ``SCARD``, and the expiry renewed while members remain: Redis
  deletes a set whose last member goes, which is exactly an empty set here);
  ``members`` is one ``SMEMBERS``, sorted here; ``try_get`` is one ``GET``.
- Values are raw bytes; the store never decodes, evaluates or unpickles them.
- Foreign data: a key of the namespace that holds another Redis type than the store
  keeps there (a hash or list where a string belongs, say) is reported as
  :class:`~rdzv.errors.RendezvousStateError` naming the key and its type, by every call
  that reads it (``get``, ``try_get``, ``check``, ``wait``, ``compare_set``, ``add``,
  ``wait_for_change``, the member-set calls), and left as found. Reads that Redis answers
  without an error for such a key (``MGET`` gives nil, ``EXISTS`` counts it) go through
  small Lua scripts that check each key's type.

Failures: connection errors and socket timeouts are retried ``retries`` times with
backoff (:mod:`rdzv.stores.remote`), then raised as
:class:`~rdzv.errors.RendezvousConnectionError` naming the endpoint (password redacted).
Authentication errors are raised at once. When a ``compare_set`` or ``add`` loses its
connection after sending, the outcome is unknown; it is resolved by reading (the value
now equals ``desired``, or the ``add`` token's record exists), and the write is repeated
only when that read proves it did not happen.

Data loss: at open, the store reads (or creates) an epoch token ``<prefix>#epoch``.
Every new connection checks it; a server that restarted without persistence no longer
has it, and every call then raises ``RendezvousConnectionError`` instead of silently
working on an empty store.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, cast

from rdzv.errors import RendezvousConnectionError, RendezvousError, RendezvousStateError
from rdzv.store import DEFAULT_STORE_TIMEOUT, MAX_SET_MEMBERS, as_bytes
from rdzv.stores.common import (
    check_amount,
    check_key,
    check_keys,
    check_member,
    check_pairs,
    import_client,
    parse_counter,
    set_full_error,
    wait_seconds,
)
from rdzv.stores.remote import (
    OutcomeUnknown,
    RemoteStore,
    RemoteUrl,
    float_param,
    parse_remote_url,
    prefix_param,
    retries_param,
    timeout_param,
    tls_params,
)
from rdzv.stores.url import StoreUrlError

DEFAULT_PORT = 6379
DEFAULT_PREFIX = "rdzv"
DEFAULT_SOCKET_TIMEOUT_S = 10.0
"""Bound on one request's round trip (URL parameter ``socket_timeout``)."""
DEFAULT_CONNECT_TIMEOUT_S = 5.0
"""Bound on opening one connection (URL parameter ``connect_timeout``)."""
ADD_RECORD_S = 600
"""How long ``add`` keeps the record that lets a retry after a lost reply find its result."""
MIN_TTL_S = 1.0
"""Smallest ``ttl`` (seconds): a shorter expiry would drop keys before peers read them."""
MAX_TTL_S = 10 * 365 * 86_400.0
"""Largest ``ttl`` (ten years, in seconds); Redis refuses expiries whose milliseconds
overflow, and a longer one is no expiry at all in practice."""
_PARAMS = (
    "prefix",
    "ttl",
    "retries",
    "socket_timeout",
    "connect_timeout",
    "ca",
    "cert",
    "key",
    "check_hostname",
)

# KEYS: k1..kn.  Returns {'ok', {v1..vn}} (false, a nil reply, for an absent key), or
# {'type', key, type} for the first key that holds another Redis type than a string
# (MGET would answer nil for it, as if it were absent).
_READ = """
local out = {}
for i = 1, #KEYS do
  local v = redis.pcall('GET', KEYS[i])
  if type(v) == 'table' then
    return {'type', KEYS[i], redis.call('TYPE', KEYS[i])['ok']}
  end
  out[i] = v
end
return {'ok', out}
"""

# KEYS: k1..kn (distinct).  Returns {'ok', how many exist}, or {'type', key, type} for
# the first key that holds another Redis type than a string (EXISTS would count it).
_PRESENT = """
local n = 0
for i = 1, #KEYS do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t == 'string' then
    n = n + 1
  elseif t ~= 'none' then
    return {'type', KEYS[i], t}
  end
end
return {'ok', n}
"""

# KEYS: k1..kn, index.  ARGV: ttl_ms, v1..vn, channel1..channeln.
_SET = """
local n = #KEYS - 1
local ttl = tonumber(ARGV[1])
for i = 1, n do
  if ttl > 0 then
    redis.call('SET', KEYS[i], ARGV[1 + i], 'PX', ttl)
  else
    redis.call('SET', KEYS[i], ARGV[1 + i])
  end
  redis.call('SADD', KEYS[n + 1], KEYS[i])
  redis.call('PUBLISH', ARGV[1 + n + i], '1')
end
if ttl > 0 then redis.call('PEXPIRE', KEYS[n + 1], ttl) end
return n
"""

# KEYS: key, index.  ARGV: expected, desired, ttl_ms, channel.  Returns {written, value}.
_CAS = """
local cur = redis.call('GET', KEYS[1])
if cur == false then
  if ARGV[1] ~= '' then return {0, ARGV[1]} end
elseif cur ~= ARGV[1] then
  return {0, cur}
end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
else
  redis.call('SET', KEYS[1], ARGV[2])
end
redis.call('SADD', KEYS[2], KEYS[1])
redis.call('PUBLISH', ARGV[4], '1')
return {1, ARGV[2]}
"""

# KEYS: key, index, record.  ARGV: amount, ttl_ms, channel, record_s.
# Returns {'ok', new} or {'bad', current value}.
_ADD = """
local done = redis.call('GET', KEYS[3])
if done then return {'ok', done} end
local cur = redis.call('GET', KEYS[1])
if cur and not string.match(cur, '^%-?%d+$') then return {'bad', cur} end
local ok = pcall(redis.call, 'INCRBY', KEYS[1], ARGV[1])
if not ok then return {'bad', cur} end
-- Lua numbers are doubles: read the exact 64-bit result back as a string.
local new = redis.call('GET', KEYS[1])
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
end
redis.call('SADD', KEYS[2], KEYS[1])
redis.call('SET', KEYS[3], new, 'EX', tonumber(ARGV[4]))
redis.call('PUBLISH', ARGV[3], '1')
return {'ok', new}
"""

# KEYS: set.  ARGV: member, most members, ttl_ms.  Returns the size after, or -1 when
# the member is new and the set is full.
_ADD_MEMBER = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0
   and redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return -1
end
redis.call('SADD', KEYS[1], ARGV[1])
local ttl = tonumber(ARGV[3])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return redis.call('SCARD', KEYS[1])
"""

# KEYS: set.  ARGV: member, ttl_ms.  Returns the size after.  SREM of the last member
# deletes the set (and its expiry); a set that keeps members has its expiry renewed, as
# every write renews the expiry of what it writes.
_REMOVE_MEMBER = """
redis.call('SREM', KEYS[1], ARGV[1])
local size = redis.call('SCARD', KEYS[1])
local ttl = tonumber(ARGV[2])
if ttl > 0 and size > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return size
"""

# KEYS: key.  ARGV: the SHA-1 (hex) of the value the caller holds, or "" for "absent".
# Returns 1 when the key's value differs from that, 0 when it is the same: a caller learns
# whether a (possibly large) value changed without the value crossing the network.
_CHANGED = """
local v = redis.call('GET', KEYS[1])
if v == false then
  if ARGV[1] == '' then return 0 end
  return 1
end
if redis.sha1hex(v) == ARGV[1] then return 0 end
return 1
"""

# KEYS: key.  ARGV: as _CHANGED.  Returns {0} when the value is the caller's, {1} when the
# key is absent (and the caller's is not), {2, value} when it holds another value: a waiter
# that wakes learns the new value in the same round trip.
_FETCH_IF_CHANGED = """
local v = redis.call('GET', KEYS[1])
if v == false then
  if ARGV[1] == '' then return {0} end
  return {1}
end
if redis.sha1hex(v) == ARGV[1] then return {0} end
return {2, v}
"""
SEEN_ENTRIES = 64
"""Bound on the values a store remembers from its waits (see :meth:`RedisStore.seen`)."""

# KEYS: key, index.  ARGV: channel.
_DELETE = """
local n = redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], KEYS[1])
if n > 0 then redis.call('PUBLISH', ARGV[1], '1') end
return n
"""


class RedisStore(RemoteStore):
    """A store in the Redis server named by ``url`` (see the module docstring)."""

    _KIND = "Redis"
    _HINT = (
        "check that redis-server runs and listens there, that no firewall blocks the port, "
        "and the password/TLS settings in the URL"
    )

    def __init__(self, url: str, *, timeout: timedelta = DEFAULT_STORE_TIMEOUT) -> None:
        redis = import_client("redis", extra="redis", scheme="redis")
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._redis: Any = redis
        parsed = parse_remote_url(url, DEFAULT_PORT, _PARAMS)
        if parsed.scheme not in ("redis", "rediss"):
            raise StoreUrlError(f"{parsed.shown!r} is not a redis:// or rediss:// URL")
        db = _db_of(parsed)
        prefix = prefix_param(parsed, DEFAULT_PREFIX, "#:")
        ttl = float_param(
            parsed,
            "ttl",
            None,
            MIN_TTL_S,
            MAX_TTL_S,
            "keys must outlive the time peers take to read them, and Redis refuses "
            "expiries beyond its range (ten years is the most this store sets)",
        )
        retries = retries_param(parsed)
        socket_timeout = timeout_param(parsed, "socket_timeout", DEFAULT_SOCKET_TIMEOUT_S)
        connect_timeout = timeout_param(parsed, "connect_timeout", DEFAULT_CONNECT_TIMEOUT_S)
        tls = tls_params(parsed, parsed.scheme == "rediss")
        super().__init__(parsed, prefix, retries, timeout)
        self._db = db
        self._ttl_ms = 0 if ttl is None else round(ttl * 1000)
        self._index = f"{prefix}#index"
        self._epoch_key = f"{prefix}#epoch"
        self._socket_timeout = socket_timeout
        self._lock = threading.Lock()
        # One subscriber connection per thread that waits, kept between its waits (a new
        # connection per wait costs a handshake, which dominates with many waiters) but
        # subscribed only during a wait; listed with a weak reference to its thread, so
        # the connection of a thread that ended is closed (see _subscriber).
        self._subscribers = threading.local()
        self._all_subscribers: list[tuple[weakref.ref[threading.Thread], Any]] = []
        tls_kwargs: dict[str, Any] = {}
        if tls is not None:
            tls_kwargs = {
                "ssl": True,
                "ssl_ca_certs": tls.ca,
                "ssl_certfile": tls.cert,
                "ssl_keyfile": tls.key,
                "ssl_check_hostname": tls.check_hostname,
            }
        # Typed as Any: redis-py's stubs do not describe bytes replies or Lua scripts.
        self._client: Any = redis.Redis(
            host=parsed.host,
            port=parsed.port,
            db=self._db,
            username=parsed.username,
            password=parsed.password,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            retry=Retry(NoBackoff(), 0),  # retries are ours: see rdzv.stores.remote
            # redis-py calls it with the new connection (its stubs say no argument).
            redis_connect_func=cast(Any, self._on_connect),
            **tls_kwargs,
        )
        self._set_script: Any = self._client.register_script(_SET)
        self._cas_script: Any = self._client.register_script(_CAS)
        self._add_script: Any = self._client.register_script(_ADD)
        self._delete_script: Any = self._client.register_script(_DELETE)
        self._add_member_script: Any = self._client.register_script(_ADD_MEMBER)
        self._remove_member_script: Any = self._client.register_script(_REMOVE_MEMBER)
        self._changed_script: Any = self._client.register_script(_CHANGED)
        self._fetch_script: Any = self._client.register_script(_FETCH_IF_CHANGED)
        self._read_script: Any = self._client.register_script(_READ)
        self._present_script: Any = self._client.register_script(_PRESENT)
        self._seen: dict[str, bytes] = {}
        self._open_epoch()

    # -- plumbing --------------------------------------------------------------------

    @property
    def ttl(self) -> float | None:
        """Seconds after its last write that a key expires (the URL's ``ttl``); None
        when keys never expire."""
        return None if self._ttl_ms == 0 else self._ttl_ms / 1000

    def _close_client(self) -> None:
        with self._lock:
            subscribers, self._all_subscribers = self._all_subscribers, []
        for _, pubsub in subscribers:
            pubsub.close()
        self._client.close()

    def _subscriber(self) -> Any:
        """This thread's subscriber connection (created on first use). Also closes the
        subscriber connections of threads that have ended: nobody can use them again."""
        pubsub = getattr(self._subscribers, "pubsub", None)
        created = None
        if pubsub is None:
            pubsub = created = self._client.pubsub()
            self._subscribers.pubsub = pubsub
        ended = []
        with self._lock:
            keep = []
            for owner, other in self._all_subscribers:
                thread = owner()
                if thread is None or not thread.is_alive():
                    ended.append(other)
                else:
                    keep.append((owner, other))
            if created is not None:
                keep.append((weakref.ref(threading.current_thread()), created))
            self._all_subscribers = keep
        for other in ended:
            other.close()
        return pubsub

    def _drop_subscriber(self) -> None:
        """Close this thread's subscriber after an error (the next wait makes a new one);
        the server ends a closed connection's subscriptions."""
        pubsub = getattr(self._subscribers, "pubsub", None)
        if pubsub is None:
            return
        self._subscribers.pubsub = None
        with self._lock:
            self._all_subscribers = [e for e in self._all_subscribers if e[1] is not pubsub]
        pubsub.close()

    def _unsubscribe(self, pubsub: Any, channels: Sequence[str]) -> bool:
        """End the subscription to ``channels`` and read up to the server's confirmation
        (one round trip), discarding publications that arrived before it; then the
        connection holds nothing and the server queues nothing more for it. False when
        the server did not confirm within ``socket_timeout`` or the connection failed:
        the caller then closes the connection, which ends the subscription too."""
        pending = {c.encode() for c in channels}
        end = time.monotonic() + self._socket_timeout
        try:
            pubsub.unsubscribe(*channels)
            # Bounded by socket_timeout; redis-py marks the connection unsubscribed once
            # the last confirmation is read.
            while pending and pubsub.subscribed:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return False
                message = pubsub.get_message(timeout=remaining)
                if message is not None and message.get("type") == "unsubscribe":
                    name = message.get("channel")
                    pending.discard(name.encode() if isinstance(name, str) else name)
        except (self._redis.RedisError, OSError):
            return False
        return not pending

    def _init_epoch(self) -> bytes:
        self._client.set(self._epoch_key, uuid.uuid4().hex, nx=True)
        value = self._client.get(self._epoch_key)
        if value is None:  # deleted in between: a flush; try once more on the next call
            raise self._redis.ConnectionError("the epoch key vanished right after SET NX")
        return bytes(value)

    def _on_connect(self, conn: Any) -> None:
        """Runs on every new connection: authenticate, then check the epoch token."""
        conn.on_connect()
        epoch = self._epoch
        if epoch is None:
            return
        conn.send_command("GET", self._epoch_key)
        seen = conn.read_response()
        if seen != epoch:
            lost = self._lose(
                f"the Redis server at {self._shown} lost this store's data (its epoch key "
                f"{self._epoch_key!r} holds {seen!r}, not {epoch!r}): it restarted without "
                "persistence, or was flushed. The rendezvous state is gone: restart the job "
                "(enable appendonly on the server to survive restarts)"
            )
            conn.disconnect()
            raise lost

    def _transient(self, exc: BaseException) -> bool:
        redis = self._redis
        if isinstance(exc, redis.AuthenticationError | redis.exceptions.AuthorizationError):
            return False
        return isinstance(
            exc, redis.ConnectionError | redis.TimeoutError | OutcomeUnknown | OSError
        )

    def _explain(self, exc: Exception, doing: str, keys: Sequence[str]) -> RendezvousError | None:
        redis = self._redis
        if isinstance(exc, redis.ResponseError) and "WRONGTYPE" in str(exc):
            return self._wrong_type(keys, doing, exc)
        if isinstance(exc, redis.AuthenticationError | redis.exceptions.AuthorizationError):
            return RendezvousConnectionError(
                f"the Redis server at {self._shown} refused the credentials while {doing} "
                f"({exc}); check the user and password in the URL "
                "(redis://user:password@host:port/db) against the server's requirepass/ACL"
            )
        if isinstance(exc, redis.exceptions.NoPermissionError):
            return RendezvousConnectionError(
                f"the Redis user of {self._shown} may not run what {doing} needs ({exc}); "
                "grant it the commands GET SET DEL EXISTS MGET INCRBY SADD SREM SCARD "
                "SISMEMBER SMEMBERS PEXPIRE EVALSHA SCRIPT PUBLISH SUBSCRIBE on the prefix's "
                "keys"
            )
        if isinstance(exc, redis.RedisError):
            return RendezvousConnectionError(
                f"the Redis server at {self._shown} failed while {doing} "
                f"({type(exc).__name__}: {exc}); check the server's log"
            )
        return None

    def _expected_type(self, full: str) -> str:
        """The Redis type this store keeps at the Redis key ``full``."""
        if full == self._index or full.startswith(f"{self._prefix}#set:"):
            return "set"
        return "string"

    def _foreign(self, full: str, kind: str, doing: str) -> RendezvousStateError:
        """The error for the Redis key ``full`` holding a ``kind`` (a Redis type) where
        this store keeps another type."""
        expected = self._expected_type(full)
        plain = f"{self._prefix}:"
        named = f" (store key {full[len(plain) :]!r})" if full.startswith(plain) else ""
        return RendezvousStateError(
            f"the Redis key {full!r}{named} at {self._shown} holds a Redis {kind}, where "
            f"this store keeps a {expected}: {doing} cannot use it, and left it as found. "
            "Another program wrote it, or uses this store's prefix "
            f"{self._prefix!r} too. Delete the key (redis-cli -n {self._db} DEL "
            f"'{full}') once no node of the job uses it, or give the job a prefix of its "
            "own (?prefix=... in the URL)"
        )

    def _wrong_type(self, keys: Sequence[str], doing: str, exc: Exception) -> RendezvousStateError:
        """Redis answered WRONGTYPE: name the key among ``keys`` that holds a foreign
        type (asking the server for their types), or, when that fails, say what is known."""
        try:
            pipe = self._client.pipeline(transaction=False)
            for full in keys:
                pipe.type(full)
            kinds = pipe.execute()
        except self._redis.RedisError:
            kinds = []
        for full, raw in zip(keys, kinds, strict=False):
            kind = raw.decode() if isinstance(raw, bytes) else str(raw)
            if kind not in ("none", self._expected_type(full)):
                return self._foreign(full, kind, doing)
        return RendezvousStateError(
            f"a Redis key under the prefix {self._prefix!r} at {self._shown} holds another "
            f"Redis type than this store keeps there, so {doing} failed ({exc}); another "
            "program writes under this prefix: give the job a prefix of its own "
            "(?prefix=... in the URL), or delete the foreign keys"
        )

    def _checked(self, reply: Any, doing: str) -> Any:
        """The payload of a ``_READ``/``_PRESENT`` reply; a foreign type is an error."""
        status = bytes(reply[0])
        if status == b"type":
            raise self._foreign(bytes(reply[1]).decode(), bytes(reply[2]).decode(), doing)
        return reply[1]

    def _k(self, key: str) -> str:
        return f"{self._prefix}:{check_key(key)}"

    def _set_key(self, key: str) -> str:
        return f"{self._prefix}#set:{check_key(key)}"

    def _channel(self, full_key: str) -> str:
        # Pub/sub channels are global to the server, not per database.
        return f"__rdzv__:{self._db}:{full_key}"

    # -- writes ----------------------------------------------------------------------

    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        names = check_keys(keys)
        check_pairs(names, values)
        if not names:
            return
        full = [self._k(k) for k in names]
        data = [as_bytes(v) for v in values]
        args: list[Any] = [self._ttl_ms, *data, *(self._channel(k) for k in full)]
        self._call(
            "set",
            lambda: self._set_script(keys=[*full, self._index], args=args),
            keys=[self._index],
        )

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        full, want, new = self._k(key), as_bytes(expected), as_bytes(desired)
        args = [want, new, self._ttl_ms, self._channel(full)]

        def attempt() -> bytes:
            try:
                _, value = self._cas_script(keys=[full, self._index], args=args)
            except (self._redis.ConnectionError, self._redis.TimeoutError) as exc:
                if isinstance(exc, self._redis.AuthenticationError):
                    raise
                return self._resolve_cas(full, want, new, exc)
            return bytes(value)

        return self._call("compare_set", attempt, keys=[full, self._index])

    def _resolve_cas(self, full: str, want: bytes, new: bytes, exc: BaseException) -> bytes:
        """The reply of a compare_set was lost: find out by reading what happened."""
        try:
            current = self._client.get(full)
        except (self._redis.ConnectionError, self._redis.TimeoutError):
            # Still unreachable: try the whole thing again (it re-reads first).
            raise OutcomeUnknown(f"compare_set on {full!r} lost its reply ({exc})") from exc
        if current is not None and bytes(current) == new:
            return new  # it happened (or someone wrote the same bytes: the same state)
        if (current is None and not want) or (current is not None and bytes(current) == want):
            # The write did not happen: the CAS may be sent again, still conditional.
            raise OutcomeUnknown(f"compare_set on {full!r} lost its reply and did not apply")
        return want if current is None else bytes(current)

    def add(self, key: str, amount: int) -> int:
        full, amount = self._k(key), check_amount(amount)
        record = f"{self._prefix}#add:{uuid.uuid4().hex}"
        args = [amount, self._ttl_ms, self._channel(full), ADD_RECORD_S]
        # Running the script again with the same record key is exactly-once: a retry
        # after a lost reply returns the recorded result instead of adding twice.
        status, value = self._call(
            "add",
            lambda: self._add_script(keys=[full, self._index, record], args=args),
            keys=[full, self._index, record],
        )
        if status == b"bad":
            parse_counter(key, bytes(value))  # raises the ValueError for a non-counter
            raise ValueError(
                f"key {key!r} holds {bytes(value)[:40]!r}, which Redis cannot add to "
                "(out of the 64-bit range, or leading zeros); set it to plain digits first"
            )
        return int(value)

    def delete_key(self, key: str) -> bool:
        full = self._k(key)
        args = [self._channel(full)]
        # A retry after a lost reply may report False for a key this call deleted.
        n = self._call(
            "delete_key", lambda: self._delete_script(keys=[full, self._index], args=args)
        )
        return bool(n)

    def add_member(self, key: str, member: bytes | str) -> int:
        full, data = self._set_key(key), check_member(member)
        args = [data, MAX_SET_MEMBERS, self._ttl_ms]
        # SADD is idempotent, so after a lost reply the script is simply sent again (by
        # _call's retries): the member is added once; the size returned is the one at the
        # retry, which may count members other callers added in between.
        size = int(
            self._call(
                "add_member",
                lambda: self._add_member_script(keys=[full], args=args),
                keys=[full],
            )
        )
        if size < 0:
            raise set_full_error(key, self._shown, MAX_SET_MEMBERS)
        return size

    def remove_member(self, key: str, member: bytes | str) -> int:
        full, data = self._set_key(key), check_member(member)
        args = [data, self._ttl_ms]
        # SREM is idempotent, so after a lost reply the script is simply sent again (by
        # _call's retries): the member is gone either way; the size returned is the one
        # at the retry.
        return int(
            self._call(
                "remove_member",
                lambda: self._remove_member_script(keys=[full], args=args),
                keys=[full],
            )
        )

    # -- reads -----------------------------------------------------------------------

    def members(self, key: str) -> list[bytes]:
        full = self._set_key(key)
        found = self._call("members", lambda: self._client.smembers(full), keys=[full])
        return sorted(bytes(m) for m in found)

    def try_get(self, key: str) -> bytes | None:
        full = self._k(key)
        value = self._call("try_get", lambda: self._client.get(full), keys=[full])
        return None if value is None else bytes(value)

    def check(self, keys: Sequence[str]) -> bool:
        full = [self._k(k) for k in check_keys(keys)]
        if not full:
            return True
        unique = sorted(set(full))
        return self._count_present(unique, "check") == len(unique)

    def _count_present(self, unique: list[str], doing: str) -> int:
        """How many of the distinct Redis keys ``unique`` exist (one script; a key of a
        foreign type raises)."""
        reply = self._call(doing, lambda: self._present_script(keys=unique), keys=unique)
        return int(self._checked(reply, doing))

    def num_keys(self) -> int:
        return int(
            self._call("num_keys", lambda: self._client.scard(self._index), keys=[self._index])
        )

    def _await_values(self, names: list[str], seconds: float) -> list[bytes] | None:
        full = [self._k(k) for k in names]
        found: list[bytes] = []

        def read() -> bool:
            values = self._checked(self._read_script(keys=full), "get")
            if any(v is None for v in values):
                return False
            found[:] = [bytes(v) for v in values]
            return True

        return found if self._wait_until(full, read, seconds, "get") else None

    def _await_keys(self, names: list[str], seconds: float) -> bool:
        full = sorted({self._k(k) for k in names})

        def present() -> bool:
            return int(self._checked(self._present_script(keys=full), "wait")) == len(full)

        return self._wait_until(full, present, seconds, "wait")

    def unchanged(self, key: str, current: bytes) -> bool:
        """True if ``key`` still holds ``current``, compared on the server by digest (the
        value does not cross the network); an rdzv extension for cheap re-reads."""
        full = self._k(check_key(key))
        digest = hashlib.sha1(current, usedforsecurity=False).hexdigest()
        return (
            int(
                self._call(
                    "unchanged",
                    lambda: self._changed_script(keys=[full], args=[digest]),
                    keys=[full],
                )
            )
            == 0
        )

    def seen(self, key: str) -> bytes | None:
        """The value of ``key`` that this store's latest :meth:`wait_for_change` on it
        found (it may have changed since: confirm it with :meth:`unchanged`); None if
        none. An rdzv extension that saves the re-read after a wake-up."""
        return self._seen.get(self._k(check_key(key)))

    def wait_for_change(self, key: str, current: bytes | None, timeout: timedelta) -> bool:
        full = self._k(key)
        seconds = wait_seconds(timeout)
        # Compare digests on the server: an unchanged value never crosses the network; a
        # changed one comes back in the same reply and is kept for seen().
        digest = "" if current is None else hashlib.sha1(current, usedforsecurity=False).hexdigest()

        def changed() -> bool:
            reply = self._fetch_script(keys=[full], args=[digest])
            status = int(reply[0])
            if status == 2:
                if len(self._seen) >= SEEN_ENTRIES:
                    self._seen.clear()
                self._seen[full] = bytes(reply[1])
            elif status == 1:
                self._seen.pop(full, None)
            return status != 0

        return self._wait_until([full], changed, seconds, "wait_for_change")

    def _wait_until(
        self, full: Sequence[str], ready: Callable[[], bool], seconds: float, doing: str
    ) -> bool:
        """True once ``ready()`` holds, False after ``seconds``; sleeps on the keys'
        change channels between reads (see the module docstring)."""
        deadline = time.monotonic() + seconds
        channels = sorted({self._channel(k) for k in full})
        # Look before paying for a subscription (and its end).
        if self._call(doing, ready, keys=full):
            return True
        if seconds <= 0:
            return False

        def sleep_on(pubsub: Any) -> bool:
            while True:  # bounded by the deadline
                if ready():
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                # Sleep until a publication on our channels (or the deadline);
                # subscribe confirmations are skipped. A publication of a write that
                # the last look already saw only makes this look again (waking early
                # is allowed).
                end = time.monotonic() + remaining
                while time.monotonic() < end:
                    message = pubsub.get_message(timeout=max(0.0, end - time.monotonic()))
                    if message is not None and message.get("type") == "message":
                        break

        def confirmed(pubsub: Any) -> None:
            """Wait (until the deadline) for the server to confirm every subscription:
            only then can no write slip between our first look and the subscription
            (the look goes through another connection)."""
            pending = {c.encode() if isinstance(c, str) else c for c in channels}
            while pending and time.monotonic() < deadline:
                message = pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
                if message is not None and message.get("type") == "subscribe":
                    name = message.get("channel")
                    pending.discard(name.encode() if isinstance(name, str) else name)

        def subscribed_wait() -> bool:
            pubsub = self._subscriber()
            try:
                pubsub.subscribe(*channels)
                confirmed(pubsub)
                woke = sleep_on(pubsub)
                # Subscribed only while this thread reads the connection (see the
                # module docstring); the connection stays for the next wait.
                ended = self._unsubscribe(pubsub, channels)
            except BaseException:
                self._drop_subscriber()
                raise
            if not ended:
                self._drop_subscriber()
            return woke

        return self._call(doing, subscribed_wait, deadline, expired=lambda: False, keys=full)


def _db_of(parsed: RemoteUrl) -> int:
    path = parsed.path.strip("/")
    if not path:
        return 0
    if not path.isdigit() or int(path) > 10_000:
        raise StoreUrlError(
            f"the path of {parsed.shown!r} must be a database number (e.g. /0), got {path!r}"
        )
    return int(path)


def open_redis(url: str, timeout: timedelta) -> RedisStore:
    """Opener for ``redis://`` and ``rediss://`` (see :func:`rdzv.stores.open_store`)."""
    return RedisStore(url, timeout=timeout)
