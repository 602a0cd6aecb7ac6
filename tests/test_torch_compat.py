"""rdzv as a drop-in for torch's dynamic rendezvous, in one process (issue 25).

- **Errors**: rdzv's classes derive from torch's whenever rdzv works with torch; the rule
  (``rdzv._torch``) is checked in fresh interpreters, with torch, with ``RDZV_TORCH=0``
  and without torch (``python -S``: no site-packages).
- **Messages**: the eight bad settings torch's public tests match, matched the way they
  match (anchored), with rdzv's explanation as the note.
- **torch's stores and backends** under the handler: ``TCPStore``, ``HashStore``,
  ``FileStore`` and ``PrefixStore`` as its store, the protocol served over them with
  polling or through torch's ``C10dRendezvousBackend``; ``info.store`` is a torch
  ``PrefixStore`` over a store every member reaches.
- **Behaviour torch tests through its private constructor** (timeouts, ``set_closed``,
  ``shutdown``, the keep-alive thread), here over ``from_backend`` and ``create_handler``,
  each on an rdzv store and on torch's c10d backend over a ``HashStore``.

The real-process tests (gloo over ``info.store``) are in ``test_torch_processes.py``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import re
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.distributed.elastic.rendezvous
import torch.distributed.elastic.rendezvous as torch_rendezvous
from test_handler import THREAD_JOIN, NoBackoff, run_all
from torch._C._distributed_c10d import FileStore, HashStore, PrefixStore, TCPStore
from torch.distributed.elastic.rendezvous import api as torch_api
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as torch_dynamic
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

import rdzv
from rdzv import (
    DynamicRendezvousHandler,
    FakeClock,
    RendezvousParameters,
    RendezvousTimeout,
    StoreRendezvousBackend,
    create_handler,
)
from rdzv import errors as rdzv_errors
from rdzv.backend import Token
from rdzv.errors import RendezvousConnectionError, StoreTimeoutError
from rdzv.store import PrefixStore as RdzvPrefixStore
from rdzv.stores import MemoryStore, drop_memory_store
from rdzv.torch_compat import TorchBackend, TorchStoreView, store_timeouts
from spec.codec import decode
from spec.state import RendezvousState
from spec.variants import KEY_BEATS

ROOT = Path(__file__).resolve().parent.parent

ERROR_NAMES = (
    "RendezvousError",
    "RendezvousClosedError",
    "RendezvousTimeoutError",
    "RendezvousConnectionError",
    "RendezvousStateError",
    "RendezvousGracefulExitError",
)

SLOW_S = 0.3
"""How long each call of a slow backend takes: longer than the timeouts below."""
SHORT = timedelta(seconds=0.2)
"""A timeout shorter than one slow call."""


def _text(error: BaseException) -> str:
    """The message and its notes, as a traceback shows them."""
    return "\n".join([str(error), *getattr(error, "__notes__", [])])


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ERROR_NAMES)
def test_every_rdzv_error_is_torchs_error_of_the_same_name(name: str) -> None:
    assert rdzv_errors.TORCH_ERRORS
    ours = getattr(rdzv, name)
    assert issubclass(ours, getattr(torch_api, name))
    assert issubclass(ours, rdzv.RendezvousError)
    assert issubclass(ours, torch_api.RendezvousError)


def test_torchs_closed_error_catches_a_closed_rendezvous_from_the_plain_handler(
    tmp_path: Path,
) -> None:
    params = RendezvousParameters(
        "rdzv", f"sqlite://{tmp_path / 'rdzv.db'}", "job", 1, 1, join_timeout="30"
    )
    handler = create_handler(params)
    try:
        handler.set_closed()
        caught: BaseException | None = None
        try:
            handler.next_rendezvous()
        except torch.distributed.elastic.rendezvous.RendezvousClosedError as exc:
            caught = exc
        assert isinstance(caught, rdzv.RendezvousClosedError)
        assert isinstance(caught, torch_rendezvous.RendezvousClosedError)
    finally:
        handler.shutdown()


def test_torchs_timeout_error_catches_a_join_timeout_from_the_plain_handler() -> None:
    params = RendezvousParameters("rdzv", "memory://torch-timeout", "job", 2, 2, timeout="0.2")
    handler = create_handler(params)
    try:
        with pytest.raises(torch_rendezvous.RendezvousTimeoutError):
            handler.next_rendezvous()
    finally:
        handler.shutdown()
        drop_memory_store("torch-timeout")


def _python(code: str, *flags: str, env: dict[str, str] | None = None) -> str:
    """Run ``code`` in a fresh interpreter at the repository root; its stdout."""
    out = subprocess.run(
        [sys.executable, *flags, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


_REPORT = (
    "import sys; sys.path.insert(0, {root!r}); import rdzv; from rdzv import errors, _torch; "
    "print(errors.TORCH_ERRORS, 'torch' in sys.modules, "
    "errors.RendezvousClosedError.__mro__[2].__module__, _torch.REASON)"
)


def test_without_torch_rdzv_imports_nothing_of_it_and_its_errors_are_its_own() -> None:
    # -S: no site-packages, so torch is not installed for this interpreter.
    out = _python(_REPORT.format(root=str(ROOT)), "-S")
    assert out == "False False builtins torch is not installed"


def test_rdzv_torch_0_keeps_rdzv_away_from_an_installed_torch() -> None:
    import os

    out = _python(_REPORT.format(root=str(ROOT)), env={**os.environ, "RDZV_TORCH": "0"})
    assert out.startswith("False False builtins RDZV_TORCH='0' turns the torch interop off")


def test_a_bad_rdzv_torch_value_is_a_clear_error_at_import() -> None:
    import os

    out = subprocess.run(
        [sys.executable, "-c", "import rdzv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RDZV_TORCH": "sometimes"},
    )
    assert out.returncode != 0
    assert "RDZV_TORCH is 'sometimes', which is neither on nor off" in out.stderr


@pytest.mark.parametrize(
    "first", ["import rdzv", "import torch.distributed.elastic.rendezvous"], ids=["rdzv", "torch"]
)
def test_the_torchrun_plugin_registers_whichever_is_imported_first(first: str) -> None:
    # Importing torch's rendezvous package loads rdzv's plug-in (its registry imports every
    # torchrun.handlers entry point): also while rdzv itself is being imported.
    code = (
        f"{first}; import rdzv, torch.distributed.elastic.rendezvous as r; "
        f"from rdzv.errors import TORCH_ERRORS; "
        f"print('rdzv' in r.rendezvous_handler_registry._registry, TORCH_ERRORS)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "True True"
    assert "Exception while registering" not in out.stderr


# -- messages: torch's words, rdzv's note ----------------------------------------------------


def _params(backend: Any = "rdzv", lo: int = 1, hi: int = 1, **config: Any) -> Any:
    return RendezvousParameters(backend, "memory://msg", "job", lo, hi, **config)


def _from_backend(lo: int, hi: int) -> Any:
    store = MemoryStore()
    return DynamicRendezvousHandler.from_backend(
        "job", store, StoreRendezvousBackend(store, "job"), lo, hi
    )


TORCH_MESSAGES: list[tuple[str, Callable[[], Any], str, str]] = [
    # (case, call, torch's sentence as torch's tests match it, a phrase of rdzv's note)
    (
        "backend",
        lambda: _params(""),
        "The rendezvous backend name must be a non-empty string.",
        "pass the name of the rendezvous backend",
    ),
    (
        "params-min",
        lambda: _params(lo=0),
        "The minimum number of rendezvous nodes (0) must be greater than zero.",
        "min_nodes (0) must be >= 1",
    ),
    (
        "params-max",
        lambda: _params(lo=3, hi=2),
        "The maximum number of rendezvous nodes (2) must be greater than or equal to the "
        "minimum number of rendezvous nodes (3).",
        "raise max_nodes or lower min_nodes",
    ),
    (
        "bool",
        lambda: _params(opt="Ture").get_as_bool("opt"),
        "The rendezvous configuration option 'opt' does not represent a valid boolean value.",
        "use one of true/false",
    ),
    (
        "int",
        lambda: _params(opt="3b").get_as_int("opt"),
        "The rendezvous configuration option 'opt' does not represent a valid integer value.",
        "pass a whole number",
    ),
    (
        "timeout",
        lambda: RendezvousTimeout(timedelta(seconds=-1)),
        f"The join timeout ({timedelta(seconds=-1)}) must be positive.",
        "pass a duration above zero",
    ),
    (
        "handler-min",
        lambda: _from_backend(0, 1),
        "The minimum number of nodes (0) must be greater than zero.",
        "a rendezvous needs at least one node",
    ),
    (
        "handler-max",
        lambda: _from_backend(3, 2),
        "The maximum number of nodes (2) must be greater than or equal to the minimum "
        "number of nodes (3).",
        "max_nodes (2) must be >= min_nodes (3)",
    ),
]


@pytest.mark.parametrize(
    ("call", "torch_text", "ours"),
    [case[1:] for case in TORCH_MESSAGES],
    ids=[case[0] for case in TORCH_MESSAGES],
)
def test_bad_settings_have_torchs_message_and_rdzvs_note(
    call: Callable[[], Any], torch_text: str, ours: str
) -> None:
    with pytest.raises(ValueError) as raised:
        call()
    # torch's tests anchor their patterns (unittest's assertRaisesRegex on str()).
    assert re.search(f"^{re.escape(torch_text)}$", str(raised.value))
    assert ours in _text(raised.value)


# -- torch's stores under the handler --------------------------------------------------------


@contextlib.contextmanager
def _torch_store(kind: str, tmp_path: Path) -> Iterator[Any]:
    """A torch store of ``kind`` every handler of the test reaches (a TCPStore's server
    lives in the test and stops when the block ends)."""
    if kind == "tcp":
        server = TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=1)
        )
        try:
            yield server
        finally:
            del server
    else:
        store: Any
        if kind == "hash":
            store = HashStore()
        elif kind == "file":
            store = FileStore(str(tmp_path / "filestore"), -1)
        else:
            store = PrefixStore("outer", HashStore())
        store.set_timeout(timedelta(seconds=1))  # as the TCPStore's: a get waits 1 s at most
        yield store


STORE_KINDS = ["tcp", "hash", "file", "prefix"]


@pytest.mark.parametrize("kind", STORE_KINDS)
@pytest.mark.parametrize("state", ["rdzv-keys", "c10d"])
def test_a_torch_store_serves_a_round_and_its_round_store(
    kind: str, state: str, tmp_path: Path
) -> None:
    with _torch_store(kind, tmp_path) as store:

        def backend() -> Any:  # the state: our keys polled, or torch's c10d backend
            if state == "c10d":
                return C10dRendezvousBackend(store, "job")
            return StoreRendezvousBackend(store, "job")

        handlers = [
            DynamicRendezvousHandler.from_backend(
                "job", store, backend(), 2, 2, local_addr="127.0.0.1",
                timeout=RendezvousTimeout(join=timedelta(seconds=THREAD_JOIN)),
            )
            for _ in range(2)
        ]  # fmt: skip
        try:
            infos = run_all([h.next_rendezvous for h in handlers])
            assert not [i for i in infos if isinstance(i, BaseException)], infos
            assert sorted(i.rank for i in infos) == [0, 1]
            assert {i.world_size for i in infos} == {2}
            assert len({(i.bootstrap_store_info.master_port, i.round) for i in infos}) == 1
            assert handlers[0].get_backend() == ("c10d" if state == "c10d" else "rdzv")
            for info in infos:  # as torch's handler: a PrefixStore over the store given
                assert isinstance(info.store, PrefixStore)
                assert info.store.underlying_store is store
                assert isinstance(info.rdzv_store, RdzvPrefixStore)
            infos[0].store.set("greeting", b"hello")
            assert infos[1].rdzv_store.get("greeting") == b"hello"
            assert store.get(f"rdzv/job/{infos[0].round}/greeting") == b"hello"
        finally:
            for h in handlers:
                h.shutdown()


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_a_torch_stores_wait_timeout_is_not_yet_and_a_dead_server_is_a_failure(
    kind: str, tmp_path: Path
) -> None:
    with _torch_store(kind, tmp_path) as store:
        view = TorchStoreView(store)
        with pytest.raises(StoreTimeoutError, match=r"did not appear .* in time"):
            view.wait(["missing"], timedelta(seconds=0.1))
        with pytest.raises(StoreTimeoutError):
            view.multi_get(["missing"])
        assert view.try_get("missing") is None
        assert not view.wait_for_change("missing", None, timedelta(seconds=0.05))
        view.set("here", "v")
        assert view.wait_for_change("here", None, timedelta(seconds=1))
        assert view.get("here") == b"v"
    if kind == "tcp":
        server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        client = TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=1))
        del server
        with pytest.raises(RendezvousConnectionError, match="check that its server is running"):
            TorchStoreView(client).get("anything")


def test_a_torch_store_timeout_is_in_the_handlers_not_yet_errors() -> None:
    assert dist.DistStoreError in store_timeouts()
    assert StoreTimeoutError in store_timeouts()


def test_c10d_state_is_rdzvs_json_in_torchs_key_never_a_pickle() -> None:
    store = HashStore()
    backend = C10dRendezvousBackend(store, "job")
    handler = DynamicRendezvousHandler.from_backend("job", store, backend, 1, 1)
    # torch's backend keeps no announcement sets or heartbeat keys, so the default
    # protocol there is hardened (scale, the default over rdzv stores, needs them).
    assert handler.variant.name == "hardened"
    try:
        handler.next_rendezvous()
        current = backend.get_state()
        assert current is not None
        state = decode(current[0])  # base64 of rdzv's canonical JSON under the c10d key
        assert state.complete and state.is_participant(handler.node)
        assert store.check(["torch.rendezvous.job"])
    finally:
        handler.shutdown()


def test_scale_over_torchs_c10d_backend_is_refused_with_the_reason() -> None:
    store = HashStore()
    handler = DynamicRendezvousHandler.from_backend(
        "job", store, C10dRendezvousBackend(store, "job"), 1, 1,
        timeout=RendezvousTimeout(join=timedelta(seconds=5)), protocol="scale",
    )  # fmt: skip
    try:
        with pytest.raises(rdzv.RendezvousError, match="'c10d' backend keeps no announcement"):
            handler.next_rendezvous()
    finally:
        handler.shutdown()


def test_torchs_corrupt_state_error_leaves_as_rdzvs() -> None:
    store = HashStore()
    backend = TorchBackend(C10dRendezvousBackend(store, "job"))
    store.set("torch.rendezvous.job", "not base64 !")
    with pytest.raises(rdzv.RendezvousStateError, match="corrupt"):
        backend.get_state()


# -- create_handler with what torch users pass ------------------------------------------------


def _torch_params(**config: Any) -> Any:
    return torch_api.RendezvousParameters(
        backend="c10d", endpoint="localhost:0", run_id="job", min_nodes=3, max_nodes=6, **config
    )


def test_create_handler_takes_torchs_parameters_backend_and_store() -> None:
    store = HashStore()
    params = _torch_params(join_timeout="50", last_call_timeout="60", close_timeout="70")
    handler = create_handler(store, C10dRendezvousBackend(store, "job"), params)
    try:
        assert handler.get_backend() == "c10d" and handler.get_run_id() == "job"
        settings = handler.settings
        assert (settings.min_nodes, settings.max_nodes) == (3, 6)
        assert settings.timeout.join == timedelta(seconds=50)
        assert settings.timeout.last_call == timedelta(seconds=60)
        assert settings.timeout.close == timedelta(seconds=70)
    finally:
        handler.shutdown()


def test_create_handler_leaves_c10ds_own_keys_to_torchs_backend_only() -> None:
    store = HashStore()
    params = _torch_params(read_timeout="60", store_type="tcp", is_host="true")
    handler = create_handler(store, C10dRendezvousBackend(store, "job"), params)
    handler.shutdown()
    ours = MemoryStore()
    with pytest.raises(ValueError, match=r"\['is_host', 'read_timeout', 'store_type'\] are not"):
        create_handler(ours, StoreRendezvousBackend(ours, "job"), params)
    with pytest.raises(ValueError, match=r"\['typo_timeout'\] are not options"):
        create_handler(store, C10dRendezvousBackend(store, "job"), _torch_params(typo_timeout="1"))


def test_create_handler_publishes_the_local_addr_as_bootstrap_address() -> None:
    store = HashStore()
    params = torch_api.RendezvousParameters(
        backend="c10d", endpoint="x", run_id="job", min_nodes=1, max_nodes=1,
        join_timeout="50", local_addr="127.0.0.2",
    )  # fmt: skip
    handler = create_handler(store, C10dRendezvousBackend(store, "job"), params)
    try:
        assert handler.next_rendezvous().bootstrap_store_info.master_addr == "127.0.0.2"
    finally:
        handler.shutdown()


def test_from_backend_takes_torchs_timeout() -> None:
    store = HashStore()
    timeout = torch_dynamic.RendezvousTimeout(join=timedelta(seconds=9))
    handler = DynamicRendezvousHandler.from_backend(
        "job", store, C10dRendezvousBackend(store, "job"), 1, 1, timeout=timeout
    )
    try:
        assert handler.settings.timeout.join == timedelta(seconds=9)
        assert handler.settings.timeout.heartbeat == timedelta(seconds=5)
    finally:
        handler.shutdown()


# -- torch's private-constructor behaviour, over from_backend ----------------------------------


@dataclass
class Setup:
    """Where a test's handlers keep the rendezvous: an rdzv store, or torch's c10d
    backend over a HashStore (the same behaviour is expected of both)."""

    name: str
    store: Any

    def backend(self, run_id: str = "job") -> Any:
        if self.name == "c10d":
            return C10dRendezvousBackend(self.store, run_id)
        return StoreRendezvousBackend(self.store, run_id)

    def state(self, run_id: str = "job") -> RendezvousState | None:
        current = self.backend(run_id).get_state()
        return None if current is None else decode(current[0])


@pytest.fixture(params=["rdzv", "c10d"])
def setup(request: pytest.FixtureRequest) -> Setup:
    return Setup(request.param, MemoryStore() if request.param == "rdzv" else HashStore())


def _handler(
    setup: Setup, lo: int = 1, hi: int = 1, backend: Any = None, **kw: Any
) -> DynamicRendezvousHandler:
    return DynamicRendezvousHandler.from_backend(
        "job",
        setup.store,
        setup.backend() if backend is None else backend,
        lo,
        hi,
        local_addr="127.0.0.1",
        timeout=kw.pop("timeout", RendezvousTimeout(join=timedelta(seconds=THREAD_JOIN))),
        **kw,
    )


class SlowBackend(torch_dynamic.RendezvousBackend):
    """A torch user's own backend (a subclass of torch's) whose calls take SLOW_S once
    ``slow`` is set: the stand-in for a store far away."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.slow = threading.Event()

    @property
    def name(self) -> str:
        return "slow"

    def _delay(self) -> None:
        if self.slow.is_set():
            time.sleep(SLOW_S)

    def get_state(self) -> tuple[bytes, Token] | None:
        self._delay()
        result: tuple[bytes, Token] | None = self._inner.get_state()
        return result

    def set_state(self, state: bytes, token: Token | None = None) -> Any:
        self._delay()
        return self._inner.set_state(state, token)


