#!/usr/bin/env python3
"""make soak: a long graft-sim run with memory and descriptors watched.

Runs `graft-sim run` with many random failures (default 1000) and samples,
every few seconds, the resident memory and the open descriptors of every
process of the run: graft-sim itself, its embedded etcd, and each trainer.
At the end it prints, for the processes that lived long enough to say
something (graft-sim for the whole run, any other process that lived at
least --min-life seconds: the failure mix restarts trainers and etcd every
few seconds), how much each grew between its first sample after a warm-up
and its last one, beside the limits it is judged by, how many processes of
each kind it saw and the longest life among them, and one JSON object on
the last line (--json FILE writes it too).

It also checks what the failures must not cost: every checkpoint the run
left complete verifies (`graftctl ckpt verify`), except those graft-sim
corrupted on purpose, which must fail it; and every disaster restarted the
job from the newest checkpoint that was intact when every rank was dead,
so no committed step was lost beyond that documented rollback.

Exit status: 0 when the verdict is bit-exact, every check holds and nothing
grew beyond the limits; 1 otherwise; 2 on bad usage.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def descendants(root):
    """pid -> (ppid, comm) of root and every process below it."""
    procs = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # comm may hold spaces: it sits between the first '(' and last ')'.
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        procs[int(d)] = (ppid, comm)
    keep, frontier = {}, [root]
    while frontier:
        p = frontier.pop()
        if p in procs and p not in keep:
            keep[p] = procs[p]
            frontier.extend(c for c, (pp, _) in procs.items() if pp == p)
    return keep


def sample(pid):
    """(rss KiB, open descriptors) of pid, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        return rss, fds
    except (OSError, StopIteration):
        return None


def check_rollbacks(recoveries):
    """Disasters that restarted the job from before the newest checkpoint
    that was intact when every rank was dead (the documented rollback)."""
    disasters = [x for x in recoveries if x.get("kind") in ("disaster", "lose_disks")]
    beyond = []
    for i, x in enumerate(disasters):
        want, got = x.get("checkpoint_step"), x.get("restored_step")
        if got is None and i + 1 < len(disasters):
            continue  # the next disaster came before any commit
        if want is None or got is None or got < want:
            beyond.append(f"disaster at t={x.get('t_fail')}: restarted from step {got}, "
                          f"newest intact checkpoint {want}")
    return {"disasters": len(disasters), "beyond": beyond}


