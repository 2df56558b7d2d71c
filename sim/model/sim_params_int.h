/*
 * What the parameters by name (sim_params.c) and the reading of graft's
 * benchmarks' --json outputs (sim_bench_json.c) share.
 */
#ifndef GRAFT_SIM_PARAMS_INT_H
#define GRAFT_SIM_PARAMS_INT_H

#include "sim_params.h"

#include <jansson.h>

/**
 * Parse @p path as JSON, or failing that its last non-empty line (a
 * benchmark's whole output). Returns the root, or NULL with *st_p and
 * @p err set.
 */
json_t *graft_sim_params_parse_file(const char *path, char *err, size_t errlen,
                                    graft_status_t *st_p);

/**
 * Store one measured value under a parameter's name (JSON key or flag),
 * with the check graft_sim_params_set() makes; GRAFT_ENOTFOUND when there
 * is no such parameter.
 */
GRAFT_WUR graft_status_t graft_sim_params_store(graft_sim_params_t *p, const char *key, double v,
                                                char *err, size_t errlen);

/**
 * A benchmark's --json object ("bench": @p name): its measured figures
 * mapped onto the parameters they measure (docs/SIM.md has the table).
 */
GRAFT_WUR graft_status_t graft_sim_params_from_bench(graft_sim_params_t *p, const json_t *b,
                                                     const char *name, char *err, size_t errlen);

#endif /* GRAFT_SIM_PARAMS_INT_H */
