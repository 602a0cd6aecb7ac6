"""The public API, with the names and semantics of PyTorch 2.13's
``torch.distributed.elastic.rendezvous`` so that code can switch by changing an import.

- :class:`RendezvousHandler`: the abstract handler torch's elastic agent drives;
- :class:`RendezvousParameters`: what torchrun passes (config values arrive as strings);
- :class:`RendezvousInfo`, :class:`RendezvousStoreInfo`: what ``next_rendezvous`` returns;
- :class:`RendezvousTimeout`, :class:`RendezvousSettings`: the handler's settings.

Durations here are ``timedelta`` (or seconds) as in torch; the handler converts them to
spec's integer milliseconds in one place (:mod:`rdzv.clock`).
"""

from __future__ import annotations

import math
import operator
import socket
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

from rdzv.clock import to_millis
from rdzv.errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from rdzv.store import Store
from rdzv.stores.url import redact
from spec.settings import Settings, SettingsError
from spec.state import MAX_ADDR_LEN, NodeId, valid_addr
from spec.variants import DEFAULT_PROTOCOL

__all__ = [
    "DEFAULT_CACHE_DURATION",
    "DEFAULT_KEEP_ALIVE_INTERVAL",
    "DEFAULT_KEEP_ALIVE_MAX_ATTEMPT",
    "DEFAULT_PROTOCOL",
    "FALLBACK_PROTOCOL",
    "MAX_DURATION",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousSettings",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeout",
    "RendezvousTimeoutError",
]

DEFAULT_KEEP_ALIVE_INTERVAL = 5.0
"""Seconds between two heartbeats (torch's default)."""
DEFAULT_KEEP_ALIVE_MAX_ATTEMPT = 3
"""Missed heartbeats after which a node is pruned as dead (torch's default)."""
DEFAULT_CACHE_DURATION = 1.0
"""Seconds a node reuses its last read of the state (torch's default)."""
FALLBACK_PROTOCOL = "hardened"
"""The default over a backend that cannot run :data:`DEFAULT_PROTOCOL`: torch's own backends
(``C10dRendezvousBackend``), a bare ``torch.distributed.Store``, a backend of your own that
keeps no announcement sets, or a store whose keys expire (Redis's ``ttl``)."""
MAX_DURATION = timedelta(days=3650)
"""The longest timeout or interval a handler accepts: 10 years, far beyond any job, and far
inside what ``timedelta`` (about 2.7 million years) and a thread's wait
(``threading.TIMEOUT_MAX``, about 292 years) can hold. spec's integer milliseconds have no
upper limit of their own."""
MAX_DURATION_TEXT = f"{int(MAX_DURATION.total_seconds())} s (10 years)"


class RendezvousHandler(ABC):
    """The interface torch's elastic agent drives (same names, same meaning)."""

    @abstractmethod
    def get_backend(self) -> str:
        """The name of the rendezvous backend."""

    @property
    def use_agent_store(self) -> bool:
        """Whether the agent may use :attr:`RendezvousInfo.store` as its own store
        (torch's agent then starts no TCPStore of its own)."""
        return False

    @abstractmethod
    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round; block until it completes; return this node's place."""

    @abstractmethod
    def is_closed(self) -> bool:
        """Whether the rendezvous has been closed."""

    @abstractmethod
    def set_closed(self) -> None:
        """Close the rendezvous for every node."""

    @abstractmethod
    def num_nodes_waiting(self) -> int:
        """How many nodes wait for the next round (the agent restarts when > 0)."""

    @abstractmethod
    def get_run_id(self) -> str:
        """The run id of the rendezvous."""

    @abstractmethod
    def shutdown(self) -> bool:
        """Release resources and close; True on success."""


