#!/usr/bin/env python3
"""train_ddp_plain.py: the plain torch.distributed version of train_ddp.py,
for comparison (README: the lines that differ). Launch with torchrun or set
MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE; no fault tolerance."""
import sys

import torch
import torch.distributed as dist

from ddp_common import (Contract, apply_sum, micro_grads, my_micro, padded, parse, run_alone,
                        setup, state_hash, touch_blob)


def main():
    a = parse()
    if a.no_graft:
        return run_alone(a)
    model, adam, sched, blob = setup(a)
    c = Contract(a)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(a.steps):
        adam.zero_grad(set_to_none=False)
        rows = micro_grads(model, a.seed, step, my_micro(rank, world))
        out = [torch.empty_like(padded(rows, world)) for _ in range(world)]
        dist.all_gather(out, padded(rows, world))
        apply_sum(model, out, world)
        adam.step()
        sched.step()
        touch_blob(blob, step + 1)
        c.committed(step + 1, state_hash(model, adam, sched, blob, step + 1))
        c.delay()
    return c.finish(a.steps, state_hash(model, adam, sched, blob, a.steps), "cold", 0)


if __name__ == "__main__":
    sys.exit(main())
