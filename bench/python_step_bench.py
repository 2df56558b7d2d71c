#!/usr/bin/env python3
"""python_step_bench: the step time of a PyTorch loop through graft.torch
against the plain torch loop it replaces, for 1, 2 and 3 groups, measured
side by side in one run.

G processes (one per group, one rank each) on a private etcd train the same
MLP (256-512-256, about 1 MiB of parameters, Adam, a batch of 32), each on
its own data, three ways in turn:

  plain   torch's DistributedDataParallel over a gloo process group of the
          G processes (what a job without graft runs)
  wrap    graft.torch.Optimizer + GradientAverager.average() (the quorum,
          the reduction over the participants, the commit)
  async   the same with the quorum beside the forward pass
          (Optimizer.start_quorum() / wait_quorum())
  ddp     graft.torch.Optimizer + graft.torch.DistributedDataParallel (the
          cross-group reduction in DDP's communication hook)

Each way's time is the median of its steps (zero_grad through step) in
group 0; the ways take turns in chunks of steps/5, the first chunk of each
a warm-up; overhead = way - plain.

Usage: bench/python_step_bench.py [--groups 1,2,3] [--steps N] [--steady-path peers|etcd]
                                  [--json]
Needs make (build/lib/libgraft.so) and the venv (scripts/python-env.sh):
run it with build/venv/bin/python.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from python_bench import ROOT, free_port, start_etcd  # noqa: E402

WAYS = ("plain", "wrap", "async", "ddp")


def model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 256))


def timed(steps, step):
    ts = []
    for i in range(steps):
        t = time.perf_counter()
        step(i)
        ts.append(time.perf_counter() - t)
    return ts


def worker(a):
    import torch
    import torch.distributed as dist

    import graft
    import graft.torch

    torch.set_num_threads(1)
    g, n = a.group, int(a.groups)
    data = [torch.randn(32, 256, generator=torch.Generator().manual_seed(i * 16 + g))
            for i in range(8)]
    steps = {w: [] for w in WAYS}

    # plain: torch's DDP across the G processes.
    store = dist.TCPStore("127.0.0.1", a.store_port, n, g == 0)
    pg = dist.ProcessGroupGloo(dist.PrefixStore("plain", store), g, n)
    m0 = model()
    ddp = torch.nn.parallel.DistributedDataParallel(m0, process_group=pg)
    opt = torch.optim.Adam(m0.parameters())

    def plain(i):
        opt.zero_grad()
        ddp(data[i % 8]).square().mean().backward()
        opt.step()

    def runtime(way):
        return graft.Runtime(env=False, job="%s-%s" % (a.job, way), group=g, groups=n,
                             etcd_endpoints=a.etcd, steady_path=a.steady_path)

    rt1, rt2, rt3 = runtime("wrap"), runtime("ddp"), runtime("async")
    m1, m2, m3 = model(), model(), model()
    opt1 = graft.torch.Optimizer(rt1, torch.optim.Adam(m1.parameters()))
    avg = graft.torch.GradientAverager(rt1)
    opt3 = graft.torch.Optimizer(rt3, torch.optim.Adam(m3.parameters()))
    avg3 = graft.torch.GradientAverager(rt3)
    net = graft.torch.DistributedDataParallel(rt2, m2)
    opt2 = graft.torch.Optimizer(rt2, torch.optim.Adam(m2.parameters()))

    def wrap(i):
        opt1.zero_grad()
        m1(data[i % 8]).square().mean().backward()
        avg.average(m1.parameters())
        opt1.step()

    def overlapped(i):
        opt3.start_quorum()
        loss = m3(data[i % 8]).square().mean()
        if opt3.wait_quorum():
            loss = m3(data[i % 8]).square().mean()
        loss.backward()
        avg3.average(m3.parameters())
        opt3.step()

    def gddp(i):
        opt2.zero_grad()
        net(data[i % 8]).square().mean().backward()
        opt2.step()

    # The ways take turns in chunks (the order rotating), so a burst of
    # load on the machine falls on all of them; the first chunk of each is
    # a warm-up.
    fns = {"plain": plain, "wrap": wrap, "async": overlapped, "ddp": gddp}
    chunk = max(1, a.steps // 5)
    for r in range(6):
        k = r % len(WAYS)
        for w in WAYS[k:] + WAYS[:k]:
            ts = timed(chunk, fns[w])
            if r > 0:
                steps[w].extend(ts)
    out = {w: statistics.median(v) for w, v in steps.items()}
    rt1.close()
    rt2.close()
    rt3.close()
    # Every process done with the plain group before any leaves.
    pg.barrier().wait()
    with open(a.out, "w") as f:
        json.dump(out, f)
    return 0


def run_groups(n, steps, etcd, tmp, steady_path):
    job = "step-" + uuid.uuid4().hex[:8]
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOG_minloglevel="2")
    procs, outs = [], []
    for g in range(n):
        out = os.path.join(tmp, "%s.%d.json" % (job, g))
        outs.append(out)
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--worker", "--group", str(g), "--groups", str(n),
             "--etcd", etcd, "--job", job, "--store-port", str(port), "--steps", str(steps),
             "--steady-path", steady_path, "--out", out], env=env))
    for p in procs:
        if p.wait(timeout=600) != 0:
            raise RuntimeError("a worker of %d groups failed" % n)
    with open(outs[0]) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description="graft.torch's step time against plain torch DDP")
    ap.add_argument("--groups", default="1,2,3", help="group counts to run [1,2,3]")
    ap.add_argument("--steps", type=int, default=200, help="steps of each loop [200]")
    ap.add_argument("--json", action="store_true", help="a JSON object on the last line")
    ap.add_argument("--steady-path", default="peers", choices=("peers", "etcd"),
                    help="graft's steady_path setting: etcd takes every step through etcd, "
                    "where the quorum costs milliseconds [peers]")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--group", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--etcd", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--store-port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    os.environ.setdefault("GRAFT_LIBRARY", os.path.join(ROOT, "build", "lib", "libgraft.so"))
    rows = []
    tmp = tempfile.mkdtemp(prefix="graft-stepbench-")
    proc, url = start_etcd(tmp)
    try:
        for n in [int(v) for v in a.groups.split(",")]:
            r = run_groups(n, a.steps, url, tmp, a.steady_path)
            rows.append({"groups": n, **{w + "_ms": r[w] * 1e3 for w in WAYS},
                         "wrap_overhead_ms": (r["wrap"] - r["plain"]) * 1e3,
                         "async_overhead_ms": (r["async"] - r["plain"]) * 1e3,
                         "ddp_overhead_ms": (r["ddp"] - r["plain"]) * 1e3,
                         "ddp_vs_plain": r["ddp"] / r["plain"]})
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print("ms per step (median of %d, group 0), MLP 256-512-256 + Adam, batch 32, "
          "steady_path %s" % (a.steps, a.steady_path))
    print("%6s %10s %10s %10s %10s %12s %13s %12s %8s"
          % ("groups", "plain DDP", "wrap+avg", "async+avg", "graft DDP", "wrap - plain",
             "async - plain", "gDDP - plain", "gDDP/x"))
    for r in rows:
        print("%6d %10.3f %10.3f %10.3f %10.3f %12.3f %13.3f %12.3f %8.2f"
              % (r["groups"], r["plain_ms"], r["wrap_ms"], r["async_ms"], r["ddp_ms"],
                 r["wrap_overhead_ms"], r["async_overhead_ms"], r["ddp_overhead_ms"],
                 r["ddp_vs_plain"]))
    if a.json:
        print(json.dumps({"bench": "python_step", "steps": a.steps,
                          "steady_path": a.steady_path, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
