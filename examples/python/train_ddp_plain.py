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
    step = 0
    while step < a.steps:
        adam.zero_grad(set_to_none=False)
        rows = micro_grads(model, a.seed, step, my_micro(rank, world))
        out = [torch.empty_like(padded(rows, world, model)) for _ in range(world)]
        dist.all_gather(out, padded(rows, world, model))
        apply_sum(model, out, world)
        adam.step()
        step += 1
        sched.step()
        touch_blob(blob, step)
        c.committed(step, state_hash(model, adam, sched, blob, step))
        c.delay()
    return c.finish(step, state_hash(model, adam, sched, blob, step))


if __name__ == "__main__":
    sys.exit(main())
