"""The JSON form of a node machine's inputs, configuration and state digests.

The handler records every step of its machines (``rdzv.events``) with the input it fed,
in full, and digests of the machine state before and after the step and of the request
that came out. ``python -m model_check validate`` reads such a log back and replays every
step through :func:`spec.machine.step`. Both sides use this module, so the form is
defined once.

The form is plain JSON: bytes as ``{"b64": ...}``, a fencing token as ``{"int": n}``,
``{"str": s}`` or ``{"b64": ...}``, a node as its three fields, a view as the bytes
:func:`spec.codec.encode` writes for it. :func:`event_from_json` raises :class:`WireError`
on anything that is not in this form, never something else.

Digests (:func:`digest`) are of ``repr``: every machine value is built from tuples,
ints, strings, bytes and enums, whose ``repr`` does not depend on ``PYTHONHASHSEED``, so
two processes of the same code agree on them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import asdict
from typing import Any

from spec.codec import CorruptState, decode, encode
from spec.machine import (
    Announced,
    AnnouncedMembers,
    Beaten,
    BeatValues,
    CasResult,
    Config,
    Event,
    IoFailed,
    Known,
    Now,
    ReadResult,
    StartOp,
    Token,
    Withdrawn,
    WokeUp,
)
from spec.settings import Settings, SettingsError
from spec.state import NodeId
from spec.variants import get_variant
from spec.vocabulary import Op

EVENT_SCHEMA = 3
"""Version of the event record layout (``rdzv.events``), which the validator checks; bump
it when a field changes meaning. Schema 2: ``row`` is the stable name of the table row
(``join.join_open_round``), not its index (schema 1), which meant different rows in
different variants. Schema 3 adds what a replay needs: ``node_id``, ``machine``,
``event``, ``config``, ``job``, ``before``, ``after`` and ``request_digest``."""

EVENT_TYPES: dict[type, str] = {
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
"""Each input's name: an event's ``type`` here, a record's ``input`` in ``rdzv.events``."""


class WireError(ValueError):
    """A recorded value is not in the form this module writes."""


def digest(value: object) -> str:
    """A short digest of a machine value (a local state, a request), stable across
    processes of the same code."""
    return hashlib.blake2b(repr(value).encode("utf-8"), digest_size=8).hexdigest()


# -- scalars -----------------------------------------------------------------------------
def _bytes(data: bytes | None) -> dict[str, str] | None:
    return None if data is None else {"b64": base64.b64encode(data).decode("ascii")}


def _unbytes(value: Any, what: str) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (binascii.Error, ValueError):
            pass
    raise WireError(f"{what} must be null or {{'b64': <base64>}}, not {value!r:.80}")


def _token(token: Token | None) -> dict[str, Any] | None:
    if token is None:
        return None
    if isinstance(token, bool):
        raise WireError(f"a fencing token cannot be a bool: {token!r}")
    if isinstance(token, int):
        return {"int": token}
    if isinstance(token, str):
        return {"str": token}
    return {"b64": base64.b64encode(token).decode("ascii")}


def _untoken(value: Any) -> Token | None:
    if value is None:
        return None
    if isinstance(value, dict) and len(value) == 1:
        ((kind, inner),) = value.items()
        if kind == "int" and isinstance(inner, int) and not isinstance(inner, bool):
            return inner
        if kind == "str" and isinstance(inner, str):
            return inner
        if kind == "b64":
            data = _unbytes(value, "a token")
            assert data is not None
            return data
    raise WireError(
        f"a token must be null, {{'int': n}}, {{'str': s}} or {{'b64': ...}}, not {value!r:.80}"
    )


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{what} must be an integer, not {value!r:.80}")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise WireError(f"{what} must be a string, not {value!r:.80}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise WireError(f"{what} must be a list, not {value!r:.80}")
    return value


def _now(now: Now) -> list[int]:
    return [now.mono, now.wall]


def _unnow(value: Any) -> Now:
    pair = _list(value, "now")
    if len(pair) != 2:
        raise WireError(f"now must be [mono, wall], not {value!r:.80}")
    return Now(_int(pair[0], "now's mono"), _int(pair[1], "now's wall"))


def node_to_json(node: NodeId) -> list[Any]:
    return [node[0], node[1], node[2]]


def node_from_json(value: Any) -> NodeId:
    fields = _list(value, "a node")
    if len(fields) != 3:
        raise WireError(f"a node must be [addr, pid, local_id], not {value!r:.80}")
    try:
        return NodeId(_str(fields[0], "a node's addr"), fields[1], fields[2])
    except ValueError as exc:
        raise WireError(str(exc)) from None


# -- the configuration -------------------------------------------------------------------
def config_to_json(config: Config) -> dict[str, Any]:
    """What a validator needs to rebuild ``config`` (its decoder is always spec's)."""
    return {
        "protocol": config.variant.name,
        "settings": asdict(config.settings),
        "key": config.key,
        "beat_modulus": config.beat_modulus,
    }


def config_from_json(value: Any) -> Config:
    if not isinstance(value, dict) or set(value) != {"protocol", "settings", "key", "beat_modulus"}:
        raise WireError(
            f"a config must hold protocol, settings, key and beat_modulus: {value!r:.120}"
        )
    try:
        variant = get_variant(_str(value["protocol"], "the protocol"))
        settings = Settings(**value["settings"]) if isinstance(value["settings"], dict) else None
    except (SettingsError, TypeError, ValueError) as exc:
        raise WireError(f"a recorded config is not valid: {exc}") from None
    if settings is None:
        raise WireError(f"a config's settings must be an object: {value['settings']!r:.80}")
    return Config(
        settings=settings,
        variant=variant,
        key=_str(value["key"], "the state key"),
        beat_modulus=_int(value["beat_modulus"], "beat_modulus"),
    )


