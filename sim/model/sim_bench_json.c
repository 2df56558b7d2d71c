/*
 * graft's benchmarks' --json outputs as the model reads them: mapped onto
 * the parameters they measure (a benchmark's object given to --params), and
 * as measured figures with their provenance (--bench-json): curves by size,
 * interpolated and extrapolated for the model's groups and ranks.
 */
#include "sim_params_int.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------ benchmark outputs --- */

/* One number of a benchmark's JSON object; >= 0, or > 0 when positive. */
static graft_status_t sim_bench_num(const json_t *obj, const char *where, const char *key,
                                    int positive, double *v_p, char *err, size_t errlen)
{
    const json_t *v = json_object_get(obj, key);
    if (v == NULL) {
        snprintf(err, errlen, "%s: no '%s'", where, key);
        return GRAFT_EFORMAT;
    }
    if (!json_is_number(v)) {
        snprintf(err, errlen, "%s.%s: expected a number", where, key);
        return GRAFT_EINVAL;
    }
    double d = json_number_value(v);
    if (!isfinite(d) || d < 0 || (positive && d == 0)) {
        snprintf(err, errlen, "%s.%s: %g is not a %s number", where, key, d,
                 positive ? "positive" : "non-negative");
        return GRAFT_ERANGE;
    }
    *v_p = d;
    return GRAFT_OK;
}

/* A non-empty array member of a benchmark's object. */
static const json_t *sim_bench_array(const json_t *obj, const char *bench, const char *key,
                                     char *err, size_t errlen)
{
    const json_t *a = json_object_get(obj, key);
    if (!json_is_array(a) || json_array_size(a) == 0) {
        snprintf(err, errlen, "%s: '%s' is not a non-empty array", bench, key);
        return NULL;
    }
    return a;
}

/* transfer_bench --json: one row per transport x read protocol x memory,
 * pull_gbps = [1, 2, 3 donors] of verified pulls. The link is one donor's
 * verified pull; the recipient's ingress cap is the best it reached with
 * several donors. Rows over tcp are preferred (a network transport; shared
 * memory exists only within a host); the best of them by one donor. */
static graft_status_t sim_bench_transfer(graft_sim_params_t *p, const json_t *b, char *err,
                                         size_t errlen)
{
    const json_t *rows = sim_bench_array(b, "transfer", "results", err, errlen);
    if (rows == NULL) {
        return GRAFT_EFORMAT;
    }
    const json_t *best = NULL;
    int best_tcp = 0;
    double best_link = 0;
    for (size_t i = 0; i < json_array_size(rows); i++) {
        const json_t *row = json_array_get(rows, i);
        const json_t *pg = json_object_get(row, "pull_gbps");
        char where[64];
        snprintf(where, sizeof(where), "transfer: results[%zu]", i);
        if (!json_is_object(row) || !json_is_array(pg) || json_array_size(pg) == 0) {
            snprintf(err, errlen, "%s: no 'pull_gbps' array", where);
            return GRAFT_EFORMAT;
        }
        for (size_t k = 0; k < json_array_size(pg); k++) {
            const json_t *x = json_array_get(pg, k);
            if (!json_is_number(x) || !isfinite(json_number_value(x)) ||
                json_number_value(x) < 0) {
                snprintf(err, errlen, "%s.pull_gbps[%zu]: expected a non-negative number", where,
                         k);
                return GRAFT_EINVAL;
            }
        }
        const char *tls = json_string_value(json_object_get(row, "tls"));
        int tcp = tls != NULL && strcmp(tls, "tcp") == 0;
        double link = json_number_value(json_array_get(pg, 0));
        if (link > 0 && (best == NULL || tcp > best_tcp || (tcp == best_tcp && link > best_link))) {
            best = row;
            best_tcp = tcp;
            best_link = link;
        }
    }
    if (best == NULL) {
        snprintf(err, errlen, "transfer: no row with a positive pull_gbps[0]");
        return GRAFT_ERANGE;
    }
    const json_t *pg = json_object_get(best, "pull_gbps");
    double nic = best_link;
    for (size_t k = 1; k < json_array_size(pg); k++) {
        double x = json_number_value(json_array_get(pg, k));
        nic = x > nic ? x : nic;
    }
    graft_status_t st = graft_sim_params_store(p, "link_gb_s", best_link, err, errlen);
    return st == GRAFT_OK ? graft_sim_params_store(p, "nic_gb_s", nic, err, errlen) : st;
}

