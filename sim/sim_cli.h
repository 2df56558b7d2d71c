/*
 * Sub-commands of graft-sim. Each takes the arguments after its name and
 * returns the process exit status (0 success, 1 failure, 2 bad usage).
 */
#ifndef GRAFT_SIM_CLI_H
#define GRAFT_SIM_CLI_H

/**
 * @brief `graft-sim model`: the cluster-scale model.
 * @param [in] argc  argument count, argv[0] is "model".
 * @param [in] argv  arguments.
 * @return exit status.
 */
int graft_sim_model_main(int argc, char **argv);

/**
 * @brief `graft-sim run`: live failure injection (validates its flags, then
 *        hands over to graft_sim_live_run()).
 * @param [in] argc  argument count, argv[0] is "run".
 * @param [in] argv  arguments.
 * @return exit status.
 */
int graft_sim_run_main(int argc, char **argv);

#endif /* GRAFT_SIM_CLI_H */
