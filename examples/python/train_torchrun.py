#!/usr/bin/env python3
"""train_torchrun.py: a small model trained by replica groups, each group a
torchrun world (or one plain python process), fault-tolerant through graft.

Inside a group the ranks are an ordinary torch.distributed job: DDP averages
the gradients over the group's ranks and ZeroRedundancyOptimizer shards
Adam's state across them. Across groups, rank r of every group averages its
gradients with rank r of the others (graft.torch.GradientAverager), and a
group that was killed and restarted heals before its first step: rank r
pulls rank r's state (all parameters and its shard of Adam's state) from a
healthy group, then trains on, bit-identical to a run without the failure.

    # one group of 2 ranks (run it 3 times with GRAFT_GROUP=0, 1, 2, each
    # with a --master_port of its own)
    GRAFT_JOB=demo GRAFT_GROUPS=3 GRAFT_GROUP=0 \\
      torchrun --nproc_per_node 2 --master_addr 127.0.0.1 --master_port 29500 \\
      --max_restarts 3 -r 2 -t 2 examples/python/train_torchrun.py --steps 200

(-r 2 -t 2: Debian's torchrun on Python 3.11 fails on its own default
--redirects.)

See --help for the variables, and README.md's Python quick start.
"""
import argparse
import os
import pickle
import random
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

import graft
import graft.torch

VARIABLES = """
graft settings (environment):
  GRAFT_JOB               the job's name; every group of one job uses the same (required)
  GRAFT_GROUP             this group's id, 0..GRAFT_GROUPS-1 (or REPLICA_GROUP_ID)
  GRAFT_GROUPS            the number of groups (or NUM_REPLICA_GROUPS)
  GRAFT_SPARE             1: instead of GRAFT_GROUP, a spare that waits for a dead
                          rank's slot (a process of its own, not a torchrun world)
  GRAFT_ETCD_ENDPOINTS    etcd's URL [http://127.0.0.1:2379]
  GRAFT_MODE              strict (a step commits only with every group: bit-exact
                          after a failure) or elastic (trains on with fewer) [strict]
  GRAFT_MIN_GROUPS        elastic: the fewest groups a step needs
  GRAFT_LEASE_TTL_MS      how soon a dead group is noticed [3000]
  GRAFT_JOIN_TIMEOUT_MS   how long a quorum waits for late groups [10000]
  GRAFT_PERSIST_ROOT      a folder for disk checkpoints (none: no disk tier)
  GRAFT_PERSIST_EVERY     steps between disk checkpoints [100]
  GRAFT_LOG               the library's log level: error, warn, info, debug [warn]
  GRAFT_LIBRARY           the libgraft.so to load [the checkout's build/lib]
torchrun sets RANK and WORLD_SIZE: the rank inside the group and the group's
size (graft's rank and ranks_per_group). Without torchrun the process is a
group of one rank. Every GRAFT_* setting is in include/graft/graft.h.
"""


def parse():
    ap = argparse.ArgumentParser(description="A replica group of a fault-tolerant job "
                                 "(one torchrun world, or one process).",
                                 epilog=VARIABLES,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100, help="steps to train [100]")
    ap.add_argument("--hidden", type=int, default=32, help="the hidden layer's width [32]")
    ap.add_argument("--batch", type=int, default=16, help="samples per rank and step [16]")
    ap.add_argument("--lr", type=float, default=0.01, help="Adam's learning rate [0.01]")
    ap.add_argument("--seed", type=int, default=1, help="the seed [1]")
    ap.add_argument("--delay", type=float, default=0.0,
                    help="seconds to sleep after each step (to watch it, or kill it) [0]")
    ap.add_argument("--log-every", type=int, default=1, help="a progress line every N steps [1]")
    ap.add_argument("--graft-ddp", action="store_true",
                    help="reduce across groups in graft.torch.DistributedDataParallel's "
                         "communication hook (overlapping the backward pass) instead of an "
                         "average() call after it")
    ap.add_argument("--out", default="",
                    help="at the end, write this rank's state (a pickle) to OUT.g<group>.r<rank>")
    return ap.parse_args()


def batch(seed, step, replica_rank, replica_world, rank, ranks, size):
    """This rank's samples of a step: each (group, rank) its own part of the
    step's data, fixed by the step, so a retried step sees the same data."""
    g = torch.Generator().manual_seed(((seed * 100003 + step) * 64 + replica_rank) * 64 + rank)
    x = torch.randn(size, 8, generator=g)
    y = torch.sin(x).sum(dim=1, keepdim=True)
    return x, y


