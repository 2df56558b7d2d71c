/*
 * Abandoned multipart uploads: a writer killed mid-upload, or one whose
 * abort failed while the store was down, leaves parts the store keeps (and
 * bills) until the upload is aborted. The sweep lists the uploads below
 * the prefix (ListMultipartUploads) and aborts those this client could not
 * abort, and those of anyone that sent nothing for the idle time
 * (ListParts: the newest part's LastModified; an upload with no part, which
 * costs nothing stored, from when this client first listed it, since some
 * stores answer a made-up Initiated time). Each request is tried once: a
 * sweep that fails is tried again after the next upload, and a store that
 * is down does not hold up the upload behind it.
 */
#include "persist_s3.h"
#include "persist_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Seconds since the epoch of an S3 timestamp ("2026-11-27T09:45:44.000Z");
 * 0 when it does not parse. */
static int64_t s3_time(const char *text)
{
    struct tm tm = {0};
    if (strptime(text, "%Y-%m-%dT%H:%M:%S", &tm) == NULL)
        return 0;
    return (int64_t)timegm(&tm);
}

/* The newest <tag> time in xml (0 if none). */
static int64_t newest_time(const char *xml, const char *tag)
{
    char open[64], val[64];
    int64_t newest = 0;
    snprintf(open, sizeof(open), "<%s>", tag);
    for (const char *p = strstr(xml, open); p != NULL; p = strstr(p + 1, open))
        if (graft__s3_xml_tag(p, tag, val, sizeof(val)))
            newest = GRAFT_MAX(newest, s3_time(val));
    return newest;
}

static bool owned(graft__s3_t *s3, const char *key, const char *id)
{
    bool found = false;
    pthread_mutex_lock(&s3->orphans_mu);
    for (size_t i = 0; !found && i < s3->n_orphans; i++)
        found = strcmp(s3->orphans[i].key, key) == 0 && strcmp(s3->orphans[i].upload_id, id) == 0;
    pthread_mutex_unlock(&s3->orphans_mu);
    return found;
}

static void forget(graft__s3_t *s3, const char *key, const char *id)
{
    pthread_mutex_lock(&s3->orphans_mu);
    for (size_t i = 0; i < s3->n_orphans; i++)
        if (strcmp(s3->orphans[i].key, key) == 0 && strcmp(s3->orphans[i].upload_id, id) == 0) {
            s3->orphans[i] = s3->orphans[--s3->n_orphans];
            break;
        }
    pthread_mutex_unlock(&s3->orphans_mu);
}

/* When this client first listed the upload id (now if never). */
static int64_t first_seen(graft__s3_t *s3, const char *id, int64_t now)
{
    int64_t first = now;
    pthread_mutex_lock(&s3->orphans_mu);
    size_t i = 0, oldest = 0;
    for (; i < s3->n_seen && strcmp(s3->seen[i].upload_id, id) != 0; i++)
        if (s3->seen[i].first_s < s3->seen[oldest].first_s)
            oldest = i;
    if (i < s3->n_seen) {
        first = s3->seen[i].first_s;
    } else {
        graft__s3_seen_t *e = &s3->seen[s3->n_seen < GP_S3_MAX_ORPHANS ? s3->n_seen++ : oldest];
        snprintf(e->upload_id, sizeof(e->upload_id), "%s", id);
        e->first_s = now;
    }
    pthread_mutex_unlock(&s3->orphans_mu);
    return first;
}

/* When the upload last saw activity: its newest part, else when this
 * client first listed it; INT64_MAX when unknown (leave it). */
