"""What the network stores (``redis://``, ``etcd://``) share: URL parsing, TLS files,
bounded retries with backoff, the errors they raise, and :class:`RemoteStore`, their
common plumbing (endpoint, namespace prefix, epoch token, retrying calls).

Nothing here imports a client library; :mod:`rdzv.stores.redis` and
:mod:`rdzv.stores.etcd` import theirs lazily.

Retry policy: an operation whose request may not have reached the server, or that is
safe to repeat (reads, blind writes of the same value, deletes), is retried up to
``retries`` times, sleeping ``RETRY_DELAY_MIN_S`` doubling to ``RETRY_DELAY_MAX_S``
between attempts. An operation that is not idempotent (compare-and-set, ``add``) is never
simply sent again: its backend first finds out by reading whether the write happened.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import ClassVar, TypeVar
from urllib.parse import unquote, urlsplit

from rdzv.errors import RendezvousConnectionError, RendezvousError
from rdzv.stores.common import BaseStore, check_keys, timeout_error, wait_seconds
from rdzv.stores.url import StoreUrlError, redact, split_query

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_RETRIES = 8
"""Attempts after the first for a transient failure (4.55 s of backoff in total:
``sum(backoff_delays(DEFAULT_RETRIES))``)."""
RETRY_DELAY_MIN_S = 0.05
"""First backoff delay between two attempts."""
RETRY_DELAY_MAX_S = 1.0
"""Upper bound of the backoff delay (it doubles from ``RETRY_DELAY_MIN_S``)."""
MAX_RETRIES = 100
"""Largest ``retries`` a URL may ask for (keeps every retry loop bounded)."""
MIN_TIMEOUT_S = 0.001
"""Smallest request or connect timeout a URL may ask for (``socket_timeout``,
``connect_timeout``, ``request_timeout``)."""
MAX_TIMEOUT_S = 86_400.0
"""Largest request or connect timeout a URL may ask for (one day; socket timeouts far
beyond it overflow the platform's time type)."""


class OutcomeUnknown(Exception):
    """A request that is not safe to repeat may have been applied, but its reply was
    lost; the backend resolves it by reading before it sends anything again."""


@dataclass(frozen=True)
class Tls:
    """Client TLS settings from URL query parameters ``ca``, ``cert``, ``key``."""

    ca: str | None
    cert: str | None
    key: str | None
    check_hostname: bool

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca)
        ctx.check_hostname = self.check_hostname
        if self.cert is not None:
            ctx.load_cert_chain(self.cert, self.key)
        return ctx


@dataclass(frozen=True)
class RemoteUrl:
    """A parsed ``scheme://[user[:password]@]host[:port][/path][?params]``."""

    url: str = field(repr=False)  # holds the password
    scheme: str
    host: str
    port: int
    username: str | None
    password: str | None = field(repr=False)
    path: str
    params: dict[str, str]

    @property
    def shown(self) -> str:
        """The URL with its password replaced by ``***`` (for messages)."""
        return redact(self.url)


def parse_remote_url(url: str, default_port: int, allowed: tuple[str, ...]) -> RemoteUrl:
    """Parse a network store URL; unknown query parameters are an error.

    Every message quotes the URL with its password redacted; a URL whose password and
    host cannot be told apart (a raw ``/``, ``?`` or ``#`` before the last ``@``) is
    refused before anything else looks at its parts (see
    :func:`rdzv.stores.url.check_userinfo`).
    """
    shown = redact(url)
    if url.find("://") < 0:
        raise StoreUrlError(f"store URL {shown!r} has no scheme (expected scheme://host:port)")
    _, params = split_query(url, allowed)
    try:
        parts = urlsplit(url.partition("?")[0])
        port = parts.port
    except ValueError as exc:
        raise StoreUrlError(f"malformed store URL {shown!r}: {exc}") from None
    host = parts.hostname
    if not host:
        raise StoreUrlError(f"store URL {shown!r} names no host (expected scheme://host:port)")
    return RemoteUrl(
        url=url,
        scheme=parts.scheme.lower(),
        host=host,
        port=default_port if port is None else port,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        path=parts.path,
        params=params,
    )


def _number(value: float) -> str:
    """``value`` for a message: whole numbers without exponent or fraction."""
    return str(int(value)) if value == int(value) else f"{value:g}"


