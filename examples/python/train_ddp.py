#!/usr/bin/env python3
"""train_ddp.py: a small CNN trained data-parallel by replica groups on CPU,
fault-tolerant through graft (GRAFT_* variables configure the runtime). A
group is one process, or one torch world of several ranks (WORLD_SIZE above
1: torchrun's, or graft-sim --torch-world's), whose ranks split each step's
micro-batches and exchange them exactly. It follows the simulator's trainer
contract (docs/SIM.md), so
`graft-sim run --trainer 'python3 examples/python/train_ddp.py'` injects
failures into it and checks the final state bit-exact; with torch worlds
of 2 ranks: `graft-sim run --ranks 2 --torch-world --trainer ...`.

Started with GRAFT_SPARE=1 (no GRAFT_GROUP) it is a spare: it waits in its
first zero_grad() until it takes a dead rank's slot, prints "spare promoted
to group G" and trains on as that group's replacement, or prints "spare
unused: the job finished without it" and exits 0. The groups end through
the closing step (opt.finish()), so that a spare sees them end, not die.
"""
import datetime
import sys

import torch
import torch.distributed as dist

import graft
import graft.torch
from ddp_common import (Contract, apply_sum, micro_grads, my_micro, padded, parse, run_alone,
                        setup, state_hash, torch_world, touch_blob)
from sim_roles import sim_contract


def exchange(model, avg, rows, rank, ranks, world):
    """Every worker's rows, by worker (group-major): the group's ranks
    gather theirs exactly over their own torch world, then rank r of every
    group gathers the group's with rank r of the others (an exact exchange
    too). None when the cross-group exchange failed (the commit is vetoed).
    A failure inside the group raises: the group's world is broken, and the
    process ends so that its launcher starts the group again."""
    workers = world * ranks
    mine = padded(rows, workers, model)
    if ranks > 1:
        parts = [torch.empty_like(mine) for _ in range(ranks)]
        dist.all_gather(parts, mine)
        mine = torch.cat(parts)
    out = avg.all_gather(mine)
    if out is None:
        return None
    n = mine.shape[0] // ranks
    return [o[r * n:(r + 1) * n] for o in out for r in range(ranks)]


def main():
    a = parse()
    if a.no_graft:
        return run_alone(a)
    where = graft.launcher_settings()
    rank, ranks = where.get("rank", 0), where.get("ranks_per_group", 1)
    if not torch_world():
        ranks = 1  # the group's ranks (if several) train apart: each its own replica
    else:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    model, adam, sched, blob = setup(a)
    c = Contract(a)
    rt = graft.Runtime(**where)
    sim_contract(rt, c, blob)
    opt = graft.torch.Optimizer(rt, adam, objects=lambda: (torch.get_rng_state(), sched.state_dict()),
                                load_objects=lambda o: (torch.set_rng_state(o[0]), sched.load_state_dict(o[1])))
    avg = graft.torch.GradientAverager(rt)
    promoted_said = False
    while True:
        try:
            info = opt.zero_grad()
        except graft.SpareUnused:
            print("spare unused: the job finished without it", flush=True)
            rt.close()
            if ranks > 1:
                dist.destroy_process_group()
            return 0
        if rt.promoted and not promoted_said:
            print("spare promoted to group %d" % rt.group, flush=True)
            promoted_said = True
        step, world = info.step, info.replica_world
        if step >= a.steps:
            if opt.finish():  # the closing step: this group ended, it did not die
                break
            continue
        worker = info.replica_rank * ranks + (rank if ranks > 1 else 0)
        rows = micro_grads(model, a.seed, step, my_micro(worker, world * ranks))
        out = exchange(model, avg, rows, rank, ranks, world)
        if out is not None:
            apply_sum(model, out, world * ranks)
        if not opt.step():
            continue
        step += 1
        sched.step()
        touch_blob(blob, step)
        c.committed(step, state_hash(model, adam, sched, blob, step))
        c.delay()
    digest = state_hash(model, adam, sched, blob, step)
    code = c.finish(step, digest, rt)
    if ranks > 1:
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
