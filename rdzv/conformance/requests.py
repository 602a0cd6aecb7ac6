"""The node machine's requests, carried out on the store under test, answer as
:mod:`spec.storage` defines: the definition the model checker serves its simulated
nodes by. Each property drives :func:`rdzv.driver.serve_on` (the handler's one adapter
to real stores, over :class:`~rdzv.backend.StoreRendezvousBackend`) and
:func:`spec.storage.serve` side by side through one seeded sequence of requests from
three nodes, and requires the same answer, tokens included, at every step.

The sequences are fixed (seeded), so a failure names a step that can be rerun. They
write few distinct states, so states come back (A, then B, then A) and tokens read
before such a sequence are used again, and they use tokens never handed out, to hold a
store to value tokens (:func:`spec.storage.value_token`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from rdzv.backend import StoreRendezvousBackend
from rdzv.conformance.common import Broken, Config
from rdzv.conformance.sets import sets_of
from rdzv.driver import serve_on
from rdzv.store import Store
from spec.codec import encode_node
from spec.machine import (
    Announce,
    Beat,
    CompareAndSet,
    Now,
    Read,
    ReadAnnounced,
    ReadBeats,
    Token,
    Withdraw,
)
from spec.state import NodeId
from spec.storage import ServedRequest, StoreImage, same_answer, serve, wait_ends

STEPS = 150
"""Requests per property run."""
NODES = tuple(NodeId("conformance.example", pid) for pid in (1, 2, 3))
STATES = (b'{"s":"A"}', b'{"s":"B"}', b'{"s":"C"}')
"""The bytes the sequences write: few, so that states come back."""
NEVER_HANDED_OUT: Token = b'{"s":"never written"}'
ROUNDS = (0, 1)
NOW = Now(0, 0)
"""The clocks every answer carries (both sides get the same; time plays no part here)."""
RUN_ID = "conformance-requests"


def _request(
    rng: random.Random, node: NodeId, seen: Sequence[Token | None], kinds: Sequence[str]
) -> ServedRequest:
    kind = rng.choice(kinds)
    key = "state"
    if kind == "read":
        return Read(key)
    if kind == "cas":
        token = rng.choice([*seen, None, NEVER_HANDED_OUT])
        return CompareAndSet(key, rng.choice(STATES), token)
    round_ = rng.choice(ROUNDS)
    if kind == "announce":
        return Announce(round_, encode_node(node))
    if kind == "withdraw":
        return Withdraw(round_, encode_node(node))
    if kind == "read_announced":
        return ReadAnnounced(round_)
    if kind == "beat":
        return Beat(rng.choice((b"1", b"2", b"3")))
    assert kind == "read_beats", kind
    return ReadBeats(tuple(rng.sample(NODES, rng.randint(1, len(NODES)))))


def _describe(step: int, node: NodeId, request: ServedRequest) -> str:
    return f"step {step} (node {node}, {request!r})"


def _run(store: Store, seed: str, kinds: Sequence[str]) -> None:
    rng = random.Random(seed)
    backend = StoreRendezvousBackend(store, RUN_ID)
    image = StoreImage()
    seen: dict[NodeId, list[Token | None]] = {node: [] for node in NODES}
    for step in range(STEPS):
        node = rng.choice(NODES)
        if rng.random() < 0.15:
            # A wait for a change from a token this node holds: ends at once exactly when
            # the state's token is no longer that one.
            token = rng.choice([*seen[node], None])
            expected = wait_ends(image, token)
            actual = backend.wait_for_change(token, 0.0)
            if actual != expected:
                raise Broken(
                    f"step {step} (node {node}, a wait for a change from token {token!r}): "
                    f"spec.storage says it {'ends' if expected else 'waits on'}, the store's "
                    f"wait_for_change(timeout 0) returned {actual!r} (stored: {image.state!r})"
                )
            continue
        request = _request(rng, node, seen[node], kinds)
        before = image
        image, expected_event = serve(image, node, request, NOW)
        try:
            actual_event = serve_on(backend, node, request, lambda: NOW)
        except Exception as exc:
            raise Broken(
                f"{_describe(step, node, request)}: the store raised {type(exc).__name__}: "
                f"{exc}, where spec.storage answers {expected_event!r}"
            ) from exc
        if not same_answer(before, request, expected_event, actual_event):
            raise Broken(
                f"{_describe(step, node, request)}: spec.storage answers {expected_event!r}, "
                f"the store answered {actual_event!r}; the model checker assumes the former"
            )
        token = getattr(expected_event, "token", None)
        if token is not None and token not in seen[node]:
            seen[node].append(token)


def _register_requests(store: Store, cfg: Config) -> None:
    _run(store, "register", ("read", "cas", "cas"))


def _all_requests(store: Store, cfg: Config) -> None:
    sets_of(store)  # a store without member sets fails with the sets properties' message
    kinds = ("read", "cas", "announce", "withdraw", "read_announced", "beat", "read_beats")
    _run(store, "all", kinds)


KEY_REQUEST_PROPERTIES = (
    ("machine reads and compare-and-sets answer as spec.storage defines", _register_requests),
)
"""For every store: the state register's requests (reads, compare-and-sets, waits)."""

SET_REQUEST_PROPERTIES = (("machine requests answer as spec.storage defines", _all_requests),)
"""For stores with member sets: every request, announcements and heartbeat keys too."""