def float_param(
    parsed: RemoteUrl,
    name: str,
    default: float | None,
    low: float,
    high: float,
    why: str,
    *,
    why_low: str | None = None,
) -> float | None:
    """A query parameter holding a number of seconds from ``low`` to ``high``, or
    ``default``; ``why`` (for the message) says what the bounds protect, and
    ``why_low``, when given, what the lower bound protects (said for a value below it)."""
    text = parsed.params.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:  # also refuses nan and inf
        reason = why_low if value < low and why_low is not None else why
        raise StoreUrlError(
            f"query parameter {name}={text!r} in {parsed.shown!r} must be a number of "
            f"seconds from {_number(low)} to {_number(high)}; {reason}"
        )
    return value


def timeout_param(parsed: RemoteUrl, name: str, default: float) -> float:
    """A query parameter holding a request or connect timeout in seconds, from
    ``MIN_TIMEOUT_S`` to ``MAX_TIMEOUT_S``, or ``default``."""
    value = float_param(
        parsed,
        name,
        default,
        MIN_TIMEOUT_S,
        MAX_TIMEOUT_S,
        f"a request or connection that may take longer than a day is a hang (the default "
        f"is {_number(default)})",
        why_low=f"a request or connection given less than {_number(MIN_TIMEOUT_S * 1000)} ms "
        f"fails before any server can answer (the default is {_number(default)})",
    )
    assert value is not None
    return value


def int_param(parsed: RemoteUrl, name: str, default: int, low: int, high: int) -> int:
    """A query parameter holding an integer in ``[low, high]``, or ``default``."""
    text = parsed.params.get(name)
    if text is None:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise StoreUrlError(
            f"query parameter {name}={text!r} in {parsed.shown!r} must be an integer "
            f"from {low} to {high}"
        )
    return int(text)


def retries_param(parsed: RemoteUrl) -> int:
    """The ``retries`` query parameter (``DEFAULT_RETRIES``, at most ``MAX_RETRIES``)."""
    return int_param(parsed, "retries", DEFAULT_RETRIES, 0, MAX_RETRIES)


def prefix_param(parsed: RemoteUrl, default: str, forbidden: str) -> str:
    """The ``prefix`` query parameter: a non-empty name without spaces or any of the
    ``forbidden`` characters (the backend's separators)."""
    prefix = parsed.params.get("prefix", default)
    if not prefix or any(c in prefix for c in forbidden) or " " in prefix:
        shown = ", ".join(repr(c) for c in forbidden)
        raise StoreUrlError(
            f"prefix={prefix!r} in {parsed.shown!r} must be a non-empty name "
            f"without {shown} or spaces"
        )
    return prefix


def tls_params(parsed: RemoteUrl, secure: bool) -> Tls | None:
    """TLS settings: ``ca`` (CA bundle), ``cert`` and ``key`` (client certificate),
    ``check_hostname`` (``true``/``false``). Only for the TLS schemes."""
    names = ("ca", "cert", "key", "check_hostname")
    given = [n for n in names if n in parsed.params]
    if not secure:
        if given:
            raise StoreUrlError(
                f"TLS parameter(s) {given} in {parsed.shown!r} need the TLS scheme "
                f"({parsed.scheme}s://...)"
            )
        return None
    files: dict[str, str | None] = {}
    for name in ("ca", "cert", "key"):
        path = parsed.params.get(name)
        if path is not None and not os.path.isfile(path):
            raise StoreUrlError(
                f"TLS file {name}={path!r} of {parsed.shown!r} does not exist or is not a "
                "file; give an absolute path to a PEM file"
            )
        files[name] = path
    if files["key"] is not None and files["cert"] is None:
        raise StoreUrlError(f"{parsed.shown!r} gives a client key but no cert=; give both")
    check = parsed.params.get("check_hostname", "true").lower()
    if check not in ("true", "false"):
        raise StoreUrlError(
            f"check_hostname={check!r} in {parsed.shown!r} must be 'true' or 'false'"
        )
    tls = Tls(files["ca"], files["cert"], files["key"], check == "true")
    try:  # load the files now: a bad one is the URL's error, not a flaky connection
        tls.context()
    except (ssl.SSLError, OSError, ValueError) as exc:
        given_files = ", ".join(f"{n}={p!r}" for n, p in files.items() if p is not None)
        raise StoreUrlError(
            f"the TLS files of {parsed.shown!r} ({given_files}) cannot be loaded: "
            f"{type(exc).__name__}: {exc}; give PEM files: ca= a CA bundle, cert= a client "
            "certificate and key= its private key (or a cert= file holding both)"
        ) from exc
    return tls