/* runtime_bench --json: recovery rows (kill -> first committed step of the
 * replacement, started at once), the largest state measured. detect_s is
 * kill -> the replacement joined (process start, init, join: the model's
 * spawn), quorum_s the replacement's graft_quorum() call -> formed. */
/* The recovery row of runtime_bench --json with the largest state. */
static graft_status_t sim_recovery_largest(const json_t *b, const json_t **row_p, char *err,
                                           size_t errlen)
{
    const json_t *rows = sim_bench_array(b, "runtime", "recovery", err, errlen);
    if (rows == NULL) {
        return GRAFT_EFORMAT;
    }
    const json_t *best = NULL;
    double best_mib = -1;
    for (size_t i = 0; i < json_array_size(rows); i++) {
        double mib = 0;
        char where[64];
        snprintf(where, sizeof(where), "runtime: recovery[%zu]", i);
        graft_status_t st =
            sim_bench_num(json_array_get(rows, i), where, "mib", 1, &mib, err, errlen);
        if (st != GRAFT_OK) {
            return st;
        }
        if (mib > best_mib) {
            best = json_array_get(rows, i);
            best_mib = mib;
        }
    }
    *row_p = best;
    return GRAFT_OK;
}

static graft_status_t sim_bench_runtime(graft_sim_params_t *p, const json_t *b, char *err,
                                        size_t errlen)
{
    const json_t *best = NULL;
    double spawn = 0, quorum = 0;
    graft_status_t st = sim_recovery_largest(b, &best, err, errlen);
    if (st == GRAFT_OK) {
        st = sim_bench_num(best, "runtime: recovery", "detect_s", 0, &spawn, err, errlen);
    }
    if (st == GRAFT_OK) {
        st = sim_bench_num(best, "runtime: recovery", "quorum_s", 0, &quorum, err, errlen);
    }
    if (st == GRAFT_OK) {
        st = graft_sim_params_store(p, "spawn_seconds", spawn, err, errlen);
    }
    return st == GRAFT_OK ? graft_sim_params_store(p, "quorum_seconds", quorum, err, errlen) : st;
}

/* membership_bench --json: kill -> the group seen unhealthy (lease expiry
 * or the runtime's own detection), median. */
static graft_status_t sim_bench_membership(graft_sim_params_t *p, const json_t *b, char *err,
                                           size_t errlen)
{
    double ms = 0;
    graft_status_t st = sim_bench_num(b, "membership", "detect_median_ms", 0, &ms, err, errlen);
    return st == GRAFT_OK ? graft_sim_params_store(p, "detect_seconds", ms / 1e3, err, errlen) : st;
}

/* persist_bench --json: graft_persist_save() blocked block_ms for mib MiB
 * (the snapshot into pinned buffers; the write runs behind training), as a
 * throughput in GB/s. */
static graft_status_t sim_persist_block_gb_s(const json_t *b, double *gb_s_p, char *err,
                                             size_t errlen)
{
    double mib = 0, block_ms = 0;
    graft_status_t st = sim_bench_num(b, "persist", "mib", 1, &mib, err, errlen);
    if (st == GRAFT_OK) {
        st = sim_bench_num(b, "persist", "block_ms", 1, &block_ms, err, errlen);
    }
    if (st == GRAFT_OK) {
        *gb_s_p = mib * 1048576.0 / 1e9 / (block_ms / 1e3);
    }
    return st;
}

/* persist_bench --json: graft_persist_save() blocked block_ms for mib MiB:
 * the blocking part of a checkpoint as a throughput, which replaces the
 * assumed checkpoint_seconds; restore_MBps, a restore with a cold page
 * cache, is the loading part of a restart. */
