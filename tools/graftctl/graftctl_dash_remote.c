/*
 * The dashboard's remote tier: the bucket the job uploads to
 * (--ckpt-remote, else GRAFT_PERSIST_REMOTE), listed with one LIST
 * request at most every GRAFTCTL_DASH_REMOTE_MS, outside the dashboard's
 * lock (a slow store never holds up a page), and the upload lag: how far
 * the newest complete local checkpoint is ahead of the newest complete
 * remote one, in steps and seconds.
 */
#include "graftctl_dash.h"

#include <graft/persist.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *env_or_null(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

json_t *graftctl_dash_remote_poll(const char *url, uint64_t *polled_ms_p)
{
    uint64_t now = graftctl_now_ms();
    if (url == NULL || (*polled_ms_p != 0 && now - *polled_ms_p < GRAFTCTL_DASH_REMOTE_MS))
        return NULL;
    *polled_ms_p = now;
    /* Tried once, briefly: the next poll tries again. */
    graft_persist_remote_config_t rc = {.url = url,
                                        .endpoint = env_or_null("GRAFT_PERSIST_REMOTE_ENDPOINT"),
                                        .region = env_or_null("GRAFT_PERSIST_REMOTE_REGION"),
                                        .max_retries = 0,
                                        .timeout_ms = 5000};
    graft_persist_remote_entry_t *e = NULL;
    size_t n = 0;
    char why[512] = "";
    graft_status_t st = graft_persist_remote_entries(&rc, &e, &n, why, sizeof(why));
    json_t *list = json_array();
    for (size_t i = 0; st == GRAFT_OK && i < n; i++)
        json_array_append_new(list, json_pack("{s:I,s:s,s:I}", "step", (json_int_t)e[i].step,
                                              "state", e[i].complete ? "complete" : "incomplete",
                                              "objects", (json_int_t)e[i].objects));
    graft_free(e);
    if (st != GRAFT_OK && why[0] == '\0')
        snprintf(why, sizeof(why), "%s", graft_status_string(st));
    return json_pack("{s:I,s:o,s:o}", "listed_unix_ms", (json_int_t)now, "checkpoints", list,
                     "error", graftctl_json_text(why));
}

/* The newest complete entry of a listing (newest first), or NULL. */
static json_t *newest_complete(json_t *list)
{
    size_t i;
    json_t *c;
    json_array_foreach(list, i, c) {
        const char *s = json_string_value(json_object_get(c, "state"));
        if (s != NULL && strcmp(s, "complete") == 0)
            return c;
    }
    return NULL;
}

static json_t *local_step(json_t *local, json_int_t step)
{
    size_t i;
    json_t *c;
    json_array_foreach(local, i, c)
        if (json_integer_value(json_object_get(c, "step")) == step)
            return c;
    return NULL;
}

json_t *graftctl_dash_remote_json(const char *url, json_t *listing, json_t *local)
{
    if (url == NULL)
        return json_null();
    json_t *rlist = json_object_get(listing, "checkpoints");
    json_t *r = newest_complete(rlist), *l = newest_complete(local);
    json_t *lag_steps = json_null(), *lag_s = json_null();
    const char *note = "";
    if (listing == NULL) {
        note = "not listed yet";
    } else if (r == NULL) {
        note = "no complete checkpoint in the bucket";
    } else if (l != NULL) {
        json_int_t ls = json_integer_value(json_object_get(l, "step"));
        json_int_t rs = json_integer_value(json_object_get(r, "step"));
        /* The remote one's time is its local copy's (the same manifest). */
        json_t *rl = local_step(local, rs);
        json_int_t lms = json_integer_value(json_object_get(l, "unix_ms"));
        json_decref(lag_steps);
        lag_steps = json_integer(ls > rs ? ls - rs : 0);
        if (ls <= rs) {
            json_decref(lag_s);
            lag_s = json_real(0.0);
        } else if (rl != NULL) {
            json_decref(lag_s);
            lag_s = json_real((double)(lms - json_integer_value(json_object_get(rl, "unix_ms"))) /
                              1000.0);
        } else {
            note = "the newest remote checkpoint is older than every local one";
        }
    }
    return json_pack("{s:o,s:O,s:O,s:O,s:o,s:o,s:s}", "url", graftctl_json_text(url),
                     "listed_unix_ms",
                     listing != NULL ? json_object_get(listing, "listed_unix_ms") : json_null(),
                     "error", listing != NULL ? json_object_get(listing, "error") : json_null(),
                     "checkpoints", rlist != NULL ? rlist : json_null(), "lag_steps", lag_steps,
                     "lag_seconds", lag_s, "lag_note", note);
}
