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

/**
 * @brief Index of a parameter by JSON key or flag name.
 * @param [in] key  "quorum_seconds" or "quorum-seconds".
 * @return 0 .. graft_sim_params_count() - 1, or -1 when there is none.
 */
int graft_sim_params_index(const char *key);

/* ------------------------------------------------------------------------ */
/* Figures measured by graft's benchmarks (graft-sim model --bench-json)     */
/* ------------------------------------------------------------------------ */

/** The figures the model takes from graft's own benchmarks. */
typedef enum graft_sim_figure_id {
    GRAFT_SIM_FIG_COORDINATION = 0, /**< coordination per step at G groups (coordination_seconds) */
    GRAFT_SIM_FIG_FORMATION,        /**< quorum formation per failure at G x R (quorum_seconds) */
    GRAFT_SIM_FIG_CHECKPOINT,       /**< blocking part of a checkpoint (checkpoint_*) */
    GRAFT_SIM_FIG_HEAL,             /**< heal (pull) throughput of one donor link (link_gb_s) */
    GRAFT_SIM_FIG_PROMOTION,        /**< a spare taking a dead rank's slot (spare_seconds) */
    GRAFT_SIM_NFIGS
} graft_sim_figure_id_t;

/** Where a figure came from. */
typedef enum graft_sim_origin {
    GRAFT_SIM_ASSUMED = 0, /**< the model's stated assumption */
    GRAFT_SIM_MEASURED,    /**< a --bench-json file */
    GRAFT_SIM_GIVEN        /**< a flag or a --params file, which win over measurements */
} graft_sim_origin_t;

/** One figure of the report with its provenance. */
typedef struct graft_sim_figure {
    const char *name;          /**< "coordination_seconds_per_step", ... */
    const char *unit;          /**< "s", "GB/s" */
    double value;              /**< in unit */
    graft_sim_origin_t origin; /**< measured, given or assumed */
    char source[512];          /**< the file(s) or flag it came from; "" when assumed */
    char basis[256];           /**< how it was derived (interpolated, extrapolated, assumed ...) */
} graft_sim_figure_t;

/** Most measured points per curve. */
#define GRAFT_SIM_MAX_POINTS 64

/** A measured point: a cost in ms at a size x, and the file it came from. */
typedef struct graft_sim_point {
    double groups, ranks; /**< size; ranks is 1 for the coordination curve */
    double ms;            /**< the median */
    const char *file;     /**< borrowed: the path given to graft_sim_bench_load() */
} graft_sim_point_t;

/** Everything read from --bench-json files; zero-initialise before use. */
typedef struct graft_sim_bench {
    int ncoord;                                    /**< steady path "peers" points */
    graft_sim_point_t coord[GRAFT_SIM_MAX_POINTS]; /**< by groups */
    int nform;                                     /**< membership formation points */
    graft_sim_point_t form[GRAFT_SIM_MAX_POINTS];  /**< by groups x ranks */
    double checkpoint_gb_s;                        /**< > 0 when measured (persist) */
    const char *checkpoint_file;
    double heal_gb_s; /**< > 0 when measured (runtime recovery) */
    const char *heal_file;
    double promote_s; /**< >= 0 when measured (graft-sim run --spares); < 0: not */
    size_t promote_n; /**< promotions it is the median of; 0: not measured */
    const char *promote_file;
} graft_sim_bench_t;

/**
 * @brief Read one benchmark's --json output ("bench": "runtime",
 *        "membership" or "persist", or a `graft-sim run --spares` report,
 *        "graft-sim-run"; see docs/SIM.md) and add its figures.
 *        A steady size whose median is negative (the benchmark's mark of a
 *        failed size) is ignored; a later point at the same size replaces an
 *        earlier one.
 * @param [in,out] bench  figures so far (unchanged on failure).
 * @param [in]     path   the file; must outlive @p bench (it is the source).
 * @param [out]    err    receives a message that starts with the file name.
 * @param [in]     errlen size of @p err.
 * @return GRAFT_OK, GRAFT_EIO, GRAFT_EFORMAT (not a benchmark's object, a
 *         missing or malformed member, or no usable figure), GRAFT_EINVAL,
 *         GRAFT_ERANGE, GRAFT_ENOTSUP (another benchmark), GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_sim_bench_load(graft_sim_bench_t *bench, const char *path,
                                              char *err, size_t errlen);

/**
 * @brief Put the measured figures into @p params for its groups and ranks,
 *        and say for every figure where it came from.
 *
 * Coordination: linear in log2(G) between the measured groups; beyond the
 * largest, its cost per dissemination-barrier round times ceil(log2 G)
 * rounds; below the smallest, the smallest. Formation: linear in log2(G R)
 * between points; beyond the largest, linear in G R; below, the smallest.
 * A figure whose parameter was given (@p given) keeps the given value.
 * Unmeasured coordination is assumed at 0.5 ms per barrier round.
 *
 * @param [in]     bench   figures read (may be empty).
 * @param [in,out] params  parameters; groups and gpus_per_group final.
 * @param [in]     given   graft_sim_params_count() entries: for parameter i,
 *                         the flag or file that set it, or NULL; may be NULL.
 * @param [out]    figs    GRAFT_SIM_NFIGS figures.
 */
void graft_sim_bench_apply(const graft_sim_bench_t *bench, graft_sim_params_t *params,
                           const char *const *given, graft_sim_figure_t *figs);

/**
 * @brief "measured", "given" or "assumed".
 * @param [in] origin  the origin.
 * @return a static string.
 */
const char *graft_sim_origin_name(graft_sim_origin_t origin);

#endif /* GRAFT_SIM_PARAMS_H */
