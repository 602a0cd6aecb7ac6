"""The torchrun plug-in: ``torchrun --rdzv-backend=rdzv --rdzv-endpoint=sqlite:///...``.

torchrun finds out-of-tree rendezvous backends in the ``torchrun.handlers`` entry-point
group. It loads :func:`torchrun_handler_creator`, calls it with no arguments and
registers the callable it returns (:func:`create_torchrun_handler`) under the entry
point's name, ``rdzv``. That creator turns torch's ``RendezvousParameters`` into a
handler torch's elastic agent accepts: an instance of torch's ``RendezvousHandler`` that
delegates every protocol decision to :class:`rdzv.handler.DynamicRendezvousHandler`.

Contract with torch's agent (``torch/distributed/elastic/agent/server/api.py`` and
``local_elastic_agent.py`` of torch 2.13):

- ``next_rendezvous()`` returns torch's ``RendezvousInfo``; its ``store`` is the round's
  namespace of our store (fresh per round) as a ``torch.distributed.Store``: the
  handler's own ``RendezvousInfo.store`` (:func:`rdzv.torch_compat.round_store`), or,
  with ``RDZV_TORCH=0``, :func:`rdzv.torch_compat.torch_store` of the round's rdzv store
  (``set``, ``get``, ``add``, ``wait``, ``multi_get``, ``multi_set``, ``compare_set``,
  ``check``, ``set_timeout`` and ``timeout``; a store timeout raises torch's
  ``DistStoreError``); its ``bootstrap_store_info`` is torch's
  ``RendezvousStoreInfo``, published by the round's rank 0, the same for every member;
- with ``use_agent_store`` (the default, as in torch), rank 0's *agent* hosts a torch
  ``TCPStore`` server, a fresh one per round, kept until its next ``next_rendezvous`` or
  ``shutdown`` (so it outlives the round's workers, which connect to it as clients);
- every error of ours leaves the adapter as torch's error of the same name (rdzv's
  errors are torch's already whenever rdzv works with torch). One
  exception: a redundant node's graceful exit raises :class:`RedundantNodeExit`, a
  ``SystemExit(0)``, because torch 2.13's launcher turns torch's own graceful-exit error
  into exit status 1 (``exit_when_redundant=false`` raises torch's error instead).

torchrun always puts ``timeout`` into the config (900 s unless ``--rdzv-conf timeout=``
or the legacy ``rdzv_timeout`` says otherwise). torch's own dynamic handler ignores it;
here, as in :func:`rdzv.handler.create_handler`, it is the join timeout whenever
``join_timeout`` is not given. The keys the handler reads are
:data:`rdzv.handler.HANDLER_CONFIG_KEYS`, those only this plug-in reads
:data:`rdzv.handler.TORCHRUN_CONFIG_KEYS`; any other key is an error.

The endpoint must be a store every agent can reach: ``memory://`` lives inside one
process, so it is refused unless the job has exactly one agent
(:func:`check_shared_store`). Logs go through ``logging`` under ``rdzv``, at the level
torchrun's ``LOGLEVEL`` names (:func:`setup_torchrun_logging`).

This module never imports torch at import time: torch is imported when torchrun calls
the creator (it is loaded by then anyway).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from rdzv.api import RendezvousInfo, RendezvousParameters, RendezvousStoreInfo, parameters_of
from rdzv.errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from rdzv.handler import (
    HANDLER_CONFIG_KEYS,
    MAX_ROUND_ATTEMPTS,
    MIN_BOOTSTRAP_WAIT,
    TORCHRUN_CONFIG_KEYS,
    DynamicRendezvousHandler,
    check_config_keys,
    create_handler,
)
from rdzv.store import PrefixStore, Store
from rdzv.torch_compat import TorchStore, is_torch_store, store_timeouts, torch_store

__all__ = [
    "BACKEND_NAME",
    "CONFIG_KEYS",
    "PluginOptions",
    "RedundantNodeExit",
    "TorchStore",
    "TorchrunHandler",
    "check_shared_store",
    "create_torchrun_handler",
    "rdzv_parameters",
    "setup_torchrun_logging",
    "torch_store",
    "torchrun_handler_creator",
]

logger = logging.getLogger(__name__)

BACKEND_NAME = "rdzv"
"""The entry point's name, what ``--rdzv-backend`` selects and ``get_backend()`` says."""

