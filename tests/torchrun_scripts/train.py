"""Worker: a training loop that all-reduces every step until the test says stop.

Every step all-reduces ``[rank + 1, stop]`` (``stop`` is 1 once the file ``<out>/finish``
exists), checks the sum against the world size and appends one JSON line to
``<out>/progress-<node>.jsonl`` (``<node>`` is the agent's ``RDZV_TEST_NODE``). All
workers stop together, after the step in which any of them saw the finish file.
Bounded: a worker that does :data:`MAX_STEPS` steps without being told to stop fails,
and a worker whose agent died (it was re-parented) stops at its next step.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

MAX_STEPS = 4000
"""Steps before the worker gives up (at STEP_PAUSE each: about three minutes)."""
STEP_PAUSE = 0.05
"""Seconds between two steps, so a step is cheap for the shared CPU."""
GROUP_TIMEOUT = timedelta(seconds=60)
"""Bound on gloo's connection setup and on each collective."""


def main() -> int:
    out = sys.argv[1]
    node = os.environ["RDZV_TEST_NODE"]
    finish = os.path.join(out, "finish")
    agent = os.getppid()
    dist.init_process_group("gloo", timeout=GROUP_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    expected = world * (world + 1) / 2
    path = os.path.join(out, f"progress-{node}.jsonl")
    with open(path, "a", encoding="utf-8") as log:
        for step in range(MAX_STEPS):
            if os.getppid() != agent:
                print("the agent died; stopping", file=sys.stderr)
                return 5
            stop = 1.0 if os.path.exists(finish) else 0.0
            tensor = torch.tensor([float(rank + 1), stop])
            dist.all_reduce(tensor)
            record = {
                "group_rank": int(os.environ["GROUP_RANK"]),
                "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                "pid": os.getpid(),
                "rank": rank,
                "restart_count": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
                "step": step,
                "sum": tensor[0].item(),
                "world_size": world,
            }
            log.write(json.dumps(record, sort_keys=True) + "\n")
            log.flush()
            if tensor[0].item() != expected:
                print(f"all-reduce gave {tensor[0].item()}, expected {expected}", file=sys.stderr)
                return 4
            if tensor[1].item() > 0:
                dist.barrier()
                dist.destroy_process_group()
                return 0
            time.sleep(STEP_PAUSE)
    print(f"no stop signal after {MAX_STEPS} steps", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
