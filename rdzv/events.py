"""Structured transition events: one JSON line per step of a node's machine.

The handler feeds every event to :func:`spec.machine.step` and logs the outcome here, on
the ``rdzv.events`` logger at DEBUG level, as one JSON object per line with sorted keys.
A trace of a production run can then be replayed against the spec: each line names the
node and which of its two machine states took the step (``machine``: ``main`` for exit,
join and keep-alive, ``control`` for queries and closes), the operation, the machine's
input in full (``event``, in the form of :mod:`spec.wire`), the node's configuration, the
decision (action and table row), the request it issued, digests of the machine state
before and after the step and of the request, and the state version (a short digest of
the fencing token) the node acted on. ``python -m model_check validate`` replays such a
log through :func:`spec.machine.step` and reports the first step the machine would not
take.

``RDZV_EVENTS_DIR=<dir>`` in a process's environment records its events without any
logging set-up: the first handler the process creates appends them to
``<dir>/events-<pid>.jsonl``.

Enable with ``logging.getLogger("rdzv.events").setLevel(logging.DEBUG)`` plus a handler;
when the logger is not enabled for DEBUG the handler does not even build the records.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spec import wire
from spec.machine import (
    Announce,
    Beat,
    CasResult,
    CompareAndSet,
    Config,
    Done,
    Event,
    Fail,
    IoFailed,
    Local,
    Read,
    ReadAnnounced,
    ReadBeats,
    Step,
    Token,
    Wait,
    Withdraw,
)

LOGGER_NAME = "rdzv.events"
logger = logging.getLogger(LOGGER_NAME)

SCHEMA = wire.EVENT_SCHEMA
"""Version of the record layout below (:data:`spec.wire.EVENT_SCHEMA`, which says what
each version changed)."""

EVENTS_DIR_ENV = "RDZV_EVENTS_DIR"
"""Environment variable: a directory to record this process's events in (see above)."""

_REQUEST_NAMES: dict[type, str] = {
    Read: "read",
    CompareAndSet: "compare_and_set",
    Wait: "wait",
    Done: "done",
    Fail: "fail",
    Announce: "announce",
    ReadAnnounced: "read_announced",
    Withdraw: "withdraw",
    Beat: "beat",
    ReadBeats: "read_beats",
}


def state_version(token: Token | None) -> str | None:
    """A short, stable digest of a fencing token (``None`` for an absent state)."""
    if token is None:
        return None
    raw = token if isinstance(token, bytes) else repr(token).encode("utf-8")
    return hashlib.blake2b(raw, digest_size=6).hexdigest()


@dataclass(frozen=True)
class TransitionEvent:
    """One step of one node's machine."""

    run_id: str
    node: str
    op: str | None
    input: str
    request: str
    action: str | None
    row: str | None
    """The table row that decided ``action``, by its stable name: ``<op>.<name>``."""
    round: int
    complete: bool
    closed: bool
    participants: int
    waiting: int
    version: str | None
    """Digest of the token the node holds after the step (see :func:`state_version`)."""
    has_set: bool | None
    """For a ``cas_result`` input: whether this node's write happened."""
    pruned: tuple[str, ...]
    mono_ms: int
    wall_ms: int
    detail: str | None = None
    """For a ``fail`` request: the failure kind and message; for ``io_failed``: the reason."""
    node_id: list[Any] | None = None
    """The node's identity as its three fields (``node`` is its string form)."""
    machine: str = "main"
    """Which of the node's machine states took the step: ``main`` or ``control``."""
    event: dict[str, Any] | None = None
    """The input in full (:func:`spec.wire.event_to_json`)."""
    config: dict[str, Any] | None = None
    """The node's configuration (:func:`spec.wire.config_to_json`)."""
    job: int | None = None
    """The job the node's other machine state had fixed, adopted before the step
    (:func:`spec.machine.adopt_job`)."""
    before: str | None = None
    """Digest of the machine state the input was fed to (:func:`spec.wire.digest`)."""
    after: str | None = None
    """Digest of the machine state after the step."""
    request_digest: str | None = None
    """Digest of the request the step issued."""

    def to_json(self) -> str:
        record: dict[str, Any] = {"schema": SCHEMA, **asdict(self)}
        record["pruned"] = list(self.pruned)
        return json.dumps(record, sort_keys=True, separators=(",", ":"))


def enabled() -> bool:
    """True when transition events are being recorded."""
    return logger.isEnabledFor(logging.DEBUG)


