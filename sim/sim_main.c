/*
 * graft-sim: the failure-injection simulator (`run`, live processes) and
 * the cluster-scale model (`model`). Each mode parses its own flags.
 */
#include "sim_cli.h"

#include <stdio.h>
#include <string.h>

static void sim_main_usage(FILE *out)
{
    fprintf(out, "usage: graft-sim <mode> [options]\n"
                 "  model   discrete-event model of a large cluster: goodput of checkpoint-\n"
                 "          restart vs single- and multi-donor P2P recovery (docs/SIM.md)\n"
                 "  run     live failure injection against real processes\n"
                 "`graft-sim <mode> --help` lists a mode's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        sim_main_usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "model") == 0) {
        return graft_sim_model_main(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "run") == 0) {
        return graft_sim_run_main(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        sim_main_usage(stdout);
        return 0;
    }
    fprintf(stderr, "graft-sim: error: unknown mode '%s' (expected 'model' or 'run')\n", argv[1]);
    sim_main_usage(stderr);
    return 2;
}
