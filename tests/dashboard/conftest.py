"""Fixtures of the dashboard tests: a real etcd (Debian's), a live
`graft-sim run` of the real trainer against it, and `graftctl dashboard`
following the run's job. One of each for the whole module."""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(REPO, os.environ.get("BUILD", "build"))
BIN = os.path.join(BUILD, "bin")
TOKEN = "operator-token-for-tests"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, fn, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


@pytest.fixture(scope="module")
def tmp():
    d = tempfile.mkdtemp(prefix="graft-dashboard-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def etcd(tmp):
    client, peer = free_port(), free_port()
    url = f"http://127.0.0.1:{client}"
    proc = subprocess.Popen(
        ["etcd", "--data-dir", os.path.join(tmp, "etcd"), "--listen-client-urls", url,
         "--advertise-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"default=http://127.0.0.1:{peer}", "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "etcd.log"), "w"))

    def up():
        try:
            return http_get(url + "/version")[0] == 200
        except OSError:
            return False
    wait_for("etcd", up, 30)
    yield url
    proc.terminate()
    proc.wait(10)


# A hang of one rank of group 1 (SIGSTOP for 4 s, longer than the 1 s lease)
# leaves the group short of a rank for seconds; then it heals. A kill of
# the same group later makes a second recovery, and a second chance for a
# browser that started late on a loaded machine.
SCHEDULE = {"events": [
    {"kind": "hang", "group": 1, "rank": 0, "at_step": 250, "duration_ms": 4000},
    {"kind": "kill_group", "group": 1, "at_step": 450},
]}
STEPS = 600


@pytest.fixture(scope="module")
def sim(tmp, etcd):
    root = os.path.join(tmp, "ckpt")
    os.makedirs(root)
    sched = os.path.join(tmp, "schedule.json")
    with open(sched, "w") as f:
        json.dump(SCHEDULE, f)
    report = os.path.join(tmp, "run.json")
    log = open(os.path.join(tmp, "sim.log"), "w")
    proc = subprocess.Popen(
        [os.path.join(BIN, "graft-sim"), "run", "--groups", "3", "--ranks", "2", "--steps",
         str(STEPS), "--seed", "3", "--schedule", sched, "--etcd", etcd, "--persist-root", root,
         "--persist-every", "50", "--json", report], stdout=log, stderr=subprocess.STDOUT)
    job = wait_for("the run's job", lambda: next(
        (d for d in os.listdir(root) if d.startswith("sim-")), None), 60)
    run = {"proc": proc, "job": job, "root": os.path.join(root, job), "report": report,
           "log": os.path.join(tmp, "sim.log")}
    yield run
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


@pytest.fixture(scope="module")
def dashboard(tmp, etcd, sim):
    port = free_port()
    out = open(os.path.join(tmp, "dashboard.log"), "w")

    def start():
        return subprocess.Popen(
            [os.path.join(BIN, "graftctl"), "--etcd", etcd, "--job", sim["job"], "dashboard",
             "--listen", f"127.0.0.1:{port}", "--token", TOKEN, "--interval-ms", "200",
             # The run's root: the job's checkpoint events name its folder
             # under it, which the dashboard lists (only there).
             "--ckpt-root", os.path.dirname(sim["root"])],
            stdout=out, stderr=subprocess.STDOUT)
    # The job exists in etcd once its first rank joined.
    proc = start()
    deadline = time.time() + 30
    url = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            assert time.time() < deadline, "graftctl dashboard did not start"
            time.sleep(0.2)
            proc = start()
            continue
        try:
            http_get(url + "/api/state")
            break
        except OSError:
            assert time.time() < deadline, "graftctl dashboard did not answer"
            time.sleep(0.1)
    yield url
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
