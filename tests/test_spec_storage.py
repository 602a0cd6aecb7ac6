"""spec.storage, the one definition of what a store request does: its rules, the machine
never deciding on what it leaves free, and the model checker serving by it (a store bug
planted in the definition changes what the checker finds). That real stores answer as it
says is the conformance suite's property (tests/test_store_kit.py plants the bugs;
every store's conformance test runs it)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

import spec
from model_check.explore import explore
from model_check.world import ModelConfig
from spec import (
    Announce,
    Announced,
    AnnouncedMembers,
    Beat,
    Beaten,
    BeatValues,
    CasResult,
    CompareAndSet,
    NodeId,
    Now,
    Read,
    ReadAnnounced,
    ReadBeats,
    ReadResult,
    StoreImage,
    Withdraw,
    Withdrawn,
    serve,
)

A, B = NodeId("a", 1), NodeId("b", 2)
NOW = Now(5, 7)


def _cas(image: StoreImage, data: bytes, token: spec.Token | None) -> tuple[StoreImage, bool]:
    after, event = serve(image, A, CompareAndSet("state", data, token), NOW)
    assert isinstance(event, CasResult)
    assert (event.data, event.token) == (after.state, after.token)
    return after, event.has_set


def test_reads_and_compare_and_sets_follow_the_token() -> None:
    empty = StoreImage()
    assert serve(empty, A, Read("state"), NOW) == (empty, ReadResult(None, None, NOW))
    # A token on an absent state never lands; None creates it.
    assert _cas(empty, b"x", b"x") == (empty, False)
    one, landed = _cas(empty, b"x", None)
    assert landed and one.state == b"x" and one.token == b"x"
    assert serve(one, B, Read("state"), NOW)[1] == ReadResult(b"x", b"x", NOW)
    # None on a present state, or a token of other bytes, loses and answers the state.
    assert _cas(one, b"y", None) == (one, False)
    assert _cas(one, b"y", b"z") == (one, False)
    two, landed = _cas(one, b"y", b"x")
    assert landed and two.state == b"y"


def test_value_tokens_make_a_token_current_again_after_a_b_a_and_versions_do_not() -> None:
    a, _ = _cas(StoreImage(), b"A", None)
    b, _ = _cas(a, b"B", b"A")
    back, _ = _cas(b, b"A", b"B")
    # The real stores' tokens are the bytes: a token read at the first A lands again.
    assert _cas(back, b"C", a.token)[1]
    versions = itertools.count(1)
    image = StoreImage()
    tokens = []
    for data in (b"A", b"B", b"A"):
        image, event = serve(
            image,
            A,
            CompareAndSet("state", data, image.token),
            NOW,
            mint=lambda _: next(versions),
        )
        assert isinstance(event, CasResult) and event.has_set
        tokens.append(image.token)
    # Minted versions: the first A's token stays stale.
    assert _cas(image, b"C", tokens[0]) == (image, False)


def test_announcement_sets_are_per_round_and_idempotent() -> None:
    image = StoreImage()
    image, event = serve(image, A, Announce(0, spec.encode_node(A)), NOW)
    assert event == Announced(1, NOW)
    image, event = serve(image, A, Announce(0, spec.encode_node(A)), NOW)
    assert event == Announced(1, NOW)
    image, event = serve(image, B, Announce(0, spec.encode_node(B)), NOW)
    assert event == Announced(2, NOW)
    image, event = serve(image, B, Announce(1, spec.encode_node(B)), NOW)
    assert event == Announced(1, NOW)
    members = serve(image, A, ReadAnnounced(0), NOW)[1]
    assert isinstance(members, AnnouncedMembers)
    assert sorted(members.members) == sorted([spec.encode_node(A), spec.encode_node(B)])
    image, event = serve(image, A, Withdraw(0, spec.encode_node(A)), NOW)
    assert event == Withdrawn(NOW)
    again, _ = serve(image, A, Withdraw(0, spec.encode_node(A)), NOW)
    assert again == image  # taking out a member that is not there changes nothing
    assert serve(image, A, ReadAnnounced(0), NOW)[1] == AnnouncedMembers(
        (spec.encode_node(B),), NOW
    )


def test_heartbeat_keys_hold_each_nodes_latest_value() -> None:
    image, event = serve(StoreImage(), A, Beat(b"1"), NOW)
    assert event == Beaten(NOW)
    image, _ = serve(image, A, Beat(b"2"), NOW)
    image, _ = serve(image, B, Beat(b"9"), NOW)
    answer = serve(image, B, ReadBeats((B, NodeId("c", 3), A)), NOW)[1]
    assert answer == BeatValues((b"9", None, b"2"), NOW)


def test_waits_end_when_the_token_is_no_longer_the_states() -> None:
    empty = StoreImage()
    assert not spec.wait_ends(empty, None)
    one, _ = _cas(empty, b"x", None)
    assert spec.wait_ends(one, None) and not spec.wait_ends(one, b"x")
    with pytest.raises(TypeError, match="not a store request"):
        serve(one, A, spec.Wait("state", b"x", 0), NOW)  # type: ignore[arg-type]


def test_has_set_is_free_only_where_the_state_already_held_the_bytes() -> None:
    one, _ = _cas(StoreImage(), b"x", None)
    same = CompareAndSet("state", b"x", None)  # loses by the rule: the token is not x's
    want = serve(one, A, same, NOW)[1]
    assert isinstance(want, CasResult) and not want.has_set
    assert spec.same_answer(one, same, want, dataclasses.replace(want, has_set=True))
    other = CompareAndSet("state", b"y", None)
    want = serve(one, A, other, NOW)[1]
    assert isinstance(want, CasResult)
    assert not spec.same_answer(one, other, want, dataclasses.replace(want, has_set=True))
    members = AnnouncedMembers((b"1", b"2"), NOW)
    assert spec.same_answer(one, ReadAnnounced(0), members, AnnouncedMembers((b"2", b"1"), NOW))
    assert not spec.same_answer(one, ReadAnnounced(0), members, AnnouncedMembers((b"1",), NOW))


@pytest.mark.parametrize("variant", spec.VARIANTS.values(), ids=lambda v: v.name)
def test_the_machine_never_decides_on_has_set(variant: spec.Variant) -> None:
    """What :func:`spec.same_answer` leaves free must not matter: a compare-and-set's
    answer is absorbed whatever its ``has_set`` says."""
    settings = spec.Settings(min_nodes=1, max_nodes=2)
    config = spec.Config(variant=variant, settings=settings)
    local = spec.Local(A)
    result = spec.step(local, spec.StartOp(spec.Op.JOIN, 60_000, NOW), config)
    checked = 0
    for _ in range(20):
        request = result.request
        if isinstance(request, CompareAndSet):
            answers = [
                spec.step(result.local, CasResult(request.data, request.data, ok, NOW), config)
                for ok in (True, False)
            ]
            assert answers[0] == answers[1]
            checked += 1
            result = answers[0]
        elif isinstance(request, Read):
            result = spec.step(result.local, ReadResult(None, None, NOW), config)
        elif isinstance(request, Announce):
            result = spec.step(result.local, Announced(1, NOW), config)
        elif isinstance(request, ReadAnnounced):
            members = AnnouncedMembers((spec.encode_node(A),), NOW)
            result = spec.step(result.local, members, config)
        elif isinstance(request, Beat):
            result = spec.step(result.local, Beaten(NOW), config)
        else:
            break
    assert checked >= 1


def _planted_store(bug: str) -> object:
    real = spec.serve

    def served(
        image: StoreImage,
        node: NodeId,
        request: spec.ServedRequest,
        now: Now,
        mint: object = spec.value_token,
    ) -> tuple[StoreImage, spec.ServedEvent]:
        if bug == "cas-ignores-token" and isinstance(request, CompareAndSet):
            request = dataclasses.replace(request, token=image.token)
        if bug == "announce-reports-one" and isinstance(request, Announce):
            after, _ = real(image, node, request, now, mint)  # type: ignore[arg-type]
            return after, Announced(1, now)
        return real(image, node, request, now, mint)  # type: ignore[arg-type]

    return served


@pytest.mark.parametrize(
    ("variant", "bug", "nodes", "lo", "hi"),
    [
        (spec.HARDENED, "cas-ignores-token", 2, 1, 2),
        (spec.SCALE, "announce-reports-one", 2, 2, 2),
    ],
)
def test_the_checker_serves_by_the_definition(
    monkeypatch: pytest.MonkeyPatch, variant: spec.Variant, bug: str, nodes: int, lo: int, hi: int
) -> None:
    cfg = ModelConfig(
        nodes=nodes,
        min_nodes=lo,
        max_nodes=hi,
        variant=variant,
        workload="ticks",
        worker_failures=0,
    )
    assert explore(cfg, max_states=200_000).violation is None
    monkeypatch.setattr(spec, "serve", _planted_store(bug))
    found = explore(cfg, max_states=200_000).violation
    assert found is not None, f"a store whose {bug} went unnoticed by the checker"
