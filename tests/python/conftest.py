"""Fixtures of the Python package's tests: a real etcd (Debian's etcd on a
free loopback port, in a temporary data directory) and real worker
processes, each one group of a job, talking UCX over loopback."""
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
# The build the suite tests: $BUILD as scripts/run-tests.sh sets it (default
# build). Under SAN=1 its libgraft.so is instrumented and a plain python
# cannot dlopen it (the ASan runtime must come first), so the Python tests
# load the plain library that `make check SAN=1` builds in build/.
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
LIB_BUILD = os.path.join(ROOT, "build") if os.environ.get("SAN") == "1" else BUILD
os.environ.setdefault("GRAFT_LIBRARY", os.path.join(LIB_BUILD, "lib", "libgraft.so"))
WORKER = os.path.join(os.path.dirname(__file__), "torch_worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def etcd(tmp_path_factory):
    """The endpoint of a private etcd, stopped at the end of the session."""
    binary = shutil.which("etcd")
    if binary is None:
        pytest.fail("etcd not found: run scripts/deps.sh (etcd-server)")
    data = tmp_path_factory.mktemp("etcd")
    for _ in range(5):
        client, peer = free_port(), free_port()
        url = "http://127.0.0.1:%d" % client
        purl = "http://127.0.0.1:%d" % peer
        proc = subprocess.Popen(
            [binary, "--name=default", "--data-dir", str(data / "d"),
             "--listen-client-urls", url, "--advertise-client-urls", url,
             "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
             "--initial-cluster", "default=" + purl, "--logger=zap", "--log-level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while time.time() < deadline and proc.poll() is None:
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        else:
            proc.kill()
            proc.wait()
            shutil.rmtree(data / "d", ignore_errors=True)
            continue  # a port was taken meanwhile: try others
        yield url
        proc.terminate()
        proc.wait(timeout=10)
        return
    pytest.fail("etcd did not start")


def job_settings(etcd, prefix="py-"):
    """Settings shared by every group of a fresh job (short timeouts)."""
    return {
        "GRAFT_JOB": prefix + uuid.uuid4().hex[:10],
        "GRAFT_ETCD_ENDPOINTS": etcd,
        "GRAFT_LEASE_TTL_MS": "2000",
        "GRAFT_JOIN_TIMEOUT_MS": "1000",
        "GRAFT_FENCE_TIMEOUT_MS": "3000",
        "GRAFT_STALL_TIMEOUT_MS": "1000",
        "GRAFT_QUORUM_TIMEOUT_MS": "60000",
        "GRAFT_LOG": "warn",
    }


@pytest.fixture
def job_env(etcd):
    """Settings shared by every group of a fresh job (short timeouts)."""
    return job_settings(etcd)


def group_env(env, group, groups):
    """The environment of one group's processes: this one's, then env, the
    group's id and count, and the package on PYTHONPATH."""
    e = dict(os.environ)
    e.update(env)
    e["GRAFT_GROUP"] = str(group)
    e["GRAFT_GROUPS"] = str(groups)
    e["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(ROOT, "python")] + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    return e


class Worker:
    """One group as a process running torch_worker.py (or script, given
    --out unless out is None); with spare=True a spare (GRAFT_SPARE=1, no
    GRAFT_GROUP) of the job's groups."""

    def __init__(self, env, group, groups, out, args, script=WORKER, spare=False):
        e = group_env(env, group, groups)
        if spare:
            del e["GRAFT_GROUP"]
            e["GRAFT_SPARE"] = "1"
        self.out = out
        self.proc = subprocess.Popen(
            [sys.executable, script] + (["--out", str(out)] if out is not None else [])
            + [str(a) for a in args],
            env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []

    def wait_step(self, step, timeout=120):
        """Read progress lines until the worker reports step >= step."""
        self.wait_line(lambda line: line.startswith("step ") and int(line.split()[1]) >= step,
                       "step %d" % step, timeout)

    def wait_line(self, match, what, timeout=120):
        """Read lines until match(line) holds; the line."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if match(line):
                return line
        raise AssertionError("worker never printed %s:\n%s" % (what, "".join(self.lines)))

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def finish(self, timeout=180):
        try:
            rest, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rest, _ = self.proc.communicate()
            raise AssertionError("worker hung:\n" + "".join(self.lines) + rest)
        self.lines.append(rest)
        assert self.proc.returncode == 0, "worker failed:\n" + "".join(self.lines)


@pytest.fixture
def spawn(job_env):
    workers = []

    def start(group, groups, out, *args, env=None, script=WORKER, spare=False):
        e = dict(job_env)
        e.update(env or {})
        w = Worker(e, group, groups, out, list(args), script, spare)
        workers.append(w)
        return w

    yield start
    for w in workers:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()
