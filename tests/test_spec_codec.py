"""The codec: round trips, canonical bytes, malformed input, and the size budget.

The contract under test: ``decode(encode(s, protocol)) == s`` for every valid state, equal states
encode to equal bytes, and *no* input makes ``decode`` raise anything but
:class:`spec.codec.CorruptState`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spec.codec import (
    MAX_INT,
    MAX_PROTOCOL_LEN,
    MIN_INT,
    VERSION,
    CorruptState,
    ProtocolMismatch,
    decode,
    decode_node,
    decode_with_protocol,
    encode,
    encode_node,
)
from spec.state import EMPTY_STATE, MAX_ADDR_LEN, NodeId, RendezvousState
from spec.variants import VARIANTS

P = "hardened"
"""The protocol the tests' states are written by (any variant name would do)."""

# -- strategies ---------------------------------------------------------------------------
ints = st.integers(0, MAX_INT)
times = st.integers(MIN_INT, MAX_INT)
nodes = st.builds(
    NodeId,
    addr=st.text(min_size=1, max_size=24),
    pid=st.one_of(st.integers(0, 10**6), ints),
    local_id=st.one_of(st.integers(0, 3), ints),
)


@st.composite
def states(draw: st.DrawFn) -> RendezvousState:
    pool = draw(st.lists(nodes, max_size=12, unique=True))
    participants = {n: draw(ints | st.integers(0, 20)) for n in pool if draw(st.booleans())}
    return RendezvousState.build(
        round=draw(ints | st.integers(0, 5)),
        complete=draw(st.booleans()),
        closed=draw(st.booleans()),
        deadline=draw(st.none() | times),
        participants=participants,
        wait_list=[n for n in pool if draw(st.booleans())],
        redundancy_list=[n for n in pool if draw(st.booleans())],
        last_heartbeats={n: draw(times) for n in pool if draw(st.booleans())},
    )


def _doc(state: RendezvousState) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(encode(state, P))
    return parsed