# -- events ------------------------------------------------------------------------------
def event_to_json(event: Event, protocol: str) -> dict[str, Any]:
    """``event`` in full; ``protocol`` encodes a :class:`Known` view."""
    if isinstance(event, StartOp):
        known = event.known
        return {
            "type": EVENT_TYPES[StartOp],
            "op": event.op.value,
            "deadline": event.deadline,
            "now": _now(event.now),
            "sightings": None
            if event.sightings is None
            else [[node_to_json(n), beat, seen] for n, beat, seen in event.sightings],
            "known": None
            if known is None
            else {
                "view": _bytes(encode(known.view, protocol)),
                "token": _token(known.token),
                "synced_at": known.synced_at,
                "job": known.job,
            },
        }
    if isinstance(event, ReadResult):
        return {
            "type": EVENT_TYPES[ReadResult],
            "data": _bytes(event.data),
            "token": _token(event.token),
            "now": _now(event.now),
        }
    if isinstance(event, CasResult):
        return {
            "type": EVENT_TYPES[CasResult],
            "data": _bytes(event.data),
            "token": _token(event.token),
            "has_set": event.has_set,
            "now": _now(event.now),
        }
    if isinstance(event, IoFailed):
        return {"type": EVENT_TYPES[IoFailed], "reason": event.reason, "now": _now(event.now)}
    if isinstance(event, Announced):
        return {"type": EVENT_TYPES[Announced], "size": event.size, "now": _now(event.now)}
    if isinstance(event, AnnouncedMembers):
        return {
            "type": EVENT_TYPES[AnnouncedMembers],
            "members": [_bytes(m) for m in event.members],
            "now": _now(event.now),
        }
    if isinstance(event, BeatValues):
        return {
            "type": EVENT_TYPES[BeatValues],
            "values": [_bytes(v) for v in event.values],
            "now": _now(event.now),
        }
    return {"type": EVENT_TYPES[type(event)], "now": _now(event.now)}  # only the time


def event_from_json(value: Any, protocol: str) -> Event:
    """The event :func:`event_to_json` wrote; :class:`WireError` otherwise."""
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise WireError(f"an event must be an object with a type: {value!r:.80}")
    kind = value["type"]
    now = _unnow(value.get("now"))
    if kind == EVENT_TYPES[StartOp]:
        try:
            op = Op(value.get("op"))
        except ValueError:
            raise WireError(f"unknown operation {value.get('op')!r:.40}") from None
        sightings = value.get("sightings")
        known = value.get("known")
        return StartOp(
            op,
            _int(value.get("deadline"), "deadline"),
            now,
            None
            if sightings is None
            else tuple(_sighting(s) for s in _list(sightings, "sightings")),
            None if known is None else _known(known, protocol),
        )
    if kind == EVENT_TYPES[ReadResult]:
        return ReadResult(_unbytes(value.get("data"), "data"), _untoken(value.get("token")), now)
    if kind == EVENT_TYPES[CasResult]:
        has_set = value.get("has_set")
        if not isinstance(has_set, bool):
            raise WireError(f"has_set must be true or false, not {has_set!r:.40}")
        return CasResult(
            _unbytes(value.get("data"), "data"), _untoken(value.get("token")), has_set, now
        )
    if kind == EVENT_TYPES[IoFailed]:
        return IoFailed(_str(value.get("reason"), "reason"), now)
    if kind == EVENT_TYPES[Announced]:
        return Announced(_int(value.get("size"), "size"), now)
    if kind == EVENT_TYPES[AnnouncedMembers]:
        members = tuple(_unbytes(m, "a member") for m in _list(value.get("members"), "members"))
        if any(m is None for m in members):
            raise WireError("an announcement set member cannot be null")
        return AnnouncedMembers(tuple(m for m in members if m is not None), now)
    if kind == EVENT_TYPES[BeatValues]:
        return BeatValues(
            tuple(_unbytes(v, "a heartbeat value") for v in _list(value.get("values"), "values")),
            now,
        )
    plain: tuple[type[WokeUp | Withdrawn | Beaten], ...] = (WokeUp, Withdrawn, Beaten)
    for only_the_time in plain:
        if kind == EVENT_TYPES[only_the_time]:
            return only_the_time(now)
    raise WireError(f"unknown event type {kind!r:.40}")


def _sighting(value: Any) -> tuple[NodeId, int, int]:
    entry = _list(value, "a sighting")
    if len(entry) != 3:
        raise WireError(f"a sighting must be [node, beat, seen], not {value!r:.80}")
    return node_from_json(entry[0]), _int(entry[1], "a sighting"), _int(entry[2], "a sighting")


def _known(value: Any, protocol: str) -> Known:
    if not isinstance(value, dict):
        raise WireError(f"known must be an object, not {value!r:.80}")
    data = _unbytes(value.get("view"), "known's view")
    if data is None:
        raise WireError("known's view cannot be null")
    try:
        view = decode(data, protocol)
    except CorruptState as exc:
        raise WireError(f"known's view does not decode: {exc}") from None
    job = value.get("job")
    return Known(
        view,
        _untoken(value.get("token")),
        _int(value.get("synced_at"), "known's synced_at"),
        None if job is None else _int(job, "known's job"),
    )
