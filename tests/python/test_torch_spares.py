"""Spares with graft.torch (docs/RUNTIME.md, "Spares"; python/README.md):
a spare is a torch_worker.py started with GRAFT_SPARE=1 and no group. It
builds its model, optimizer and regions, then waits at its first
zero_grad() (or start_quorum()) until a group's process dies and it takes
that slot; it heals like a replacement and the job ends bit-identical to
the fault-free run, with no process started after the kill. A spare the
job ended without gets graft.SpareUnused there and exits 0."""
import base64
import json
import pickle
import time
import urllib.request

import numpy as np
import pytest

import graft  # noqa: F401  (GRAFT_LIBRARY and sys.path come from conftest)
from test_torch import _assert_identical

STEPS = 16
KILL_AT = 8

# The ways a group trains: gradients averaged with GradientAverager.average(),
# in the DDP wrapper's hook, with the quorum beside the forward pass; or
# every group on the same data, with BatchNorm buffers and state dicts
# (an EMA's tensor region, a data position, the scheduler) as state.
WAYS = {
    "average": ("--average",),
    "ddp": ("--average", "--ddp"),
    "async_quorum": ("--average", "--async-quorum"),
    "buffers_and_state_dicts": ("--batchnorm", "--stateful"),
}


def _load(path):
    with open(path, "rb") as f:
        return pickle.load(f)


def _b64(b):
    return base64.b64encode(b).decode()