def _slow(setup: Setup) -> SlowBackend:
    return SlowBackend(setup.backend())


def test_from_backend_takes_the_settings(setup: Setup) -> None:
    timeout = RendezvousTimeout()
    for lo, hi, given in ((3, 6, timeout), (3, 3, timeout), (3, 6, None)):
        handler = DynamicRendezvousHandler.from_backend(
            "job", setup.store, setup.backend(), lo, hi, timeout=given
        )
        assert handler.get_backend() == setup.name and handler.get_run_id() == "job"
        assert (handler.settings.run_id, handler.settings.min_nodes) == ("job", lo)
        assert handler.settings.max_nodes == hi
        if given is None:
            assert handler.settings.timeout.join == timedelta(seconds=600)
        else:
            assert handler.settings.timeout is given
        handler.shutdown()


def test_ranks_world_size_and_the_round_store(setup: Setup) -> None:
    handlers = [_handler(setup, 3, 3) for _ in range(3)]
    try:
        infos = run_all([h.next_rendezvous for h in handlers])
        assert sorted(i.rank for i in infos) == [0, 1, 2]
        assert {i.world_size for i in infos} == {3}
        infos[2].store.set("dummy_key", b"x")
        assert setup.store.get("rdzv/job/0/dummy_key") == b"x"
    finally:
        for h in handlers:
            h.shutdown()


