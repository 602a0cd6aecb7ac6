"""The error hierarchy, with PyTorch's public names.

Every error a user of the handler can see is a :class:`RendezvousError`. Messages say
what is wrong and what to do about it.

When rdzv works with torch (:data:`TORCH_ERRORS`; the rule is in :mod:`rdzv._torch`:
torch is installed and ``RDZV_TORCH`` is not ``0``), each class also derives from
torch's class of the same name in ``torch.distributed.elastic.rendezvous``, so code
written for torch catches rdzv's errors unchanged::

    except torch.distributed.elastic.rendezvous.RendezvousClosedError:  # catches rdzv's too

A torch that lacks one of the names (older releases had fewer) gives that class torch's
``RendezvousError`` as its torch base. Without torch every class derives from
``Exception`` only, and torch is never imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from rdzv import _torch

__all__ = [
    "TORCH_ERRORS",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousStateError",
    "RendezvousTimeoutError",
    "StoreTimeoutError",
]


def _torch_base(name: str) -> type[Exception]:
    """torch's error class ``name`` (its ``RendezvousError`` if it has no such class), or
    ``Exception`` when rdzv works without torch."""
    api = _torch.rendezvous_api()
    if api is None:
        return Exception
    base = getattr(api, name, None)
    if not (isinstance(base, type) and issubclass(base, Exception)):
        base = api.RendezvousError
    assert isinstance(base, type) and issubclass(base, Exception)
    return base


if TYPE_CHECKING:  # the type checker sees the torch-free hierarchy
    _TorchRendezvousError: TypeAlias = Exception
    _TorchClosed: TypeAlias = Exception
    _TorchTimeout: TypeAlias = Exception
    _TorchConnection: TypeAlias = Exception
    _TorchState: TypeAlias = Exception
    _TorchGracefulExit: TypeAlias = Exception
else:
    _TorchRendezvousError = _torch_base("RendezvousError")
    _TorchClosed = _torch_base("RendezvousClosedError")
    _TorchTimeout = _torch_base("RendezvousTimeoutError")
    _TorchConnection = _torch_base("RendezvousConnectionError")
    _TorchState = _torch_base("RendezvousStateError")
    _TorchGracefulExit = _torch_base("RendezvousGracefulExitError")


class RendezvousError(_TorchRendezvousError):
    """Base class of every rendezvous error."""


class RendezvousClosedError(RendezvousError, _TorchClosed):
    """The rendezvous is closed: the job is over and no new round can start."""


class RendezvousTimeoutError(RendezvousError, _TorchTimeout):
    """An operation did not finish before its deadline."""


class RendezvousConnectionError(RendezvousError, _TorchConnection):
    """The store could not be reached, or a write's outcome is unknown."""


class RendezvousStateError(RendezvousError, _TorchState):
    """The store holds a state that is not valid (corrupt or foreign bytes)."""


class RendezvousGracefulExitError(RendezvousError, _TorchGracefulExit):
    """This node was surplus (redundant) when the job ended; it may exit cleanly."""


class StoreTimeoutError(RendezvousTimeoutError, TimeoutError):
    """A store wait (``get`` of a missing key, ``wait``) ran past the store's timeout."""


TORCH_ERRORS: bool = _TorchRendezvousError is not Exception
"""Whether the classes above derive from torch's (decided once, at import): the one
answer to "does rdzv work with torch in this process"."""
