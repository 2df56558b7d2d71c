"""Groups of many ranks under torchrun (issue 23): 3 groups x 2 ranks, each
group one torchrun world running examples/python/train_torchrun.py on
CPU/gloo (DDP and ZeroRedundancyOptimizer inside the group, rank r of every
group averaging with rank r of the others). A rank killed (torchrun restarts
the group) and a whole group killed (a new torchrun replaces it) both end
with every rank of every group bit-identical to the same rank of a
fault-free run: parameters, its shard of Adam's state, RNG states."""
import json
import os
import pickle
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import graft  # noqa: F401  (GRAFT_LIBRARY and sys.path come from conftest)
from conftest import BUILD, ROOT, free_port, group_env, job_settings

TRAINER = os.path.join(ROOT, "examples", "python", "train_torchrun.py")
GROUPS, RANKS, STEPS = 3, 2, 12

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.run")


def quiet_port():
    """A free port below the ephemeral range (32768 and up on Linux), so
    the many connections other tests open on this machine cannot take it
    between now and torchrun's bind."""
    for _ in range(100):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


class Torchrun:
    """One group: a torchrun agent and its ranks, in a session of their own
    (so the whole group can be killed), read line by line by a thread."""

    def __init__(self, env, group, out, max_restarts=0, delay=0.1, steps=STEPS, groups=GROUPS,
                 extra=(), trainer=TRAINER, spare=False):
        e = group_env(env, group, groups)
        if spare:   # a spare world: no group until it takes one at its first quorum
            del e["GRAFT_GROUP"]
            e["GRAFT_SPARE"] = "1"
        # Debian's torch 1.13 on Python 3.11 cannot parse torchrun's default
        # "--redirects 0" (AttributeError: 'NoneType' object has no attribute
        # 'get'); redirecting and teeing standard error works. The static
        # rendezvous, a port per group: the agent holds its store there and
        # the ranks use it, at every restart. (--standalone's fixed port
        # would make the groups' agents share one store; the c10d
        # rendezvous picks a new free port for the ranks' store at each
        # restart and binds it later, and another process took it in
        # between on this busy machine.)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
               "--nproc_per_node", str(RANKS), "--rdzv_backend", "static",
               "--master_addr", "127.0.0.1", "--master_port", str(quiet_port()),
               "--max_restarts", str(max_restarts), "--monitor_interval", "0.5",
               "-r", "2", "-t", "2", trainer, "--steps", str(steps),
               "--delay", str(delay), "--out", str(out)] + list(extra)
        self.group = group
        self.proc = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines = []
        self.times = []   # when each line was read (time.time())
        self._cv = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._cv:
                self.lines.append(line)
                self.times.append(time.time())
                self._cv.notify_all()
        with self._cv:
            self.lines.append(None)  # end of output
            self._cv.notify_all()

    def wait_for(self, predicate, what, timeout=120, since=0):
        """The first line from line number since on for which predicate is
        true: (line, when it was read, the number of the line after it)."""
        deadline = time.time() + timeout
        with self._cv:
            i = since
            while True:
                while i < len(self.lines):
                    line = self.lines[i]
                    i += 1
                    if line is None:
                        raise AssertionError("group %d ended before %s:\n%s"
                                             % (self.group, what, self.text()))
                    if predicate(line):
                        return line, self.times[i - 1], i
                left = deadline - time.time()
                if left <= 0:
                    raise AssertionError("group %d: no %s in %d s:\n%s"
                                         % (self.group, what, timeout, self.text()))
                self._cv.wait(left)

    def text(self):
        return "".join(x for x in list(self.lines) if x is not None)

    def pid_of(self, rank):
        """The newest pid rank printed."""
        tag = "group %d rank %d: pid " % (self.group, rank)
        pids = [int(x.split(tag)[1].split(",")[0]) for x in list(self.lines)
                if x is not None and tag in x]
        assert pids, self.text()
        return pids[-1]

    def wait_step(self, step):
        tag = "group %d rank 0: step " % self.group
        return self.wait_for(lambda x: tag in x and int(x.split(tag)[1].split()[0]) >= step,
                             "step %d" % step)

    def kill(self):
        """The agent and every rank. torch 2's torchrun starts each rank in
        a session of its own (torch 1.13's stay in the agent's), so killing
        the agent's session alone leaves the ranks training on: seen on a
        GPU machine with torch 2.11, where the "killed" group finished its
        steps and its replacement found no donor."""
        ranks = []
        for rank in range(RANKS):
            try:
                ranks.append(self.pid_of(rank))
            except AssertionError:   # not started yet: in the agent's session
                pass
        os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def finish(self, timeout=240):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("group %d hung:\n%s" % (self.group, self.text()))
        self._reader.join(10)
        assert self.proc.returncode == 0, "group %d failed:\n%s" % (self.group, self.text())


@pytest.fixture
def torchrun(job_env):
    groups = []

    def start(group, out, env=None, **kw):
        e = dict(job_env)
        e.update(env or {})
        t = Torchrun(e, group, out, **kw)
        groups.append(t)
        return t

    yield start
    for t in groups:
        if t.proc.poll() is None:
            t.kill()