def _config_value_text(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"


def torch_worded(torch_text: str, ours: str, kind: type[ValueError] = ValueError) -> ValueError:
    """A ``kind`` whose message is torch's sentence for the same mistake, so that code and
    tests written against torch's text match it exactly (torch's own tests anchor their
    patterns, ``^...$``), with rdzv's explanation and fix (``ours``) as its note (PEP 678):
    every traceback prints it under the message, and ``pytest.raises(match=...)`` matches
    message and notes alike."""
    error = kind(torch_text)
    error.add_note(ours)
    return error


def check_node_bounds(min_nodes: object, max_nodes: object, nodes: str) -> None:
    """Refuse node bounds torch refuses, in torch's words (``nodes`` is torch's noun:
    ``"rendezvous nodes"`` for parameters, ``"nodes"`` for a handler) with spec's
    explanation as the note. Bounds that are not integers are left to
    :class:`spec.settings.Settings`, which says so."""
    if isinstance(min_nodes, bool) or not isinstance(min_nodes, int):
        return
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int):
        return
    try:
        Settings(min_nodes=min_nodes, max_nodes=max_nodes)
    except SettingsError as exc:
        if min_nodes < 1:
            torch_text = f"The minimum number of {nodes} ({min_nodes}) must be greater than zero."
        else:
            torch_text = (
                f"The maximum number of {nodes} ({max_nodes}) must be greater than or equal "
                f"to the minimum number of {nodes} ({min_nodes})."
            )
        raise torch_worded(torch_text, str(exc), SettingsError) from None


def check_local_addr(addr: str) -> None:
    """Refuse ``addr`` as this host's address (the bootstrap address other nodes connect
    to, and the first part of the node id) with a ``ValueError`` that says why, unless it
    is a non-empty host name or IP address: never whitespace, at most
    :data:`~spec.state.MAX_ADDR_LEN` characters of valid Unicode text."""
    if not addr:
        problem = "is empty"
    elif any(c.isspace() for c in addr):
        problem = "holds whitespace, which no host name or IP address does"
    elif not valid_addr(addr):
        problem = f"is longer than {MAX_ADDR_LEN} characters or not valid Unicode text"
    else:
        return
    raise ValueError(
        f"local_addr must be a host name, an IP address or None, got {addr!r}, which "
        f"{problem}; pass this host's address or leave it out to use the host name"
    )


