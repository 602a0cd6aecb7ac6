"""The error hierarchy, with PyTorch's public names.

Every error a user of the handler can see is a :class:`RendezvousError`. Messages say
what is wrong and what to do about it.
"""

from __future__ import annotations


class RendezvousError(Exception):
    """Base class of every rendezvous error."""


class RendezvousClosedError(RendezvousError):
    """The rendezvous is closed: the job is over and no new round can start."""


class RendezvousTimeoutError(RendezvousError):
    """An operation did not finish before its deadline."""


class RendezvousConnectionError(RendezvousError):
    """The store could not be reached, or a write's outcome is unknown."""


class RendezvousStateError(RendezvousError):
    """The store holds a state that is not valid (corrupt or foreign bytes)."""


class RendezvousGracefulExitError(RendezvousError):
    """This node was surplus (redundant) when the job ended; it may exit cleanly."""


class StoreTimeoutError(RendezvousTimeoutError, TimeoutError):
    """A store wait (``get`` of a missing key, ``wait``) ran past the store's timeout."""
