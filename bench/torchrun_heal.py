#!/usr/bin/env python3
"""torchrun_heal: kill -> first commit for a group that is a torchrun world.

2 groups x 2 ranks of examples/python/train_torchrun.py (DDP and
ZeroRedundancyOptimizer inside each group, CPU/gloo, strict mode), each group
under `torchrun --max_restarts 2 --monitor_interval 0.5`. At step 10 rank 1
of group 1 is SIGKILLed; torchrun stops the group's other rank and starts
both again. The phases, from the kill, as the harness reads the trainers'
lines (so each includes up to a few ms of reading):

  seen     torchrun reports the dead rank (its 'failed (exitcode: -9)' line)
  up       a new rank of group 1 printed its pid (python, torch, the group's
           process group and graft.Runtime() are up)
  healed   a new rank printed 'start peer' (quorum and heal done)
  commit   group 1's rank 0 printed a step line: its first applied commit

Usage: bench/torchrun_heal.py --etcd URL [--trials N] [--json]
(etcd: a running etcd's client URL). Needs make (build/lib/libgraft.so).
"""
import argparse
import json
import os
import signal
import statistics
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("GRAFT_LIBRARY", os.path.join(ROOT, "build", "lib", "libgraft.so"))

import conftest  # noqa: E402
from test_torchrun import Torchrun  # noqa: E402


def trial(etcd, out):
    env = conftest.job_settings(etcd, "bench-tr-")
    groups = [Torchrun(env, g, out, max_restarts=2, delay=0.1, steps=30, groups=2)
              for g in range(2)]
    try:
        g1 = groups[1]
        g1.wait_step(10)
        victim = g1.pid_of(1)
        since = len(g1.lines)
        t0 = time.time()
        os.kill(victim, signal.SIGKILL)
        phases = {}
        _, t, _ = g1.wait_for(lambda x: "failed (exitcode: -9)" in x, "torchrun's report",
                              since=since)
        phases["seen"] = t - t0
        _, t, _ = g1.wait_for(lambda x: "group 1 rank" in x and ": pid " in x, "a new rank",
                              since=since)
        phases["up"] = t - t0
        _, t, since = g1.wait_for(lambda x: "group 1 rank" in x and "start peer" in x,
                                  "the heal", since=since)
        phases["healed"] = t - t0
        # The old rank 0 may print a step line after the kill: only lines
        # after the heal count.
        _, t, _ = g1.wait_for(lambda x: "group 1 rank 0: step " in x, "a commit", since=since)
        phases["commit"] = t - t0
        for g in groups:
            g.finish()
        return phases
    finally:
        for g in groups:
            if g.proc.poll() is None:
                g.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--etcd", required=True, help="a running etcd's client URL")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = "/tmp/torchrun_heal.%d" % os.getpid()
    runs = []
    for i in range(a.trials):
        p = trial(a.etcd, out)
        runs.append(p)
        if not a.json:
            print("trial %d: " % i + ", ".join("%s %.2f s" % kv for kv in p.items()), flush=True)
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    load = os.getloadavg()[0]
    if a.json:
        print(json.dumps({"trials": runs, "median": med, "loadavg_1min": load}))
    else:
        print("median: " + ", ".join("%s %.2f s" % kv for kv in med.items())
              + " (load average %.1f)" % load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
