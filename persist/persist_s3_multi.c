/*
 * S3 multipart upload with parallel parts over one curl multi handle.
 * Each part carries its Content-MD5, so the store verifies it; a part that
 * fails is resent alone after a jittered back-off. Only when the store
 * lost the upload itself (NoSuchUpload, e.g. a server restarted without
 * its state) is a new upload begun, since nothing else can finish it.
 */
#include "persist_s3.h"
#include "persist_internal.h"

#include <openssl/evp.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum { PART_TODO, PART_BUSY, PART_DONE } part_state_t;

typedef struct part {
    uint32_t num;
    uint64_t off;
    uint64_t len;
    part_state_t state;
    uint32_t attempts;
    uint64_t not_before_ns;
    uint8_t *buf;
    char md5[32];
    char etag[128];
    CURL *easy;
    struct curl_slist *hdrs;
    graft__s3_resp_t resp;
} part_t;

typedef struct upload {
    graft__s3_t *s3;
    const char *key;
    int fd;
    char *id_enc; /* the upload id, percent-encoded */
    part_t *parts;
    uint32_t nparts;
    uint32_t done;
    uint32_t busy;
    bool lost; /* the store no longer knows the upload */
} upload_t;

static graft_status_t create_upload(upload_t *u, char *why, size_t why_len)
{
    graft__s3_resp_t r = {.fd = -1};
    char what[300];
    char id[512] = "";
    snprintf(what, sizeof(what), "CreateMultipartUpload %s%s", u->s3->prefix, u->key);
    graft_status_t st = graft__s3_request(u->s3, "POST", u->key, "uploads=", NULL, 0, NULL, &r,
                                          what, why, why_len);
    if (st == GRAFT_OK && !graft__s3_xml_tag(r.body, "UploadId", id, sizeof(id))) {
        snprintf(why, why_len, "%s: no UploadId in the answer", what);
        st = GRAFT_EIO;
    }
    graft_free(r.body);
    if (st != GRAFT_OK)
        return st;
    u->id_enc = curl_easy_escape(NULL, id, 0);
    return u->id_enc != NULL ? GRAFT_OK : GRAFT_ENOMEM;
}

/* One request about the upload itself, tried once (a probe, a clean-up). */
static graft_status_t upload_request(upload_t *u, const char *method, const char *query_fmt,
                                     const char *what)
{
    char query[600];
    snprintf(query, sizeof(query), query_fmt, u->id_enc);
    graft__s3_resp_t r = {.fd = -1};
    char why[256];
    graft_status_t st = graft__s3_request_once(u->s3, method, u->key, query, 5000L, &r, what, why,
                                               sizeof(why));
    if (st != GRAFT_OK)
        GRAFT_DEBUG(GRAFT_MOD_PERSIST, "%s", why);
    graft_free(r.body);
    return st;
}

/* ListParts: false only when the store says NoSuchUpload. */
static bool upload_exists(upload_t *u)
{
    return upload_request(u, "GET", "max-parts=1&uploadId=%s", "ListParts") != GRAFT_ENOTFOUND;
}

static void part_release(CURLM *m, part_t *p)
{
    if (p->easy != NULL) {
        curl_multi_remove_handle(m, p->easy);
        curl_easy_cleanup(p->easy);
        p->easy = NULL;
    }
    curl_slist_free_all(p->hdrs);
    p->hdrs = NULL;
    graft_free(p->buf);
    p->buf = NULL;
}

/* Read the part (again at every try: memory holds only the parts in
 * flight) and hash it (MD5 for Content-MD5, SHA-256 for the signature) a
 * slice at a time, keeping the parts in flight moving between slices:
 * hashing a whole part at once stalled every transfer for ~20 ms a part. */
#define GP_S3_SLICE (1u << 20)
static graft_status_t part_read(upload_t *u, CURLM *m, part_t *p, char sha_hex[65], char *why,
                                size_t why_len)
{
    EVP_MD_CTX *md5 = EVP_MD_CTX_new(), *sha = EVP_MD_CTX_new();
    graft_status_t st = GRAFT_OK;
    bool ok = md5 != NULL && sha != NULL && EVP_DigestInit_ex(md5, EVP_md5(), NULL) == 1 &&
              EVP_DigestInit_ex(sha, EVP_sha256(), NULL) == 1;
    for (uint64_t off = 0; ok && off < p->len; off += GP_S3_SLICE) {
        size_t n = (size_t)GRAFT_MIN((uint64_t)GP_S3_SLICE, p->len - off);
        ssize_t got = pread(u->fd, p->buf + off, n, (off_t)(p->off + off));
        if (got < 0 || (size_t)got != n) {
            snprintf(why, why_len, "%s: reading part %u of the local file: %s", u->key, p->num,
                     got < 0 ? strerror(errno) : "short read");
            st = GRAFT_EIO;
            break;
        }
        ok = EVP_DigestUpdate(md5, p->buf + off, n) == 1 &&
             EVP_DigestUpdate(sha, p->buf + off, n) == 1;
        int running;
        (void)curl_multi_perform(m, &running);
    }
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdn = 0;
    if (st == GRAFT_OK && ok && EVP_DigestFinal_ex(md5, md, &mdn) == 1)
        EVP_EncodeBlock((unsigned char *)p->md5, md, (int)mdn);
    else
        ok = false;
    if (st == GRAFT_OK && ok && EVP_DigestFinal_ex(sha, md, &mdn) == 1)
        graft__s3_hex(md, mdn, sha_hex);
    else
        ok = false;
    EVP_MD_CTX_free(md5);
    EVP_MD_CTX_free(sha);
    if (st == GRAFT_OK && !ok) {
        snprintf(why, why_len, "%s: hashing part %u failed", u->key, p->num);
        st = GRAFT_EINTERNAL;
    }
    return st;
}

