"""Shared test configuration.

Hypothesis runs derandomized in CI (and whenever HYPOTHESIS_PROFILE=ci), so a CI run is
reproducible; locally the default profile explores new examples each run.
"""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import HealthCheck, settings

# Every handler of the test run, in this process and in the processes it starts (they
# inherit the environment), checks spec.invariants on each state it reads or writes.
os.environ["RDZV_CHECK_INVARIANTS"] = "1"

CPU_FILES = re.compile(
    r"test_(model_check.*|prove.*|spec_.*|diagrams|docs_tables|layering|lockstep)\.py"
)
"""Test files that only compute (no servers, processes or real time): marked ``cpu``, so
that scripts/test.sh runs them on every core at once and the rest, some of which wait on
real processes with generous but real bounds, one at a time."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if CPU_FILES.fullmatch(item.path.name):
            item.add_marker(pytest.mark.cpu)


settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


# -- real store servers (redis-server, etcd) ------------------------------------------------
# A missing binary raises servers.ServerMissing (tests/servers.py): the tests fail, never skip.

from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import ExitStack  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, TypeVar  # noqa: E402

from servers import Certs, EtcdServer, RedisServer, TcpProxy, make_certs  # noqa: E402


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One plain redis-server shared by a session's conformance tests (each store uses
    its own key prefix)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One plain etcd shared by a session's conformance tests (each store uses its own
    key prefix)."""
    server = EtcdServer(tmp_path_factory.mktemp("etcd"))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A throwaway CA with server (127.0.0.1) and client certificates."""
    return make_certs(tmp_path_factory.mktemp("certs"))


_Server = TypeVar("_Server", RedisServer, EtcdServer)


def _starter(kind: type[_Server], workdir: Path, stem: str) -> Iterator[Callable[..., _Server]]:
    """Yield ``start(**options)``, which starts a private server in its own directory
    under ``workdir``; every server started is stopped afterwards, each even if stopping
    another one raised (and one whose start failed is stopped too)."""
    started: list[_Server] = []
    with ExitStack() as stops:

        def start(**options: Any) -> _Server:
            server = kind(workdir / f"{stem}{len(started)}", **options)
            started.append(server)
            stops.callback(server.stop)  # before it starts: a failed start is cleaned up
            return server.start()

        yield start


@pytest.fixture
def start_redis(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """``start_redis(persistent=..., password=..., certs=...)`` starts a private server;
    every server started is stopped after the test."""
    yield from _starter(RedisServer, tmp_path, "redis")


@pytest.fixture
def start_etcd(tmp_path: Path) -> Iterator[Callable[..., EtcdServer]]:
    """``start_etcd(certs=...)`` starts a private etcd; stopped after the test."""
    yield from _starter(EtcdServer, tmp_path, "etcd")


@pytest.fixture
def tcp_proxy() -> Iterator[Callable[[int], TcpProxy]]:
    """``tcp_proxy(port)`` starts a proxy to 127.0.0.1:port; every proxy started is stopped
    after the test, each even if stopping another one raised."""
    with ExitStack() as stops:

        def start(port: int) -> TcpProxy:
            proxy = TcpProxy(port).start()  # a start that raised started no thread
            stops.callback(proxy.stop)
            return proxy

        yield start


# -- every multi-process and torchrun test validates its processes' event logs -------------
VALIDATED_FILES = re.compile(
    r"test_(handler_processes|distributed_rendezvous|torchrun|torch_processes|agent_workload"
    r"|run_reuse|store_outage)\.py"
)
"""Test modules that run real handlers in processes of their own. Each of their tests runs
with ``RDZV_EVENTS_DIR`` set to a fresh directory, inherited by every process it starts
(torchrun's agents included), and afterwards every step any handler recorded must be one
``spec.machine.step`` takes from its recorded input (``python -m model_check validate``)."""


@pytest.fixture(autouse=True)
def validated_event_logs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    if not VALIDATED_FILES.fullmatch(request.node.path.name):
        yield
        return
    from model_check import validate

    logs = tmp_path / "rdzv-events"
    logs.mkdir()
    before = os.environ.get("RDZV_EVENTS_DIR")
    os.environ["RDZV_EVENTS_DIR"] = str(logs)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("RDZV_EVENTS_DIR", None)
        else:
            os.environ["RDZV_EVENTS_DIR"] = before
    if any(logs.glob("*.jsonl")):
        summary = validate.validate([logs])
        assert summary.divergence is None, summary.report()
