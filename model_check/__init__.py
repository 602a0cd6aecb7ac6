"""model_check: deterministic simulation and exhaustive exploration of the protocol."""
