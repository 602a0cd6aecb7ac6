"""Worker: join the gloo group torchrun set up, all-reduce rank + 1, print the result as JSON."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> int:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        tensor = torch.tensor([float(rank + 1)])
        dist.all_reduce(tensor)
        record = {
            "rank": rank,
            "world_size": world,
            "sum": tensor.item(),
            "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
            "use_agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE"),
        }
        out = sys.argv[1]
        with open(os.path.join(out, f"allreduce-{rank}.json"), "w", encoding="utf-8") as f:
            json.dump(record, f, sort_keys=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