def test_each_call_of_next_rendezvous_joins_the_next_round(setup: Setup) -> None:
    handler = _handler(setup)
    try:
        for expected in range(4):
            assert handler.next_rendezvous().round == expected
            state = setup.state()
            assert state is not None and state.round == expected
    finally:
        handler.shutdown()


def test_a_join_slower_than_the_join_timeout_raises_a_timeout(setup: Setup) -> None:
    backend = _slow(setup)
    backend.slow.set()
    handler = _handler(setup, backend=backend, timeout=RendezvousTimeout(join=SHORT))
    try:
        with pytest.raises(rdzv.RendezvousTimeoutError):
            handler.next_rendezvous()
    finally:
        backend.slow.clear()
        handler.shutdown()


def test_a_close_slower_than_the_close_timeout_raises_a_timeout(setup: Setup) -> None:
    backend = _slow(setup)
    handler = _handler(setup, backend=backend, timeout=RendezvousTimeout(close=SHORT))
    try:
        backend.slow.set()
        with pytest.raises(rdzv.RendezvousTimeoutError):
            handler.set_closed()
    finally:
        backend.slow.clear()
        handler.shutdown()


def test_set_closed_closes_for_every_node_and_may_be_repeated(setup: Setup) -> None:
    one, two = _handler(setup, cache_duration=0), _handler(setup, cache_duration=0)
    try:
        assert not one.is_closed() and not two.is_closed()
        one.set_closed()
        one.set_closed()
        assert one.is_closed() and two.is_closed()
        state = setup.state()
        assert state is not None and state.closed
    finally:
        one.shutdown()
        two.shutdown()