def transition(
    run_id: str,
    event: Event,
    result: Step,
    op_name: str | None,
    replay: Replay,
) -> TransitionEvent:
    """The record of feeding ``event`` and getting ``result``, with what a validator
    needs to take the step again (``replay``)."""
    local = result.local
    view = local.view
    request = result.request
    detail: str | None = None
    if isinstance(request, Fail):
        detail = f"{request.kind.value}: {request.message}"
    elif isinstance(event, IoFailed):
        detail = event.reason
    return TransitionEvent(
        run_id=run_id,
        node=str(local.node),
        op=op_name,
        input=wire.EVENT_TYPES[type(event)],
        request=_REQUEST_NAMES[type(request)],
        action=None if result.action is None else result.action.value,
        row=result.row,
        round=view.round,
        complete=view.complete,
        closed=view.closed,
        participants=view.num_participants,
        waiting=len(view.wait_list),
        version=state_version(local.token),
        has_set=event.has_set if isinstance(event, CasResult) else None,
        pruned=tuple(str(n) for n in result.pruned),
        mono_ms=event.now.mono,
        wall_ms=event.now.wall,
        detail=detail,
        **replay.fields(event, result),
    )


@dataclass(frozen=True)
class Replay:
    """What makes a record replayable: the machine state the input was fed to, which
    machine state of the node it is, and the node's configuration."""

    before: Local
    machine: str
    config: Config
    job: int | None

    def fields(self, event: Event, result: Step) -> dict[str, Any]:
        config = self.config
        return {
            "node_id": wire.node_to_json(self.before.node),
            "machine": self.machine,
            "event": wire.event_to_json(event, config.variant.name),
            "config": wire.config_to_json(config),
            "job": self.job,
            "before": wire.digest(self.before),
            "after": wire.digest(result.local),
            "request_digest": wire.digest(result.request),
        }


def emit(record: TransitionEvent) -> None:
    logger.debug(record.to_json())


class _ProcessFile(logging.Handler):
    """Appends each record as one line to ``<dir>/events-<pid>.jsonl``, one whole line
    per ``write`` on a file opened for appending, so lines of several processes (a
    forked child inherits this handler) never interleave; the file follows the pid."""

    def __init__(self, directory: Path) -> None:
        super().__init__(logging.DEBUG)
        self.directory = directory
        self._fd: int | None = None
        self._pid = -1

    def _file(self) -> int:
        pid = os.getpid()
        if self._fd is None or self._pid != pid:
            path = self.directory / f"events-{pid}.jsonl"
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._pid = pid
        return self._fd

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = (record.getMessage() + "\n").encode("utf-8")
            with self.lock if self.lock is not None else threading.Lock():
                fd = self._file()
                view = memoryview(line)
                for _ in range(len(line) + 1):  # bounded: each write moves at least a byte
                    if not view:
                        break
                    view = view[os.write(fd, view) :]
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        with self.lock if self.lock is not None else threading.Lock():
            if self._fd is not None and self._pid == os.getpid():
                os.close(self._fd)
            self._fd = None
        super().close()


_from_env_lock = threading.Lock()
_from_env: str | None = None
_from_env_handler: _ProcessFile | None = None


def record_from_env() -> None:
    """Record this process's events under ``$RDZV_EVENTS_DIR`` if it is set (once per
    process and directory; the handler calls it when it is created). A directory that cannot be
    written is a ``ValueError`` that names it."""
    global _from_env, _from_env_handler
    directory = os.environ.get(EVENTS_DIR_ENV, "")
    if _from_env == (directory or None):
        return
    with _from_env_lock:
        if _from_env == (directory or None):
            return
        if not directory:  # unset since: stop recording where it was set
            if _from_env_handler is not None:
                logger.removeHandler(_from_env_handler)
                _from_env_handler.close()
                logger.setLevel(logging.NOTSET)
                logger.propagate = True
            _from_env_handler = _from_env = None
            return
        path = Path(directory)
        if not path.is_dir() or not os.access(path, os.W_OK):
            raise ValueError(
                f"{EVENTS_DIR_ENV}={directory!r} is not a writable directory; create it or "
                f"unset {EVENTS_DIR_ENV} to record no transition events"
            )
        if _from_env_handler is not None:  # the variable changed: the new place only
            logger.removeHandler(_from_env_handler)
            _from_env_handler.close()
        _from_env_handler = _ProcessFile(path)
        logger.addHandler(_from_env_handler)
        logger.setLevel(logging.DEBUG)
        # Only the file gets them: a root handler (torchrun configures one) would print
        # every step otherwise.
        logger.propagate = False
        _from_env = directory


def parse(line: str) -> dict[str, Any]:
    """Read one recorded line back (raises ``ValueError`` on anything else)."""
    value = json.loads(line)
    if not isinstance(value, dict) or value.get("schema") != SCHEMA:
        raise ValueError(
            f"not an rdzv transition event of schema {SCHEMA}: {line[:80]!r}; "
            f"pass lines logged by the rdzv.events logger"
        )
    return value
