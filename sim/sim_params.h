/*
 * Parameters of the model by name: one table maps each JSON key to its
 * field, and the command-line flag is the key with '-' for '_'
 * (gpu_mtbf_hours <-> --gpu-mtbf-hours). Used by the model's command line
 * and by --params FILE.
 */
#ifndef GRAFT_SIM_PARAMS_H
#define GRAFT_SIM_PARAMS_H

#include "sim_model.h"

#include <stdio.h>

/**
 * @brief Set one parameter from text (a command-line value).
 * @param [in,out] params  parameters to update.
 * @param [in]     key     JSON key ("link_gb_s") or flag name ("link-gb-s").
 * @param [in]     value   decimal text; "inf" is accepted where infinity is valid.
 * @param [out]    err     receives a message naming the key on failure.
 * @param [in]     errlen  size of @p err.
 * @return GRAFT_OK, GRAFT_ENOTFOUND (no such parameter), GRAFT_EINVAL (not a
 *         number of the right kind), GRAFT_ERANGE.
 */
GRAFT_WUR graft_status_t graft_sim_params_set(graft_sim_params_t *params, const char *key,
                                              const char *value, char *err, size_t errlen);

/**
 * @brief Apply a JSON file of measured parameters. The file holds one object
 *        whose keys name parameters; when it has a "model_params" object,
 *        only that object is read; when it is the --json object of one of
 *        graft's benchmarks ("bench": "transfer", "runtime", "membership" or
 *        "persist"), its figures are mapped onto the parameters they measure
 *        (docs/SIM.md). A file whose whole text is not JSON is read by its
 *        last non-empty line, so a benchmark's full output can be passed as
 *        it is.
 * @param [in,out] params  parameters to update (unchanged on failure).
 * @param [in]     path    the file.
 * @param [out]    err     receives a message naming the file and key.
 * @param [in]     errlen  size of @p err.
 * @return GRAFT_OK, GRAFT_EIO (unreadable), GRAFT_EFORMAT (not a JSON
 *         object, or a benchmark's object without a figure the model
 *         needs), GRAFT_ENOTFOUND (unknown key), GRAFT_EINVAL (wrong type),
 *         GRAFT_ERANGE (out of range, or a measured figure that is not
 *         positive), GRAFT_ENOTSUP (a benchmark the model does not read),
 *         GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_sim_params_load(graft_sim_params_t *params, const char *path,
                                               char *err, size_t errlen);

/**
 * @brief Print every parameter with its flag, unit and default.
 * @param [in] out  stream.
 */
void graft_sim_params_usage(FILE *out);

/** Number of named parameters. */
int graft_sim_params_count(void);

/**
 * @brief The JSON key and current value of parameter @p i, for reports.
 * @param [in]  params   parameters.
 * @param [in]  i        0 .. graft_sim_params_count() - 1.
 * @param [out] value_p  the value as a double.
 * @return the key, or NULL when @p i is out of range.
 */
const char *graft_sim_params_get(const graft_sim_params_t *params, int i, double *value_p);

#endif /* GRAFT_SIM_PARAMS_H */
