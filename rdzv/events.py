"""Structured transition events: one JSON line per step of a node's machine.

The handler feeds every event to :func:`spec.machine.step` and logs the outcome here, on
the ``rdzv.events`` logger at DEBUG level, as one JSON object per line with sorted keys.
A trace of a production run can then be replayed against the spec: each line names the
node, the operation, the machine's input, the decision (action and table row), the
request it issued, and the state version (a short digest of the fencing token) the node
acted on.

Enable with ``logging.getLogger("rdzv.events").setLevel(logging.DEBUG)`` plus a handler;
when the logger is not enabled for DEBUG the handler does not even build the records.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from typing import Any

from spec.machine import (
    Announce,
    Announced,
    AnnouncedMembers,
    Beat,
    Beaten,
    BeatValues,
    CasResult,
    CompareAndSet,
    Done,
    Event,
    Fail,
    IoFailed,
    Read,
    ReadAnnounced,
    ReadBeats,
    ReadResult,
    StartOp,
    Step,
    Token,
    Wait,
    Withdraw,
    Withdrawn,
    WokeUp,
)

LOGGER_NAME = "rdzv.events"
logger = logging.getLogger(LOGGER_NAME)

SCHEMA = 2
"""Version of the record layout below; bump it when a field changes meaning. Schema 2:
``row`` is the stable name of the table row (``join.join_open_round``), not its index
(schema 1), which meant different rows in different variants."""

_INPUT_NAMES: dict[type, str] = {
    StartOp: "start_op",
    ReadResult: "read_result",
    CasResult: "cas_result",
    WokeUp: "woke_up",
    IoFailed: "io_failed",
    Announced: "announced",
    AnnouncedMembers: "announced_members",
    Withdrawn: "withdrawn",
    Beaten: "beaten",
    BeatValues: "beat_values",
}
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

    def to_json(self) -> str:
        record: dict[str, Any] = {"schema": SCHEMA, **asdict(self)}
        record["pruned"] = list(self.pruned)
        return json.dumps(record, sort_keys=True, separators=(",", ":"))


def enabled() -> bool:
    """True when transition events are being recorded."""
    return logger.isEnabledFor(logging.DEBUG)


def transition(run_id: str, event: Event, result: Step, op_name: str | None) -> TransitionEvent:
    """The record of feeding ``event`` and getting ``result``."""
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
        input=_INPUT_NAMES[type(event)],
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
    )


def emit(record: TransitionEvent) -> None:
    logger.debug(record.to_json())


def parse(line: str) -> dict[str, Any]:
    """Read one recorded line back (raises ``ValueError`` on anything else)."""
    value = json.loads(line)
    if not isinstance(value, dict) or value.get("schema") != SCHEMA:
        raise ValueError(
            f"not an rdzv transition event of schema {SCHEMA}: {line[:80]!r}; "
            f"pass lines logged by the rdzv.events logger"
        )
    return value
