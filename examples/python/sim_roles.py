"""The --role-log lines of the simulator's trainer contract (docs/SIM.md),
written from graft's events and the transfer endpoint's debug messages,
as examples/train_mlp.c writes them."""
import os
import re
import sys

import graft

_SERVING = re.compile(r"serving group (\d+) rank (\d+) at step (\d+)")
_PULLED = re.compile(r"group (\d+) rank (\d+) done with step (\d+) \(([a-z]+)\)")


def sim_contract(rt, c, blob):
    """The contract's part that is not training: the --blob-mib ballast as
    a region, the role log, and the runtime whose group names a spare's
    files ("{group}")."""
    c.rt = rt
    if blob is not None:
        rt.register("blob", blob, "blob")
    log_roles(rt, c)


def log_roles(rt, c):
    """Route heals, serves and the library's log into the role log; the
    library's messages at or above GRAFT_LOG (default warn) still go to
    standard error."""
    if not c.a.role_log:
        return
    want = os.environ.get("GRAFT_LOG", "warn")
    threshold = graft.LOG_LEVELS.index(want) if want in graft.LOG_LEVELS else 2

    def on_log(level, module, message):
        if module == "transfer" and level == "debug":
            m = _SERVING.match(message)
            if m:
                c.role("%s serving %s %s" % (m.group(3), m.group(1), m.group(2)))
            m = _PULLED.match(message)
            if m:
                c.role("%s pulled %s %s %s" % (m.group(3), m.group(1), m.group(2), m.group(4)))
        if level != "off" and graft.LOG_LEVELS.index(level) <= threshold:
            sys.stderr.write("graft %-5s %s[%d]: %s\n" % (level, module, os.getpid(), message))

    graft.set_log_callback(on_log)
    graft.set_log_level("debug")

    def on_event(e):
        if e.kind == "recovery":
            c.role("%d heal %s %.1f %s" % (e.step, e.status_name, e.transfer_ns / 1e6, e.detail))

    rt.on_event(on_event)
