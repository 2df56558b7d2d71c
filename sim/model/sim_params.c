/*
 * The model's parameters by name (see sim_params.h). Values are parsed with
 * strtod/strtol and JSON with jansson; every failure names the key.
 *
 * The benchmarks' --json outputs that --params and --bench-json read are
 * in sim_bench_json.c; --params FILE (graft_sim_params_load) is in
 * sim_params_load.c, above both.
 */
#include "sim_params.h"
#include "sim_params_int.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct sim_param_desc {
    const char *key;
    size_t offset;
    int is_int;
    const char *help;
} sim_param_desc_t;

#define SIM_D(field, help) {#field, offsetof(graft_sim_params_t, field), 0, help}
#define SIM_I(field, help) {#field, offsetof(graft_sim_params_t, field), 1, help}

static const sim_param_desc_t sim_param_table[] = {
    SIM_I(groups, "replica groups"),
    SIM_I(gpus_per_group, "GPUs (ranks) per group"),
    SIM_D(gpu_mtbf_hours, "mean time between failures of one GPU, hours (inf: no failures)"),
    SIM_D(disaster_fraction, "share of failures that take down every group"),
    SIM_D(step_seconds, "one optimizer step (compute), seconds"),
    SIM_D(coordination_seconds, "graft's coordination added to every step, seconds "
                                "(measured by --bench-json runtime)"),
    SIM_D(state_gb, "training state per GPU a replacement pulls, GB"),
    SIM_D(link_gb_s, "bandwidth of one donor link, GB/s"),
    SIM_D(nic_gb_s, "recipient's ingress cap per GPU, GB/s"),
    SIM_D(verify_gb_s, "hash throughput of a verified pull, GB/s (0: never the bottleneck)"),
    SIM_I(donors, "donors per multi-donor pull"),
    SIM_D(detect_seconds, "failure to detection, seconds"),
    SIM_D(spawn_seconds, "replacement group up on a spare, seconds"),
    SIM_D(spare_seconds, "with graft's spares (already running): detection to a spare in the "
                         "slot, seconds; used instead of spawn_seconds in the \"with spares\" "
                         "columns (measured by --bench-json of a graft-sim run --spares report)"),
    SIM_D(quorum_seconds, "forming a new quorum, seconds"),
    SIM_D(donor_timeout_seconds, "a donor's death to its stripes being reassigned, seconds"),
    SIM_D(link_faults_per_hour, "transient faults per hour of one rank's link to a serving donor"),
    SIM_D(checkpoint_seconds, "blocking part of one persistent checkpoint (C), seconds "
                              "(its fixed part when checkpoint_gb_s is set)"),
    SIM_D(checkpoint_gb_s, "blocking snapshot throughput per GPU, GB/s (0: unused; else C "
                           "adds state_gb / it)"),
    SIM_D(restart_seconds, "whole-job restart from disk after detection (R), seconds "
                           "(besides loading when restore_gb_s is set)"),
    SIM_D(restore_gb_s, "restore throughput per GPU, GB/s (0: unused; else R adds "
                        "state_gb / it)"),
    SIM_D(horizon_days, "simulated time per run, days"),
    SIM_I(runs, "independent runs averaged per point"),
};

#define SIM_NPARAMS ((int)(sizeof(sim_param_table) / sizeof(sim_param_table[0])))

int graft_sim_params_count(void)
{
    return SIM_NPARAMS;
}

/* Matches a JSON key or a flag name (same text with '-' for '_'). */
static const sim_param_desc_t *sim_param_find(const char *key)
{
    for (int i = 0; i < SIM_NPARAMS; i++) {
        const char *a = sim_param_table[i].key, *b = key;
        while (*a != '\0' && (*a == *b || (*a == '_' && *b == '-'))) {
            a++;
            b++;
        }
        if (*a == '\0' && *b == '\0') {
            return &sim_param_table[i];
        }
    }
    return NULL;
}

int graft_sim_params_index(const char *key)
{
    const sim_param_desc_t *d = key != NULL ? sim_param_find(key) : NULL;
    return d != NULL ? (int)(d - sim_param_table) : -1;
}

const char *graft_sim_params_get(const graft_sim_params_t *params, int i, double *value_p)
{
    if (i < 0 || i >= SIM_NPARAMS) {
        return NULL;
    }
    const char *base = (const char *)params + sim_param_table[i].offset;
    if (sim_param_table[i].is_int) {
        int v;
        memcpy(&v, base, sizeof(v));
        *value_p = v;
    } else {
        double v;
        memcpy(&v, base, sizeof(v));
        *value_p = v;
    }
    return sim_param_table[i].key;
}

