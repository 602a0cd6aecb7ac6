"""The shared rendezvous state and the identity of a node.

Contract: everything here is an immutable value. Updates build new values; nothing in
this module reads a clock, performs I/O or keeps hidden caches. Collections are kept in
canonical (sorted, duplicate-free) order by construction, so two equal states print,
encode and fingerprint identically whatever order the updates happened in.

Times in the shared state are integers of milliseconds of *wall-clock* time as seen by
the node that wrote them (heartbeats, the last-call deadline). Comparing such a time
with another node's clock is exactly what the reference protocol does; the model
checker shows what that costs.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

Millis = int
"""Integer milliseconds. Wall-clock instants, monotonic instants and durations alike."""

MAX_ID = 2**63 - 1
"""Largest pid or local id (and the largest integer the codec accepts anywhere)."""
MAX_ADDR_LEN = 1024
"""Longest node address, in characters."""


def valid_addr(addr: object) -> bool:
    """True for a node address the codec can write and read back, and logs can print: a
    non-empty string of at most :data:`MAX_ADDR_LEN` characters that is valid Unicode
    text (no lone surrogates, which JSON can carry but UTF-8 cannot)."""
    if not isinstance(addr, str) or not 0 < len(addr) <= MAX_ADDR_LEN:
        return False
    if addr.isascii():
        return True
    try:
        addr.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _NodeFields(NamedTuple):
    addr: str
    pid: int
    local_id: int


class NodeId(_NodeFields):
    """One handler instance: host address, process id and a per-process counter.

    Ordered (ranks are positions in the sorted participant set), hashable and printable
    as ``addr_pid_localid`` like the reference implementation. A node is an immutable
    tuple ``(addr, pid, local_id)`` underneath, so hashing, comparing and sorting nodes run
    at C speed: a state of 1,024 participants decodes, hashes and sorts several times
    faster than with a dataclass (``benchmarks/bench_scale.py``; the model checker hashes
    every state it sees). The fields are checked when a node is made.
    """

    __slots__ = ()

    def __new__(cls, addr: str, pid: int, local_id: int = 0) -> NodeId:
        # Refuse identities the codec could not read back: a state holding one would
        # make the store unreadable for every node.
        if not valid_addr(addr):
            raise ValueError(
                f"node address {addr!r} must be a non-empty string of at most "
                f"{MAX_ADDR_LEN} characters of valid Unicode text; pass the host name or "
                "IP address"
            )
        for name, value in (("pid", pid), ("local_id", local_id)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
                raise ValueError(f"node {name} {value!r} must be an integer in [0, 2**63-1]")
        return tuple.__new__(cls, (addr, pid, local_id))

    def __str__(self) -> str:
        return f"{self[0]}_{self[1]}_{self[2]}"


def trusted_nodes(fields: Iterable[tuple[str, int, int]]) -> list[NodeId]:
    """:class:`NodeId` values from ``(addr, pid, local_id)`` fields the caller has already
    checked (the codec, which checks them with messages about the stored bytes), without
    checking them again; built in C, with no Python call per node."""
    return list(map(_new_node, fields))


_new_node = functools.partial(tuple.__new__, NodeId)


def compared_values(cls: type) -> Callable[[Any], tuple[object, ...]]:
    """What ``==`` compares on an instance of the dataclass ``cls``: the values of its
    fields with ``compare=True``, in order, as one tuple (built in C); their hashes are
    of the same tuple.

    For the classes that define ``__eq__`` themselves instead of leaving it to
    ``@dataclass`` (``RendezvousState`` here, ``spec.machine.Local``,
    ``model_check.world.Proc``): the compiled checker (``--native``) keeps them Python
    classes, and mypyc compiles ``a == b`` on a Python class that has no ``__eq__`` of its
    own as ``a is b``."""
    names = [f.name for f in fields(cls) if f.compare]
    if len(names) < 2:
        raise TypeError(f"{cls.__name__}: compared_values needs two or more compared fields")
    return operator.attrgetter(*names)


class _Keep:
    """Marker type for :data:`KEEP`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "KEEP"


KEEP = _Keep()
"""Pass as ``deadline=`` to :meth:`RendezvousState.evolve` to keep the current deadline."""


def _sorted_unique(nodes: Iterable[NodeId]) -> tuple[NodeId, ...]:
    return tuple(sorted(set(nodes)))


def _sorted_pairs(pairs: Mapping[NodeId, int]) -> tuple[tuple[NodeId, int], ...]:
    return tuple(sorted(pairs.items()))


