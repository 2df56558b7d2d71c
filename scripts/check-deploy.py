#!/usr/bin/env python3
"""Checks the deployment files of deploy/ offline (tests/test_graft_agent.c).

No Slurm and no Kubernetes cluster is needed, and none is used:

- deploy/slurm/graft.sbatch: `bash -n`, shellcheck when installed, then a
  run of the script with a stand-in `srun` (drops its options and runs the
  command once per node, SLURM_NODEID set) and GRAFT_AGENT_EXTRA=--dry-run:
  each node's graft-agent parses its options and prints its plan, which must
  name the node's group (or spares only on a spare node) and fill the
  node's GPUs. `srun --test-only` needs a Slurm controller and is not run.
- deploy/k8s/*.yaml: Kubernetes' own schemas through kubernetes-validate
  (PyPI, installed by scripts/python-env.sh; reported as skipped when it is
  missing), and each graft-agent container's command line through
  --dry-run in the environment its ConfigMap and env give it: it must parse
  and start as many processes as the container has GPUs; GRAFT_GROUPS must
  equal the groups Job's completions.

Exit status 0 when everything checked passed; a line "check-deploy:
skipped ..." names what could not be checked here.
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

import yaml

SBATCH = "deploy/slurm/graft.sbatch"
FAKE_SRUN = """#!/bin/bash
# Stands in for Slurm's srun: drops its options, runs the command per node.
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
for ((n = 0; n < SLURM_JOB_NUM_NODES; n++)); do
    SLURM_NODEID=$n SLURM_PROCID=$n "$@" || exit
done
"""
failures = []


def fail(why):
    print("check-deploy: FAILED: " + why)
    failures.append(why)


def run(cmd, env=None):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout


def check_sbatch(agent):
    rc, out = run(["bash", "-n", SBATCH])
    if rc != 0:
        fail("bash -n %s: %s" % (SBATCH, out))
    if shutil.which("shellcheck"):
        rc, out = run(["shellcheck", "-s", "bash", SBATCH])
        if rc != 0:
            fail("shellcheck %s:\n%s" % (SBATCH, out))
    else:
        print("check-deploy: no shellcheck here: %s not linted" % SBATCH)
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "srun"), "w") as f:
            f.write(FAKE_SRUN)
        os.chmod(os.path.join(d, "srun"), 0o755)
        env = dict(os.environ, PATH=d + ":" + os.environ["PATH"], SLURM_JOB_ID="42",
                   SLURM_JOB_NUM_NODES="3", SPARE_NODES="1", GRAFT_AGENT=agent,
                   GRAFT_ETCD_ENDPOINTS="http://etcd0:2379", GRAFT_AGENT_EXTRA="--dry-run",
                   LOG_DIR=os.path.join(d, "logs"))
        for k in ("GRAFT_JOB", "GRAFT_GROUP", "RANKS", "SPARES"):
            env.pop(k, None)
        rc, out = run(["bash", SBATCH, "python3", "train.py", "--steps", "10"], env)
        print("".join("check-deploy: sbatch| " + line + "\n" for line in out.splitlines()))
        slots = [line for line in out.splitlines() if line.startswith("slot ")]
        expect = [
            "slot 0: rank, rank 0: GRAFT_GROUP=0 GRAFT_RANK=0 env CUDA_VISIBLE_DEVICES=0 "
            "python3 train.py --steps 10",
            "slot 7: spare, rank 3: GRAFT_SPARE=1 GRAFT_RANK=3 env CUDA_VISIBLE_DEVICES=7",
            "slot 0: rank, rank 0: GRAFT_GROUP=1 GRAFT_RANK=0",
            "job slurm-42",
        ]
        if rc != 0:
            fail("%s with a stand-in srun exited %d" % (SBATCH, rc))
        for e in expect:
            if e not in out:
                fail("%s: no '%s' in its dry run" % (SBATCH, e))
        if len(slots) != 3 * 8:
            fail("%s: %d processes on 3 nodes of 8 GPUs, not 24" % (SBATCH, len(slots)))
        if sum("GRAFT_GROUP=" in s for s in slots) != 8:
            fail("%s: 2 groups x 4 ranks expected" % SBATCH)
        rc, out = run(["bash", SBATCH], env)
        if rc != 2:
            fail("%s without a trainer exited %d, not 2" % (SBATCH, rc))


def validate_schemas(files):
    tool = os.path.join(os.path.dirname(sys.executable), "kubernetes-validate")
    if not os.access(tool, os.X_OK):
        tool = shutil.which("kubernetes-validate")
    if tool is None:
        print("check-deploy: skipped the schema check of deploy/k8s: kubernetes-validate is not "
              "installed (BUILD=... sh scripts/python-env.sh installs it)")
        return
    rc, out = run([tool, "--strict", "--quiet"] + files)
    print("".join("check-deploy: k8s| " + line + "\n" for line in out.splitlines()))
    if rc != 0:
        fail("kubernetes-validate --strict: %s" % out)


def container_env(c, config):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAFT_")}
    for src in c.get("envFrom", []):
        env.update(config.get(src.get("configMapRef", {}).get("name"), {}))
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "job-completion-index" in str(e.get("valueFrom", {})):
            env[e["name"]] = "0"
    return env


def check_agent_container(agent, doc, c, config):
    where = "%s/%s container %s" % (doc["kind"], doc["metadata"]["name"], c["name"])
    args = list(c.get("args", []))
    if "--" not in args:
        fail(where + ": no '--' before the trainer")
        return
    args.insert(args.index("--"), "--dry-run")
    rc, out = run([agent] + args, container_env(c, config))
    if rc != 0:
        fail("%s: graft-agent refused its options: %s" % (where, out))
        return
    gpus = int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
    slots = sum(line.startswith("slot ") for line in out.splitlines())
    if gpus and slots != gpus:
        fail("%s: %d processes for %d GPUs" % (where, slots, gpus))
    print("check-deploy: %s: %d processes, options accepted" % (where, slots))


def check_k8s(agent):
    files = sorted(glob.glob("deploy/k8s/*.yaml"))
    if not files:
        fail("no deploy/k8s/*.yaml")
        return
    docs = [d for f in files for d in yaml.safe_load_all(open(f)) if d]
    config = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    validate_schemas(files)
    agents = 0
    for d in docs:
        spec = d.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []):
            if c.get("command", [""])[0].endswith("graft-agent"):
                agents += 1
                check_agent_container(agent, d, c, config)
        if d["kind"] == "Job" and d["metadata"]["name"] == "graft-groups":
            groups = config.get("graft-config", {}).get("GRAFT_GROUPS")
            if str(d["spec"]["completions"]) != groups:
                fail("graft-groups has %s completions, GRAFT_GROUPS is %s"
                     % (d["spec"]["completions"], groups))
    if agents < 2:
        fail("deploy/k8s: %d graft-agent containers, expected the groups' and the spares'" % agents)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agent", required=True, help="the graft-agent program")
    a = ap.parse_args()
    check_sbatch(os.path.abspath(a.agent))
    check_k8s(os.path.abspath(a.agent))
    print("check-deploy: %s" % ("ok" if not failures else "%d failure(s)" % len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