/* Stores @v into @d's field after checking the whole set of parameters. */
static graft_status_t sim_param_store(graft_sim_params_t *params, const sim_param_desc_t *d,
                                      double v, char *err, size_t errlen)
{
    graft_status_t st = GRAFT_OK;
    graft_sim_params_t tmp = *params;
    char *base = (char *)&tmp + d->offset;
    if (d->is_int) {
        if (!(v == floor(v)) || v < -2147483648.0 || v > 2147483647.0) {
            snprintf(err, errlen, "%s: %g is not an integer", d->key, v);
            st = GRAFT_EINVAL;
            goto out;
        }
        int iv = (int)v;
        memcpy(base, &iv, sizeof(iv));
    } else {
        memcpy(base, &v, sizeof(v));
    }
    /* Only this field's own range matters here: other fields may still be
     * set later (e.g. from flags), so check them at the end. Checking a
     * copy whose other fields are defaults-or-earlier values keeps the
     * message about this key. */
    char e2[200];
    st = graft_sim_params_check(&tmp, e2, sizeof(e2));
    if (st != GRAFT_OK && strncmp(e2, d->key, strlen(d->key)) == 0 &&
        e2[strlen(d->key)] == ':') {
        snprintf(err, errlen, "%s", e2);
        goto out;
    }
    st = GRAFT_OK;
    *params = tmp;
out:
    return st;
}

graft_status_t graft_sim_params_set(graft_sim_params_t *params, const char *key, const char *value,
                                    char *err, size_t errlen)
{
    graft_status_t st = GRAFT_OK;
    const sim_param_desc_t *d;
    char *end = NULL;

    if (params == NULL || key == NULL || err == NULL || errlen == 0) {
        return GRAFT_EINVAL;
    }
    d = sim_param_find(key);
    if (d == NULL) {
        snprintf(err, errlen, "unknown parameter '%s'", key);
        st = GRAFT_ENOTFOUND;
        goto out;
    }
    if (value == NULL || value[0] == '\0') {
        snprintf(err, errlen, "%s: needs a value", d->key);
        st = GRAFT_EINVAL;
        goto out;
    }
    errno = 0;
    double v = strtod(value, &end);
    if (end == value || *end != '\0' || isnan(v) || (errno == ERANGE && isinf(v))) {
        snprintf(err, errlen, "%s: '%s' is not a number", d->key, value);
        st = GRAFT_EINVAL;
        goto out;
    }
    st = sim_param_store(params, d, v, err, errlen);
out:
    return st;
}

/* Stores one measured value under a parameter's name, with its check. */
graft_status_t graft_sim_params_store(graft_sim_params_t *p, const char *key, double v, char *err,
                                      size_t errlen)
{
    const sim_param_desc_t *d = sim_param_find(key);
    return d != NULL ? sim_param_store(p, d, v, err, errlen) : GRAFT_ENOTFOUND;
}

/* Parses @path as JSON, or failing that its last non-empty line. */
json_t *graft_sim_params_parse_file(const char *path, char *err, size_t errlen,
                                    graft_status_t *st_p)
{
    json_error_t jerr;
    json_t *root = NULL;
    char *text = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        *st_p = GRAFT_EIO;
        goto out;
    }
    /* Bench outputs are small; refuse anything that is clearly not one. */
    const size_t cap = 16u << 20;
    text = malloc(cap + 1);
    if (text == NULL) {
        *st_p = GRAFT_ENOMEM;
        snprintf(err, errlen, "%s: out of memory", path);
        goto out;
    }
    size_t n = fread(text, 1, cap + 1, f);
    if (ferror(f)) {
        snprintf(err, errlen, "%s: read failed: %s", path, strerror(errno));
        *st_p = GRAFT_EIO;
        goto out;
    }
    if (n > cap) {
        snprintf(err, errlen, "%s: larger than %zu bytes", path, cap);
        *st_p = GRAFT_EFORMAT;
        goto out;
    }
    text[n] = '\0';
    root = json_loadb(text, n, 0, &jerr);
    if (root == NULL) {
        /* Perhaps a benchmark's whole output: its JSON is the last line. */
        size_t end = n;
        while (end > 0 && (text[end - 1] == '\n' || text[end - 1] == '\r' ||
                           text[end - 1] == ' ' || text[end - 1] == '\t')) {
            end--;
        }
        size_t start = end;
        while (start > 0 && text[start - 1] != '\n') {
            start--;
        }
        json_error_t jerr2;
        if (start > 0 && end > start) {
            root = json_loadb(text + start, end - start, 0, &jerr2);
        }
        if (root == NULL) {
            snprintf(err, errlen, "%s: not JSON: line %d column %d: %s", path, jerr.line,
                     jerr.column, jerr.text);
            *st_p = GRAFT_EFORMAT;
            goto out;
        }
    }
    *st_p = GRAFT_OK;
out:
    free(text);
    if (f != NULL) {
        fclose(f);
    }
    return root;
}

void graft_sim_params_usage(FILE *out)
{
    graft_sim_params_t d;
    graft_sim_params_default(&d);
    for (int i = 0; i < SIM_NPARAMS; i++) {
        char flag[64];
        double v;
        snprintf(flag, sizeof(flag), "--%s", sim_param_table[i].key);
        for (char *c = flag + 2; *c != '\0'; c++) {
            if (*c == '_') {
                *c = '-';
            }
        }
        (void)graft_sim_params_get(&d, i, &v);
        fprintf(out, "  %-26s %s [%g]\n", flag, sim_param_table[i].help, v);
    }
}
