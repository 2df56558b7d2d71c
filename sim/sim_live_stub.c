/*
 * Stand-in for the live engine of `graft-sim run`, which needs the runtime
 * (the step protocol) that this build does not have yet. The command line
 * (sim_run_cli.c) is complete, so scripts can already rely on its flags and
 * get a clear, distinct exit status. The live engine replaces this file.
 */
#include "sim_live.h"

#include <stdio.h>

int graft_sim_live_run(const graft_sim_live_opts_t *opts)
{
    (void)opts;
    fprintf(stderr, "graft-sim run: error: live mode is not built yet (it needs the graft "
                    "runtime); the flags were valid. Use `graft-sim model` for the "
                    "cluster-scale model.\n");
    return GRAFT_SIM_EXIT_UNAVAILABLE;
}
