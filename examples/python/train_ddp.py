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
from sim_roles import log_roles


def main():
    a = parse()
    if a.no_graft:
        return run_alone(a)
    model, adam, sched, blob = setup(a)
    c = Contract(a)
    rt = graft.Runtime()
    if blob is not None:
        rt.register("blob", blob, "blob")
    opt = graft.torch.Optimizer(rt, adam, objects=lambda: (torch.get_rng_state(), sched.state_dict()),
                                load_objects=lambda o: (torch.set_rng_state(o[0]), sched.load_state_dict(o[1])))
    avg = graft.torch.GradientAverager(rt)
    log_roles(rt, c)
    while rt.step < a.steps:
        info = opt.zero_grad()
        rows = micro_grads(model, a.seed, info.step, my_micro(info.replica_rank, info.replica_world))
        out = avg.all_gather(padded(rows, info.replica_world))
        if out is not None:
            apply_sum(model, out, info.replica_world)
        if opt.step():
            sched.step()
            touch_blob(blob, rt.step)
            c.committed(rt.step, state_hash(model, adam, sched, blob, rt.step))
        c.delay()
    rt.checkpoint_wait()
    digest = state_hash(model, adam, sched, blob, rt.step)
    return c.finish(rt.step, digest, rt.start_kind, rt.metrics()["recoveries"], rt.metrics())


if __name__ == "__main__":
    sys.exit(main())
