#!/usr/bin/env python3
"""python_bench: the heal of a group through the Python package beside the
same heal through the C API, and the per-step overhead of graft.torch's
optimizer wrapper.

Heal: 3 groups x 1 rank in strict mode on a private etcd, each holding S of
state in a blob region plus its model; group 1 is killed (SIGKILL) at step
5 and its successor takes over: a process started at once ("respawn"), or
a spare started with the job (GRAFT_SPARE=1; "spare"), or a follow spare
(GRAFT_SPARE_FOLLOW=1 too: it pulls every step while it waits; "follow"),
the dead group evicted at once with `graftctl evict` as an agent would
(a follower that joins at the step it holds heals nothing: 'heal' 0). 'total' is the
kill to the successor's first applied commit. The Python side is
examples/python/train_ddp.py
(its blob a torch tensor registered zero-copy through graft.Runtime); the C
side is examples/train_mlp.c (its blob a malloc'ed buffer registered with
graft_region_register). Both follow graft-sim's trainer contract, so one
harness times both from their own files: 'heal' is the verified pull as the
successor's runtime reports it (--role-log "heal GRAFT_OK <ms>"), 'total'
the kill to its first applied commit (--hash-log).

Overhead: one group, a 2-layer MLP (about 1 MiB of parameters) with Adam;
the median time of zero_grad() + step() through graft.torch.Optimizer, of
the plain optimizer's, and of the bare Runtime.quorum() + commit() calls.

Usage: bench/python_bench.py [--mib 64,1024] [--reps N] [--steps N]
                             [--successor respawn,spare,follow] [--json]
Needs make ($BUILD/bin/train_mlp, $BUILD/lib/libgraft.so; BUILD=build) and the venv
(scripts/python-env.sh): run it with build/venv/bin/python.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
# The build it runs: $BUILD as make's BUILD= (default build/).
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
os.environ.setdefault("GRAFT_LIBRARY", os.path.join(BUILD, "lib", "libgraft.so"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_etcd(tmp):
    c, p = free_port(), free_port()
    url, purl = "http://127.0.0.1:%d" % c, "http://127.0.0.1:%d" % p
    proc = subprocess.Popen(
        ["etcd", "--name=default", "--data-dir", os.path.join(tmp, "etcd"),
         "--listen-client-urls", url, "--advertise-client-urls", url, "--listen-peer-urls", purl,
         "--initial-advertise-peer-urls", purl, "--initial-cluster", "default=" + purl,
         "--logger=zap", "--log-level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("etcd did not start")


def trainer_cmd(kind):
    if kind == "c":
        return [os.path.join(BUILD, "bin", "train_mlp")]
    return [sys.executable, os.path.join(ROOT, "examples", "python", "train_ddp.py")]


def lines(path):
    try:
        with open(path) as f:
            return f.read().split("\n")
    except FileNotFoundError:
        return []


def spares_registered(etcd, job):
    """The spare records of the job in etcd (its JSON gateway)."""
    import base64
    key = "/graft/%s/spares/" % job
    end = key[:-1] + chr(ord(key[-1]) + 1)
    body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                       "range_end": base64.b64encode(end.encode()).decode(),
                       "count_only": True}).encode()
    with urllib.request.urlopen(etcd + "/v3/kv/range", body, timeout=5) as r:
        return int(json.load(r).get("count", 0))


def heal_once(kind, mib, etcd, tmp, steps, successor="respawn"):
    job = "bench-" + uuid.uuid4().hex[:8]
    env = dict(os.environ, GRAFT_JOB=job, GRAFT_ETCD_ENDPOINTS=etcd, GRAFT_GROUPS="3",
               GRAFT_LEASE_TTL_MS="1000", GRAFT_JOIN_TIMEOUT_MS="1000",
               PYTHONPATH=os.path.join(ROOT, "python"))
    procs = {}

    spare = successor in ("spare", "follow")

    def spawn(g, tag):
        e = dict(env, GRAFT_GROUP=str(g))
        if g is None:  # a spare: its files are named once it knows its group
            e.pop("GRAFT_GROUP", None)
            e["GRAFT_SPARE"] = "1"
            if successor == "follow":
                e["GRAFT_SPARE_FOLLOW"] = "1"
        base = os.path.join(tmp, "%s-g%s-%s" % (job, "{group}" if g is None else g, tag))
        args = trainer_cmd(kind) + ["--steps", str(steps), "--seed", "1", "--blob-mib", str(mib),
                                    "--step-delay-ms", "50", "--hash-log", base + ".hash",
                                    "--role-log", base + ".role"]
        log = open(base.replace("{group}", "spare") + ".log", "w")
        procs[(g, tag)] = subprocess.Popen(args, env=e, stdout=log, stderr=subprocess.STDOUT)
        return base

    for g in range(3):
        spawn(g, "a")
    if spare:
        base = spawn(None, "s").replace("{group}", "1")
    base1 = os.path.join(tmp, "%s-g1-a" % job)
    deadline = time.time() + 600
    while time.time() < deadline:
        done = [ln for ln in lines(base1 + ".hash") if ln]
        if len(done) >= 5 and (not spare or spares_registered(etcd, job) == 1):
            break
        if procs[(1, "a")].poll() is not None:
            raise RuntimeError("group 1 ended early: see %s.log" % base1)
        time.sleep(0.02)
    t0 = time.time()
    procs[(1, "a")].send_signal(signal.SIGKILL)
    procs[(1, "a")].wait()
    if spare:
        subprocess.run([os.path.join(BUILD, "bin", "graftctl"), "--etcd", etcd, "--job",
                        job, "--yes", "evict", "1"], check=True, stdout=subprocess.DEVNULL)
    else:
        base = spawn(1, "b")
    first = None
    while time.time() < deadline:
        if first is None and [ln for ln in lines(base + ".hash") if ln]:
            first = time.time() - t0
        if all(p.poll() is not None for k, p in procs.items() if k != (1, "a")):
            break
        time.sleep(0.01)
    for k, p in procs.items():
        if p.poll() is None:
            p.kill()
            p.wait()
        elif k != (1, "a") and p.returncode != 0:
            raise RuntimeError("a %s trainer failed: see %s" % (kind, tmp))
    heals = [ln.split() for ln in lines(base + ".role") if " heal " in ln]
    ok = [float(h[3]) for h in heals if h[2] == "GRAFT_OK"]
    if successor == "follow" and not heals and first is not None:
        return 0.0, first  # joined at the step it followed: nothing to pull
    if not ok or first is None:
        raise RuntimeError("the successor did not heal: see %s.role" % base)
    return ok[-1] / 1000.0, first


def overhead(steps):
    import torch

    import graft
    import graft.torch

    torch.set_num_threads(1)

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                   torch.nn.Linear(512, 256))

    x = torch.randn(32, 256)

    def loop(zero_grad, step):
        ts = []
        for _ in range(steps):
            t = time.perf_counter()
            zero_grad()
            ts.append(time.perf_counter() - t)
            m(x).square().mean().backward()
            t = time.perf_counter()
            step()
            ts[-1] += time.perf_counter() - t
        return statistics.median(ts[steps // 10:])

    m = model()
    plain = torch.optim.Adam(m.parameters())
    t_plain = loop(plain.zero_grad, plain.step)
    tmp = tempfile.mkdtemp(prefix="graft-pybench-")
    proc, url = start_etcd(tmp)
    failed = True
    try:
        with graft.Runtime(env=False, job="ov-" + uuid.uuid4().hex[:8], group=0, groups=1,
                           etcd_endpoints=url) as rt:
            m = model()
            opt = graft.torch.Optimizer(rt, torch.optim.Adam(m.parameters()))
            t_wrap = loop(opt.zero_grad, opt.step)
        with graft.Runtime(env=False, job="ov-" + uuid.uuid4().hex[:8], group=0, groups=1,
                           etcd_endpoints=url) as rt:
            m = model()
            rt.register("w", m[0].weight.data, "param")
            t_bare = loop(rt.quorum, rt.commit)
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return t_plain, t_wrap, t_bare


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", default="64,1024")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200, help="steps of the overhead loops")
    ap.add_argument("--successor", default="respawn",
                    help="respawn, spare, follow (comma-separated)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = {"heal": [], "overhead": {}}
    tmp = tempfile.mkdtemp(prefix="graft-pybench-")
    proc, url = start_etcd(tmp)
    try:
        for mib in [int(v) for v in a.mib.split(",")]:
            for kind in ("python", "c"):
                for successor in a.successor.split(","):
                    heal, total = [], []
                    for _ in range(a.reps):
                        h, t = heal_once(kind, mib, url, tmp, 14, successor)
                        heal.append(h)
                        total.append(t)
                    out["heal"].append({"mib": mib, "api": kind, "successor": successor,
                                        "heal_s": statistics.median(heal),
                                        "total_s": statistics.median(total), "reps": a.reps})
        failed = False
    finally:
        proc.terminate()
        proc.wait()
        if failed:  # the trainers' logs say why
            print("python_bench: kept %s" % tmp, file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    t_plain, t_wrap, t_bare = overhead(a.steps)
    out["overhead"] = {"plain_step_ms": t_plain * 1e3, "wrapper_step_ms": t_wrap * 1e3,
                       "wrapper_overhead_ms": (t_wrap - t_plain) * 1e3,
                       "bare_quorum_commit_ms": t_bare * 1e3}
    print("heal of one group of 3 (strict), median of %d; total = kill -> the successor's "
          "first commit" % a.reps)
    print("%8s  %-7s %-9s %10s %10s" % ("state", "api", "successor", "heal s", "total s"))
    for r in out["heal"]:
        print("%5d MiB  %-7s %-9s %10.3f %10.3f" % (r["mib"], r["api"], r["successor"],
                                                   r["heal_s"], r["total_s"]))
    o = out["overhead"]
    print("per step (zero_grad + step), 1 group, median of %d" % a.steps)
    print("  plain Adam                  %8.3f ms" % o["plain_step_ms"])
    print("  graft.torch.Optimizer       %8.3f ms" % o["wrapper_step_ms"])
    print("  overhead of the wrapper     %8.3f ms" % o["wrapper_overhead_ms"])
    print("  bare quorum() + commit()    %8.3f ms" % o["bare_quorum_commit_ms"])
    if a.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