HANDLER_KEYS: tuple[str, ...] = HANDLER_CONFIG_KEYS
"""Config keys :func:`rdzv.handler.create_handler` reads (``timeout`` among them)."""
PLUGIN_KEYS: tuple[str, ...] = TORCHRUN_CONFIG_KEYS
"""Config keys only this plug-in reads."""
CONFIG_KEYS: tuple[str, ...] = tuple(sorted(HANDLER_KEYS + PLUGIN_KEYS))
"""Every ``--rdzv-conf`` key the ``rdzv`` backend accepts; any other is an error."""

DISABLE_AGENT_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""torch's switch: ``1`` turns the shared agent store off (honoured here as in torch)."""
AGENT_STORE_NAMESPACE = "torchrun-agent-store"
"""Sub-namespace of a round's store where rank 0 publishes its agent store's address."""
MIN_AGENT_STORE_WAIT = timedelta(seconds=MIN_BOOTSTRAP_WAIT)
"""Non-zero ranks wait at least this long for rank 0's agent store address: the wait is
the handler's wait for rank 0 (:meth:`rdzv.handler.DynamicRendezvousHandler.wait_for_rank_0`),
with its floor :data:`rdzv.handler.MIN_BOOTSTRAP_WAIT`."""


# -- parameters ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PluginOptions:
    """What the plug-in's own ``--rdzv-conf`` keys say."""

    use_agent_store: bool = True
    """Rank 0's agent hosts the workers' TCPStore (torch's default)."""
    exit_when_redundant: bool = True
    """A redundant node's ``next_rendezvous`` raises :class:`RedundantNodeExit`
    (torchrun exits 0) instead of torch's ``RendezvousGracefulExitError``."""


class RedundantNodeExit(SystemExit):
    """This node was redundant (its round was full) when the job ended: exit with 0.

    A ``SystemExit`` so that it passes torch's agent and launcher, which run their
    clean-up (``finally``) on the way, and torchrun exits with status 0. torch 2.13's
    launcher turns its own ``RendezvousGracefulExitError`` into status 1 (the agent
    swallows it and returns no result, and the launcher then fails on that).
    """

    def __init__(self, message: str) -> None:
        super().__init__(0)
        self.message = message

    def __str__(self) -> str:
        return self.message


def rdzv_parameters(params: Any) -> tuple[RendezvousParameters, PluginOptions]:
    """Our parameters from torch's (or ours), and the plug-in's own options.

    Checks every ``--rdzv-conf`` key and value and raises ``ValueError`` naming the key,
    the value and the fix. torchrun's ``timeout`` is passed on: the handler reads it as
    the join timeout unless ``join_timeout`` is given
    (:func:`rdzv.handler.config_join_timeout`).
    """
    missing = [
        name
        for name in ("backend", "endpoint", "run_id", "min_nodes", "max_nodes", "config")
        if not hasattr(params, name)
    ]
    if missing:
        raise TypeError(
            f"expected torch's RendezvousParameters, got {type(params).__name__} without "
            f"{', '.join(missing)}; torchrun passes them, or build "
            f"torch.distributed.elastic.rendezvous.RendezvousParameters yourself"
        )
    config = dict(params.config)
    check_config_keys(
        config,
        CONFIG_KEYS,
        source="--rdzv-conf",
        owner=f"the {BACKEND_NAME!r} rendezvous backend",
        note=" (c10d's TCPStore options do not apply)",
    )
    endpoint = params.endpoint
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise ValueError(
            f"the {BACKEND_NAME!r} rendezvous backend needs a store URL as endpoint, got "
            f"{endpoint!r}; pass e.g. --rdzv-endpoint=sqlite:///tmp/job.db "
            f"(or redis://host:6379/0, etcd://host:2379)"
        )
    ours = parameters_of(params, config)
    check_shared_store(endpoint, ours.max_nodes)
    # The plug-in's own keys are read (so bad values get the usual clear errors) and
    # taken out: the handler does not know them. torchrun's ``timeout`` stays: the
    # handler reads it as the join timeout unless ``join_timeout`` is given.
    share = ours.get_as_bool("use_agent_store", True) is not False
    if os.environ.get(DISABLE_AGENT_STORE_ENV, "0") == "1":
        share = False
    options = PluginOptions(
        use_agent_store=share,
        exit_when_redundant=ours.get_as_bool("exit_when_redundant", True) is not False,
    )
    for key in PLUGIN_KEYS:
        ours.config.pop(key, None)
    return ours, options