def _bytes(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


SAMPLE = RendezvousState.build(
    round=3,
    complete=True,
    deadline=None,
    participants={NodeId("a", 1, 0): 0, NodeId("b", 2, 1): 1},
    wait_list=[NodeId("c", 3, 0)],
    redundancy_list=[NodeId("d", 4, 0)],
    last_heartbeats={NodeId(x, i + 1, 0): 1_800_000_000_000 + i for i, x in enumerate("abcd")},
)
SAMPLE_BYTES = encode(SAMPLE, P)


# -- round trip and canonical form ----------------------------------------------------------
@given(states())
def test_round_trip(state: RendezvousState) -> None:
    data = encode(state, P)
    assert decode(data) == state
    assert encode(decode(data), P) == data


def test_round_trip_of_the_empty_state() -> None:
    assert decode(encode(EMPTY_STATE, P)) == EMPTY_STATE


def test_encoding_is_compact_sorted_ascii_json() -> None:
    data = encode(SAMPLE, P)
    assert data.isascii()
    assert b" " not in data and b"\n" not in data
    doc = json.loads(data)
    assert list(doc) == sorted(doc)
    assert doc["v"] == VERSION
    assert doc["participants"] == [["a", 1, 0, 0], ["b", 2, 1, 1]]
    assert doc["heartbeats"][0] == ["a", 1, 0, 1_800_000_000_000]


@given(states(), st.randoms(use_true_random=False))
def test_equal_states_built_in_any_order_encode_identically(
    state: RendezvousState, rnd: Any
) -> None:
    def shuffled(items: list[Any]) -> list[Any]:
        out = list(items)
        rnd.shuffle(out)
        return out

    rebuilt = RendezvousState.build(
        round=state.round,
        complete=state.complete,
        closed=state.closed,
        deadline=state.deadline,
        participants=dict(shuffled(list(state.participants))),
        wait_list=shuffled(list(state.wait_list)),
        redundancy_list=shuffled(list(state.redundancy_list)),
        last_heartbeats=dict(shuffled(list(state.last_heartbeats))),
    )
    assert rebuilt == state
    assert encode(rebuilt, P) == encode(state, P)


def test_same_state_reached_by_different_update_orders_encodes_identically() -> None:
    a, b = NodeId("x", 1), NodeId("y", 2)
    one = EMPTY_STATE.evolve(participants={a: 0}).evolve(participants={a: 0, b: 0})
    two = EMPTY_STATE.evolve(participants={b: 0}).evolve(participants={b: 0, a: 0})
    assert encode(one, P) == encode(two, P)


def test_decode_accepts_unsorted_lists_and_bytes_like_input() -> None:
    doc = _doc(SAMPLE)
    doc["participants"].reverse()
    doc["heartbeats"].reverse()
    assert decode(_bytes(doc)) == SAMPLE
    # Typed as bytes, but bytes-like values from store clients are accepted too.
    assert decode(bytearray(SAMPLE_BYTES)) == SAMPLE  # type: ignore[arg-type]
    assert decode(memoryview(SAMPLE_BYTES)) == SAMPLE  # type: ignore[arg-type]


@given(states(), st.randoms(use_true_random=False))
def test_canonical_and_reordered_encodings_decode_to_equal_states(
    state: RendezvousState, rnd: Any
) -> None:
    # Canonical bytes take the fast path; shuffled lists the checking one.
    doc = _doc(state)
    for key in ("participants", "heartbeats", "wait_list", "redundancy_list"):
        rnd.shuffle(doc[key])
    fast, checked = decode(encode(state, P)), decode(_bytes(doc))
    assert fast == checked == state
    assert [hash(n) for n, _ in fast.participants] == [hash(n) for n, _ in state.participants]
    assert [str(n) for n in fast.wait_list] == [str(n) for n in state.wait_list]


def test_a_node_listed_twice_is_decoded_once() -> None:
    decoded = decode(SAMPLE_BYTES)
    members = {n: n for n, _ in decoded.participants}
    shared = [n for n, _ in decoded.last_heartbeats if n in members]
    assert shared and all(members[n] is n for n in shared)


def test_heartbeats_listing_exactly_the_participants_reuse_their_nodes_and_are_checked() -> None:
    # A complete round's heartbeats list exactly its participants: the fast path reuses
    # the participants' checked nodes for them, and still checks the heartbeat times and
    # the types of every column.
    nodes = [NodeId("h", 1, i) for i in range(40)]
    state = RendezvousState.build(
        participants={n: i for i, n in enumerate(nodes)},
        last_heartbeats={n: 1_000 + i for i, n in enumerate(nodes)},
        complete=True,
    )
    decoded = decode(encode(state, P))
    assert decoded == state
    members = {n: n for n, _ in decoded.participants}
    assert all(members[n] is n for n, _ in decoded.last_heartbeats)
    assert [t for _, t in decoded.last_heartbeats] == [1_000 + i for i in range(40)]
    doc = _doc(state)
    doc["heartbeats"][3][1] = True  # a pid that equals 1 but is not a number
    with pytest.raises(CorruptState, match="heartbeats"):
        decode(_bytes(doc))
    doc = _doc(state)
    doc["participants"][5][3] = -1  # the participants' own values are still checked
    with pytest.raises(CorruptState, match="rank"):
        decode(_bytes(doc))


# -- malformed input: only CorruptState --------------------------------------------------
def _only_corrupt(data: Any) -> None:
    """decode(data) either succeeds with a re-encodable state or raises CorruptState."""
    try:
        state = decode(data)
    except CorruptState as exc:
        assert str(exc).startswith("the rendezvous state is corrupt")
        return
    assert decode(encode(state, P)) == state


@settings(max_examples=1500)
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    _only_corrupt(data)


@settings(max_examples=1500)
@given(st.binary(max_size=200).map(lambda b: b"{" + b))
def test_random_bytes_after_a_brace(data: bytes) -> None:
    _only_corrupt(data)


@settings(max_examples=500)
@given(states(), st.data())
def test_every_truncation_of_a_valid_encoding(state: RendezvousState, data: st.DataObject) -> None:
    encoded = encode(state, P)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(CorruptState):
        decode(encoded[:cut])


def test_all_truncations_of_the_sample() -> None:
    for cut in range(len(SAMPLE_BYTES)):
        with pytest.raises(CorruptState):
            decode(SAMPLE_BYTES[:cut])


@settings(max_examples=1000)
@given(states(), st.data())
def test_byte_mutations_of_a_valid_encoding(state: RendezvousState, data: st.DataObject) -> None:
    encoded = bytearray(encode(state, P))
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.integers(0, len(encoded) - 1))
        kind = data.draw(st.sampled_from(["flip", "insert", "delete"]))
        byte = data.draw(st.integers(0, 255))
        if kind == "flip":
            encoded[where] = byte
        elif kind == "insert":
            encoded.insert(where, byte)
        elif len(encoded) > 1:
            del encoded[where]
    _only_corrupt(bytes(encoded))