static graft_status_t part_start(upload_t *u, CURLM *m, part_t *p, char *why, size_t why_len)
{
    p->buf = graft__malloc(p->len);
    if (p->buf == NULL)
        return GRAFT_ENOMEM;
    char sha_hex[65];
    graft_status_t st = part_read(u, m, p, sha_hex, why, why_len);
    if (st != GRAFT_OK)
        return st;
    char query[700];
    snprintf(query, sizeof(query), "partNumber=%u&uploadId=%s", p->num, u->id_enc);
    p->resp.fd = -1;
    graft__s3_resp_reset(&p->resp);
    p->easy = graft__s3_easy_hashed(u->s3, "PUT", u->key, query, p->buf, p->len, p->md5,
                                    sha_hex, &p->resp, &p->hdrs);
    if (p->easy == NULL)
        return GRAFT_ENOMEM;
    curl_easy_setopt(p->easy, CURLOPT_PRIVATE, p);
    if (curl_multi_add_handle(m, p->easy) != CURLM_OK)
        return GRAFT_EINTERNAL;
    p->state = PART_BUSY;
    p->attempts++;
    u->busy++;
    return GRAFT_OK;
}

/* A part's transfer ended: keep its ETag, or schedule its resend. */
static graft_status_t part_finish(upload_t *u, CURLM *m, part_t *p, CURLcode cc, char *why,
                                  size_t why_len)
{
    char what[300];
    snprintf(what, sizeof(what), "UploadPart %u of %s%s", p->num, u->s3->prefix, u->key);
    bool retry = false;
    graft_status_t st = graft__s3_outcome(u->s3, (int)cc, &p->resp, what, &retry, why, why_len);
    long retry_after = p->resp.retry_after_s;
    u->busy--;
    part_release(m, p);
    if (st == GRAFT_OK && p->resp.etag[0] == '\0') {
        snprintf(why, why_len, "%s: no ETag in the answer", what);
        st = GRAFT_EIO;
        retry = true;
    }
    if (st == GRAFT_OK) {
        snprintf(p->etag, sizeof(p->etag), "%s", p->resp.etag);
        atomic_fetch_add(&u->s3->bytes_sent, p->len);
        p->state = PART_DONE;
        u->done++;
        return GRAFT_OK;
    }
    /* Some stores answer a part of an upload they lost with a 500 (moto):
     * from the second failure on, ask whether the upload still exists. */
    if (st == GRAFT_ENOTFOUND || (st == GRAFT_EIO && p->attempts >= 2 && !upload_exists(u))) {
        u->lost = true;
        return GRAFT_ENOTFOUND;
    }
    if (!retry || p->attempts > u->s3->max_retries)
        return st;
    uint64_t ms = graft__s3_backoff_ms(u->s3, p->attempts, retry_after);
    GRAFT_DEBUG(GRAFT_MOD_PERSIST, "%s (try %u); resending it in %llu ms", why, p->attempts,
                (unsigned long long)ms);
    p->state = PART_TODO;
    p->not_before_ns = graft__now_ns() + ms * 1000000u;
    return GRAFT_OK;
}

static graft_status_t upload_parts(upload_t *u, char *why, size_t why_len)
{
    graft_status_t st = GRAFT_OK;
    CURLM *m = curl_multi_init();
    if (m == NULL)
        return GRAFT_ENOMEM;
    while (st == GRAFT_OK && u->done < u->nparts) {
        if (u->s3->stop != NULL && atomic_load(u->s3->stop)) {
            snprintf(why, why_len, "%s: upload canceled", u->key);
            st = GRAFT_ECANCELED;
            break;
        }
        uint64_t now = graft__now_ns();
        for (uint32_t i = 0; i < u->nparts && u->busy < u->s3->parallel && st == GRAFT_OK; i++)
            if (u->parts[i].state == PART_TODO && u->parts[i].not_before_ns <= now)
                st = part_start(u, m, &u->parts[i], why, why_len);
        int running = 0;
        if (st == GRAFT_OK && curl_multi_perform(m, &running) != CURLM_OK)
            st = GRAFT_EINTERNAL;
        CURLMsg *msg;
        int left;
        while (st == GRAFT_OK && (msg = curl_multi_info_read(m, &left)) != NULL) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            part_t *p = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&p);
            st = part_finish(u, m, p, msg->data.result, why, why_len);
        }
        if (st == GRAFT_OK && u->done < u->nparts)
            curl_multi_poll(m, NULL, 0, 50, NULL);
    }
    for (uint32_t i = 0; i < u->nparts; i++)
        part_release(m, &u->parts[i]);
    curl_multi_cleanup(m);
    return st;
}