class RendezvousParameters:
    """Parameters of a rendezvous, as torchrun passes them.

    ``config`` holds every other keyword argument; torchrun passes their values as
    strings, so :meth:`get_as_int`, :meth:`get_as_bool` and :meth:`get_as_float`
    parse strings.
    """

    def __init__(
        self,
        backend: str,
        endpoint: str,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(backend, str) or not backend:
            raise torch_worded(
                "The rendezvous backend name must be a non-empty string.",
                f"backend must be a non-empty string, got {backend!r}; "
                f"pass the name of the rendezvous backend, e.g. 'rdzv'",
            )
        if not isinstance(endpoint, str):
            raise ValueError(
                f"endpoint must be a string, got {_config_value_text(endpoint)}; "
                f"pass a store URL such as 'sqlite:///tmp/job.db' or 'memory://job'"
            )
        if not isinstance(run_id, str):
            raise ValueError(
                f"run_id must be a string, got {_config_value_text(run_id)}; "
                f"pass the job's id, e.g. 'job-42'"
            )
        # The node bounds are validated where the protocol defines them (in torch's words).
        check_node_bounds(min_nodes, max_nodes, "rendezvous nodes")
        Settings(min_nodes=min_nodes, max_nodes=max_nodes)
        if local_addr is not None:
            if not isinstance(local_addr, str):
                raise ValueError(
                    f"local_addr must be a string or None, got {_config_value_text(local_addr)}; "
                    f"pass this host's address or leave it out to use the host name"
                )
            check_local_addr(local_addr)
        self.backend = backend
        self.endpoint = endpoint
        self.run_id = run_id
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.local_addr = local_addr
        self.config: dict[str, Any] = dict(kwargs)

    def __repr__(self) -> str:
        return (
            f"RendezvousParameters(backend={self.backend!r}, endpoint={redact(self.endpoint)!r}, "
            f"run_id={self.run_id!r}, min_nodes={self.min_nodes}, max_nodes={self.max_nodes}, "
            f"local_addr={self.local_addr!r}, config={dict(sorted(self.config.items()))!r})"
        )

    def get(self, key: str, default: Any = None) -> Any:
        """The value of config option ``key``, or ``default``."""
        return self.config.get(key, default)

    def get_as_bool(self, key: str, default: bool | None = None) -> bool | None:
        """Option ``key`` as a bool: 1/0, true/false, t/f, yes/no, y/n (any case)."""
        value = self.get(key, default)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            text = value.strip().lower()
            if text in ("1", "true", "t", "yes", "y"):
                return True
            if text in ("0", "false", "f", "no", "n"):
                return False
        raise torch_worded(
            f"The rendezvous configuration option '{key}' does not represent a valid boolean "
            f"value.",
            f"config option {key!r} is {_config_value_text(value)}, which is not a boolean; "
            f"use one of true/false, yes/no, 1/0",
        )

    def get_as_int(self, key: str, default: int | None = None) -> int | None:
        """Option ``key`` as an int (strings of digits are parsed)."""
        value = self.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool):
            raise _not_an_integer(key, value)
        number: int | None = None
        if isinstance(value, int):
            number = value
        elif isinstance(value, str):
            try:
                number = int(value.strip())
            except ValueError:
                number = None
        elif isinstance(value, float) and value.is_integer():  # 3.0, never inf or 2.7
            number = int(value)
        else:
            try:
                number = operator.index(value)  # other integer types (numpy's)
            except TypeError:
                number = None
        if number is None:
            raise _not_an_integer(key, value)
        return number

    def get_as_float(self, key: str, default: float | None = None) -> float | None:
        """Option ``key`` as a finite float (``'0.5'`` and ``'30'`` both parse)."""
        value = self.get(key, default)
        if value is None:
            return None
        number: float | None = None
        if not isinstance(value, bool):
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = None
            except OverflowError:  # an int beyond float's range
                raise ValueError(
                    f"config option {key!r} is {_config_value_text(value)}, which is too "
                    f"large to be a number of seconds; pass e.g. '30' or '0.5'"
                ) from None
        if number is None or not math.isfinite(number):
            raise ValueError(
                f"config option {key!r} is {_config_value_text(value)}, which is not a "
                f"finite number; pass a number of seconds such as '30' or '0.5'"
            )
        return number


def _not_an_integer(key: str, value: object) -> ValueError:
    return torch_worded(
        f"The rendezvous configuration option '{key}' does not represent a valid integer value.",
        f"config option {key!r} is {_config_value_text(value)}, which is not an integer; "
        f"pass a whole number such as '3'",
    )


PARAMETER_FIELDS = ("backend", "endpoint", "run_id", "min_nodes", "max_nodes", "config")
"""The attributes of torch's ``RendezvousParameters`` (and ours) that
:func:`parameters_of` reads, besides the optional ``local_addr``."""


def parameters_of(params: Any, config: Mapping[str, Any] | None = None) -> RendezvousParameters:
    """``params`` as rdzv's :class:`RendezvousParameters`: itself, or a copy of torch's
    ``RendezvousParameters`` (any object with :data:`PARAMETER_FIELDS`), checked as ours
    are. ``config``, if given, replaces the config of the copy. A ``TypeError`` names what
    is missing."""
    if isinstance(params, RendezvousParameters) and config is None:
        return params
    missing = [name for name in PARAMETER_FIELDS if not hasattr(params, name)]
    if missing:
        raise TypeError(
            f"expected RendezvousParameters (rdzv's or torch's), got {type(params).__name__} "
            f"without {', '.join(missing)}; build them with rdzv.RendezvousParameters(backend, "
            f"endpoint, run_id, min_nodes, max_nodes, **config)"
        )
    return RendezvousParameters(
        params.backend,
        params.endpoint,
        params.run_id,
        params.min_nodes,
        params.max_nodes,
        getattr(params, "local_addr", None),
        **dict(params.config if config is None else config),
    )