# -- one node identity (an announcement set's member) ----------------------------------------
def _only_corrupt_node(data: bytes) -> None:
    """decode_node(data) either gives a node that encodes back to ``data``'s identity or
    raises CorruptState: nothing else escapes, whatever the bytes."""
    try:
        node = decode_node(data)
    except CorruptState:
        return
    assert decode_node(encode_node(node)) == node


@settings(max_examples=1000)
@given(st.binary(max_size=100))
def test_random_bytes_as_a_member(data: bytes) -> None:
    _only_corrupt_node(data)


@settings(max_examples=500)
@given(st.binary(max_size=60).map(lambda b: b"[" + b))
def test_random_bytes_after_a_bracket_as_a_member(data: bytes) -> None:
    _only_corrupt_node(data)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"[" * 1024, "nested too deeply"),  # within a member's size limit, deeper than JSON's
        (b"junk", "JSONDecodeError"),
        (b"\xff", "UnicodeDecodeError"),
        (b'["h",1]', "must have 3 fields, got 2"),
        (b'{"addr":"h"}', "must be a list, got dict"),
        (b'["h",1,NaN]', "NaN"),
    ],
)
def test_malformed_members_are_corrupt_and_say_why(data: bytes, reason: str) -> None:
    with pytest.raises(CorruptState, match=reason):
        decode_node(data)


@given(
    st.builds(NodeId, st.text(min_size=1, max_size=20), st.integers(0, 2**31), st.integers(0, 99))
)
def test_member_round_trip(node: NodeId) -> None:
    assert decode_node(encode_node(node)) == node


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=1000)
@given(json_values)
def test_arbitrary_json_values(value: Any) -> None:
    _only_corrupt(json.dumps(value).encode())


@settings(max_examples=500)
@given(st.fixed_dictionaries({key: json_values for key in _doc(SAMPLE)}))
def test_right_keys_with_arbitrary_values(doc: dict[str, Any]) -> None:
    _only_corrupt(_bytes(doc))


@settings(max_examples=500)
@given(
    st.sampled_from(["participants", "heartbeats", "wait_list", "redundancy_list"]),
    st.lists(st.lists(json_values, max_size=5), max_size=4),
)
def test_node_lists_with_arbitrary_entries(field: str, entries: list[Any]) -> None:
    doc = _doc(SAMPLE)
    doc[field] = entries
    _only_corrupt(_bytes(doc))


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        target: Any = doc
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return edit


INT_FIELDS: list[tuple[Any, ...]] = [
    ("round",),
    ("deadline",),
    ("participants", 0, 1),
    ("participants", 0, 2),
    ("participants", 0, 3),
    ("heartbeats", 0, 1),
    ("heartbeats", 0, 2),
    ("heartbeats", 0, 3),
    ("wait_list", 0, 1),
    ("wait_list", 0, 2),
    ("redundancy_list", 0, 2),
]
BOOL_FIELDS: list[tuple[Any, ...]] = [("complete",), ("closed",)]
LIST_FIELDS: list[tuple[Any, ...]] = [
    ("participants",),
    ("wait_list",),
    ("redundancy_list",),
    ("heartbeats",),
    ("participants", 0),
    ("wait_list", 0),
    ("heartbeats", 0),
]
ADDR_FIELDS: list[tuple[Any, ...]] = [
    ("participants", 0, 0),
    ("wait_list", 0, 0),
    ("redundancy_list", 0, 0),
    ("heartbeats", 0, 0),
]

WRONG_FOR_INT = [True, False, "1", [1], {"n": 1}, None]
WRONG_FOR_BOOL = [0, 1, "true", None, [], {}]
WRONG_FOR_LIST = ["x", 1, None, {}, True]
WRONG_FOR_ADDR = ["", 1, None, True, ["a"], "h" * (MAX_ADDR_LEN + 1)]