static graft_status_t complete_upload(upload_t *u, char *why, size_t why_len)
{
    size_t cap = 128 + (size_t)u->nparts * 200;
    char *xml = graft__malloc(cap);
    if (xml == NULL)
        return GRAFT_ENOMEM;
    size_t n = (size_t)snprintf(xml, cap, "<CompleteMultipartUpload>");
    for (uint32_t i = 0; i < u->nparts; i++)
        n += (size_t)snprintf(xml + n, cap - n,
                              "<Part><PartNumber>%u</PartNumber><ETag>%s</ETag></Part>",
                              u->parts[i].num, u->parts[i].etag);
    n += (size_t)snprintf(xml + n, cap - n, "</CompleteMultipartUpload>");
    char query[600];
    snprintf(query, sizeof(query), "uploadId=%s", u->id_enc);
    char what[300];
    snprintf(what, sizeof(what), "CompleteMultipartUpload %s%s", u->s3->prefix, u->key);
    graft__s3_resp_t r = {.fd = -1};
    graft_status_t st = graft__s3_request(u->s3, "POST", u->key, query, (const uint8_t *)xml, n,
                                          NULL, &r, what, why, why_len);
    graft_free(r.body);
    graft_free(xml);
    return st;
}

/* The store would otherwise keep the parts (and bill them). An abort that
 * fails (the store down) is remembered and tried again by the next sweep
 * (graft__s3_sweep_uploads()). */
static void abort_upload(upload_t *u)
{
    graft_status_t st = upload_request(u, "DELETE", "uploadId=%s", "AbortMultipartUpload");
    if (st == GRAFT_OK || st == GRAFT_ENOTFOUND)
        return;
    char *id = curl_unescape(u->id_enc, 0);
    pthread_mutex_lock(&u->s3->orphans_mu);
    if (id != NULL && u->s3->n_orphans < GP_S3_MAX_ORPHANS) {
        graft__s3_orphan_t *o = &u->s3->orphans[u->s3->n_orphans++];
        snprintf(o->key, sizeof(o->key), "%s%s", u->s3->prefix, u->key);
        snprintf(o->upload_id, sizeof(o->upload_id), "%s", id);
    }
    pthread_mutex_unlock(&u->s3->orphans_mu);
    GRAFT_WARN(GRAFT_MOD_PERSIST, "AbortMultipartUpload of %s%s failed (%s); the next sweep "
               "tries again", u->s3->prefix, u->key, graft_status_string(st));
    curl_free(id);
}

static graft_status_t upload_once(upload_t *u, uint64_t bytes, char *why, size_t why_len)
{
    uint64_t part = u->s3->part_bytes;
    /* S3 allows 10000 parts: a larger file gets larger parts. */
    if ((bytes + part - 1) / part > GP_S3_MAX_PARTS)
        part = (bytes + GP_S3_MAX_PARTS - 1) / GP_S3_MAX_PARTS;
    u->nparts = (uint32_t)((bytes + part - 1) / part);
    u->parts = graft__calloc(u->nparts, sizeof(*u->parts));
    if (u->parts == NULL)
        return GRAFT_ENOMEM;
    for (uint32_t i = 0; i < u->nparts; i++) {
        u->parts[i].num = i + 1;
        u->parts[i].off = (uint64_t)i * part;
        u->parts[i].len = GRAFT_MIN(part, bytes - u->parts[i].off);
    }
    graft_status_t st = create_upload(u, why, why_len);
    if (st == GRAFT_OK)
        st = upload_parts(u, why, why_len);
    if (st == GRAFT_OK)
        st = complete_upload(u, why, why_len);
    if (st != GRAFT_OK && u->id_enc != NULL && !u->lost)
        abort_upload(u);
    for (uint32_t i = 0; i < u->nparts; i++)
        graft_free(u->parts[i].resp.body);
    graft_free(u->parts);
    u->parts = NULL;
    curl_free(u->id_enc);
    u->id_enc = NULL;
    u->done = u->busy = 0;
    return st;
}

graft_status_t graft__s3_multipart(graft__s3_t *s3, const char *key, int fd, uint64_t bytes,
                                   char *why, size_t why_len)
{
    graft_status_t st = GRAFT_EIO;
    for (uint32_t round = 0; round < 3; round++) {
        upload_t u = {.s3 = s3, .key = key, .fd = fd};
        st = upload_once(&u, bytes, why, why_len);
        if (st == GRAFT_OK || !u.lost)
            return st;
        GRAFT_WARN(GRAFT_MOD_PERSIST, "%s: the store lost the multipart upload; beginning it "
                   "again", why);
    }
    return st;
}