@dataclass
class RendezvousStoreInfo:
    """Where the training job's own store (torch's TCPStore) lives for this round."""

    TCP_STORE_ADDR_KEY: ClassVar[str] = "TCP_STORE_ADDR"
    TCP_STORE_PORT_KEY: ClassVar[str] = "TCP_STORE_PORT"

    master_addr: str
    master_port: int

    @staticmethod
    def build(
        rank: int,
        store: Store,
        local_addr: str | None = None,
        server_port: int | None = None,
        timeout: timedelta | None = None,
    ) -> RendezvousStoreInfo:
        """Rank 0 publishes its address and a port into ``store``; everyone reads them.

        Pass the round's (prefixed) store so that every round publishes afresh. Non-zero
        ranks wait for rank 0 at most ``timeout`` (the store's own timeout if None).
        """
        keys = [RendezvousStoreInfo.TCP_STORE_ADDR_KEY, RendezvousStoreInfo.TCP_STORE_PORT_KEY]
        if rank == 0:
            addr = local_addr or socket.gethostname()
            port = server_port or free_port()
            # One write for both keys: the waiting ranks see them appear together.
            store.multi_set(keys, [addr.encode("utf-8"), str(port).encode("ascii")])
        wait_get = getattr(store, "wait_get", None)
        if callable(wait_get):  # rdzv stores: the wait's own read returns the values
            addr_raw, port_raw = wait_get(keys, timeout)
        else:  # torch's stores take wait(keys) or wait(keys, timeout), never None
            store.wait(keys, *([] if timeout is None else [timeout]))
            addr_raw, port_raw = store.multi_get(keys)
        try:
            return RendezvousStoreInfo(addr_raw.decode("utf-8"), int(port_raw.decode("ascii")))
        except (UnicodeDecodeError, ValueError):
            raise RendezvousStateError(
                f"the bootstrap info in the store is not an address and a port "
                f"({addr_raw[:64]!r}, {port_raw[:16]!r}); another program wrote these keys: "
                f"use a run id of its own"
            ) from None


def free_port() -> int:
    """A TCP port that is free on this host right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port: int = sock.getsockname()[1]
        return port


class RendezvousInfo:
    """What ``next_rendezvous`` returns: this node's place in the completed round.

    Built like torch's (store, rank, world_size, bootstrap_store_info); ``round`` (the
    round number), ``participants`` and ``wait_list`` (the round's members and the nodes
    waiting for the next round, as torch's reference module fills them) and
    ``rdzv_store`` (the round's namespace as an rdzv store, when ``store`` is a torch
    store) are optional keywords.
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        bootstrap_store_info: RendezvousStoreInfo,
        *,
        round: int | None = None,
        participants: Iterable[NodeId] | None = None,
        wait_list: Iterable[NodeId] | None = None,
        rdzv_store: Store | None = None,
    ) -> None:
        self._store = store
        self._rdzv_store: Store = store if rdzv_store is None else rdzv_store
        self._rank = rank
        self._world_size = world_size
        self._bootstrap_store_info = bootstrap_store_info
        self._round = round
        self._participants = _sorted_nodes(participants, "participants")
        self._wait_list = _sorted_nodes(wait_list, "wait_list")

    @property
    def store(self) -> Any:
        """The round's store, namespaced to this run and round (``rdzv/<run_id>/<round>/``).

        When rdzv works with torch (:data:`rdzv.errors.TORCH_ERRORS`) the handler makes
        it a ``torch.distributed.PrefixStore`` over a store every member reaches (the
        handler's store, or a ``torch.distributed.Store`` view of it), which
        ``torch.distributed.init_process_group(store=...)`` takes; otherwise it is
        :attr:`rdzv_store`."""
        return self._store

    @property
    def rdzv_store(self) -> Store:
        """The same namespace as an rdzv store (:class:`rdzv.store.Store`: store timeouts
        raise :class:`~rdzv.errors.StoreTimeoutError`, and ``wait_get`` and member sets
        are there where the store has them), for code that does not use torch."""
        return self._rdzv_store

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def bootstrap_store_info(self) -> RendezvousStoreInfo:
        return self._bootstrap_store_info

    @property
    def round(self) -> int | None:
        return self._round

    @property
    def participants(self) -> list[NodeId]:
        """The round's members, sorted (rank ``i`` is the ``i``-th); a fresh list, empty
        when not given."""
        return list(self._participants)

    @property
    def wait_list(self) -> list[NodeId]:
        """The nodes that waited for the next round when this round completed, sorted; a
        fresh list, empty when not given."""
        return list(self._wait_list)

    def __repr__(self) -> str:
        return (
            f"RendezvousInfo(rank={self._rank}, world_size={self._world_size}, "
            f"round={self._round}, bootstrap_store_info={self._bootstrap_store_info!r})"
        )


