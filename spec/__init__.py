"""spec: the rdzv rendezvous protocol, once, as data.

Pure and standard-library only: no clocks, no I/O, no threads, no randomness. The model
checker (``model_check``) and the real handler (``rdzv``) both interpret what is here.

- :mod:`spec.state`: node identity and the shared state (immutable values);
- :mod:`spec.settings`: settings with PyTorch's defaults and validation;
- :mod:`spec.vocabulary`: operations, actions, failure kinds;
- :mod:`spec.tables`: the ordered decision tables, one per operation;
- :mod:`spec.effects`: what each action does to the state, sanitize, the round epilogue;
- :mod:`spec.variants`: protocol variants as small diffs of tables and effects;
- :mod:`spec.machine`: the per-node executor loop as a sans-IO state machine;
- :mod:`spec.codec`: canonical versioned bytes for the shared state;
- :mod:`spec.invariants`: named safety properties.
"""

from spec.codec import CorruptState, decode, decode_node, encode, encode_node
from spec.effects import (
    UPSTREAM_EFFECTS,
    Fold,
    Sanitized,
    expired_by_wall,
    fold_and_complete,
    fold_announced,
    prune,
    prune_ending_broken_rounds,
    remove_participant_epilogue,
    sanitize,
    sanitize_ending_broken_rounds,
)
from spec.invariants import (
    STATE_INVARIANTS,
    STEP_INVARIANTS,
    StateInvariant,
    StepInvariant,
    check_state,
    check_step,
)
from spec.machine import (
    STATE_KEY,
    Announce,
    Announced,
    AnnouncedMembers,
    CasResult,
    CompareAndSet,
    Config,
    Done,
    Event,
    Fail,
    InvalidTransition,
    IoFailed,
    Local,
    Now,
    Phase,
    Read,
    ReadAnnounced,
    ReadResult,
    Request,
    StartOp,
    Step,
    Token,
    Wait,
    WokeUp,
    context,
    next_timer,
    step,
)
from spec.settings import SECOND, Settings, SettingsError
from spec.state import EMPTY_STATE, KEEP, Millis, NodeId, RendezvousState
from spec.tables import Atom, Context, Literal, NoRowMatches, Row, Table, row
from spec.variants import (
    HARDENED,
    LOCAL,
    SCALE,
    TORCH_213,
    UPSTREAM,
    VARIANTS,
    WALL,
    Pruner,
    Variant,
    get_variant,
)
from spec.vocabulary import ACTION_FAILURES, Action, FailKind, Op

__all__ = [
    "ACTION_FAILURES",
    "EMPTY_STATE",
    "HARDENED",
    "KEEP",
    "LOCAL",
    "SCALE",
    "SECOND",
    "STATE_INVARIANTS",
    "STATE_KEY",
    "STEP_INVARIANTS",
    "TORCH_213",
    "UPSTREAM",
    "UPSTREAM_EFFECTS",
    "VARIANTS",
    "WALL",
    "Action",
    "Announce",
    "Announced",
    "AnnouncedMembers",
    "Atom",
    "CasResult",
    "CompareAndSet",
    "Config",
    "Context",
    "CorruptState",
    "Done",
    "Event",
    "Fail",
    "FailKind",
    "Fold",
    "InvalidTransition",
    "IoFailed",
    "Literal",
    "Local",
    "Millis",
    "NoRowMatches",
    "NodeId",
    "Now",
    "Op",
    "Phase",
    "Pruner",
    "Read",
    "ReadAnnounced",
    "ReadResult",
    "RendezvousState",
    "Request",
    "Row",
    "Sanitized",
    "Settings",
    "SettingsError",
    "StartOp",
    "StateInvariant",
    "Step",
    "StepInvariant",
    "Table",
    "Token",
    "Variant",
    "Wait",
    "WokeUp",
    "check_state",
    "check_step",
    "context",
    "decode",
    "decode_node",
    "encode",
    "encode_node",
    "expired_by_wall",
    "fold_and_complete",
    "fold_announced",
    "get_variant",
    "next_timer",
    "prune",
    "prune_ending_broken_rounds",
    "remove_participant_epilogue",
    "row",
    "sanitize",
    "sanitize_ending_broken_rounds",
    "step",
]