def _states(prefix, groups=GROUPS):
    out = {}
    for g in range(groups):
        for r in range(RANKS):
            with open("%s.g%d.r%d" % (prefix, g, r), "rb") as f:
                out[g, r] = pickle.load(f)
    return out


def _assert_same(a, b, what, steps=STEPS):
    assert a["step"] == b["step"] == steps, what
    assert len(a["params"]) == len(b["params"]), what
    for x, y in zip(a["params"], b["params"]):
        assert x.tobytes() == y.tobytes(), what + ": parameters"
    assert [n for n, _ in a["optim"]] == [n for n, _ in b["optim"]], what
    for (n, x), (_, y) in zip(a["optim"], b["optim"]):
        assert x.tobytes() == y.tobytes(), what + ": " + n
    assert a["rng"][0].tobytes() == b["rng"][0].tobytes(), what + ": torch RNG"
    assert a["rng"][1].tobytes() == b["rng"][1].tobytes(), what + ": numpy RNG"
    assert a["rng"][2] == b["rng"][2], what + ": random's RNG"


@pytest.fixture(scope="module")
def reference(etcd, tmp_path_factory):
    """A fault-free run of the same job (its own job name): the state every
    rank of every group must end with."""
    out = tmp_path_factory.mktemp("ref") / "ref"
    env = job_settings(etcd, "tr-ref-")
    groups = [Torchrun(env, g, out, delay=0) for g in range(GROUPS)]
    try:
        for t in groups:
            t.finish()
    finally:
        for t in groups:
            if t.proc.poll() is None:
                t.kill()
    states = _states(out)
    # Each rank holds its own shard of Adam's state (ZeroRedundancyOptimizer).
    assert [n for n, _ in states[0, 0]["optim"]] != [n for n, _ in states[0, 1]["optim"]]
    return states


def _check(states, reference):
    for (g, r), st in states.items():
        _assert_same(st, reference[g, r], "group %d rank %d" % (g, r))


def test_rank_killed_torchrun_restarts_the_group(torchrun, reference, tmp_path):
    out = tmp_path / "run"
    groups = [torchrun(g, out, max_restarts=2) for g in range(GROUPS)]
    groups[1].wait_step(4)
    victim = groups[1].pid_of(1)
    os.kill(victim, signal.SIGKILL)
    # torchrun stops the group's other rank and starts both again; they heal.
    groups[1].wait_for(lambda x: "group 1 rank 1: start peer" in x, "rank 1's heal")
    for t in groups:
        t.finish()
    states = _states(out)
    assert states[1, 0]["start"] == "peer" and states[1, 1]["start"] == "peer"
    assert states[1, 1]["metrics"]["recoveries"] >= 1
    assert victim != groups[1].pid_of(1)
    _check(states, reference)


def test_group_killed_and_replaced(torchrun, reference, tmp_path):
    out = tmp_path / "run"
    groups = [torchrun(g, out) for g in range(GROUPS)]
    groups[2].wait_step(4)
    groups[2].kill()
    repl = torchrun(2, out)
    for t in [groups[0], groups[1], repl]:
        t.finish()
    states = _states(out)
    assert states[2, 0]["start"] == "peer" and states[2, 1]["start"] == "peer"
    assert sum(states[g, r]["metrics"]["serves"] for g in (0, 1) for r in range(RANKS)) >= 2
    _check(states, reference)


def test_graft_ddp_group_killed_and_replaced(torchrun, tmp_path):
    """graft.torch.DistributedDataParallel in a group of 2 ranks (its hook
    averages each bucket over the group's ranks, then over rank r of the
    other group): group 1 killed whole and replaced, every rank ends
    bit-identical to a fault-free run of the same trainer."""
    extra = ["--graft-ddp"]
    ref_out, out = tmp_path / "ref", tmp_path / "run"
    ref_env = {"GRAFT_JOB": "tr-ddp-ref-" + os.urandom(4).hex()}
    refs = [torchrun(g, ref_out, env=ref_env, groups=2, delay=0, extra=extra) for g in range(2)]
    for t in refs:
        t.finish()
    groups = [torchrun(g, out, groups=2, extra=extra) for g in range(2)]
    groups[1].wait_step(4)
    groups[1].kill()
    repl = torchrun(1, out, groups=2, extra=extra)
    for t in [groups[0], repl]:
        t.finish()
    states, ref = _states(out, groups=2), _states(ref_out, groups=2)
    assert states[1, 0]["start"] == "peer" and states[1, 1]["start"] == "peer"
    for (g, r), st in states.items():
        _assert_same(st, ref[g, r], "group %d rank %d" % (g, r))


