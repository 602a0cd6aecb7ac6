"""rdzv: a model-checked elastic rendezvous with PyTorch's handler API.

Switch from torch by changing the import::

    from rdzv import DynamicRendezvousHandler, RendezvousParameters, create_handler
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# First: whether rdzv works with torch is decided before any other module of rdzv loads
# (importing torch's rendezvous package loads rdzv's torchrun plug-in; see rdzv._torch).
from rdzv import _torch  # noqa: F401
from rdzv.api import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousSettings,
    RendezvousStoreInfo,
    RendezvousTimeout,
)
from rdzv.backend import RendezvousBackend, StoreRendezvousBackend
from rdzv.clock import Clock, FakeClock, SystemClock
from rdzv.errors import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousStateError,
    RendezvousTimeoutError,
)
from rdzv.handler import DynamicRendezvousHandler, create_handler
from rdzv.store import PrefixStore, Store

if TYPE_CHECKING:
    from rdzv.stores import open_store

__version__ = "0.1.0"
"""rdzv's version: the one place it is written (pyproject.toml reads it from here)."""

__all__ = [
    "Clock",
    "DynamicRendezvousHandler",
    "FakeClock",
    "PrefixStore",
    "RendezvousBackend",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousSettings",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeout",
    "RendezvousTimeoutError",
    "Store",
    "StoreRendezvousBackend",
    "SystemClock",
    "__version__",
    "create_handler",
    "open_store",
]


def __getattr__(name: str) -> Any:
    # The stores package is imported on first use, so ``import rdzv`` stays light.
    if name == "open_store":
        from rdzv.stores import open_store

        return open_store
    raise AttributeError(f"module 'rdzv' has no attribute {name!r}")
