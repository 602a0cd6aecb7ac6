"""Canonical, versioned encoding of the shared state. Never pickle.

Format (version 2): one JSON object, UTF-8, keys sorted, no whitespace::

    {"closed":false,"complete":true,"deadline":null,
     "heartbeats":[["host",pid,local_id,wall_ms],...],
     "participants":[["host",pid,local_id,rank],...],
     "protocol":"hardened",
     "redundancy_list":[["host",pid,local_id],...],
     "round":3,"v":2,
     "wait_list":[["host",pid,local_id],...]}

plus ``"epoch":N`` (an integer >= 1) in a run that a new job reopened after the job
before it closed the run (``epoch`` 0 is not written).

Lists are sorted by node, so the same state always encodes to the same bytes.

``protocol`` names the protocol variant (:mod:`spec.variants`) of the node that wrote the
state. Nodes of different protocols must never share a state: their tables disagree on
what it means, so they hang or complete rounds that neither would complete alone.
:func:`decode` with ``protocol`` raises :class:`ProtocolMismatch` for a state another
protocol wrote, which the node machine turns into an immediate failure naming both.
Version 1 (the same object without ``protocol``, written by rdzv before it recorded the
protocol) is still read, as a state of unknown protocol, which any node accepts; it is
never written.

Decoding accepts exactly this shape and nothing else: unknown or missing keys, wrong
types (``true`` is not an integer), integers out of range, duplicate keys or nodes,
non-finite numbers, excessive nesting, invalid UTF-8 and unknown versions all raise
:class:`CorruptState` with a message naming the problem. No other exception escapes
:func:`decode`, whatever the input, and decoding never executes anything.
"""

from __future__ import annotations

import itertools
import json
import operator
from typing import Any, NoReturn

from spec.state import (
    MAX_ADDR_LEN,
    MAX_ID,
    NodeId,
    RendezvousState,
    trusted_nodes,
    valid_addr,
)

VERSION = 2
"""The version :func:`encode` writes."""
READ_VERSIONS = (1, 2)
"""The versions :func:`decode` reads (1: no ``protocol`` field)."""
MAX_PROTOCOL_LEN = 64
"""Longest protocol name accepted (printable ASCII, no spaces)."""
MAX_INT = MAX_ID
"""Largest integer accepted anywhere in the state (fits a signed 64-bit field)."""
MIN_INT = -(2**63)
"""Smallest time accepted (times may be negative in simulations)."""
MAX_BYTES = 64 * 1024 * 1024
"""Refuse to parse anything larger: a state for 100,000 nodes is well below this."""

_KEYS = frozenset(
    {
        "v",
        "protocol",
        "round",
        "complete",
        "closed",
        "deadline",
        "participants",
        "wait_list",
        "redundancy_list",
        "heartbeats",
    }
)
_KEYS_V1 = _KEYS - {"protocol"}
_OPTIONAL_KEYS = frozenset({"epoch"})
"""Keys of version 2 written only when they are not 0 (``epoch``: which job under the run
id; only a run a new job reopened has one), so states of the first job encode as before."""


class CorruptState(ValueError):
    """The bytes in the store are not a valid rendezvous state."""


class ProtocolMismatch(CorruptState):
    """The state is valid, but a node of another protocol wrote it.

    A :class:`CorruptState` (so that "decoding raises only CorruptState" still holds);
    ``stored`` and ``expected`` name the two protocols."""

    def __init__(self, stored: str, expected: str) -> None:
        super().__init__(
            f"the rendezvous state was written by a node of protocol {stored!r}, but this "
            f"node runs protocol {expected!r}; every node of a run must use the same "
            f"protocol: start this node with protocol={stored} (or restart the whole job "
            f"with protocol={expected} under a new run id)"
        )
        self.stored = stored
        self.expected = expected


