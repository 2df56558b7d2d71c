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

A spare world (``GRAFT_SPARE=1`` with more than one rank) must be promoted
whole (docs/RUNTIME.md, "Groups of spares"): unless ``GRAFT_SPARE_GROUP``
names it, its ranks get the setting ``spare_group`` from what they share,
the launcher's rendezvous (``MASTER_ADDR``, ``MASTER_PORT``,
``TORCHELASTIC_RUN_ID``).
"""
import hashlib
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
    world = _spare_world(env, out.get("ranks_per_group", 1))
    if world is not None:
        out["spare_group"] = world
    return out


def _spare_world(env, ranks):
    """The name a spare world's ranks share, or None (not a spare, one rank,
    a GRAFT_SPARE_GROUP given, or no rendezvous to name it by)."""
    if env.get("GRAFT_SPARE") != "1" or ranks < 2 or env.get("GRAFT_SPARE_GROUP"):
        return None
    where = (env.get("MASTER_ADDR"), env.get("MASTER_PORT"))
    if not all(where):
        return None
    key = "%s:%s/%s" % (where[0], where[1], env.get("TORCHELASTIC_RUN_ID", ""))
    return "world-" + hashlib.sha256(key.encode()).hexdigest()[:16]