def backoff_delays(retries: int) -> list[float]:
    """The sleeps between ``retries + 1`` attempts."""
    delays = []
    delay = RETRY_DELAY_MIN_S
    for _ in range(retries):
        delays.append(delay)
        delay = min(delay * 2, RETRY_DELAY_MAX_S)
    return delays


def with_retries(
    call: Callable[[], T],
    *,
    retries: int,
    transient: Callable[[BaseException], bool],
    fail: Callable[[BaseException, int], RendezvousConnectionError],
    deadline: float | None = None,
    expired: Callable[[], T] | None = None,
    on_retry: Callable[[BaseException, list[float]], None] | None = None,
) -> T:
    """Run ``call``; on a ``transient`` error sleep and try again, at most ``retries``
    more times (and never past the monotonic ``deadline``). The last error is turned into
    ``fail(error, attempts)``, except that when the deadline stops the retries and
    ``expired`` is given, ``expired()`` is returned (a wait that ran out of time while the
    server was unreachable just times out; the caller's next request reports the
    outage). Non-transient errors propagate unchanged. ``on_retry(error, delays)`` is
    called before the first retry, with the sleeps the retries take."""
    delays = backoff_delays(retries)
    attempt = 0
    while True:  # bounded: at most retries + 1 passes
        attempt += 1
        try:
            return call()
        except Exception as exc:
            if not transient(exc):
                raise
            if attempt > len(delays):
                raise fail(exc, attempt) from exc
            delay = delays[attempt - 1]
            if deadline is not None and time.monotonic() + delay > deadline:
                if expired is not None:
                    return expired()
                raise fail(exc, attempt) from exc
            if attempt == 1 and on_retry is not None:
                on_retry(exc, delays)
            time.sleep(delay)


def unreachable(
    what: str, shown: str, doing: str, exc: BaseException, attempts: int, hint: str
) -> RendezvousConnectionError:
    """The error for a server that could not be reached (password already redacted)."""
    text = str(exc).replace("\n", " ")
    return RendezvousConnectionError(
        f"the {what} store at {shown} failed while {doing} after {attempts} attempt(s) "
        f"({type(exc).__name__}: {text}); {hint}"
    )