WRONG_TYPE_CASES = (
    [(p, v) for p in INT_FIELDS for v in WRONG_FOR_INT if not (p == ("deadline",) and v is None)]
    + [(p, v) for p in BOOL_FIELDS for v in WRONG_FOR_BOOL]
    + [(p, v) for p in LIST_FIELDS for v in WRONG_FOR_LIST]
    + [(p, v) for p in ADDR_FIELDS for v in WRONG_FOR_ADDR]
    + [(p, v) for p in INT_FIELDS if p != ("deadline",) and p[-1] != 3 for v in (-1, MAX_INT + 1)]
    + [(p, v) for p in [("deadline",), ("heartbeats", 0, 3)] for v in (MIN_INT - 1, MAX_INT + 1)]
    + [(("participants", 0, 3), v) for v in (-1, MAX_INT + 1)]
)


@pytest.mark.parametrize(
    ("path", "value"), WRONG_TYPE_CASES, ids=[f"{p}={v!r}"[:60] for p, v in WRONG_TYPE_CASES]
)
def test_wrong_type_or_range_for_each_field(path: tuple[Any, ...], value: Any) -> None:
    doc = _doc(SAMPLE)
    _set(path, value)(doc)
    with pytest.raises(CorruptState) as info:
        decode(_bytes(doc))
    assert str(path[0]) in str(info.value) or "node" in str(info.value)


def test_boundary_values_are_accepted() -> None:
    doc = _doc(SAMPLE)
    doc["deadline"] = MIN_INT
    doc["heartbeats"][0][3] = MAX_INT
    doc["participants"][0][1] = MAX_INT
    doc["round"] = MAX_INT
    doc["participants"][0][0] = "h" * MAX_ADDR_LEN
    state = decode(_bytes(doc))
    assert state.deadline == MIN_INT and state.round == MAX_INT


# -- named malformed cases with informative messages -----------------------------------------
def _mutated(edit: Callable[[dict[str, Any]], None]) -> bytes:
    doc = _doc(SAMPLE)
    edit(doc)
    return _bytes(doc)


# fmt: off
NAMED: list[tuple[str, bytes, str]] = [
    ("empty", b"", "not a rdzv state"),
    ("pickle", b"\x80\x04\x95\x00", "not a rdzv state"),
    ("json-array", b"[1,2]", "not a rdzv state"),
    ("leading-space", b" " + SAMPLE_BYTES, "not a rdzv state"),
    ("deep-list-nesting", b"[" * 100_000, "not a rdzv state"),
    ("deep-object-nesting", b'{"a":' * 100_000, "nested too deeply"),
    ("deep-nesting-in-a-field", SAMPLE_BYTES[:-1] + b',"x":' + b"[" * 100_000, "nested"),
    ("non-utf8", b'{"v":1,"\xff":0}', "invalid UTF-8 at byte 8"),
    ("bad-json", b'{"v":1,', "invalid JSON"),
    ("nan", SAMPLE_BYTES.replace(b'"deadline":null', b'"deadline":NaN'), "non-finite number NaN"),
    ("infinity", SAMPLE_BYTES.replace(b'"deadline":null', b'"deadline":Infinity'),
     "non-finite number Infinity"),
    ("minus-infinity", SAMPLE_BYTES.replace(b'"deadline":null', b'"deadline":-Infinity'),
     "non-finite number -Infinity"),
    ("float", SAMPLE_BYTES.replace(b'"round":3', b'"round":3.0'), "non-integer number 3.0"),
    ("exponent", SAMPLE_BYTES.replace(b'"round":3', b'"round":3e0'), "non-integer number 3e0"),
    ("huge-int", SAMPLE_BYTES.replace(b'"round":3', b'"round":' + b"9" * 30),
     "out of range"),
    ("giant-int", SAMPLE_BYTES.replace(b'"round":3', b'"round":' + b"9" * 20_000), "corrupt"),
    ("bool-round", _mutated(_set(("round",), True)), "round must be an integer, got bool"),
    ("bool-pid", _mutated(_set(("wait_list", 0, 1), False)),
     "wait_list[0] pid must be an integer, got bool"),
    ("string-complete", _mutated(_set(("complete",), "yes")), "complete must be true or false"),
    ("negative-rank", _mutated(_set(("participants", 1, 3), -1)),
     "participants[1] rank = -1 is out of range"),
    ("duplicate-key", SAMPLE_BYTES[:-1] + b',"round":4}', "duplicate key 'round'"),
    ("duplicate-participant",
     _mutated(lambda d: d["participants"].append(list(d["participants"][0]))),
     "node a_1_0 appears twice in participants"),
    ("duplicate-waiter", _mutated(lambda d: d["wait_list"].append(["c", 3, 0])),
     "node c_3_0 appears twice in wait_list"),
    ("duplicate-heartbeat", _mutated(lambda d: d["heartbeats"].append(["a", 1, 0, 5])),
     "appears twice in heartbeats"),
    ("short-node", _mutated(_set(("wait_list", 0), ["c", 3])), "wait_list[0] must have 3 fields"),
    ("long-participant", _mutated(_set(("participants", 0), ["a", 1, 0, 0, 9])),
     "participants[0] must have 4 fields, got 5"),
    ("empty-addr", _mutated(_set(("wait_list", 0, 0), "")), "address must be a non-empty string"),
    ("lone-surrogate-addr", _mutated(_set(("participants", 0, 0), "\ud800")),
     "participants[0]: the address must be a non-empty string"),
    ("lone-surrogate-waiter", _mutated(_set(("wait_list", 0, 0), "h\udfff")),
     "no lone surrogates"),
    ("unknown-version", _mutated(_set(("v",), 3)), "unsupported version 3"),
    ("version-zero", _mutated(_set(("v",), 0)), "unsupported version 0"),
    ("version-true", _mutated(_set(("v",), True)), "unsupported version True"),
    ("version-string", _mutated(_set(("v",), "1")), "unsupported version '1'"),
    ("no-version", _mutated(lambda d: d.pop("v")), "no version field"),
    ("no-protocol", _mutated(lambda d: d.pop("protocol")), "missing keys ['protocol']"),
    ("protocol-in-version-1", _mutated(_set(("v",), 1)), "unknown keys ['protocol']"),
    ("int-protocol", _mutated(_set(("protocol",), 1)), "protocol must be a name"),
    ("null-protocol", _mutated(_set(("protocol",), None)), "protocol must be a name"),
    ("empty-protocol", _mutated(_set(("protocol",), "")), "protocol must be a name"),
    ("spaced-protocol", _mutated(_set(("protocol",), "hard ened")), "protocol must be a name"),
    ("non-ascii-protocol", _mutated(_set(("protocol",), "härdened")), "protocol must be a name"),
    ("surrogate-protocol", _mutated(_set(("protocol",), "\ud800")), "protocol must be a name"),
    ("long-protocol", _mutated(_set(("protocol",), "p" * (MAX_PROTOCOL_LEN + 1))),
     "protocol must be a name"),
    ("missing-key", _mutated(lambda d: d.pop("closed")), "missing keys ['closed']"),
    ("extra-key", _mutated(_set(("extra",), 1)), "unknown keys ['extra']"),
    ("trailing-data", SAMPLE_BYTES + b"[", "invalid JSON (Extra data"),
]
# fmt: on


