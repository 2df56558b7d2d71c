"""A group of many ranks is a launcher's world (torchrun's, or any other that
sets the same variables).

Each process of a group learns its rank inside the group and the group's
size from ``RANK`` and ``WORLD_SIZE`` (torchrun sets them; ``LOCAL_RANK`` is
the process's index on its host), and its group from ``GRAFT_GROUP`` or
torchft's ``REPLICA_GROUP_ID``; the number of groups from ``GRAFT_GROUPS`` or
``NUM_REPLICA_GROUPS``. launcher_settings() turns them into the runtime's
settings ``group``, ``groups``, ``rank`` and ``ranks_per_group``:

    rt = graft.Runtime(**graft.launcher_settings())

A ``GRAFT_RANK`` or ``GRAFT_RANKS_PER_GROUP`` that is set must agree with
``RANK`` / ``WORLD_SIZE``; a disagreement raises UsageError naming both.
"""
import os

from graft.errors import UsageError

# (graft setting, graft variable, the launcher's variables in order of preference)
_VARIABLES = [
    ("group", "GRAFT_GROUP", ("REPLICA_GROUP_ID",)),
    ("groups", "GRAFT_GROUPS", ("NUM_REPLICA_GROUPS",)),
    ("rank", "GRAFT_RANK", ("RANK",)),
    ("ranks_per_group", "GRAFT_RANKS_PER_GROUP", ("WORLD_SIZE",)),
]


def _integer(name, text):
    try:
        value = int(text)
    except ValueError:
        raise UsageError(-1, "graft: %s=%r is not an integer" % (name, text)) from None
    if value < 0:
        raise UsageError(-1, "graft: %s=%r is negative" % (name, text))
    return value


def launcher_settings(environ=None):
    """The settings group, groups, rank and ranks_per_group from the
    environment (default os.environ): GRAFT_* first, then the launcher's
    variables. A setting that neither names is left out (the runtime's
    default applies: rank 0 of 1). Raises UsageError when a GRAFT_*
    variable and the launcher's disagree, or a value is not an integer."""
    env = os.environ if environ is None else environ
    out = {}
    for setting, graft_var, others in _VARIABLES:
        mine = env.get(graft_var)
        theirs = next(((v, env[v]) for v in others if env.get(v)), None)
        if mine:
            value = _integer(graft_var, mine)
            if theirs is not None and _integer(theirs[0], theirs[1]) != value:
                raise UsageError(-1, "graft: %s=%s but the launcher's %s=%s; unset one"
                                 % (graft_var, mine, theirs[0], theirs[1]))
            out[setting] = value
        elif theirs is not None:
            out[setting] = _integer(theirs[0], theirs[1])
    if out.get("ranks_per_group", 1) < 1:
        raise UsageError(-1, "graft: a group needs at least one rank (WORLD_SIZE)")
    if out.get("rank", 0) >= out.get("ranks_per_group", 1):
        raise UsageError(-1, "graft: rank %d is outside a group of %d ranks"
                         % (out.get("rank", 0), out.get("ranks_per_group", 1)))
    return out
