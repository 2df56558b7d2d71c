#!/usr/bin/env python3
"""train_ddp.py: a small CNN trained data-parallel by replica groups on CPU,
fault-tolerant through graft (each process is one group; GRAFT_* variables
configure the runtime). It follows the simulator's trainer contract
(docs/SIM.md), so `graft-sim run --trainer 'python3 examples/python/train_ddp.py'`
injects failures into it and checks the final state bit-exact."""
import sys

import torch

import graft
import graft.torch
from ddp_common import (Contract, apply_sum, micro_grads, my_micro, padded, parse, run_alone,
                        setup, state_hash, touch_blob)
from sim_roles import sim_contract


def main():
    a = parse()
    if a.no_graft:
        return run_alone(a)
    model, adam, sched, blob = setup(a)
    c = Contract(a)
    rt = graft.Runtime()
    sim_contract(rt, c, blob)
    opt = graft.torch.Optimizer(rt, adam, objects=lambda: (torch.get_rng_state(), sched.state_dict()),
                                load_objects=lambda o: (torch.set_rng_state(o[0]), sched.load_state_dict(o[1])))
    avg = graft.torch.GradientAverager(rt)
    step = 0
    while step < a.steps:
        info = opt.zero_grad()
        step, rank, world = info.step, info.replica_rank, info.replica_world
        rows = micro_grads(model, a.seed, step, my_micro(rank, world))
        out = avg.all_gather(padded(rows, world))
        if out is not None:
            apply_sum(model, out, world)
        if not opt.step():
            continue
        step += 1
        sched.step()
        touch_blob(blob, step)
        c.committed(step, state_hash(model, adam, sched, blob, step))
        c.delay()
    return c.finish(step, state_hash(model, adam, sched, blob, step), rt)


if __name__ == "__main__":
    sys.exit(main())
