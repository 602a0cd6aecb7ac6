"""The store as the node machine assumes it: one definition of what each request does.

The machine (:mod:`spec.machine`) asks for store requests and is answered with events.
This module says, as one pure function, what a correct store answers and how its
contents change: :func:`serve` takes the part of the store one run uses (a
:class:`StoreImage`), the node asking and its request, and returns the image afterwards
with the event that answers the request. :func:`wait_ends` says when a pending
:class:`~spec.machine.Wait` may end before its time.

Both sides of the project use this definition:

- the model checker serves every request of its simulated nodes with :func:`serve` on
  its simulated store (``model_check/model.py``);
- the real handler carries requests out on real stores through one adapter,
  :func:`rdzv.driver.serve_on`, and the store conformance suite
  (:func:`rdzv.testing.check_store`, property "machine requests answer as
  spec.storage defines") drives that adapter and this function side by side on every
  store and requires the same answers and the same tokens.

Tokens. A store hands out a token with every state it returns; a compare-and-set lands
exactly when its token is the current state's (``None``: the state is absent). How a
store mints the token of a new state is the ``mint`` argument: the real stores' token is
the stored bytes themselves (:func:`value_token`, the default), so bytes written again
after a change (A, then B, then A) make an old token current again. The model checker
mints a version instead (every write makes every token held elsewhere stale), which is
stricter: there, a write whose token was read before such an A-B-A sequence loses and
the node reads and decides again. docs/model_checker.md ("Store semantics") says why
that loses no behaviour the checker must see.

The answer's ``has_set`` is the one thing a store may get "wrong": a store whose
compare-and-set returns only the value afterwards cannot tell, when the state already
holds the request's bytes, whether this write put them there, and may answer ``True``.
The machine decides on the state and token returned, never on ``has_set``
(:func:`spec.machine.step` absorbs a :class:`~spec.machine.CasResult` as it does a read),
so both answers lead to the same step; :func:`same_answer` says which answers count as
the definition's.

What is not here: the wake-up time of a wait (the caller's clock decides it), the
bootstrap keys rank 0 publishes after a round (outside the machine, see
:mod:`rdzv.handler`), and failures (an unreachable store or an unknown write outcome is
answered with :class:`~spec.machine.IoFailed` by whoever carries the request out).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from spec.codec import decode_node, encode_node
from spec.machine import (
    Announce,
    Announced,
    AnnouncedMembers,
    Beat,
    Beaten,
    BeatValues,
    CasResult,
    CompareAndSet,
    Now,
    Read,
    ReadAnnounced,
    ReadBeats,
    ReadResult,
    Token,
    Withdraw,
    Withdrawn,
)
from spec.state import NodeId

ServedRequest = Read | CompareAndSet | Announce | ReadAnnounced | Withdraw | Beat | ReadBeats
"""The requests :func:`serve` answers (a :class:`~spec.machine.Wait` is answered by time
or by :func:`wait_ends`)."""

ServedEvent = (
    ReadResult | CasResult | Announced | AnnouncedMembers | Withdrawn | Beaten | BeatValues
)
"""The events that answer them."""

SERVED_REQUESTS = (Read, CompareAndSet, Announce, ReadAnnounced, Withdraw, Beat, ReadBeats)


@dataclass(frozen=True)
class StoreImage:
    """The part of a store one rendezvous run uses.

    ``state`` is the state register's bytes (None: absent) and ``token`` the token of
    those bytes (None exactly when the state is absent). ``announced`` holds the
    announcement sets as sorted (round, node) pairs, and ``beats`` the heartbeat keys as
    sorted (node, value) pairs.
    """

    state: bytes | None = None
    token: Token | None = None
    announced: tuple[tuple[int, NodeId], ...] = ()
    beats: tuple[tuple[NodeId, bytes], ...] = ()


def value_token(data: bytes) -> Token:
    """The real stores' token of a state: its bytes."""
    return data


