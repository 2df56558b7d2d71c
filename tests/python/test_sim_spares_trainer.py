"""graft-sim run --spares drives the PyTorch example as spares
(examples/python/train_ddp.py under GRAFT_SPARE=1, its files named with
"{group}": docs/SIM.md, the trainer contract): 2 groups x 1 rank and one
spare group; a group killed, then a rank of the other. Each slot is
taken by a spare (the first one started with the run, the second the
replacement the supervisor started as a spare), and the run ends
bit-exact against the --no-graft reference.

Skipped while the built graft-sim has no --spares (the simulator's side
was written beside this test and may land after it)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT

SIM = os.path.join(BUILD, "bin", "graft-sim")


def test_train_ddp_spares_under_graft_sim(tmp_path):
    if not os.access(SIM, os.X_OK):
        pytest.fail("%s is missing: run make" % SIM)
    usage = subprocess.run([SIM, "run", "--help"], capture_output=True, text=True)
    if "--spares" not in usage.stdout + usage.stderr:
        pytest.skip("this graft-sim has no --spares")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"),
               GRAFT_LIBRARY=os.environ["GRAFT_LIBRARY"],
               GRAFT_SIM_CACHE_DIR=str(tmp_path / "cache"), TMPDIR=str(tmp_path))
    report = tmp_path / "report.json"
    schedule = tmp_path / "schedule.json"
    schedule.write_text(json.dumps({"events": [
        {"kind": "kill_group", "at_step": 6, "group": 1},
        {"kind": "kill_rank", "at_step": 14, "group": 0, "rank": 0}]}))
    cmd = [SIM, "run", "--spares", "1", "--trainer",
           "%s %s" % (sys.executable, os.path.join(ROOT, "examples", "python", "train_ddp.py")),
           "--groups", "2", "--ranks", "1", "--steps", "24", "--schedule", str(schedule),
           "--seed", "5", "--json", str(report)]
    r = subprocess.run(cmd, env=env, cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads(report.read_text())
    assert rep["verdict"] == "bit-exact", r.stdout[-3000:]
    assert rep["failures_injected_total"] == 2
    assert rep["spares"]["promoted"] == 2
    assert [x["replaced_by"] for x in rep["recoveries"]] == ["spare", "spare"]