static graft_status_t sim_bench_persist(graft_sim_params_t *p, const json_t *b, char *err,
                                        size_t errlen)
{
    double gb_s = 0, restore = 0;
    graft_status_t st = sim_persist_block_gb_s(b, &gb_s, err, errlen);
    if (st == GRAFT_OK) {
        st = sim_bench_num(b, "persist", "restore_MBps", 1, &restore, err, errlen);
    }
    if (st == GRAFT_OK) {
        st = graft_sim_params_store(p, "checkpoint_gb_s", gb_s, err, errlen);
    }
    if (st == GRAFT_OK) {
        st = graft_sim_params_store(p, "checkpoint_seconds", 0.0, err, errlen);
    }
    return st == GRAFT_OK ? graft_sim_params_store(p, "restore_gb_s", restore / 1e3, err, errlen)
                          : st;
}

/* graft-sim run --spares --json: spares.promote_seconds, the median of
 * the promotions it saw (the old record gone -> the spare's in the view). */
static graft_status_t sim_bench_promotion(graft_sim_bench_t *bn, const json_t *b,
                                          const char *path, char *err, size_t errlen)
{
    const json_t *ps = json_object_get(json_object_get(b, "spares"), "promote_seconds");
    double n = 0, med = 0;
    if (!json_is_object(ps)) {
        snprintf(err, errlen, "graft-sim-run: no 'spares.promote_seconds' (a run without "
                              "--spares?)");
        return GRAFT_EFORMAT;
    }
    graft_status_t st = sim_bench_num(ps, "graft-sim-run: spares.promote_seconds", "n", 0, &n,
                                      err, errlen);
    if (st == GRAFT_OK && n < 1) {
        snprintf(err, errlen, "graft-sim-run: spares.promote_seconds.n: no spare was promoted");
        return GRAFT_EFORMAT;
    }
    if (st == GRAFT_OK) {
        st = sim_bench_num(ps, "graft-sim-run: spares.promote_seconds", "median", 0, &med, err,
                           errlen);
    }
    if (st == GRAFT_OK) {
        bn->promote_s = med;
        bn->promote_n = (size_t)n;
        bn->promote_file = path;
    }
    return st;
}

/* A benchmark's --json object ("bench": name): its measured figures mapped
 * onto the parameters they measure (docs/SIM.md has the table). */
graft_status_t graft_sim_params_from_bench(graft_sim_params_t *p, const json_t *b, const char *name,
                                           char *err, size_t errlen)
{
    if (strcmp(name, "transfer") == 0) {
        return sim_bench_transfer(p, b, err, errlen);
    }
    if (strcmp(name, "runtime") == 0) {
        return sim_bench_runtime(p, b, err, errlen);
    }
    if (strcmp(name, "membership") == 0) {
        return sim_bench_membership(p, b, err, errlen);
    }
    if (strcmp(name, "persist") == 0) {
        return sim_bench_persist(p, b, err, errlen);
    }
    if (strcmp(name, "graft-sim-run") == 0) {
        graft_sim_bench_t bn;
        memset(&bn, 0, sizeof(bn));
        graft_status_t st = sim_bench_promotion(&bn, b, "", err, errlen);
        return st == GRAFT_OK ? graft_sim_params_store(p, "spare_seconds", bn.promote_s, err,
                                                       errlen)
                              : st;
    }
    snprintf(err, errlen, "bench '%s': not one the model reads (transfer, runtime, membership, "
                          "persist, graft-sim-run)", name);
    return GRAFT_ENOTSUP;
}

/* ------------------------------------- --bench-json: measured figures --- */

/* Adds or replaces (same size) one point of a curve. */
static graft_status_t sim_point_add(graft_sim_point_t *pts, int *n, graft_sim_point_t pt,
                                    const char *path, char *err, size_t errlen)
{
    for (int i = 0; i < *n; i++) {
        if (pts[i].groups * pts[i].ranks == pt.groups * pt.ranks) {
            pts[i] = pt;
            return GRAFT_OK;
        }
    }
    if (*n == GRAFT_SIM_MAX_POINTS) {
        snprintf(err, errlen, "%s: more than %d measured sizes", path, GRAFT_SIM_MAX_POINTS);
        return GRAFT_ERANGE;
    }
    pts[(*n)++] = pt;
    return GRAFT_OK;
}