def valid_protocol(name: object) -> bool:
    """Whether ``name`` can be recorded as a protocol: 1 to :data:`MAX_PROTOCOL_LEN`
    printable ASCII characters without spaces (every variant name is one)."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_PROTOCOL_LEN
        and name.isascii()
        and name.isprintable()
        and " " not in name
    )


def check_protocol(stored: str | None, expected: str) -> None:
    """:class:`ProtocolMismatch` unless a node of protocol ``expected`` may use a state
    that protocol ``stored`` wrote (``None``: a version-1 state, of unknown protocol)."""
    if stored is not None and stored != expected:
        raise ProtocolMismatch(stored, expected)


def _node_fields(node: NodeId) -> list[Any]:
    return [node.addr, node.pid, node.local_id]


def encode(state: RendezvousState, protocol: str) -> bytes:
    """The canonical bytes of ``state``, as written by a node of protocol ``protocol``
    (a variant name; ``ValueError`` unless :func:`valid_protocol`)."""
    if not valid_protocol(protocol):
        raise ValueError(
            f"protocol {protocol!r} cannot be recorded in the state: pass a variant name "
            f"of 1 to {MAX_PROTOCOL_LEN} printable ASCII characters without spaces, e.g. "
            f"'hardened'"
        )
    doc = {
        "v": VERSION,
        "protocol": protocol,
        "round": state.round,
        "complete": state.complete,
        "closed": state.closed,
        "deadline": state.deadline,
        "participants": [[*_node_fields(n), r] for n, r in state.participants],
        "wait_list": [_node_fields(n) for n in state.wait_list],
        "redundancy_list": [_node_fields(n) for n in state.redundancy_list],
        "heartbeats": [[*_node_fields(n), t] for n, t in state.last_heartbeats],
    }
    if state.epoch:
        doc["epoch"] = state.epoch
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def encode_node(node: NodeId) -> bytes:
    """The canonical bytes of one node identity (an announcement set member)."""
    return json.dumps(_node_fields(node), separators=(",", ":"), ensure_ascii=True).encode("ascii")


def decode_node(data: bytes) -> NodeId:
    """The node identity :func:`encode_node` wrote; :class:`CorruptState` otherwise (like
    :func:`decode`, nothing else escapes, whatever the bytes)."""
    shown = bytes(data[:64]) if isinstance(data, bytes | bytearray | memoryview) else data
    try:
        entry = json.loads(
            bytes(data).decode("ascii"),
            parse_constant=_reject_constant,
            parse_float=_reject_float,
        )
        node, _ = _node(entry, f"member {shown!r}", 0)
    except CorruptState:
        raise
    except RecursionError:
        raise CorruptState(
            f"a member {shown!r} that is not a node identity (nested too deeply)"
        ) from None
    except Exception as exc:  # the contract: only CorruptState escapes
        reason = f"{type(exc).__name__}: {str(exc)[:200]}"
        raise CorruptState(f"a member {shown!r} that is not a node identity ({reason})") from None
    return node


# -- decoding ------------------------------------------------------------------------------
def _bad(what: str) -> NoReturn:
    raise CorruptState(f"the rendezvous state is corrupt: {what}")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            _bad(f"duplicate key {key!r}")
        out[key] = value
    return out


def _reject_constant(name: str) -> NoReturn:
    _bad(f"non-finite number {name}")


def _reject_float(text: str) -> NoReturn:
    _bad(f"non-integer number {text[:32]}")


def _int(value: Any, where: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        _bad(f"{where} must be an integer, got {type(value).__name__}")
    if not low <= value <= MAX_INT:
        _bad(f"{where} = {value} is out of range [{low}, {MAX_INT}]")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        _bad(f"{where} must be true or false, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        _bad(f"{where} must be a list, got {type(value).__name__}")
    return value


def _node(entry: Any, where: str, extra: int) -> tuple[NodeId, list[Any]]:
    items = _list(entry, where)
    if len(items) != 3 + extra:
        _bad(f"{where} must have {3 + extra} fields, got {len(items)}")
    addr = items[0]
    if not valid_addr(addr):
        _bad(
            f"{where}: the address must be a non-empty string of at most {MAX_ADDR_LEN} chars"
            " of valid Unicode text (no lone surrogates)"
        )
    node = NodeId(addr, _int(items[1], f"{where} pid"), _int(items[2], f"{where} local_id"))
    return node, items[3:]


_Columns = tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]
"""The address, pid and local-id columns of a node list, as :func:`_fast_entries` read them."""


def _fast_entries(
    value: Any,
    extra: int,
    low: int,
    interned: dict[NodeId, NodeId],
    seen: list[tuple[_Columns, list[NodeId]]],
) -> list[tuple[NodeId, int]] | list[NodeId] | None:
    """The common case of a node list, fast: every entry a list of ``3 + extra`` fields,
    well formed, the entries in strictly increasing order (as :func:`encode` writes them)
    and the addresses in ASCII (any other address is checked for lone surrogates on the
    checking path). Returns the nodes (``extra`` 0) or (node, value) pairs (``extra`` 1),
    or None when anything is off, and the caller then takes the checking path, which
    names the problem. Nodes already seen in this state are shared (``interned``).

    Every check runs over whole columns with built-ins (``map``, ``min``, ``max``,
    ``zip``), not per entry in Python: a state of 1,024 nodes is checked several times
    faster (``benchmarks/bench_scale.py`` decodes one per node).

    ``seen`` holds the node columns this state's earlier lists had on this path and the
    nodes made of them: a list with the same columns (the heartbeats of a complete round
    list exactly its participants) reuses those nodes, already checked and ordered, and
    this call adds its own columns when it makes new ones. Equal columns of exactly the
    types checked here hold exactly the same values, so reusing them checks as much."""
    if type(value) is not list:
        return None
    if not value:
        return []
    width = 3 + extra
    if set(map(type, value)) != {list} or set(map(len, value)) != {width}:
        return None
    columns = list(zip(*value, strict=True))
    addrs, pids, local_ids = columns[0], columns[1], columns[2]
    numbers = columns[3] if extra else ()
    if set(map(type, addrs)) != {str} or set(map(type, pids)) != {int}:
        return None
    if set(map(type, local_ids)) != {int}:
        return None
    if extra and set(map(type, numbers)) != {int}:
        return None
    if extra and (min(numbers) < low or max(numbers) > MAX_INT):
        return None
    node_columns = (addrs, pids, local_ids)
    for known, known_nodes in seen:
        if known == node_columns:
            return list(zip(known_nodes, numbers, strict=True)) if extra else list(known_nodes)
    lengths = list(map(len, addrs))
    if min(lengths) < 1 or max(lengths) > MAX_ADDR_LEN or not all(map(str.isascii, addrs)):
        return None
    if min(pids) < 0 or max(pids) > MAX_INT or min(local_ids) < 0 or max(local_ids) > MAX_INT:
        return None
    nodes = trusted_nodes(zip(addrs, pids, local_ids, strict=True))
    if not all(map(operator.lt, nodes, itertools.islice(nodes, 1, None))):
        return None  # out of order or a duplicate
    nodes = list(map(interned.setdefault, nodes, nodes))
    seen.append((node_columns, nodes))
    return list(zip(nodes, numbers, strict=True)) if extra else nodes


def _node_list(value: Any, name: str) -> tuple[NodeId, ...]:
    nodes = []
    for i, entry in enumerate(_list(value, name)):
        node, _ = _node(entry, f"{name}[{i}]", 0)
        nodes.append(node)
    return _unique_sorted(nodes, name)


def _unique_sorted(nodes: list[NodeId], name: str) -> tuple[NodeId, ...]:
    ordered = sorted(nodes)
    for a, b in itertools.pairwise(ordered):
        if a == b:
            _bad(f"node {a} appears twice in {name}")
    return tuple(ordered)


def _node_map(value: Any, name: str, field: str, low: int = 0) -> tuple[tuple[NodeId, int], ...]:
    pairs: list[tuple[NodeId, int]] = []
    for i, entry in enumerate(_list(value, name)):
        node, rest = _node(entry, f"{name}[{i}]", 1)
        pairs.append((node, _int(rest[0], f"{name}[{i}] {field}", low)))
    _unique_sorted([n for n, _ in pairs], name)
    return tuple(sorted(pairs))


def decode(data: bytes, protocol: str | None = None) -> RendezvousState:
    """Parse and validate bytes produced by :func:`encode`; see the module docstring.

    With ``protocol``, a state written by a node of another protocol raises
    :class:`ProtocolMismatch` (a :class:`CorruptState`)."""
    state, stored = decode_with_protocol(data)
    if protocol is not None:
        check_protocol(stored, protocol)
    return state


def decode_with_protocol(data: bytes) -> tuple[RendezvousState, str | None]:
    """:func:`decode`, and the protocol that wrote the state (``None`` for version 1),
    for decoders that remember answers and check the protocol themselves
    (:func:`check_protocol`)."""
    try:
        return _decode(data)
    except CorruptState:
        raise
    except RecursionError:
        raise CorruptState("the rendezvous state is corrupt: nested too deeply") from None
    except Exception as exc:  # the documented contract: only CorruptState escapes
        raise CorruptState(
            f"the rendezvous state is corrupt: {type(exc).__name__}: {str(exc)[:200]}"
        ) from None


def _decode(data: bytes) -> tuple[RendezvousState, str | None]:
    if not isinstance(data, bytes | bytearray | memoryview):
        _bad(f"expected bytes, got {type(data).__name__}")
    raw = bytes(data)
    if len(raw) > MAX_BYTES:
        _bad(f"{len(raw)} bytes is larger than the {MAX_BYTES}-byte limit")
    if not raw.startswith(b"{"):
        _bad(
            "not a rdzv state (expected a JSON object); another program, or an older "
            "rendezvous implementation, may have written this key"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        _bad(f"invalid UTF-8 at byte {exc.start}")
    try:
        doc = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_reject_constant,
            parse_float=_reject_float,
        )
    except json.JSONDecodeError as exc:
        _bad(f"invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")
    if not isinstance(doc, dict):
        _bad("the top level must be a JSON object")
    if "v" not in doc:
        _bad("no version field 'v'; this is not a state written by rdzv")
    version = doc["v"]
    if isinstance(version, bool) or version not in READ_VERSIONS:
        _bad(
            f"unsupported version {version!r}; this rdzv understands versions "
            f"{', '.join(map(str, READ_VERSIONS))} (a newer rdzv may have written it: run "
            f"the same rdzv version on every node)"
        )
    expected = _KEYS if version == VERSION else _KEYS_V1
    keys = set(doc)
    if version == VERSION:
        keys -= _OPTIONAL_KEYS
    if keys != expected:
        missing = sorted(expected - keys)
        unknown = sorted(keys - expected)
        _bad(f"missing keys {missing}, unknown keys {unknown}")
    protocol: str | None = None
    if version == VERSION:
        protocol = doc["protocol"]
        if not valid_protocol(protocol):
            _bad(
                f"protocol must be a name of 1 to {MAX_PROTOCOL_LEN} printable ASCII "
                f"characters without spaces, got {str(protocol)[:80]!r}"
            )
    deadline = doc["deadline"]
    interned: dict[NodeId, NodeId] = {}
    seen: list[tuple[_Columns, list[NodeId]]] = []

    def node_map(name: str, field: str, low: int = 0) -> tuple[tuple[NodeId, int], ...]:
        fast = _fast_entries(doc[name], 1, low, interned, seen)
        if fast is None:
            return _node_map(doc[name], name, field, low)
        return tuple(fast)  # type: ignore[arg-type]

    def node_list(name: str) -> tuple[NodeId, ...]:
        fast = _fast_entries(doc[name], 0, 0, interned, seen)
        if fast is None:
            return _node_list(doc[name], name)
        return tuple(fast)  # type: ignore[arg-type]

    state = RendezvousState(
        round=_int(doc["round"], "round"),
        complete=_bool(doc["complete"], "complete"),
        closed=_bool(doc["closed"], "closed"),
        deadline=None if deadline is None else _int(deadline, "deadline", MIN_INT),
        participants=node_map("participants", "rank"),
        wait_list=node_list("wait_list"),
        redundancy_list=node_list("redundancy_list"),
        last_heartbeats=node_map("heartbeats", "time", MIN_INT),
        epoch=_int(doc["epoch"], "epoch", 1) if "epoch" in doc else 0,
    )
    return state, protocol