def _sorted_nodes(nodes: Iterable[NodeId] | None, what: str) -> tuple[NodeId, ...]:
    if nodes is None:
        return ()
    if isinstance(nodes, str | bytes):
        raise TypeError(
            f"RendezvousInfo {what} must be node ids (spec.state.NodeId), got the string "
            f"{nodes!r}; pass a list of node ids"
        )
    listed = tuple(nodes)
    wrong = [node for node in listed if not isinstance(node, NodeId)]
    if wrong:
        raise TypeError(
            f"RendezvousInfo {what} must be node ids (spec.state.NodeId), got "
            f"{wrong[0]!r} ({type(wrong[0]).__name__}); pass the nodes of the round's state"
        )
    return tuple(sorted(listed))


def as_duration(
    value: timedelta | float,
    what: str,
    *,
    shown: str | None = None,
    fix: str = "",
    allow_zero: bool = False,
    resolution: bool = True,
) -> timedelta:
    """``value`` (a timedelta or a number of seconds) as a timedelta, after the checks every
    duration of a handler needs; a ``ValueError`` otherwise.

    The value must be a finite number (or a timedelta), positive (or zero with
    ``allow_zero``), at most :data:`MAX_DURATION`, and, with ``resolution``, not so short
    that it rounds to 0 ms in spec's integer milliseconds. Messages read
    ``<what> is <shown>, which ...``: ``what`` names the setting (``"the join timeout"``,
    ``"config option 'join_timeout'"``), ``shown`` is the value as the caller wrote it
    (default: its seconds) and ``fix`` ends every message about the value.
    """
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise ValueError(
            f"{what} must be a number of seconds or a timedelta, got "
            f"{_config_value_text(value)}; pass e.g. 30 or timedelta(seconds=30){fix}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(
            f"{what} must be a finite number of seconds, got {value!r}; pass e.g. 30{fix}"
        )
    if shown is None:
        seconds = value.total_seconds() if isinstance(value, timedelta) else value
        shown = f"{seconds!r} s"
    # Compared as given: converting a huge int to float or timedelta would overflow.
    if isinstance(value, timedelta):
        sign = (value > timedelta(0)) - (value < timedelta(0))
        too_long = value > MAX_DURATION
    else:
        sign = (value > 0) - (value < 0)
        too_long = value > MAX_DURATION.total_seconds()
    if sign < 0 or (sign == 0 and not allow_zero):
        problem = "is negative" if allow_zero else "is not a positive number of seconds"
        advice = "pass 0 or more seconds" if allow_zero else "pass a duration above zero"
        raise ValueError(f"{what} is {shown}, which {problem}; {advice}{fix}")
    if too_long:
        raise ValueError(
            f"{what} is {shown}, which is longer than {MAX_DURATION_TEXT}, the longest "
            f"duration rdzv accepts; pass a shorter duration{fix}"
        )
    if resolution and sign > 0 and to_millis(value) == 0:
        raise ValueError(
            f"{what} is {shown}, which is below the 1 ms resolution of the rendezvous "
            f"settings (it would round to 0 ms); pass at least 0.001 s{fix}"
        )
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