SHARED_STORES = "sqlite:///path/job.db, redis://host:6379/0 or etcd://host:2379"
"""The stores torchrun agents can share, as the refusal of ``memory://`` names them."""


def check_shared_store(endpoint: str, max_nodes: int) -> None:
    """``ValueError`` if ``endpoint`` is a ``memory://`` store and the job may have more
    than one agent: under torchrun every agent is a process of its own, and a memory
    store lives inside one process, so agents would never meet (each would wait for the
    others until the join timeout). A job of exactly one agent (``--nnodes=1``) may use
    it. A malformed URL is left to :func:`rdzv.stores.open_store`, which names the fix."""
    from rdzv.stores.url import redact, split_url

    try:
        scheme, _ = split_url(endpoint)
    except ValueError:
        return
    if scheme != "memory" or max_nodes <= 1:
        return
    raise ValueError(
        f"--rdzv-endpoint={redact(endpoint)} is a memory:// store, which lives inside one "
        f"process, but this job allows {max_nodes} agents (--nnodes up to {max_nodes}) and "
        f"under torchrun every agent is a process of its own: they could never meet, and "
        f"each would wait for the others until the join timeout. Give every agent the same "
        f"shared store: {SHARED_STORES} (sqlite:// for agents on one host, redis:// or "
        f"etcd:// for agents on many hosts); memory:// serves only a job of exactly one "
        f"agent (--nnodes=1)"
    )


# -- errors ----------------------------------------------------------------------------------

_ERROR_NAMES: tuple[tuple[type[RendezvousError], str], ...] = (
    # Most specific first: the first class the error is an instance of wins.
    (RendezvousGracefulExitError, "RendezvousGracefulExitError"),
    (RendezvousClosedError, "RendezvousClosedError"),
    (RendezvousTimeoutError, "RendezvousTimeoutError"),
    (RendezvousConnectionError, "RendezvousConnectionError"),
    (RendezvousStateError, "RendezvousStateError"),
    (RendezvousError, "RendezvousError"),
)


def torch_error(error: RendezvousError) -> Exception:
    """``error`` as torch's error of the same name: ``error`` itself when it is one
    already (rdzv's errors derive from torch's whenever rdzv works with torch, see
    :mod:`rdzv.errors`), else torch's class with the same message and ``error`` as its
    cause (``RDZV_TORCH=0`` under torchrun)."""
    from torch.distributed.elastic.rendezvous import api as torch_api

    name = next(name for ours, name in _ERROR_NAMES if isinstance(error, ours))
    torch_class: type[Exception] = getattr(torch_api, name, torch_api.RendezvousError)
    if isinstance(error, torch_class):
        return error
    translated: Exception = torch_class(str(error))
    translated.__cause__ = error
    return translated


# -- the handler -----------------------------------------------------------------------------