/* runtime_bench --json: steady[] of the "peers" path gives the coordination
 * curve (a median < 0 marks a failed size); recovery[] the heal throughput. */
static graft_status_t sim_bench_fig_runtime(graft_sim_bench_t *bn, const json_t *b,
                                            const char *path, char *err, size_t errlen)
{
    graft_status_t st = GRAFT_OK;
    const json_t *steady = json_object_get(b, "steady");
    int used = 0;
    if (steady != NULL && !json_is_array(steady)) {
        snprintf(err, errlen, "runtime: 'steady' is not an array");
        return GRAFT_EFORMAT;
    }
    for (size_t i = 0; i < json_array_size(steady); i++) {
        const json_t *row = json_array_get(steady, i);
        const char *where_path = json_string_value(json_object_get(row, "path"));
        char where[64];
        snprintf(where, sizeof(where), "runtime: steady[%zu]", i);
        if (!json_is_object(row) || where_path == NULL) {
            snprintf(err, errlen, "%s: not an object with a 'path' string", where);
            return GRAFT_EFORMAT;
        }
        const json_t *med = json_object_get(row, "median_ms");
        if (!json_is_number(med)) {
            snprintf(err, errlen, "%s: no numeric 'median_ms'", where);
            return GRAFT_EFORMAT;
        }
        if (strcmp(where_path, "peers") != 0 || json_number_value(med) < 0) {
            continue; /* the etcd path, or a size that failed */
        }
        graft_sim_point_t pt = {0, 1, 0, path};
        st = sim_bench_num(row, where, "groups", 1, &pt.groups, err, errlen);
        if (st == GRAFT_OK) {
            st = sim_bench_num(row, where, "median_ms", 0, &pt.ms, err, errlen);
        }
        if (st == GRAFT_OK) {
            st = sim_point_add(bn->coord, &bn->ncoord, pt, path, err, errlen);
        }
        if (st != GRAFT_OK) {
            return st;
        }
        used++;
    }
    const json_t *rec = json_object_get(b, "recovery");
    if (json_is_array(rec) && json_array_size(rec) > 0) {
        const json_t *best = NULL;
        double mib = 0, transfer_s = 0;
        st = sim_recovery_largest(b, &best, err, errlen);
        if (st == GRAFT_OK) {
            st = sim_bench_num(best, "runtime: recovery", "mib", 1, &mib, err, errlen);
        }
        if (st == GRAFT_OK) {
            st = sim_bench_num(best, "runtime: recovery", "transfer_s", 1, &transfer_s, err,
                               errlen);
        }
        if (st != GRAFT_OK) {
            return st;
        }
        bn->heal_gb_s = mib * 1048576.0 / 1e9 / transfer_s;
        bn->heal_file = path;
        used++;
    }
    if (used == 0) {
        snprintf(err, errlen, "runtime: no usable figure (no steady \"peers\" size that "
                              "succeeded, no recovery)");
        return GRAFT_EFORMAT;
    }
    return GRAFT_OK;
}

/* membership_bench --json: one size ("groups", "form_median_ms" a number)
 * or the default run ("form_median_ms" a map from group count to median). */