def _count(etcd, prefix):
    """How many keys etcd holds under prefix."""
    key = prefix.encode()
    body = {"key": _b64(key), "range_end": _b64(key[:-1] + bytes([key[-1] + 1])),
            "count_only": True}
    req = urllib.request.Request(etcd + "/v3/kv/range", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return int(json.loads(r.read()).get("count", "0"))


def _wait_spares(etcd, job, n, timeout=30):
    """Wait until n spares are registered under the job's spares/."""
    prefix = "/graft/%s/spares/" % job
    deadline = time.time() + timeout
    while _count(etcd, prefix) != n:
        assert time.time() < deadline, "%d spares registered, not %d" % (
            _count(etcd, prefix), n)
        time.sleep(0.05)


def _two_groups_and_a_spare(spawn, job_env, tmp_path, args, spare_env=None):
    """The fault-free reference of two groups (ref0, ref1), then two groups
    (g0, g1) and a spare of rank 0 (spare, with spare_env) waiting."""
    ref_env = {"GRAFT_JOB": job_env["GRAFT_JOB"] + "-ref"}
    refs = [spawn(g, 2, tmp_path / ("ref%d" % g), *args, env=ref_env) for g in range(2)]
    for w in refs:
        w.finish()
    run = args + ["--delay", 0.05]
    ws = [spawn(g, 2, tmp_path / ("g%d" % g), *run) for g in range(2)]
    spare = spawn(0, 2, tmp_path / "spare", *run, spare=True, env=spare_env)
    spare.wait_line(lambda line: line.startswith("spare waiting"), "spare waiting")
    return ws, spare


@pytest.mark.parametrize("way", list(WAYS))
def test_spare_takes_a_killed_groups_slot(spawn, etcd, job_env, tmp_path, way):
    """Two groups and a spare started with them; group 1's process is killed
    at step 8 and nothing is started after: the spare takes slot (1, 0),
    heals (parameters, Adam state, RNG states, scheduler, and per way the
    buffers and state dicts), averages with group 0 from the first step
    after its promotion, and both end bit-identical to a fault-free run of
    two groups, with its losses."""
    ws, spare = _two_groups_and_a_spare(spawn, job_env, tmp_path,
                                        ["--steps", STEPS, "--finish", *WAYS[way]])
    _wait_spares(etcd, job_env["GRAFT_JOB"], 1)
    ws[1].wait_step(KILL_AT)
    ws[1].kill()
    # From here on nothing is spawned: the spare is the replacement.
    line = spare.wait_line(lambda line: line.startswith("spare promoted"), "spare promoted",
                           timeout=60)
    assert line.split() == ["spare", "promoted", "to", "group", "1"]
    assert _count(etcd, "/graft/%s/spares/" % job_env["GRAFT_JOB"]) == 0
    ws[0].finish()
    spare.finish()

    ref, g0, sp = (_load(tmp_path / n) for n in ("ref0", "g0", "spare"))
    _assert_identical([ref, _load(tmp_path / "ref1"), g0, sp])
    assert g0["losses"] == ref["losses"]
    assert sp["spare"] and sp["group"] == 1 and sp["start"] == "peer"
    assert sp["metrics"]["recoveries"] >= 1 and g0["metrics"]["serves"] >= 1
    assert sp["events"].count("spare_promoted") == 1
    assert sp["regions"] == g0["regions"]
    if "--average" in WAYS[way]:
        # The spare's first reduction, at the step it healed to, already
        # has both groups taking part, and every later one too.
        step, world, participating, participants = sp["averages"][0]
        assert step >= KILL_AT and world == 2 and participating == 1 and participants == 2
        assert all(a[1:] == (2, 1, 2) for a in sp["averages"])
        rebuilds, failures = sp["avg"]
        assert rebuilds >= 1
    else:
        for o in (g0, sp):
            assert [n for n, _ in o["buffers"]] == [n for n, _ in ref["buffers"]]
            for (_, a), (_, b) in zip(o["buffers"], ref["buffers"]):
                assert a.tobytes() == b.tobytes()
            assert np.array_equal(o["ema"][0], ref["ema"][0]) and o["ema"][1] == ref["ema"][1]
            assert o["position"] == ref["position"] == 32 * STEPS


def test_follow_spare_joins_without_pull(spawn, etcd, job_env, tmp_path):
    """A follow spare (GRAFT_SPARE_FOLLOW=1) pulls every step from group 0
    while it waits. Group 1 is killed at step 8; group 0 (strict) waits at
    its step and serves it to the follower, which takes the slot and joins
    at that step without a pull (no recovery), averages with group 0 from
    its first step, and both end bit-identical to a fault-free run."""
    ws, spare = _two_groups_and_a_spare(spawn, job_env, tmp_path,
                                        ["--steps", STEPS, "--finish", "--average"],
                                        {"GRAFT_SPARE_FOLLOW": "1"})
    _wait_spares(etcd, job_env["GRAFT_JOB"], 1)
    ws[1].wait_step(KILL_AT)
    ws[1].kill()
    spare.wait_line(lambda line: line.startswith("spare promoted"), "spare promoted", timeout=60)
    ws[0].finish()
    spare.finish()
    ref, g0, sp = (_load(tmp_path / n) for n in ("ref0", "g0", "spare"))
    _assert_identical([ref, _load(tmp_path / "ref1"), g0, sp])
    assert sp["group"] == 1 and sp["start"] == "peer"
    assert sp["metrics"]["recoveries"] == 0, sp["metrics"]
    assert sp["metrics"]["follow_pulls"] >= 1 and g0["metrics"]["follow_serves"] >= 1
    assert all(a[1:] == (2, 1, 2) for a in sp["averages"])


def test_spare_the_job_ended_without_exits_cleanly(spawn, etcd, job_env, tmp_path):
    """Two groups that end through the closing step (Optimizer.finish()) and
    a spare waiting beside them: no slot falls vacant, the spare's
    zero_grad() raises graft.SpareUnused once every group's finished record
    is written, and it exits 0 with its spare record gone."""
    args = ["--steps", 6, "--finish", "--average"]
    ws = [spawn(g, 2, tmp_path / ("g%d" % g), *args) for g in range(2)]
    spare = spawn(0, 2, tmp_path / "spare", *args, spare=True)
    spare.wait_line(lambda line: line.startswith("spare waiting"), "spare waiting")
    for w in ws:
        w.finish()
    spare.finish(timeout=60)
    assert "spare unused: the job finished without it\n" in spare.lines
    assert not any(line.startswith("spare promoted") for line in spare.lines)
    out = _load(tmp_path / "spare")
    assert out == {"spare_unused": True, "group": None, "finished": True, "events": []}
    assert _count(etcd, "/graft/%s/spares/" % job_env["GRAFT_JOB"]) == 0
    for g in range(2):
        assert _load(tmp_path / ("g%d" % g))["step"] == 6


def test_spare_setting(etcd, job_env):
    """spare=True needs no group, and group is None until a promotion (a
    plain runtime's is its own from the start); without it, group is
    still required."""
    with graft.Runtime(env=False, job=job_env["GRAFT_JOB"], groups=2, spare=True,
                       etcd_endpoints=etcd) as rt:
        assert rt.spare and rt.group is None and not rt.promoted and rt.rank == 0
    with graft.Runtime(env=False, job=job_env["GRAFT_JOB"], groups=2, group=1,
                       etcd_endpoints=etcd) as rt:
        assert not rt.spare and rt.group == 1 and not rt.promoted
    with pytest.raises(graft.UsageError) as e:
        graft.Runtime(env=False, job="x", groups=2, etcd_endpoints=etcd)
    assert "unless the process is a spare" in str(e.value)


def test_train_ddp_example_as_a_spare(spawn, tmp_path):
    """examples/python/train_ddp.py under GRAFT_SPARE=1, as graft-sim starts
    it: two groups and two spares of rank 0, the spares' files named with
    "{group}" (docs/SIM.md, the trainer contract); group 1 is killed at
    step 6. One spare says "spare promoted to group 1", trains on and
    writes its hash log, role log (its heal) and final hash under group 1's
    names; the other says "spare unused: the job finished without it" and
    writes no file. All exit 0, and the final state hashes of group 0 and
    the promoted spare are the --no-graft reference's."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    script = os.path.join(ROOT, "examples", "python", "train_ddp.py")
    steps = 12
    flags = ["--steps", steps, "--seed", 3, "--step-delay-ms", 50]
    ref = tmp_path / "ref.hash"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    subprocess.run([sys.executable, script, "--no-graft", "--state-hash-out", str(ref)]
                   + [str(f) for f in flags], check=True, env=env, timeout=120)

    def start(name, group=0, spare=False):
        return spawn(group, 2, None, *flags, "--state-hash-out", tmp_path / (name + ".hash"),
                     "--hash-log", tmp_path / (name + ".log"), "--role-log",
                     tmp_path / (name + ".role"), script=script, spare=spare)

    ws = [start("g%d" % g, g) for g in range(2)]
    spares = [start("s%d-{group}" % i, spare=True) for i in range(2)]
    deadline = time.time() + 120
    log1 = tmp_path / "g1.log"
    while not (log1.exists() and len(log1.read_text().split("\n")) > 6):
        assert time.time() < deadline and ws[1].proc.poll() is None, "".join(ws[1].lines)
        time.sleep(0.02)
    ws[1].kill()
    for w in [ws[0]] + spares:
        w.finish()
    said = ["".join(s.lines) for s in spares]
    promoted = [i for i, text in enumerate(said) if "spare promoted to group 1\n" in text]
    unused = [i for i, text in enumerate(said)
              if "spare unused: the job finished without it\n" in text]
    assert len(promoted) == 1 and len(unused) == 1 and promoted != unused, said
    want = ref.read_text()
    assert (tmp_path / "g0.hash").read_text() == want
    s = "s%d-1" % promoted[0]
    assert (tmp_path / (s + ".hash")).read_text() == want
    logged = [line.split()[0] for line in (tmp_path / (s + ".log")).read_text().splitlines()]
    assert logged and logged[-1] == str(steps)
    assert " heal " in (tmp_path / (s + ".role")).read_text()
    assert not list(tmp_path.glob("s%d-*" % unused[0]))