class TorchrunHandler:
    """Adapts :class:`~rdzv.handler.DynamicRendezvousHandler` to torch's agent.

    At run time the object torchrun gets is an instance of a subclass that also derives
    from torch's ``RendezvousHandler`` (see :func:`create_torchrun_handler`).
    """

    def __init__(
        self, handler: DynamicRendezvousHandler, options: PluginOptions | None = None
    ) -> None:
        self._handler = handler
        self._options = options if options is not None else PluginOptions()
        self._server: Any = None  # rank 0's torch TCPStore of the current round
        self._join_timeout = handler.settings.timeout.join

    # torch's API -----------------------------------------------------------------------------
    def get_backend(self) -> str:
        return BACKEND_NAME

    @property
    def use_agent_store(self) -> bool:
        return self._options.use_agent_store

    def get_run_id(self) -> str:
        return self._handler.get_run_id()

    def next_rendezvous(self) -> Any:
        """Join the next round; torch's ``RendezvousInfo`` for it."""
        from torch.distributed.elastic.rendezvous import api as torch_api

        # The agent has stopped the previous round's workers before it asks for a new
        # round, so the previous round's agent store has no client left.
        self._stop_server()
        # The agent-store exchange shares the join's deadline rather than starting afresh.
        deadline = self._handler.clock.monotonic() + self._join_timeout.total_seconds()
        try:
            info, addr, port = self._join(deadline)
        except RendezvousGracefulExitError as exc:
            if not self._options.exit_when_redundant:
                raise torch_error(exc) from exc
            logger.warning("%s; leaving with SystemExit(0): torchrun exits with status 0", exc)
            raise RedundantNodeExit(str(exc)) from exc
        except RendezvousError as exc:
            raise torch_error(exc) from exc
        # info.store is a torch Store whenever rdzv works with torch; else make one (the
        # agent keeps it for the round, and with it its Python half).
        store = info.store if is_torch_store(info.store) else torch_store(info.rdzv_store)
        return torch_api.RendezvousInfo(
            cast(Any, store),
            info.rank,
            info.world_size,
            torch_api.RendezvousStoreInfo(addr, port),
        )

    def is_closed(self) -> bool:
        try:
            return self._handler.is_closed()
        except RendezvousError as exc:
            raise torch_error(exc) from exc

    def set_closed(self) -> None:
        try:
            self._handler.set_closed()
        except RendezvousError as exc:
            raise torch_error(exc) from exc

    def num_nodes_waiting(self) -> int:
        try:
            return self._handler.num_nodes_waiting()
        except RendezvousError as exc:
            raise torch_error(exc) from exc

    def shutdown(self) -> bool:
        try:
            return self._handler.shutdown()
        finally:
            self._stop_server()

    # extras ----------------------------------------------------------------------------------
    @property
    def handler(self) -> DynamicRendezvousHandler:
        """The rdzv handler behind this adapter."""
        return self._handler

    @property
    def agent_store_port(self) -> int | None:
        """The port of the agent store this node hosts (rank 0 only), else None."""
        return None if self._server is None else int(self._server.port)

    # internals -------------------------------------------------------------------------------
    def _join(self, deadline: float) -> tuple[RendezvousInfo, str, int]:
        """The handler's next round, with the bootstrap address and the port the workers
        use. A round that ends before its rank 0 published its agent store is left for the
        next one (at most :data:`rdzv.handler.MAX_ROUND_ATTEMPTS` rounds), as the handler
        does for the bootstrap info."""
        for _ in range(MAX_ROUND_ATTEMPTS):
            # Every round of this call shares the one deadline of the agent's call.
            info = self._handler.next_rendezvous_until(deadline)
            addr = info.bootstrap_store_info.master_addr
            if not self._options.use_agent_store:
                return info, addr, info.bootstrap_store_info.master_port
            try:
                port = self._share_agent_store(info.rank, info.rdzv_store, addr, deadline)
            except BaseException:
                # This node will not work in the round: stop its heartbeats so that the
                # other members find it gone rather than wait for it.
                self._stop_server()
                self._handler.abandon_round()
                raise
            if port is not None:
                return info, addr, port
            logger.warning(
                "round %d ended before its rank 0 published its agent store; node %s joins "
                "the next round",
                info.round,
                self._handler.node,
            )
        raise RendezvousTimeoutError(
            f"node {self._handler.node} joined {MAX_ROUND_ATTEMPTS} rounds and each ended "
            f"before its rank 0 published its agent store; check why the nodes of this run "
            f"die right after forming a round"
        )

    def _share_agent_store(
        self, rank: int, round_store: Store, addr: str, deadline: float
    ) -> int | None:
        """Rank 0 starts a fresh TCPStore server and publishes its port in the round's
        namespace; every member returns that port. Non-zero ranks wait for it with the
        handler's wait for rank 0 (until the join's ``deadline`` on the handler's clock,
        at least :data:`MIN_AGENT_STORE_WAIT`, checking that the round still stands);
        None if the round ended first."""
        shared = PrefixStore(AGENT_STORE_NAMESPACE, round_store)
        if rank == 0:
            from torch._C._distributed_c10d import TCPStore

            # A fresh server per round: no key of a previous round's workers survives.
            self._server = TCPStore(host_name=addr, port=0, is_master=True, wait_for_workers=False)
            info: RendezvousStoreInfo | None = RendezvousStoreInfo.build(
                0, shared, addr, int(self._server.port)
            )
        else:

            def attempt(seconds: float) -> RendezvousStoreInfo | None:
                try:
                    return RendezvousStoreInfo.build(
                        rank, shared, addr, timeout=timedelta(seconds=seconds)
                    )
                except store_timeouts():
                    return None

            info = self._handler.wait_for_rank_0(attempt, deadline, "its agent store")
        if info is None:
            return None
        if info.master_addr != addr:
            raise RendezvousStateError(
                f"rank 0 published its agent store at {info.master_addr!r} but its "
                f"bootstrap address at {addr!r}; another program writes into this run's "
                f"namespace: use a run id of its own"
            )
        return info.master_port

    def _stop_server(self) -> None:
        # Dropping the last reference to a torch TCPStore stops its server.
        self._server = None