static graft_status_t sim_bench_fig_membership(graft_sim_bench_t *bn, const json_t *b,
                                               const char *path, char *err, size_t errlen)
{
    graft_status_t st;
    double ranks = 0;
    const json_t *form = json_object_get(b, "form_median_ms");
    st = sim_bench_num(b, "membership", "ranks_per_group", 1, &ranks, err, errlen);
    if (st != GRAFT_OK) {
        return st;
    }
    if (json_is_number(form)) {
        graft_sim_point_t pt = {0, ranks, 0, path};
        st = sim_bench_num(b, "membership", "groups", 1, &pt.groups, err, errlen);
        if (st == GRAFT_OK) {
            st = sim_bench_num(b, "membership", "form_median_ms", 0, &pt.ms, err, errlen);
        }
        return st == GRAFT_OK ? sim_point_add(bn->form, &bn->nform, pt, path, err, errlen) : st;
    }
    if (!json_is_object(form)) {
        snprintf(err, errlen, "membership: 'form_median_ms' is neither a number nor an object");
        return GRAFT_EFORMAT;
    }
    const char *key;
    const json_t *v;
    int used = 0;
    json_object_foreach((json_t *)form, key, v)
    {
        char *end = NULL;
        double groups = strtod(key, &end);
        if (end == key || *end != '\0' || !(groups >= 1) || !json_is_number(v)) {
            snprintf(err, errlen, "membership: form_median_ms.%s: expected a group count "
                                  "mapped to a number", key);
            return GRAFT_EFORMAT;
        }
        if (json_number_value(v) < 0) {
            continue; /* a size that failed */
        }
        graft_sim_point_t pt = {groups, ranks, json_number_value(v), path};
        st = sim_point_add(bn->form, &bn->nform, pt, path, err, errlen);
        if (st != GRAFT_OK) {
            return st;
        }
        used++;
    }
    if (used == 0) {
        snprintf(err, errlen, "membership: no size whose formation succeeded");
        return GRAFT_EFORMAT;
    }
    return GRAFT_OK;
}

graft_status_t graft_sim_bench_load(graft_sim_bench_t *bench, const char *path, char *err,
                                    size_t errlen)
{
    graft_status_t st = GRAFT_OK;
    char e2[300];
    graft_sim_bench_t *tmp = NULL;

    if (bench == NULL || path == NULL || err == NULL || errlen == 0) {
        return GRAFT_EINVAL;
    }
    json_t *root = graft_sim_params_parse_file(path, err, errlen, &st);
    if (root == NULL) {
        goto out;
    }
    const char *name = json_string_value(json_object_get(root, "bench"));
    if (!json_is_object(root) || name == NULL) {
        snprintf(err, errlen, "%s: not a benchmark's --json object (no \"bench\" name)", path);
        st = GRAFT_EFORMAT;
        goto out;
    }
    tmp = malloc(sizeof(*tmp));
    if (tmp == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        st = GRAFT_ENOMEM;
        goto out;
    }
    *tmp = *bench;
    if (strcmp(name, "runtime") == 0) {
        st = sim_bench_fig_runtime(tmp, root, path, e2, sizeof(e2));
    } else if (strcmp(name, "membership") == 0) {
        st = sim_bench_fig_membership(tmp, root, path, e2, sizeof(e2));
    } else if (strcmp(name, "persist") == 0) {
        st = sim_persist_block_gb_s(root, &tmp->checkpoint_gb_s, e2, sizeof(e2));
        tmp->checkpoint_file = path;
    } else if (strcmp(name, "graft-sim-run") == 0) {
        st = sim_bench_promotion(tmp, root, path, e2, sizeof(e2));
    } else {
        snprintf(e2, sizeof(e2), "bench '%s': --bench-json reads runtime, membership, "
                                 "persist and graft-sim-run (use --params for the others)",
                 name);
        st = GRAFT_ENOTSUP;
    }
    if (st != GRAFT_OK) {
        snprintf(err, errlen, "%s: %s", path, e2);
        goto out;
    }
    *bench = *tmp;
out:
    free(tmp);
    json_decref(root);
    return st;
}

const char *graft_sim_origin_name(graft_sim_origin_t origin)
{
    switch (origin) {
    case GRAFT_SIM_MEASURED:
        return "measured";
    case GRAFT_SIM_GIVEN:
        return "given";
    default:
        return "assumed";
    }
}

static int sim_point_cmp(const void *a, const void *b)
{
    const graft_sim_point_t *x = a, *y = b;
    double u = x->groups * x->ranks, v = y->groups * y->ranks;
    return (u > v) - (u < v);
}

static double sim_rounds(double groups)
{
    double r = ceil(log2(groups));
    return r < 1 ? 1 : r;
}

/*
 * Evaluates a curve at size @x (groups x ranks). Returns 1 with the largest
 * point in *top_p when @x lies beyond it (the caller extrapolates), else 0
 * with the value in *ms_p. Fills @f's source and basis.
 */
