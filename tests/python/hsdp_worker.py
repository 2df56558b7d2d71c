"""One rank of an HSDP-shaped replica group, run by torchrun for
test_hsdp_gpu.py: FSDP (FULL_SHARD, NCCL) over the group's ranks on the GPU,
graft's GradientAverager (NCCL) across groups, rank r of every group with
rank r of the others (HSDP's replicate dimension).

FSDP's flat parameters (use_orig_params=False) are what graft registers:
each rank's optimizer holds its own shard of the parameters and of Adam's
state, as 1-D contiguous CUDA tensors whose storage FSDP keeps between
steps, so rank r of a replacement group pulls rank r's shard from a donor.

Every rank of every group builds the same model (one seed): FSDP shards the
local copy, so the ranks of a group must start from one model. All the
ranks share the one GPU: each gets an NCCL host id of its own (NCCL refuses
two ranks of a communicator on one GPU of one host), and NCCL's traffic
goes over loopback sockets, as between hosts."""
import argparse
import os
import pickle
import random
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import graft
import graft.torch


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--out", default="")
    return ap.parse_args()


def say(text):
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def batch(seed, step, replica_rank, rank, size):
    """This rank's samples of a step, fixed by the step (a retried step sees
    the same data), made on the CPU and moved to the GPU."""
    g = torch.Generator().manual_seed(((seed * 100003 + step) * 64 + replica_rank) * 64 + rank)
    x = torch.randn(size, 8, generator=g)
    y = torch.sin(x).sum(dim=1, keepdim=True)
    return x.cuda(), y.cuda()


def snapshot(rt, started, shards, opt):
    return {
        "step": rt.step, "start": started, "metrics": rt.metrics(),
        "params": [p.detach().cpu().numpy().copy() for p in shards],
        "optim": [(n, t.cpu().numpy().copy())
                  for n, t in graft.torch._state_tensors(opt.local_optim)],
        "rng": (torch.get_rng_state().numpy().copy(), np.random.get_state()[1].copy(),
                random.getstate()),
        "cuda_rng": torch.cuda.get_rng_state().numpy().copy(),
    }


def hsdp_step(a, info, rank, tag, net, shards, avg, opt):
    """One training step; whether it was applied (committed)."""
    x, y = batch(a.seed, info.step, info.replica_rank, rank, a.batch)
    loss = torch.nn.functional.mse_loss(net(x), y)
    loss.backward()                           # FSDP: reduce-scattered over the group
    avg.average(shards)                       # rank r of every group, over NCCL
    applied = opt.step()
    say("%s: step %d loss %.5f groups %d%s" % (
        tag, opt.runtime.step, loss.item(), info.replica_world,
        "" if applied else " (not applied: retried; averager: %r)" % (avg.last_error,)))
    if a.delay:
        time.sleep(a.delay)
    return applied


def main():
    a = parse()
    where = graft.launcher_settings()
    group, rank = where.get("group", 0), where.get("rank", 0)
    os.environ["NCCL_HOSTID"] = "graft-hsdp-g%d-r%d" % (group, rank)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_IB_DISABLE", "1")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    torch.manual_seed(a.seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, a.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(a.hidden, a.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(a.hidden, 1)).cuda()
    numel = sum(p.numel() for p in model.parameters())
    net = FSDP(model, device_id=0, use_orig_params=False,
               sharding_strategy=ShardingStrategy.FULL_SHARD)
    shards = list(net.parameters())
    seed = a.seed * 1000 + group * 10 + rank   # the other RNGs: per rank
    np.random.seed(seed)
    random.seed(seed)

    rt = graft.Runtime(**where)
    avg = graft.torch.GradientAverager(rt, timeout_s=10, backend="nccl")
    opt = graft.torch.Optimizer(rt, torch.optim.Adam(shards, lr=a.lr),
                                objects=graft.rng_state, load_objects=graft.set_rng_state)
    tag = "group %d rank %d" % (rt.group, rt.rank)
    say("%s: pid %d, %d ranks per group, %d groups, shard %s of %d" % (
        tag, os.getpid(), where.get("ranks_per_group", 1), rt.groups,
        [tuple(p.shape) for p in shards], numel))
    ptrs = [p.data_ptr() for p in shards]

    info = opt.zero_grad()                    # the quorum; a replacement heals here
    started = rt.start_kind
    say("%s: start %s at step %d" % (tag, started, rt.step))
    held = 0                                  # steps in a row not applied
    while not (info.step >= a.steps and opt.finish()):
        if info.step < a.steps:
            applied = hsdp_step(a, info, rank, tag, net, shards, avg, opt)
            held = 0 if applied else held + 1
            if held >= 20:   # fail fast, not at the test's timeout
                say("%s: 20 steps in a row not applied" % tag)
                return 3
        info = opt.zero_grad()

    # The registered memory is still FSDP's shard storage.
    assert [p.data_ptr() for p in shards] == ptrs, "FSDP moved a flat parameter's storage"
    m = rt.metrics()
    say("%s: done at step %d (start %s, healed %d, served %d)"
        % (tag, rt.step, started, m["recoveries"], m["serves"]))
    if a.out:
        with open("%s.g%d.r%d" % (a.out, rt.group, rt.rank), "wb") as f:
            pickle.dump(snapshot(rt, started, shards, opt), f)
    rt.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