def test_num_nodes_waiting_counts_the_nodes_waiting_for_the_next_round(setup: Setup) -> None:
    fast = RendezvousTimeout(join=timedelta(seconds=THREAD_JOIN), last_call=SHORT)
    member = _handler(setup, 1, 3, timeout=fast)
    late = [_handler(setup, 1, 3, timeout=fast) for _ in range(2)]
    threads: list[threading.Thread] = []
    try:
        assert member.next_rendezvous().world_size == 1
        assert member.num_nodes_waiting() == 0
        for h in late:  # each waits for the next round until the rendezvous closes
            threads.append(threading.Thread(target=_join_quietly, args=(h,), daemon=True))
            threads[-1].start()
        end = time.monotonic() + THREAD_JOIN
        while member.num_nodes_waiting() < 2 and time.monotonic() < end:  # bounded
            time.sleep(0.02)
        assert member.num_nodes_waiting() == 2
    finally:
        member.shutdown()  # closes: the waiting nodes' joins end
        for t in threads:
            t.join(THREAD_JOIN)
        for h in late:
            h.shutdown()
    assert not any(t.is_alive() for t in threads)


def _join_quietly(handler: DynamicRendezvousHandler) -> None:
    with contextlib.suppress(rdzv.RendezvousError):
        handler.next_rendezvous()


