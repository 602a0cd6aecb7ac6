"""Whether rdzv works with PyTorch in this process: decided once, when rdzv is imported.

The rule (documented in docs/handler.md, "Coming from torch"):

- ``RDZV_TORCH=0`` (or ``false``, ``no``, ``off``) in the environment: never, and torch is
  not imported. Unset, empty, ``1``, ``true``, ``yes``, ``on`` or ``auto``: as below. Any
  other value is a ``ValueError`` at import.
- torch is not installed (``importlib.util.find_spec("torch")`` finds nothing): never,
  and nothing of torch is imported.
- torch is installed: ``torch.distributed.elastic.rendezvous.api`` is imported now. If
  that fails (a build without ``torch.distributed``, a CUDA build whose libraries are
  missing), rdzv works without torch and logs why once.

"Works with torch" means: rdzv's errors derive from torch's errors of the same names,
and ``RendezvousInfo.store`` is a ``torch.distributed.Store``. The answer never changes
during the life of the process (classes cannot change their bases afterwards), so
importing torch later, or setting the variable later, changes nothing.

This module imports only the standard library, so that :mod:`rdzv.errors` can consult it
before anything else of rdzv exists.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from types import ModuleType

__all__ = ["ENV", "REASON", "RENDEZVOUS_API", "rendezvous_api"]

ENV = "RDZV_TORCH"
"""The environment variable that can turn the torch interop off (``RDZV_TORCH=0``)."""

API_MODULE = "torch.distributed.elastic.rendezvous.api"
_OFF = ("0", "false", "no", "off")
_AUTO = ("", "1", "true", "yes", "on", "auto")


def _decide() -> tuple[ModuleType | None, str]:
    """torch's ``rendezvous.api`` module (None when rdzv works without torch) and why."""
    setting = os.environ.get(ENV, "").strip().lower()
    if setting in _OFF:
        return None, f"{ENV}={os.environ[ENV]!r} turns the torch interop off"
    if setting not in _AUTO:
        raise ValueError(
            f"the environment variable {ENV} is {os.environ[ENV]!r}, which is neither on nor "
            f"off; set it to 0 to keep rdzv away from torch, or unset it (rdzv then works "
            f"with torch whenever torch is installed)"
        )
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken entry in sys.modules or sys.path
        found = False
    if not found:
        return None, "torch is not installed"
    try:
        api = importlib.import_module(API_MODULE)
    except Exception as exc:  # ImportError, OSError (missing CUDA libraries), ...
        reason = (
            f"torch is installed but torch.distributed.elastic.rendezvous.api does not "
            f"import ({type(exc).__name__}: {exc})"
        )
        logging.getLogger("rdzv").warning("rdzv works without torch: %s", reason)
        return None, reason
    version = getattr(importlib.import_module("torch"), "__version__", "?")
    return api, f"torch {version} is installed"


_deciding = True


def rendezvous_api() -> ModuleType | None:
    """torch's ``rendezvous.api`` module when rdzv works with torch, else None.

    Also answers while the decision is being made: importing torch's rendezvous package
    loads rdzv's torchrun plug-in (torch's registry imports every ``torchrun.handlers``
    entry point), and so :mod:`rdzv.errors`, before :func:`_decide` returned. torch has
    fully loaded its ``api`` module by then, so that module is the answer.
    """
    if _deciding:
        return sys.modules.get(API_MODULE)
    return RENDEZVOUS_API


RENDEZVOUS_API, REASON = _decide()
"""torch's ``torch.distributed.elastic.rendezvous.api`` module when rdzv works with torch
(else None), and a sentence saying why."""
_deciding = False
