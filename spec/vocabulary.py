"""The protocol's vocabulary: operations, actions and outcomes."""

from __future__ import annotations

import enum


class Op(enum.Enum):
    """An operation a node runs to completion against the shared state."""

    EXIT = "exit"
    """Leave the round this node participates in (first half of next_rendezvous)."""
    JOIN = "join"
    """Join the next round and wait until it completes (second half of next_rendezvous)."""
    CLOSE = "close"
    """Mark the rendezvous closed for everybody (set_closed, shutdown)."""
    KEEP_ALIVE = "keep_alive"
    """Refresh this node's heartbeat if it is due (the heartbeat timer)."""
    QUERY = "query"
    """Bring the local view up to date and stop (is_closed, num_nodes_waiting)."""


class Action(enum.Enum):
    """What a decision table row tells the node to do next."""

    KEEP_ALIVE = "keep_alive"
    ADD_TO_PARTICIPANTS = "add_to_participants"
    ADD_TO_WAIT_LIST = "add_to_wait_list"
    ADD_TO_REDUNDANCY_LIST = "add_to_redundancy_list"
    REMOVE_FROM_PARTICIPANTS = "remove_from_participants"
    REMOVE_FROM_WAIT_LIST = "remove_from_wait_list"
    REMOVE_FROM_REDUNDANCY_LIST = "remove_from_redundancy_list"
    MARK_RENDEZVOUS_COMPLETE = "mark_rendezvous_complete"
    MARK_RENDEZVOUS_CLOSED = "mark_rendezvous_closed"
    REOPEN = "reopen"
    """Start a new job under the run id of a closed one that nobody is listed in any
    more: the next round opens, empty and not closed."""
    ANNOUNCE = "announce"
    """Add this node to the round's announcement set (a store-side set, no
    compare-and-set): a later fold admits it. Writes no state."""
    WITHDRAW = "withdraw_announcement"
    """Take this node's announcement out of the round's announcement set (its join
    deadline passed before a fold admitted it), then read the state again. Writes no
    state."""
    FOLD = "fold_announcements"
    """Read the round's announcement set and admit the announced nodes in one write."""
    FOLD_AND_COMPLETE = "fold_and_complete"
    """As :attr:`FOLD`, then mark the round complete."""
    BEAT = "beat"
    """Write this node's own heartbeat key (heartbeats kept under per-node keys); no
    write of the state."""
    WATCH = "watch"
    """Read the heartbeat keys of the nodes this node monitors; no write of the state."""
    PRUNE_DEAD = "prune_dead"
    """Remove the monitored nodes whose heartbeat stood still past the expiry (the
    variant's prune), and write the state."""
    SYNC = "sync"
    """Nothing to do yet: wait for the state to change or a timer to fire."""
    ERROR_CLOSED = "error_closed"
    ERROR_TIMEOUT = "error_timeout"
    ERROR_GRACEFUL_EXIT = "error_graceful_exit"
    FINISH = "finish"

    @property
    def mutates(self) -> bool:
        """True for actions that change the shared state (and so need a write)."""
        return self not in _NON_MUTATING

    @property
    def folds(self) -> bool:
        """True for actions whose effect needs the announcement set (read first)."""
        return self in (Action.FOLD, Action.FOLD_AND_COMPLETE)


_NON_MUTATING = frozenset(
    {
        Action.SYNC,
        Action.ANNOUNCE,
        Action.WITHDRAW,
        Action.BEAT,
        Action.WATCH,
        Action.ERROR_CLOSED,
        Action.ERROR_TIMEOUT,
        Action.ERROR_GRACEFUL_EXIT,
        Action.FINISH,
    }
)


class FailKind(enum.Enum):
    """Why an operation ended without finishing."""

    CLOSED = "closed"
    """The rendezvous is closed (RendezvousClosedError)."""
    TIMEOUT = "timeout"
    """The operation's deadline passed (RendezvousTimeoutError)."""
    GRACEFUL_EXIT = "graceful_exit"
    """A redundant node found the rendezvous closed (RendezvousGracefulExitError)."""
    CORRUPT_STATE = "corrupt_state"
    """The store holds bytes that are not a valid state (RendezvousStateError)."""
    PROTOCOL_MISMATCH = "protocol_mismatch"
    """The state was written by a node of another protocol variant (RendezvousStateError)."""
    CONNECTION = "connection"
    """The store could not be reached or the outcome of a write is unknown."""


ACTION_FAILURES: dict[Action, FailKind] = {
    Action.ERROR_CLOSED: FailKind.CLOSED,
    Action.ERROR_TIMEOUT: FailKind.TIMEOUT,
    Action.ERROR_GRACEFUL_EXIT: FailKind.GRACEFUL_EXIT,
}
