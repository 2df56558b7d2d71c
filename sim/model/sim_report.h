/*
 * What `graft-sim model` computed, and its three renderings: a table for
 * people, a JSON document for scripts, and an SVG plot of goodput against
 * the persistent checkpoint interval.
 */
#ifndef GRAFT_SIM_REPORT_H
#define GRAFT_SIM_REPORT_H

#include "sim_model.h"

#include <stdio.h>

/** Everything one `graft-sim model` invocation computed. */
typedef struct graft_sim_report {
    graft_sim_params_t params;
    uint64_t seed;
    double sweep_lo_seconds; /**< first grid interval */
    double sweep_hi_seconds; /**< last grid interval */
    int npoints;             /**< grid points per strategy */
    graft_sim_result_t *grid[GRAFT_SIM_NSTRATEGIES]; /**< npoints results each */
    graft_sim_optimum_t optimum[GRAFT_SIM_NSTRATEGIES];
    double fixed_interval_seconds; /**< > 0 when --persist-every-seconds was given */
    graft_sim_result_t fixed[GRAFT_SIM_NSTRATEGIES];
    /** The P2P strategies at their best interval, each heal's replacement
     *  up after spawn_seconds (without) or spare_seconds (with graft's
     *  spares); checkpoint-restart's entries are unused (a restart from
     *  disk is the whole job's). */
    graft_sim_result_t without_spares[GRAFT_SIM_NSTRATEGIES];
    graft_sim_result_t with_spares[GRAFT_SIM_NSTRATEGIES];
} graft_sim_report_t;

/**
 * @brief Print the table.
 * @param [in] report  a complete report.
 * @param [in] out     stream.
 */
void graft_sim_report_print(const graft_sim_report_t *report, FILE *out);

/**
 * @brief Write the report as one JSON object.
 * @param [in]  report  a complete report.
 * @param [in]  path    output file (replaced).
 * @param [out] err     receives a message on failure.
 * @param [in]  errlen  size of @p err.
 * @return GRAFT_OK, GRAFT_EIO or GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_sim_report_write_json(const graft_sim_report_t *report,
                                                     const char *path, char *err, size_t errlen);

/**
 * @brief Draw goodput against checkpoint interval, one line per strategy,
 *        with each optimum and Young/Daly interval marked.
 * @param [in]  report  a complete report.
 * @param [in]  path    output file (replaced).
 * @param [out] err     receives a message on failure.
 * @param [in]  errlen  size of @p err.
 * @return GRAFT_OK or GRAFT_EIO.
 */
GRAFT_WUR graft_status_t graft_sim_plot_write_svg(const graft_sim_report_t *report,
                                                  const char *path, char *err, size_t errlen);

#endif /* GRAFT_SIM_REPORT_H */