_TIMEOUT_DEFAULTS: dict[str, timedelta] = {
    "join": timedelta(seconds=600),
    "last_call": timedelta(seconds=30),
    "close": timedelta(seconds=30),
    "heartbeat": timedelta(seconds=5),
}


def _as_timedelta(name: str, value: timedelta | float | None) -> timedelta:
    default = _TIMEOUT_DEFAULTS[name]
    if value is None:
        return default
    # A timedelta shorter than 1 ms is kept here, as torch keeps it; the handler refuses
    # it when it converts its settings to milliseconds. A number that short is refused
    # now, while its value is still known (a timedelta would drop what is below 1 us).
    try:
        return as_duration(
            value,
            f"the {name} timeout",
            fix=f", or None for the default ({default.total_seconds():g} s)",
            resolution=not isinstance(value, timedelta),
        )
    except ValueError as exc:
        if isinstance(value, timedelta):
            positive = value > timedelta(0)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            positive = not value <= 0  # NaN is neither: as_duration names it
        else:
            positive = True
        if positive:
            raise
        raise torch_worded(f"The {name} timeout ({value}) must be positive.", str(exc)) from None


class RendezvousTimeout:
    """The timeouts of a rendezvous; ``None`` means torch's default
    (join 600 s, last call 30 s, close 30 s, heartbeat 5 s). Each must be positive and at
    most :data:`MAX_DURATION`; a number of seconds must be at least 1 ms."""

    def __init__(
        self,
        join: timedelta | float | None = None,
        last_call: timedelta | float | None = None,
        close: timedelta | float | None = None,
        heartbeat: timedelta | float | None = None,
    ) -> None:
        self._join = _as_timedelta("join", join)
        self._last_call = _as_timedelta("last_call", last_call)
        self._close = _as_timedelta("close", close)
        self._heartbeat = _as_timedelta("heartbeat", heartbeat)

    @property
    def join(self) -> timedelta:
        """How long next_rendezvous may take."""
        return self._join

    @property
    def last_call(self) -> timedelta:
        """How long to wait for more nodes once min_nodes have joined."""
        return self._last_call

    @property
    def close(self) -> timedelta:
        """How long set_closed may take."""
        return self._close

    @property
    def heartbeat(self) -> timedelta:
        """How long one keep-alive may take."""
        return self._heartbeat

    def __repr__(self) -> str:
        return (
            f"RendezvousTimeout(join={self._join!r}, last_call={self._last_call!r}, "
            f"close={self._close!r}, heartbeat={self._heartbeat!r})"
        )


TIMEOUT_FIELDS = ("join", "last_call", "close", "heartbeat")


def timeout_of(timeout: Any) -> Any:
    """torch's ``RendezvousTimeout`` (any object whose :data:`TIMEOUT_FIELDS` are all
    timedeltas) as ours; anything else unchanged (the handler checks it)."""
    if timeout is None or isinstance(timeout, RendezvousTimeout):
        return timeout
    values = [getattr(timeout, name, None) for name in TIMEOUT_FIELDS]
    if all(isinstance(value, timedelta) for value in values):
        return RendezvousTimeout(*values)
    return timeout


@dataclass(repr=False, eq=False)
class RendezvousSettings:
    """The settings of a handler (torch's fields)."""

    run_id: str
    min_nodes: int
    max_nodes: int
    timeout: RendezvousTimeout
    keep_alive_interval: timedelta
    keep_alive_max_attempt: int

    def __repr__(self) -> str:
        return (
            f"RendezvousSettings(run_id={self.run_id!r}, min_nodes={self.min_nodes}, "
            f"max_nodes={self.max_nodes}, timeout={self.timeout!r}, "
            f"keep_alive_interval={self.keep_alive_interval!r}, "
            f"keep_alive_max_attempt={self.keep_alive_max_attempt})"
        )
