/*
 * graftctl: the connection to etcd and the observer of the job that the
 * commands against a job share (graftctl_connect). Below the commands;
 * calls none of them.
 */
#include "graftctl.h"

#include <stdio.h>
#include <string.h>

static bool valid_job(const char *job)
{
    size_t n = strlen(job);
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = job[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '.' || ch == '-'))
            return false;
    }
    return true;
}

int graftctl_connect_why(const graftctl_opts_t *o, graftctl_conn_t *c, char *why, size_t len)
{
    int rc = GRAFTCTL_FAIL;
    graft_status_t st;
    graft_etcd_range_result_t res = {0};
    memset(c, 0, sizeof(*c));
    if (o->job == NULL) {
        snprintf(why, len, "no job: give --job NAME or set GRAFT_JOB");
        return GRAFTCTL_USAGE;
    }
    if (!valid_job(o->job)) {
        snprintf(why, len, "bad job name '%s' (1-64 of [A-Za-z0-9_.-])", o->job);
        return GRAFTCTL_USAGE;
    }
    char *prefix = NULL;
    if (graft_membership_job_prefix(o->job, &prefix) != GRAFT_OK) {
        snprintf(why, len, "out of memory");
        return GRAFTCTL_FAIL;
    }
    snprintf(c->prefix, sizeof(c->prefix), "%s", prefix);
    graft_free(prefix);
    graft_etcd_config_t ec = {
        .endpoints = (const char *const *)o->endpoints,
        .n_endpoints = o->n_endpoints,
        .request_timeout_ms = o->timeout_ms,
        .connect_timeout_ms = 1000,
        .max_retries = 1,
        .username = o->user,
        .password = o->password,
        .ca_file = o->ca_file,
        .cert_file = o->cert_file,
        .key_file = o->key_file,
    };
    st = graft_etcd_create(&ec, &c->etcd);
    if (st != GRAFT_OK) {
        snprintf(why, len, "etcd client: %s", graft_status_string(st));
        goto fail;
    }
    /* One cheap read first, so that an unreachable etcd or an unknown job
     * is named before any observer thread starts. */
    graft_etcd_range_opts_t ro = {.prefix = true, .count_only = true};
    st = graft_etcd_range(c->etcd, c->prefix, &ro, &res);
    if (st == GRAFT_EAUTH) {
        snprintf(why, len, "etcd at %s: %s (check --user and --password, or --cacert, "
                "--cert and --key for TLS)", o->endpoints_text, graft_status_string(st));
        goto fail;
    }
    if (st != GRAFT_OK) {
        snprintf(why, len, "etcd unreachable (tried %s): %s", o->endpoints_text,
                graft_status_string(st));
        goto fail;
    }
    if (res.count == 0) {
        snprintf(why, len, "unknown job '%s': no keys under %s in etcd at %s", o->job,
                c->prefix, o->endpoints_text);
        goto fail;
    }
    graft_membership_config_t mc = {
        .job = o->job,
        .etcd = &ec,
        .observer = true,
    };
    st = graft_membership_create(&mc, &c->obs);
    if (st != GRAFT_OK) {
        snprintf(why, len, "observing job '%s' at %s: %s", o->job, o->endpoints_text,
                graft_status_string(st));
        goto fail;
    }
    rc = GRAFTCTL_OK;
    goto out;
fail:
    graftctl_disconnect(c);
out:
    graft_etcd_range_result_clear(&res);
    return rc;
}

int graftctl_connect(const graftctl_opts_t *o, graftctl_conn_t *c)
{
    char why[1024];
    int rc = graftctl_connect_why(o, c, why, sizeof(why));
    if (rc != GRAFTCTL_OK)
        fprintf(stderr, "graftctl: %s\n", why);
    return rc;
}

void graftctl_disconnect(graftctl_conn_t *c)
{
    graft_membership_destroy(c->obs);
    graft_etcd_destroy(c->etcd);
    c->obs = NULL;
    c->etcd = NULL;
}