def test_shutdown_closes_returns_true_and_may_be_repeated(setup: Setup) -> None:
    handler = _handler(setup)
    handler.next_rendezvous()
    assert handler.shutdown() is True
    assert handler.shutdown() is True
    state = setup.state()
    assert state is not None and state.closed


def test_shutdown_returns_false_when_the_store_is_gone() -> None:
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    client = TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=1))
    handler = DynamicRendezvousHandler.from_backend(
        "job", client, C10dRendezvousBackend(client, "job"), 1, 1,
        timeout=RendezvousTimeout(close=timedelta(seconds=2)),
    )  # fmt: skip
    handler.next_rendezvous()
    del server  # the TCPStore server stops: nothing can close the rendezvous now
    assert handler.shutdown() is False


def _keep_alive_threads(handler: DynamicRendezvousHandler) -> list[threading.Thread]:
    name = f"rdzv-keep-alive-{handler.node}"
    return [t for t in threading.enumerate() if t.name == name]


def test_the_keep_alive_thread_runs_from_next_rendezvous_to_shutdown(setup: Setup) -> None:
    handler = _handler(setup)
    assert _keep_alive_threads(handler) == []
    handler.next_rendezvous()
    (thread,) = _keep_alive_threads(handler)
    assert thread.is_alive() and thread.daemon
    handler.shutdown()
    assert not thread.is_alive() and _keep_alive_threads(handler) == []