def test_elastic_group_trains_on(torchrun, tmp_path):
    """Elastic (min_groups 1), 2 groups x 2 ranks: group 1 is killed whole;
    group 0 commits steps alone; the replacement group heals to where group
    0 is, and both end with every rank identical to the other group's."""
    # Group 0 must still be training when the replacement is up (one that
    # comes after every other group finished finds no donor): 0.3 s a
    # step leaves it about 15 s after the kill.
    steps = 60
    env = {"GRAFT_MODE": "elastic", "GRAFT_MIN_GROUPS": "1"}
    out = tmp_path / "run"
    groups = [torchrun(g, out, env=env, groups=2, steps=steps, delay=0.3) for g in range(2)]
    groups[1].wait_step(6)
    groups[1].kill()
    groups[0].wait_for(lambda x: "group 0 rank 0: step " in x and x.rstrip().endswith("groups 1"),
                       "a step committed alone")
    repl = torchrun(1, out, env=env, groups=2, steps=steps, delay=0.3)
    repl.wait_for(lambda x: "group 1 rank 1: start peer" in x, "rank 1's heal")
    for t in (groups[0], repl):
        t.finish()
    states = _states(out, groups=2)
    for r in range(RANKS):
        assert states[1, r]["start"] == "peer"
        _assert_same(states[1, r], states[0, r], "rank %d" % r, steps=steps)


def test_spare_world_takes_a_dead_group(torchrun, job_env, tmp_path):
    """A torchrun world of 2 spare ranks (GRAFT_SPARE=1, its spare_group
    derived from the world's rendezvous) waits beside 2 groups x 2 ranks.
    Group 1's world is killed whole: the spare world takes group 1 whole
    (both ranks, one transaction), heals from group 0 and finishes, every
    rank identical to group 0's same rank (parameters, its shard of Adam's
    state, RNG states)."""
    steps = 40
    out = tmp_path / "run"
    groups = [torchrun(g, out, groups=2, steps=steps, delay=0.3) for g in range(2)]
    spare = torchrun(0, out, groups=2, steps=steps, delay=0.3, spare=True)
    for r in range(RANKS):
        spare.wait_for(lambda x, r=r: "spare rank %d: pid" % r in x, "spare rank %d" % r)
    groups[1].wait_step(6)
    groups[1].kill()
    for r in range(RANKS):
        spare.wait_for(lambda x, r=r: "group 1 rank %d: spare promoted to group 1" % r in x,
                       "rank %d's promotion" % r)
    for t in (groups[0], spare):
        t.finish()
    # Whole: both promotions name the world's group of spares.
    ctl = subprocess.run([os.path.join(BUILD, "bin", "graftctl"), "--json", "events", "--kind",
                          "spare_promoted"], env=dict(os.environ, **job_env),
                         capture_output=True, text=True, timeout=60)
    assert ctl.returncode == 0, ctl.stderr
    events = json.loads(ctl.stdout)
    events = events["events"] if isinstance(events, dict) else events
    assert sorted((e["group"], e["rank"]) for e in events) == [(1, 0), (1, 1)], events
    worlds = {e["detail"].split("group of spares ")[-1] for e in events}
    assert len(worlds) == 1 and worlds.pop().startswith("world-"), events
    states = _states(out, groups=2)
    for r in range(RANKS):
        assert states[1, r]["start"] == "peer"
        assert states[1, r]["metrics"]["recoveries"] >= 1
        _assert_same(states[1, r], states[0, r], "rank %d" % r, steps=steps)


def test_launcher_settings():
    """RANK / WORLD_SIZE give the rank and the group's size; GRAFT_GROUP or
    torchft's REPLICA_GROUP_ID the group; a GRAFT_* variable that disagrees
    with the launcher's is an error naming both."""
    ls = graft.launcher_settings
    assert ls({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "GRAFT_GROUP": "3",
               "GRAFT_GROUPS": "4"}) == {"group": 3, "groups": 4, "rank": 1,
                                          "ranks_per_group": 2}
    assert ls({"RANK": "0", "WORLD_SIZE": "2", "REPLICA_GROUP_ID": "1",
               "NUM_REPLICA_GROUPS": "3"}) == {"group": 1, "groups": 3, "rank": 0,
                                                "ranks_per_group": 2}
    assert ls({}) == {}
    with pytest.raises(graft.UsageError) as e:
        ls({"RANK": "1", "GRAFT_RANK": "0", "WORLD_SIZE": "2"})
    assert "GRAFT_RANK=0" in str(e.value) and "RANK=1" in str(e.value)
    with pytest.raises(graft.UsageError) as e:
        ls({"RANK": "2", "WORLD_SIZE": "2"})
    assert "outside a group of 2" in str(e.value)
    with pytest.raises(graft.UsageError) as e:
        ls({"REPLICA_GROUP_ID": "x"})
    assert "REPLICA_GROUP_ID='x'" in str(e.value)
    # A spare world's ranks share one group of spares, named from their
    # rendezvous; another world's differs; one rank, or a name given, none.
    world = {"GRAFT_SPARE": "1", "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
             "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "run-a"}
    a1 = ls(world)["spare_group"]
    assert a1 == ls(dict(world, RANK="0"))["spare_group"] and a1.startswith("world-")
    assert a1 != ls(dict(world, MASTER_PORT="29501"))["spare_group"]
    assert "spare_group" not in ls(dict(world, WORLD_SIZE="1", RANK="0"))
    assert "spare_group" not in ls(dict(world, GRAFT_SPARE_GROUP="mine"))
    assert "spare_group" not in ls(dict(world, GRAFT_SPARE="0"))