static int64_t last_activity(graft__s3_t *s3, const char *rel, const char *id,
                             const char *id_enc, int64_t now)
{
    char *query = graft__asprintf("uploadId=%s", id_enc);
    graft__s3_resp_t r = {.fd = -1};
    char why[256];
    int64_t last = INT64_MAX;
    if (query != NULL && graft__s3_request_once(s3, "GET", rel, query, (long)s3->timeout_ms, &r,
                                                "ListParts", why, sizeof(why)) == GRAFT_OK) {
        last = newest_time(r.body != NULL ? r.body : "", "LastModified");
        if (last == 0)
            last = first_seen(s3, id, now);
    }
    graft_free(query);
    graft_free(r.body);
    return last;
}

/* One <Upload> of the listing: abort it when abandoned. */
static graft_status_t sweep_one(graft__s3_t *s3, const char *upload, int64_t now,
                                uint64_t idle_ms, size_t *aborted_p, char *why, size_t why_len)
{
    char key[1024], id[512];
    if (!graft__s3_xml_tag(upload, "Key", key, sizeof(key)) ||
        !graft__s3_xml_tag(upload, "UploadId", id, sizeof(id)))
        return GRAFT_OK;
    size_t pl = strlen(s3->prefix);
    if (strncmp(key, s3->prefix, pl) != 0)
        return GRAFT_OK;
    char *id_enc = curl_easy_escape(NULL, id, 0);
    if (id_enc == NULL)
        return GRAFT_ENOMEM;
    const char *rel = key + pl;
    bool mine = owned(s3, key, id);
    int64_t last = mine ? 0 : last_activity(s3, rel, id, id_enc, now);
    graft_status_t st = GRAFT_OK;
    if (mine || (last != INT64_MAX && (now - last) * 1000 >= (int64_t)idle_ms)) {
        char query[600], what[1100];
        graft__s3_resp_t r = {.fd = -1};
        snprintf(query, sizeof(query), "uploadId=%s", id_enc);
        snprintf(what, sizeof(what), "AbortMultipartUpload %s", key);
        st = graft__s3_request_once(s3, "DELETE", rel, query, (long)s3->timeout_ms, &r, what,
                                    why, why_len);
        graft_free(r.body);
        if (st == GRAFT_OK || st == GRAFT_ENOTFOUND) {
            GRAFT_INFO(GRAFT_MOD_PERSIST, "s3://%s/%s: aborted an abandoned multipart upload "
                       "(%s)", s3->bucket, key, mine ? "its abort had failed" : "nothing sent "
                       "for longer than the idle time");
            forget(s3, key, id);
            (*aborted_p)++;
            st = GRAFT_OK;
        }
    }
    curl_free(id_enc);
    return st;
}

graft_status_t graft__s3_sweep_uploads(graft__s3_t *s3, uint64_t idle_ms, size_t *aborted_p,
                                       char *why, size_t why_len)
{
    *aborted_p = 0;
    /* Parameters in sorted order, as SigV4 signs them; the prefix needs no
     * escaping (parse_url() refuses what would). */
    char *query = graft__asprintf("prefix=%s&uploads=", s3->prefix);
    if (query == NULL)
        return GRAFT_ENOMEM;
    graft__s3_resp_t r = {.fd = -1};
    char what[300];
    snprintf(what, sizeof(what), "ListMultipartUploads %s", s3->prefix);
    graft_status_t st = graft__s3_request_once(s3, "GET", NULL, query, (long)s3->timeout_ms, &r,
                                               what, why, why_len);
    graft_free(query);
    int64_t now = (int64_t)time(NULL);
    for (const char *p = st == GRAFT_OK && r.body != NULL ? strstr(r.body, "<Upload>") : NULL;
         p != NULL && st == GRAFT_OK; p = strstr(p + 1, "<Upload>")) {
        const char *end = strstr(p, "</Upload>");
        if (end == NULL)
            break;
        char *one = graft__strndup(p, (size_t)(end - p) + 9);
        st = one != NULL ? sweep_one(s3, one, now, idle_ms, aborted_p, why, why_len)
                         : GRAFT_ENOMEM;
        graft_free(one);
    }
    graft_free(r.body);
    return st;
}