def test_the_keep_alive_thread_ends_when_the_handler_is_collected(setup: Setup) -> None:
    handler = _handler(setup)
    handler.next_rendezvous()
    (thread,) = _keep_alive_threads(handler)
    ref = weakref.ref(handler)
    del handler
    gc.collect()
    left = ref()
    if left is not None:  # kept alive by mistake: stop its thread before failing
        left.shutdown()
    assert left is None, "the keep-alive thread must not keep its handler alive"
    thread.join(THREAD_JOIN)
    assert not thread.is_alive()


def test_keep_alive_updates_this_nodes_heartbeat(setup: Setup) -> None:
    # rdzv's store runs the default protocol, scale (the heartbeat is a key of its own);
    # torch's c10d backend keeps no such keys, so there the default is hardened (the
    # heartbeat is a stamp in the state).
    clock = FakeClock()
    handler = _handler(setup, keep_alive_interval=30, clock=clock, rng=NoBackoff())
    assert handler.variant.name == ("hardened" if setup.name == "c10d" else "scale")

    def heartbeat() -> object:
        if handler.variant.heartbeats == KEY_BEATS:
            return setup.store.try_get(f"rdzv/job/beat/{handler.node}")
        state = setup.state()
        return None if state is None else state.heartbeat_of(handler.node)

    try:
        handler.next_rendezvous()
        before = heartbeat()
        assert handler.variant.heartbeats == KEY_BEATS or before is not None
        assert clock.wait_for_sleepers(1)
        clock.advance(60.0)  # two intervals: the heartbeat is due
        end = time.monotonic() + THREAD_JOIN
        beat = before
        while beat == before and time.monotonic() < end:  # bounded
            time.sleep(0.01)
            beat = heartbeat()
        assert beat is not None and beat != before
    finally:
        handler.shutdown()