@pytest.mark.parametrize(
    ("data", "message"), [(d, m) for _, d, m in NAMED], ids=[n for n, _, _ in NAMED]
)
def test_named_malformed_inputs(data: bytes, message: str) -> None:
    with pytest.raises(CorruptState) as info:
        decode(data)
    assert message in str(info.value)


@pytest.mark.parametrize("value", ["text", 42, None, ["x"]], ids=repr)
def test_non_bytes_input(value: Any) -> None:
    with pytest.raises(CorruptState, match="expected bytes"):
        decode(value)


def test_corrupt_state_is_a_value_error() -> None:
    assert issubclass(CorruptState, ValueError)


# -- size budget ------------------------------------------------------------------------------
def _big_state(participants: int, waiting: int) -> RendezvousState:
    wall = 1_812_345_678_901

    def host(i: int) -> NodeId:
        return NodeId(f"worker-{i:05d}.cluster.example.com", 100_000 + (i * 7919) % 899_999, 0)

    members = [host(i) for i in range(participants)]
    waiters = [host(participants + i) for i in range(waiting)]
    return RendezvousState.build(
        round=12,
        complete=True,
        participants={n: r for r, n in enumerate(sorted(members))},
        wait_list=waiters,
        last_heartbeats={n: wall + i for i, n in enumerate(members + waiters)},
    )


@pytest.mark.parametrize(
    ("participants", "waiting", "budget"),
    [(500, 500, 160_000), (5_000, 5_000, 1_600_000)],
    ids=["500+500", "5000+5000"],
)
def test_state_size_budget(participants: int, waiting: int, budget: int) -> None:
    state = _big_state(participants, waiting)
    data = encode(state, P)
    print(
        f"\n{participants} participants + {waiting} waiting: {len(data):,} bytes "
        f"(budget {budget:,}, {100 * len(data) / budget:.0f}%)"
    )
    assert len(data) <= budget
    assert decode(data) == state


