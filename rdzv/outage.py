"""What a handler's queries do while the store cannot be reached: answer from the last
view, for a bounded time, and say so in the log (:class:`QueryOutage`)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from rdzv.clock import Clock, to_seconds
from rdzv.errors import RendezvousConnectionError
from spec.state import Millis, NodeId

logger = logging.getLogger("rdzv.handler")
"""The handler's logger: these lines read as the handler's."""


OUTAGE_RETRY_INTERVAL = 1.0
"""Seconds: while the store is unreachable, a query tries it again at most this often and
answers from the last view in between (so torch's agent, which polls every 0.1 s, is not
held up by the store's own retries on every poll)."""


def _at(seconds: float) -> str:
    """A wall-clock instant for a log line (UTC, to the millisecond)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%H:%M:%S.%f")[:-3] + " UTC"


class QueryOutage:
    """When a handler's queries (``num_nodes_waiting()``, ``is_closed()``) answer from
    their last view because the store cannot be reached, and for how long they may.

    The bound is the longer of the heartbeat expiry (``keep_alive_interval`` x
    ``keep_alive_max_attempt``) and the join timeout, counted from the first failed
    query. While the store is away for everybody nobody can prune anybody, and the
    first read after it returns starts every heartbeat sighting afresh (spec's machine
    forgets them on a failed call), so the view stays true for the whole outage. Only an
    outage of this node alone makes it stale: past the expiry its peers may have judged
    it dead. It answers on up to the join timeout, the time a node waits to form a round
    anyway, so an outage of at least the expiry is always survived; past the bound the
    query raises as before the outage began. Used under the handler's control lock only
    (its one caller)."""

    def __init__(self, node: NodeId, run_id: str, bound: float) -> None:
        self.node = node
        self.run_id = run_id
        self.bound = bound
        self.since: float | None = None
        """Monotonic seconds of the first failed query of the current outage."""
        self.tried: float = 0.0
        """Monotonic seconds of the latest attempt during the outage."""

    def answer_from_view(self, mono: float) -> bool:
        """Whether a query answers from the view without trying the store: during an
        outage, within the bound, and less than OUTAGE_RETRY_INTERVAL after the last try."""
        return (
            self.since is not None
            and mono - self.since <= self.bound
            and mono - self.tried < OUTAGE_RETRY_INTERVAL
        )

    def reached(self, clock: Clock) -> None:
        if self.since is not None:
            logger.info(
                "node %s reaches the store of run %r again after %.1f s; queries answer "
                "from the store again",
                self.node,
                self.run_id,
                clock.monotonic() - self.since,
            )
            self.since = None

    def failed(
        self, clock: Clock, error: RendezvousConnectionError, synced_at: Millis | None
    ) -> None:
        """A query failed on ``error``; its machine state's view was read or written at
        the monotonic ``synced_at`` (None: it has none). Raises once past the bound."""
        mono = clock.monotonic()
        self.tried = mono
        if self.since is None:
            self.since = mono
            then = (
                "no view (this node never read the store)"
                if synced_at is None
                else f"the view of {_at(clock.time() - (mono - to_seconds(synced_at)))}"
            )
            logger.warning(
                "node %s: store of run %r unreachable since %s, answering "
                "num_nodes_waiting() and is_closed() from %s; retrying (for at most %g s, "
                "the longer of the heartbeat expiry and the join timeout): %s",
                self.node,
                self.run_id,
                _at(clock.time()),
                then,
                self.bound,
                error,
            )
        if synced_at is None or mono - self.since > self.bound:
            lasted = mono - self.since
            raise RendezvousConnectionError(
                f"{error} (the store has been unreachable for {lasted:.1f} s"
                + (
                    ", and this node never read it"
                    if synced_at is None
                    else f", longer than the {self.bound:g} s (the longer of the heartbeat "
                    f"expiry and the join timeout) within which queries answer from the "
                    f"last view: the job can no longer tell whether its membership changed"
                )
                + "; bring the store back, then restart the job if it does not recover)"
            ) from error