@pytest.mark.parametrize("failure", ["slow", "broken"])
def test_a_failed_or_slow_keep_alive_is_logged_and_the_thread_goes_on(
    setup: Setup, failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = _slow(setup)
    handler = _handler(
        setup,
        backend=backend,
        keep_alive_interval=0.05,
        timeout=RendezvousTimeout(join=timedelta(seconds=THREAD_JOIN), heartbeat=SHORT),
    )
    try:
        handler.next_rendezvous()
        (thread,) = _keep_alive_threads(handler)
        with caplog.at_level(logging.WARNING, logger="rdzv.handler"):
            if failure == "slow":
                backend.slow.set()
            else:  # the state under the backend is garbage from now on
                backend._inner = _Broken()
            end = time.monotonic() + THREAD_JOIN
            while time.monotonic() < end and not _keep_alive_warnings(caplog):  # bounded
                time.sleep(0.02)
            warned = _keep_alive_warnings(caplog)
        assert warned, "no keep-alive failure was logged"
        assert ("before its deadline" if failure == "slow" else "broken store") in warned[0]
        assert thread.is_alive()
    finally:
        backend.slow.clear()
        handler._heartbeats.shut()
    thread.join(THREAD_JOIN)
    assert not thread.is_alive()


class _Broken:
    def get_state(self) -> Any:
        raise OSError("broken store")

    def set_state(self, state: bytes, token: Any = None) -> Any:
        raise OSError("broken store")


def _keep_alive_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "keep-alive of node" in r.getMessage()]