@functools.cache
def _torch_handler_class() -> type[TorchrunHandler]:
    """:class:`TorchrunHandler` that is also torch's ``RendezvousHandler``."""
    from torch.distributed.elastic.rendezvous.api import RendezvousHandler as TorchHandler

    class TorchrunRendezvousHandler(TorchrunHandler, TorchHandler):
        """rdzv's handler as torch's ``RendezvousHandler`` (made by torchrun)."""

    TorchrunRendezvousHandler.__module__ = __name__
    return TorchrunRendezvousHandler


LOG_FORMAT = "[%(levelname).1s %(asctime)s %(process)d %(name)s] %(message)s"
"""The format of rdzv's log lines under torchrun when nothing else handles them."""
_LOG_HANDLER_MARK = "_rdzv_torchrun_handler"


def setup_torchrun_logging() -> None:
    """Log as torch's elastic modules do under torchrun
    (``torch.distributed.elastic.utils.logging.get_logger``): the ``rdzv`` logger's level
    comes from the ``LOGLEVEL`` environment variable (``WARNING`` if unset; ``INFO`` shows
    one line per rendezvous event, ``DEBUG`` adds the JSON events of ``rdzv.events``),
    and, unless some handler already takes its records (the application configured
    logging), it writes to stderr. Called by :func:`create_torchrun_handler`; calling it
    again changes nothing but the level."""
    log = logging.getLogger("rdzv")
    level = os.environ.get("LOGLEVEL", "WARNING").strip().upper() or "WARNING"
    try:
        log.setLevel(level)
    except ValueError:
        log.setLevel(logging.WARNING)
        logger.warning(
            "LOGLEVEL=%r is not a logging level (DEBUG, INFO, WARNING, ERROR, CRITICAL); "
            "rdzv logs at WARNING",
            os.environ.get("LOGLEVEL"),
        )
    if log.hasHandlers():
        return
    handler = logging.StreamHandler()  # stderr, as torch's loggers
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    setattr(handler, _LOG_HANDLER_MARK, True)
    log.addHandler(handler)


def create_torchrun_handler(params: Any) -> TorchrunHandler:
    """The creator torchrun registers: torch's ``RendezvousParameters`` in, an instance
    of torch's ``RendezvousHandler`` out (see the module docstring)."""
    setup_torchrun_logging()
    ours, options = rdzv_parameters(params)
    try:
        handler = create_handler(ours)
    except RendezvousError as exc:
        raise torch_error(exc) from exc
    return _torch_handler_class()(handler, options)


def torchrun_handler_creator() -> Callable[[Any], TorchrunHandler]:
    """The ``torchrun.handlers`` entry point: torch calls it with no arguments and
    registers what it returns as the creator of the ``rdzv`` backend."""
    return create_torchrun_handler