static int sim_curve_at(const graft_sim_point_t *in, int n, double x, graft_sim_figure_t *f,
                        double *ms_p, graft_sim_point_t *top_p)
{
    graft_sim_point_t pts[GRAFT_SIM_MAX_POINTS];
    memcpy(pts, in, (size_t)n * sizeof(pts[0]));
    qsort(pts, (size_t)n, sizeof(pts[0]), sim_point_cmp);
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        if (strstr(f->source, pts[i].file) == NULL && used + strlen(pts[i].file) + 3 <
                                                          sizeof(f->source)) {
            used += (size_t)snprintf(f->source + used, sizeof(f->source) - used, "%s%s",
                                     used > 0 ? ", " : "", pts[i].file);
        }
    }
    double lo = pts[0].groups * pts[0].ranks, hi = pts[n - 1].groups * pts[n - 1].ranks;
    if (x > hi) {
        *top_p = pts[n - 1];
        return 1;
    }
    if (x <= lo) {
        *ms_p = pts[0].ms;
        snprintf(f->basis, sizeof(f->basis), "%s the smallest measured size (%g)",
                 x == lo ? "at" : "clamped to", lo);
        return 0;
    }
    int i = 1;
    while (pts[i].groups * pts[i].ranks < x) {
        i++;
    }
    double x0 = pts[i - 1].groups * pts[i - 1].ranks, x1 = pts[i].groups * pts[i].ranks;
    double w = (log2(x) - log2(x0)) / (log2(x1) - log2(x0));
    *ms_p = pts[i - 1].ms + w * (pts[i].ms - pts[i - 1].ms);
    snprintf(f->basis, sizeof(f->basis), "interpolated linearly in log2 between %g (%g ms) and "
                                         "%g (%g ms)",
             x0, pts[i - 1].ms, x1, pts[i].ms);
    return 0;
}

/* The parameter of @key was given: returns what gave it, or NULL. */
static const char *sim_given(const char *const *given, const char *key)
{
    int i = graft_sim_params_index(key);
    return given != NULL && i >= 0 ? given[i] : NULL;
}

static void sim_fig_init(graft_sim_figure_t *f, const char *name, const char *unit,
                         const char *given)
{
    memset(f, 0, sizeof(*f));
    f->name = name;
    f->unit = unit;
    if (given != NULL) {
        f->origin = GRAFT_SIM_GIVEN;
        snprintf(f->source, sizeof(f->source), "%s", given);
        snprintf(f->basis, sizeof(f->basis), "given; wins over any measurement");
    }
}

static void sim_fig_coordination(const graft_sim_bench_t *bn, graft_sim_params_t *p,
                                 const char *given, graft_sim_figure_t *f)
{
    double g = p->groups, ms = 0;
    sim_fig_init(f, "coordination_seconds_per_step", "s", given);
    if (given == NULL && bn->ncoord > 0) {
        f->origin = GRAFT_SIM_MEASURED;
        graft_sim_point_t top;
        if (sim_curve_at(bn->coord, bn->ncoord, g, f, &ms, &top)) {
            double per_round = top.ms / sim_rounds(top.groups);
            ms = per_round * sim_rounds(g);
            snprintf(f->basis, sizeof(f->basis),
                     "extrapolated beyond %g groups: %.4g ms per dissemination-barrier round "
                     "x ceil(log2 %g) = %g rounds",
                     top.groups, per_round, g, sim_rounds(g));
        }
        p->coordination_seconds = ms / 1e3;
    } else if (given == NULL) {
        p->coordination_seconds = 0.5e-3 * sim_rounds(g);
        snprintf(f->basis, sizeof(f->basis), "assumed: 0.5 ms per dissemination-barrier round x "
                                             "ceil(log2 %g) = %g rounds",
                 g, sim_rounds(g));
    }
    f->value = p->coordination_seconds;
}