@pytest.mark.parametrize(
    ("addr", "pid", "local_id"),
    [
        ("", 1, 0),
        ("x" * 1025, 1, 0),
        ("\ud800", 1, 0),
        ("h", -1, 0),
        ("h", 1, -1),
        ("h", True, 0),
        ("h", 2**63, 0),
    ],
)
def test_node_ids_the_codec_cannot_read_back_are_refused(
    addr: str, pid: int, local_id: int
) -> None:
    with pytest.raises(ValueError, match="node"):
        NodeId(addr, pid, local_id)


def test_non_ascii_addresses_round_trip_and_print() -> None:
    node = NodeId("hôte-ü.例え", 7, 0)
    state = RendezvousState.build(participants={node: 0}, last_heartbeats={node: 5})
    assert decode(encode(state, P)) == state
    assert str(decode(encode(state, P)).participants[0][0]).encode("utf-8")


def test_the_longest_allowed_address_round_trips() -> None:
    node = NodeId("a" * 1024, 2**63 - 1, 2**63 - 1)
    state = RendezvousState.build(participants={node: 0}, last_heartbeats={node: 5})
    assert decode(encode(state, P)) == state


# -- the protocol that wrote the state (issue 26) -------------------------------------------
SAMPLE_V2 = (
    b'{"closed":false,"complete":true,"deadline":null,'
    b'"heartbeats":[["a",1,0,1800000000000],["b",2,0,1800000000001],'
    b'["c",3,0,1800000000002],["d",4,0,1800000000003]],'
    b'"participants":[["a",1,0,0],["b",2,1,1]],"protocol":"hardened",'
    b'"redundancy_list":[["d",4,0]],"round":3,"v":2,"wait_list":[["c",3,0]]}'
)
"""The sample as version 2 writes it: the format, pinned byte for byte."""
SAMPLE_V1 = SAMPLE_V2.replace(b'"protocol":"hardened",', b"").replace(b'"v":2', b'"v":1')
"""The sample as rdzv wrote it before it recorded the protocol (version 1)."""


def test_the_sample_encodes_to_the_pinned_version_2_bytes() -> None:
    assert SAMPLE_BYTES == SAMPLE_V2
    assert VERSION == 2


@given(states(), st.sampled_from(sorted(VARIANTS)))
def test_round_trip_keeps_the_protocol(state: RendezvousState, protocol: str) -> None:
    data = encode(state, protocol)
    assert decode_with_protocol(data) == (state, protocol)
    assert decode(data, protocol) == state == decode(data)
    assert encode(decode(data), protocol) == data


@pytest.mark.parametrize(("stored", "expected"), [("hardened", "scale"), ("upstream", "hardened")])
def test_a_state_of_another_protocol_is_refused_naming_both(stored: str, expected: str) -> None:
    data = encode(SAMPLE, stored)
    with pytest.raises(ProtocolMismatch) as info:
        decode(data, expected)
    error = info.value
    assert isinstance(error, CorruptState)  # "decode raises only CorruptState" still holds
    assert (error.stored, error.expected) == (stored, expected)
    message = str(error)
    assert f"protocol {stored!r}" in message and f"protocol {expected!r}" in message
    assert "every node of a run must use the same protocol" in message
    assert decode(data) == SAMPLE  # without a protocol to check, it reads as usual


def test_a_version_1_state_is_read_as_of_unknown_protocol() -> None:
    assert decode_with_protocol(SAMPLE_V1) == (SAMPLE, None)
    for protocol in VARIANTS:
        assert decode(SAMPLE_V1, protocol) == SAMPLE
    assert encode(decode(SAMPLE_V1), P) == SAMPLE_V2  # written back as version 2


@pytest.mark.parametrize("protocol", ["", "a b", "härdened", "p" * (MAX_PROTOCOL_LEN + 1), 7])
def test_encode_refuses_a_protocol_it_could_not_read_back(protocol: Any) -> None:
    with pytest.raises(ValueError, match="cannot be recorded in the state"):
        encode(SAMPLE, protocol)


def test_every_variant_name_can_be_recorded() -> None:
    for name, variant in VARIANTS.items():
        assert decode_with_protocol(encode(EMPTY_STATE, name))[1] == variant.name == name