def verify_checkpoints(build, root, recoveries):
    """graftctl ckpt verify on each checkpoint left under root: those
    graft-sim corrupted must fail, every other one must pass."""
    graftctl = os.path.join(build, "bin", "graftctl")
    corrupted = {x["corrupted_step"] for x in recoveries if "corrupted_step" in x}
    res = {"verified": 0, "failed_as_corrupted": 0, "faults": []}
    # The run's checkpoints sit in a folder of its job's name under root.
    jobs = [os.path.join(root, d) for d in sorted(os.listdir(root))
            if os.path.isdir(os.path.join(root, d))]
    if len(jobs) != 1:
        res["faults"].append(f"{root}: {len(jobs)} job folders, expected 1")
        return res
    root = jobs[0]
    ls = subprocess.run([graftctl, "--json", "ckpt", "ls", root], capture_output=True, text=True)
    try:
        listed = json.loads(ls.stdout)
    except ValueError:
        res["faults"].append(f"graftctl ckpt ls exited {ls.returncode}: {ls.stderr.strip()}")
        return res
    for c in listed.get("checkpoints", []):
        if c.get("state") != "complete":
            continue  # a write the last kills cut short: never restored
        step = c.get("step")
        v = subprocess.run([graftctl, "ckpt", "verify", root, str(step)], capture_output=True,
                           text=True)
        if step in corrupted:
            if v.returncode == 0:
                res["faults"].append(f"step {step}: corrupted by graft-sim, yet it verified")
            else:
                res["failed_as_corrupted"] += 1
        elif v.returncode == 0:
            res["verified"] += 1
        else:
            res["faults"].append(f"step {step}: {(v.stdout + v.stderr).strip()[-300:]}")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build", help="build directory [build]")
    ap.add_argument("--failures", type=int, default=1000, help="random failures [1000]")
    ap.add_argument("--groups", type=int, default=3, help="replica groups [3]")
    ap.add_argument("--ranks", type=int, default=1, help="ranks per group [1]")
    ap.add_argument("--steps-per-failure", type=float, default=2.0,
                    help="optimizer steps per planned failure [2]: with few, failures come "
                         "due while others still heal and overlap, as graft-sim allows "
                         "(one whole group always stands)")
    ap.add_argument("--persist-every", type=int, default=20,
                    help="a persistent checkpoint every this many steps [20]")
    ap.add_argument("--seed", default="7", help="seed of the run [7]")
    ap.add_argument("--netns", action="store_true",
                    help="groups in network namespaces (root): the mix then holds partition, "
                         "isolate, throttle and cut_donor too")
    ap.add_argument("--etcd-members", type=int, default=1,
                    help="members of the embedded etcd [1]; with 3 or more the mix kills "
                         "etcd's leader instead of restarting etcd")
    ap.add_argument("--persist-remote", metavar="s3://BUCKET[/PREFIX]",
                    help="an object store for the trainers' remote tier (credentials from "
                         "AWS_*): the mix then holds lose_disks, disasters that also empty "
                         "the local checkpoint root")
    ap.add_argument("--persist-remote-endpoint", metavar="URL",
                    help="the store's URL when it is not AWS S3")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between samples [5]")
    ap.add_argument("--warmup", type=float, default=60.0,
                    help="a process's first sample counted is this many seconds after it "
                         "was first seen [60]")
    ap.add_argument("--min-life", type=float, default=120.0,
                    help="besides graft-sim, the processes judged are those that lived this "
                         "long [120]")
    ap.add_argument("--rss-limit-mib", type=float, default=16.0,
                    help="most growth of resident memory allowed per process [16 MiB]")
    ap.add_argument("--fd-limit", type=int, default=8,
                    help="most growth of open descriptors allowed per process [8]")
    ap.add_argument("--minutes", type=float, default=30.0,
                    help="graft-sim gives up after this long [30]")
    ap.add_argument("--json", help="also write the result here")
    a = ap.parse_args()
    if a.failures < 1 or a.groups < 2 or a.ranks < 1 or a.interval <= 0:
        ap.error("need --failures >= 1, --groups >= 2, --ranks >= 1, --interval > 0")

    out = os.path.join(a.build, "soak")
    ckpts = os.path.join(out, "checkpoints")
    if os.path.isdir(ckpts):
        subprocess.run(["rm", "-rf", ckpts], check=True)
    os.makedirs(ckpts)
    report = os.path.join(out, "report.json")
    sim = os.path.join(a.build, "bin", "graft-sim")
    cmd = [sim, "run", "--groups", str(a.groups), "--ranks", str(a.ranks),
           "--steps", str(max(100, int(a.failures * a.steps_per_failure))), "--seed", a.seed,
           "--random-failures", str(a.failures), "--persist-root", ckpts,
           "--persist-every", str(a.persist_every), "--json", report,
           "--etcd-members", str(a.etcd_members)] + (["--netns"] if a.netns else [])
    if a.persist_remote:
        cmd += ["--persist-remote", a.persist_remote]
    if a.persist_remote_endpoint:
        cmd += ["--persist-remote-endpoint", a.persist_remote_endpoint]
    print("soak:", " ".join(cmd), flush=True)
    log = open(os.path.join(out, "sim.log"), "w")
    env = dict(os.environ)
    env["GRAFT_SIM_TIMEOUT_S"] = str(int(a.minutes * 60))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    seen = {}  # pid -> {"comm", "first", "samples": [(t, rss, fds)]}
    last_note = 0.0
    while proc.poll() is None:
        now = time.monotonic() - t0
        for pid, (_, comm) in descendants(proc.pid).items():
            s = sample(pid)
            if s is None:
                continue
            rec = seen.setdefault(pid, {"comm": comm, "first": now, "samples": []})
            rec["samples"].append((now, s[0], s[1]))
        if now - last_note >= 60:
            last_note = now
            alive = sum(1 for r in seen.values() if r["samples"][-1][0] >= now - a.interval)
            print(f"soak: t={now:6.0f}s, {alive} processes, {len(seen)} seen", flush=True)
        time.sleep(a.interval)
    rc = proc.returncode
    wall = time.monotonic() - t0

    verdict, injected, r = None, 0, {}
    try:
        with open(report) as f:
            r = json.load(f)
        verdict, injected = r.get("verdict"), r.get("failures_injected_total", 0)
    except (OSError, ValueError):
        pass
    kinds = r.get("failures_injected") or {}
    rollbacks = check_rollbacks(r.get("recoveries") or [])
    checkpoints = verify_checkpoints(a.build, ckpts, r.get("recoveries") or [])

    rows, lives = [], {}
    for pid, rec in seen.items():
        s = rec["samples"]
        life = s[-1][0] - rec["first"]
        n, longest = lives.get(rec["comm"], (0, 0.0))
        lives[rec["comm"]] = (n + 1, max(longest, life))
        if pid != proc.pid and life < a.min_life:
            continue
        counted = [x for x in s if x[0] >= rec["first"] + a.warmup] or s[-1:]
        rss_growth = (counted[-1][1] - counted[0][1]) / 1024.0
        fd_growth = counted[-1][2] - counted[0][2]
        rows.append({"pid": pid, "process": rec["comm"], "life_s": round(life, 1),
                     "rss_first_mib": round(counted[0][1] / 1024.0, 1),
                     "rss_last_mib": round(counted[-1][1] / 1024.0, 1),
                     "rss_growth_mib": round(rss_growth, 2),
                     "fds_first": counted[0][2], "fds_last": counted[-1][2],
                     "fd_growth": fd_growth,
                     "flat": rss_growth <= a.rss_limit_mib and fd_growth <= a.fd_limit})
    rows.sort(key=lambda x: -x["life_s"])

    print(f"\nsoak: {injected} failures injected in {wall:.0f} s, verdict {verdict}, "
          f"graft-sim exit {rc}")
    print(f"{'process':<12} {'pid':>7} {'life s':>8} {'RSS MiB':>16} {'growth':>8} "
          f"{'fds':>9} {'growth':>6}  flat")
    for x in rows:
        print(f"{x['process']:<12} {x['pid']:>7} {x['life_s']:>8.0f} "
              f"{x['rss_first_mib']:>7.1f}->{x['rss_last_mib']:<7.1f} {x['rss_growth_mib']:>8.2f} "
              f"{x['fds_first']:>4}->{x['fds_last']:<4} {x['fd_growth']:>6}  "
              f"{'yes' if x['flat'] else 'NO'}")
    print(f"limits: resident memory +{a.rss_limit_mib:g} MiB, descriptors +{a.fd_limit} per "
          f"process, counted from {a.warmup:g} s after it was first seen; graft-sim, and every "
          f"other process that lived at least {a.min_life:g} s")
    print("processes seen: " + ", ".join(f"{c} {n} (longest {l:.0f} s)"
                                         for c, (n, l) in sorted(lives.items())))
    print(f"failures by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    print(f"disasters: {rollbacks['disasters']}, each restarted from the newest intact "
          f"checkpoint: {'yes' if not rollbacks['beyond'] else 'NO'}"
          + "".join(f"\n  {x}" for x in rollbacks["beyond"]))
    print(f"checkpoints left: {checkpoints['verified']} verified, {checkpoints['failed_as_corrupted']}"
          f" corrupted by graft-sim and refused, faults: {len(checkpoints['faults'])}"
          + "".join(f"\n  {x}" for x in checkpoints["faults"]))
    ok = rc == 0 and verdict == "bit-exact" and injected >= a.failures and rows and \
        all(x["flat"] for x in rows) and not rollbacks["beyond"] and \
        not checkpoints["faults"] and checkpoints["verified"] > 0
    result = {"bench": "soak", "failures_planned": a.failures, "failures_injected": injected,
              "failures_by_kind": kinds, "disasters": rollbacks["disasters"],
              "rollbacks_beyond_checkpoint": rollbacks["beyond"], "checkpoints": checkpoints,
              "verdict": verdict, "sim_exit": rc, "wall_s": round(wall, 1),
              "groups": a.groups, "ranks": a.ranks, "rss_limit_mib": a.rss_limit_mib,
              "fd_limit": a.fd_limit, "processes": rows,
              "seen": {c: {"count": n, "longest_life_s": round(l, 1)}
                       for c, (n, l) in lives.items()},
              "ok": bool(ok)}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