static void sim_fig_formation(const graft_sim_bench_t *bn, graft_sim_params_t *p,
                              const char *given, graft_sim_figure_t *f)
{
    double x = (double)p->groups * p->gpus_per_group, ms = 0;
    sim_fig_init(f, "formation_seconds_per_failure", "s", given);
    if (given == NULL && bn->nform > 0) {
        f->origin = GRAFT_SIM_MEASURED;
        graft_sim_point_t top;
        if (sim_curve_at(bn->form, bn->nform, x, f, &ms, &top)) {
            double x1 = top.groups * top.ranks;
            ms = top.ms * x / x1;
            snprintf(f->basis, sizeof(f->basis),
                     "extrapolated linearly in groups x ranks from %g x %g (%g ms) to %d x %d",
                     top.groups, top.ranks, top.ms, p->groups,
                     p->gpus_per_group);
        }
        p->quorum_seconds = ms / 1e3;
    } else if (given == NULL) {
        snprintf(f->basis, sizeof(f->basis), "assumed: quorum_seconds default");
    }
    f->value = p->quorum_seconds;
}

static void sim_fig_promotion(const graft_sim_bench_t *bn, graft_sim_params_t *p,
                              const char *given, graft_sim_figure_t *f)
{
    sim_fig_init(f, "spare_promotion_seconds", "s", given);
    if (given == NULL && bn->promote_n > 0) {
        f->origin = GRAFT_SIM_MEASURED;
        p->spare_seconds = bn->promote_s;
        snprintf(f->source, sizeof(f->source), "%s", bn->promote_file);
        snprintf(f->basis, sizeof(f->basis), "graft-sim run --spares: median of %zu "
                                             "promotions (old record gone -> the spare's)",
                 bn->promote_n);
    } else if (given == NULL) {
        snprintf(f->basis, sizeof(f->basis), "assumed: spare_seconds default");
    }
    f->value = p->spare_seconds;
}

void graft_sim_bench_apply(const graft_sim_bench_t *bench, graft_sim_params_t *params,
                           const char *const *given, graft_sim_figure_t *figs)
{
    graft_sim_figure_t *f;
    const char *g;

    sim_fig_coordination(bench, params, sim_given(given, "coordination_seconds"),
                         &figs[GRAFT_SIM_FIG_COORDINATION]);
    sim_fig_formation(bench, params, sim_given(given, "quorum_seconds"),
                      &figs[GRAFT_SIM_FIG_FORMATION]);

    f = &figs[GRAFT_SIM_FIG_CHECKPOINT];
    g = sim_given(given, "checkpoint_gb_s");
    sim_fig_init(f, "checkpoint_blocking_seconds", "s",
                 g != NULL ? g : sim_given(given, "checkpoint_seconds"));
    if (f->origin != GRAFT_SIM_GIVEN && bench->checkpoint_gb_s > 0) {
        f->origin = GRAFT_SIM_MEASURED;
        params->checkpoint_seconds = 0;
        params->checkpoint_gb_s = bench->checkpoint_gb_s;
        snprintf(f->source, sizeof(f->source), "%s", bench->checkpoint_file);
        snprintf(f->basis, sizeof(f->basis), "state_gb %g / measured snapshot %.3g GB/s",
                 params->state_gb, params->checkpoint_gb_s);
    } else if (f->origin != GRAFT_SIM_GIVEN) {
        snprintf(f->basis, sizeof(f->basis), "assumed: %g s + state_gb %g / %g GB/s (memcpy)",
                 params->checkpoint_seconds, params->state_gb, params->checkpoint_gb_s);
    }
    f->value = graft_sim_checkpoint_cost(params);

    f = &figs[GRAFT_SIM_FIG_HEAL];
    sim_fig_init(f, "heal_gb_s_per_donor_link", "GB/s", sim_given(given, "link_gb_s"));
    if (f->origin != GRAFT_SIM_GIVEN && bench->heal_gb_s > 0) {
        f->origin = GRAFT_SIM_MEASURED;
        params->link_gb_s = bench->heal_gb_s;
        snprintf(f->source, sizeof(f->source), "%s", bench->heal_file);
        snprintf(f->basis, sizeof(f->basis), "runtime recovery: mib / transfer_s of the "
                                             "largest state");
    } else if (f->origin != GRAFT_SIM_GIVEN) {
        snprintf(f->basis, sizeof(f->basis), "assumed: link_gb_s default");
    }
    f->value = params->link_gb_s;
    sim_fig_promotion(bench, params, sim_given(given, "spare_seconds"),
                      &figs[GRAFT_SIM_FIG_PROMOTION]);
}