@dataclass(frozen=True)
class RendezvousState:
    """What the store holds for one run: the round and its membership.

    ``participants`` maps each participant to its rank (0 until the round completes);
    ``last_heartbeats`` maps every listed node to the wall time of its last keep-alive.
    Both are stored as sorted tuples of pairs; use :meth:`participant_map` and
    :meth:`heartbeat_map` for lookups and :meth:`build` to construct from mappings.
    """

    round: int = 0
    complete: bool = False
    closed: bool = False
    deadline: Millis | None = None
    """Wall-clock end of the last call; set when participants reach min_nodes."""
    participants: tuple[tuple[NodeId, int], ...] = ()
    wait_list: tuple[NodeId, ...] = ()
    redundancy_list: tuple[NodeId, ...] = ()
    last_heartbeats: tuple[tuple[NodeId, Millis], ...] = ()
    epoch: int = 0
    """Which job under the run id this state belongs to: 0 for the first, one more each
    time a new job reopens the run after the previous one closed it."""
    _participant_map: dict[NodeId, int] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )
    _heartbeat_map: dict[NodeId, int] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        # Lookup tables are derived caches, never part of identity or equality.
        object.__setattr__(self, "_participant_map", dict(self.participants))
        object.__setattr__(self, "_heartbeat_map", dict(self.last_heartbeats))

    def __eq__(self, other: object) -> bool:
        # Not left to @dataclass: see compared_values.
        return other.__class__ is self.__class__ and _state_values(self) == _state_values(other)

    def __hash__(self) -> int:
        # The value never changes, so its hash is computed once (the model checker hashes
        # the same states many times).
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(_state_values(self))
            object.__setattr__(self, "_hash", cached)
        return cached

    @classmethod
    def build(
        cls,
        *,
        round: int = 0,
        complete: bool = False,
        closed: bool = False,
        deadline: Millis | None = None,
        participants: Mapping[NodeId, int] | None = None,
        wait_list: Iterable[NodeId] = (),
        redundancy_list: Iterable[NodeId] = (),
        last_heartbeats: Mapping[NodeId, Millis] | None = None,
        epoch: int = 0,
    ) -> RendezvousState:
        """Construct a state from plain mappings and iterables, canonically ordered."""
        return cls(
            round=round,
            complete=complete,
            closed=closed,
            deadline=deadline,
            participants=_sorted_pairs(participants or {}),
            wait_list=_sorted_unique(wait_list),
            redundancy_list=_sorted_unique(redundancy_list),
            last_heartbeats=_sorted_pairs(last_heartbeats or {}),
            epoch=epoch,
        )

    def evolve(
        self,
        *,
        round: int | None = None,
        complete: bool | None = None,
        closed: bool | None = None,
        deadline: Millis | _Keep | None = KEEP,
        participants: Mapping[NodeId, int] | None = None,
        wait_list: Iterable[NodeId] | None = None,
        redundancy_list: Iterable[NodeId] | None = None,
        last_heartbeats: Mapping[NodeId, Millis] | None = None,
        epoch: int | None = None,
    ) -> RendezvousState:
        """A copy with some fields replaced (``deadline=KEEP`` leaves it as it is)."""
        return RendezvousState(
            round=self.round if round is None else round,
            complete=self.complete if complete is None else complete,
            closed=self.closed if closed is None else closed,
            deadline=self.deadline if isinstance(deadline, _Keep) else deadline,
            participants=(
                self.participants if participants is None else _sorted_pairs(participants)
            ),
            wait_list=self.wait_list if wait_list is None else _sorted_unique(wait_list),
            redundancy_list=(
                self.redundancy_list if redundancy_list is None else _sorted_unique(redundancy_list)
            ),
            last_heartbeats=(
                self.last_heartbeats if last_heartbeats is None else _sorted_pairs(last_heartbeats)
            ),
            epoch=self.epoch if epoch is None else epoch,
        )

    # -- lookups -------------------------------------------------------------------
    def participant_map(self) -> dict[NodeId, int]:
        """A fresh dict node -> rank."""
        return dict(self._participant_map)

    def heartbeat_map(self) -> dict[NodeId, Millis]:
        """A fresh dict node -> wall time of its last heartbeat."""
        return dict(self._heartbeat_map)

    def is_participant(self, node: NodeId) -> bool:
        return node in self._participant_map

    def rank_of(self, node: NodeId) -> int | None:
        return self._participant_map.get(node)

    def heartbeat_of(self, node: NodeId) -> Millis | None:
        return self._heartbeat_map.get(node)

    def is_waiting(self, node: NodeId) -> bool:
        return node in self.wait_list

    def is_redundant(self, node: NodeId) -> bool:
        return node in self.redundancy_list

    def is_listed(self, node: NodeId) -> bool:
        """Whether ``node`` is a participant, on the wait list or on the redundancy list."""
        return self.is_participant(node) or self.is_waiting(node) or self.is_redundant(node)

    def listed_nodes(self) -> tuple[NodeId, ...]:
        """Every listed node (participants, wait list, redundancy list), sorted."""
        return tuple(sorted({*self._participant_map, *self.wait_list, *self.redundancy_list}))

    @property
    def num_participants(self) -> int:
        return len(self.participants)

    def participant_nodes(self) -> tuple[NodeId, ...]:
        """Participants in sorted order (the order ranks are assigned in)."""
        return tuple(node for node, _ in self.participants)

    def describe(self) -> str:
        """A one-line human-readable summary (used in traces and error messages)."""
        parts = ", ".join(f"{n}:{r}" for n, r in self.participants)
        waits = ", ".join(str(n) for n in self.wait_list)
        reds = ", ".join(str(n) for n in self.redundancy_list)
        beats = ", ".join(f"{n}@{t}" for n, t in self.last_heartbeats)
        flags = (
            [f"round={self.round}"]
            if not self.epoch
            else [f"epoch={self.epoch}", f"round={self.round}"]
        )
        if self.complete:
            flags.append("complete")
        if self.closed:
            flags.append("closed")
        if self.deadline is not None:
            flags.append(f"last_call_until={self.deadline}")
        return (
            f"{' '.join(flags)} participants=[{parts}] wait=[{waits}] "
            f"redundant=[{reds}] heartbeats=[{beats}]"
        )


_state_values = compared_values(RendezvousState)

EMPTY_STATE = RendezvousState()
"""The state of a run nobody has written yet."""