class RemoteStore(BaseStore):
    """The plumbing of a store on a server: its redacted URL, its namespace ``prefix``,
    the epoch token that reveals lost data, and :meth:`_call`, which runs a request with
    bounded retries and refuses to run once the data is known to be lost.

    A subclass parses its URL, calls ``super().__init__``, opens its client, then calls
    :meth:`_open_epoch`; it names itself in ``_KIND`` and its checklist in ``_HINT``."""

    _KIND: ClassVar[str]
    """The server's name in messages ("Redis", "etcd")."""
    _HINT: ClassVar[str]
    """What to check when the server cannot be reached (ends the error message)."""

    def __init__(self, parsed: RemoteUrl, prefix: str, retries: int, timeout: timedelta) -> None:
        super().__init__(timeout)
        self._shown = parsed.shown
        self._prefix = prefix
        self._retries = retries
        self._epoch: bytes | None = None
        self._lost: str | None = None
        self._closed = False
        self._retrying = False
        """A call had to retry and none has succeeded since (logged once per outage)."""

    def _retrying_now(self, doing: str, exc: BaseException, delays: list[float]) -> None:
        """Log the first retry of an outage (until a call succeeds again)."""
        if self._retrying:
            return
        self._retrying = True
        logger.warning(
            "the %s store at %s is unreachable while %s (%s: %s); retrying up to %d times "
            "over %.1f s",
            self._KIND,
            self._shown,
            doing,
            type(exc).__name__,
            str(exc).replace("\n", " ")[:200],
            len(delays),
            sum(delays),
        )

    @property
    def endpoint(self) -> str:
        """The URL, password redacted."""
        return self._shown

    @property
    def prefix(self) -> str:
        return self._prefix

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._shown!r}, prefix={self._prefix!r})"

    def close(self) -> None:
        """Close this store's connections. Every later call raises
        :class:`RendezvousConnectionError`; closing again does nothing."""
        self._closed = True
        self._close_client()

    @abstractmethod
    def _close_client(self) -> None:
        """Close the client library's connections."""

    def set(self, key: str, value: bytes | str) -> None:
        self.multi_set([key], [value])

    @abstractmethod
    def multi_set(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None: ...

    # -- blocking reads --------------------------------------------------------------

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        names = check_keys(keys)
        if not names:
            return []
        seconds = wait_seconds(self._timeout)
        values = self._await_values(names, seconds)
        if values is None:
            raise timeout_error(self._shown, names, seconds)
        return values

    def wait_get(self, keys: Sequence[str], timeout: timedelta | None = None) -> list[bytes]:
        """``wait(keys, timeout)`` then ``multi_get(keys)`` in one: the values once every
        key exists, read by the wait itself (one read fewer); an rdzv extension."""
        names = check_keys(keys)
        if not names:
            return []
        seconds = wait_seconds(self._timeout if timeout is None else timeout)
        values = self._await_values(names, seconds)
        if values is None:
            raise timeout_error(self._shown, names, seconds)
        return values

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        names = check_keys(keys)
        seconds = wait_seconds(self._timeout if timeout is None else timeout)
        if names and not self._await_keys(names, seconds):
            raise timeout_error(self._shown, names, seconds)

    @abstractmethod
    def _await_values(self, names: list[str], seconds: float) -> list[bytes] | None:
        """The values of the keys ``names`` once all exist; None after ``seconds``."""

    @abstractmethod
    def _await_keys(self, names: list[str], seconds: float) -> bool:
        """True once the keys ``names`` all exist; False after ``seconds``."""

    # -- epoch -----------------------------------------------------------------------

    @abstractmethod
    def _init_epoch(self) -> bytes:
        """Create the namespace's epoch token unless it exists; return its value."""

    def _open_epoch(self) -> None:
        """Read (or create) the epoch token; on failure close the client and re-raise."""
        try:
            self._epoch = self._call("connecting", self._init_epoch)
        except BaseException:
            self.close()
            raise

    def _lose(self, message: str) -> RendezvousConnectionError:
        """Record that this store's data is gone: this and every later call raise
        ``message`` instead of working on an empty store."""
        self._lost = message
        return RendezvousConnectionError(message)

    def _check_not_lost(self) -> None:
        """Refuse a call on a closed store, or on one whose data is known to be lost."""
        if self._closed:
            raise RendezvousConnectionError(
                f"the {self._KIND} store {self._shown} was closed; open a new one with open_store()"
            )
        if self._lost is not None:
            raise RendezvousConnectionError(self._lost)

    # -- retries ---------------------------------------------------------------------

    @abstractmethod
    def _transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` is worth another attempt of a request that is safe to repeat."""

    def _fail(self, doing: str) -> Callable[[BaseException, int], RendezvousConnectionError]:
        def fail(exc: BaseException, attempts: int) -> RendezvousConnectionError:
            return unreachable(self._KIND, self._shown, doing, exc, attempts, self._HINT)

        return fail

    def _explain(self, exc: Exception, doing: str, keys: Sequence[str]) -> RendezvousError | None:
        """The error to raise instead of ``exc``, a non-transient error of the client
        library, when its own words would not say what to fix (``keys``: the server-side
        keys the call used, to name the one at fault); None keeps ``exc``."""
        return None

    def _call(
        self,
        doing: str,
        call: Callable[[], T],
        deadline: float | None = None,
        expired: Callable[[], T] | None = None,
        keys: Sequence[str] = (),
    ) -> T:
        """Run ``call`` (safe to repeat) with bounded retries (see :func:`with_retries`);
        ``keys`` are the server-side keys it uses (for :meth:`_explain`)."""
        self._check_not_lost()
        try:
            result = with_retries(
                call,
                retries=self._retries,
                transient=self._transient,
                fail=self._fail(doing),
                deadline=deadline,
                expired=expired,
                on_retry=lambda exc, delays: self._retrying_now(doing, exc, delays),
            )
            if self._retrying:
                self._retrying = False
                logger.info("the %s store at %s answers again", self._KIND, self._shown)
            return result
        except Exception as exc:
            explained = self._explain(exc, doing, keys)
            if explained is None:
                raise
            raise explained from exc