def say(text):
    """One progress line, in one write: the ranks of a group share the
    launcher's output, and a line written in two parts can be split by
    another rank's."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main():
    a = parse()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    where = graft.launcher_settings()       # group, groups, rank, ranks_per_group
    rank, ranks = where.get("rank", 0), where.get("ranks_per_group", 1)
    if ranks > 1:
        dist.init_process_group("gloo")      # the group's own process group (torchrun's)
    # Every process starts from its own seed: the cold start makes rank r of
    # every group identical, a heal keeps it so.
    seed = a.seed * 1000 + where.get("group", 0) * 10 + rank
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)

    model = torch.nn.Sequential(torch.nn.Linear(8, a.hidden), torch.nn.ReLU(),
                                torch.nn.Dropout(0.1), torch.nn.Linear(a.hidden, 1))
    rt = graft.Runtime(**where)
    avg = graft.torch.GradientAverager(rt, timeout_s=5)
    if a.graft_ddp:
        # torch's DDP over the group's ranks, its hook also reducing across groups.
        net = graft.torch.DistributedDataParallel(rt, model, averager=avg)
    elif ranks > 1:
        net = torch.nn.parallel.DistributedDataParallel(model)
    else:
        net = model
    if ranks > 1:
        inner = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                        lr=a.lr)
    else:
        inner = torch.optim.Adam(model.parameters(), lr=a.lr)

    opt = graft.torch.Optimizer(rt, inner, objects=graft.rng_state,
                                load_objects=graft.set_rng_state)
    # A spare (GRAFT_SPARE=1) learns its group at its first quorum.
    tag = ("spare rank %d" % rt.rank) if rt.spare else "group %d rank %d" % (rt.group, rt.rank)
    say("%s: pid %d, %d ranks per group, %d groups" % (tag, os.getpid(), ranks, rt.groups))

    started = None
    while True:
        try:
            info = opt.zero_grad()           # the quorum; a group that is behind heals here
        except graft.SpareUnused:            # a spare every group ended the job without
            say("%s: spare unused: the job finished without it" % tag)
            rt.close()
            if ranks > 1:
                dist.destroy_process_group()
            return 0
        if started is None:
            if rt.promoted:
                tag = "group %d rank %d" % (rt.group, rt.rank)
                say("%s: spare promoted to group %d" % (tag, rt.group))
            started = rt.start_kind
            say("%s: start %s at step %d" % (tag, started, rt.step))
        if info.step >= a.steps:
            # A clean end: with GRAFT_PERSIST_ROOT set, the final state's
            # checkpoint is written (and waited for) here. A group whose
            # closing commit failed opens the step again; the groups that
            # ended are not waited for (docs/RUNTIME.md, "A clean end").
            if opt.finish():
                break
            say("%s: closing step %d not committed: again" % (tag, info.step))
            continue
        x, y = batch(a.seed, info.step, info.replica_rank, info.replica_world, rank, ranks,
                     a.batch)
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()                      # DDP: averaged over the group's ranks
        if not a.graft_ddp:
            avg.average(model.parameters())  # rank r of every group: averaged across groups
        applied = opt.step()                 # the commit: the step is taken only on a yes
        if rt.step % a.log_every == 0 or not applied:
            say("%s: step %d loss %.5f groups %d%s"
                % (tag, rt.step, loss.item(), info.replica_world,
                   "" if applied else " (not applied: retried)"))
        if a.delay:
            time.sleep(a.delay)

    m = rt.metrics()
    say("%s: done at step %d (start %s, healed %d, served %d)"
        % (tag, rt.step, started, m["recoveries"], m["serves"]))
    if a.out:
        state = {
            "step": rt.step, "start": started, "metrics": m,
            "params": [p.detach().numpy().copy() for p in model.parameters()],
            "optim": [(n, t.numpy().copy())
                      for n, t in graft.torch._state_tensors(opt.local_optim)],
            "rng": (torch.get_rng_state().numpy().copy(), np.random.get_state()[1].copy(),
                    random.getstate()),
        }
        with open("%s.g%d.r%d" % (a.out, rt.group, rt.rank), "wb") as f:
            pickle.dump(state, f)
    rt.close()
    if ranks > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