def lands(image: StoreImage, token: Token | None) -> bool:
    """Whether a compare-and-set with ``token`` lands on ``image``: the token is the
    state's (both None: the state is absent)."""
    return token == image.token


def wait_ends(image: StoreImage, token: Token | None) -> bool:
    """Whether a wait for a change from the state of ``token`` may end now: the state's
    token is no longer ``token`` (a wait may also end at its time, or early at any
    moment: the machine reads and decides again)."""
    return not lands(image, token)


def serve(
    image: StoreImage,
    node: NodeId,
    request: ServedRequest,
    now: Now,
    mint: Callable[[bytes], Token] = value_token,
) -> tuple[StoreImage, ServedEvent]:
    """Carry out ``request`` of ``node`` atomically on ``image``: the image afterwards and
    the event answering the request (its clocks are ``now``).

    - :class:`~spec.machine.Read`: the state and its token.
    - :class:`~spec.machine.CompareAndSet`: when the request's token is the state's (both
      None: the state is absent), the state becomes the request's bytes with the token
      ``mint(bytes)``; either way the answer holds the state and token afterwards and
      whether this write landed.
    - :class:`~spec.machine.Announce` / :class:`~spec.machine.Withdraw`: the member joins
      / leaves the round's announcement set (again: no change); an announce is answered
      with the set's size afterwards.
    - :class:`~spec.machine.ReadAnnounced`: the set's members, in no particular order
      (a store may list them in any; the machine must not depend on it).
    - :class:`~spec.machine.Beat`: ``node``'s heartbeat key holds the value.
    - :class:`~spec.machine.ReadBeats`: each named node's heartbeat value, None when it
      has none, in the order asked.
    """
    if isinstance(request, Read):
        return image, ReadResult(image.state, image.token, now)
    if isinstance(request, CompareAndSet):
        if not lands(image, request.token):
            return image, CasResult(image.state, image.token, False, now)
        token = mint(request.data)
        return replace(image, state=request.data, token=token), CasResult(
            request.data, token, True, now
        )
    if isinstance(request, Announce):
        entry = (request.round, decode_node(request.member))
        announced = image.announced
        if entry not in announced:
            announced = tuple(sorted((*announced, entry)))
        size = sum(1 for r, _ in announced if r == request.round)
        return replace(image, announced=announced), Announced(size, now)
    if isinstance(request, Withdraw):
        entry = (request.round, decode_node(request.member))
        announced = tuple(e for e in image.announced if e != entry)
        return replace(image, announced=announced), Withdrawn(now)
    if isinstance(request, ReadAnnounced):
        members = tuple(encode_node(n) for r, n in image.announced if r == request.round)
        return image, AnnouncedMembers(members, now)
    if isinstance(request, Beat):
        others = tuple(entry for entry in image.beats if entry[0] != node)
        return replace(image, beats=tuple(sorted((*others, (node, request.value))))), Beaten(now)
    if isinstance(request, ReadBeats):
        table = dict(image.beats)
        return image, BeatValues(tuple(table.get(n) for n in request.nodes), now)
    raise TypeError(f"{request!r} is not a store request spec.storage serves")


def same_answer(
    before: StoreImage, request: ServedRequest, want: ServedEvent, got: ServedEvent
) -> bool:
    """Whether a store's answer ``got`` to ``request``, served on ``before``, is the
    definition's answer ``want`` (:func:`serve`) in every respect the machine can see:
    the members of an announcement set in any order, and ``has_set`` free when the state
    already held the request's bytes (see the module's docstring)."""
    if isinstance(want, AnnouncedMembers) and isinstance(got, AnnouncedMembers):
        return sorted(want.members) == sorted(got.members) and want.now == got.now
    if (
        isinstance(request, CompareAndSet)
        and isinstance(want, CasResult)
        and isinstance(got, CasResult)
        and before.state == request.data
    ):
        return replace(got, has_set=want.has_set) == want
    return want == got
