/*
 * The S3 client's requests (persist_s3.h): one signed libcurl handle, the
 * response's body and headers, the outcome of a finished transfer, the
 * back-off between tries, and one request tried with retries or once. The
 * lowest floor of the client: persist_s3.c (objects, listing),
 * persist_s3_multi.c (multipart uploads), persist_s3_sweep.c (abandoned
 * uploads) and persist_s3_get.c (ranged downloads) call it, and it calls
 * none of them.
 */
#include "persist_s3.h"
#include "persist_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>

/* ------------------------------------------------------------- hashes --- */

void graft__s3_md5_b64(const void *data, size_t len, char out[32])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (EVP_Digest(data, len, md, &n, EVP_md5(), NULL) != 1)
        n = 0;
    EVP_EncodeBlock((unsigned char *)out, md, (int)n);
}

void graft__s3_hex(const unsigned char *md, unsigned int n, char out[65])
{
    out[0] = '\0';
    for (unsigned int i = 0; i < n && i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
}

/* "x-amz-content-sha256: <hex>": S3 wants the payload's hash as a header,
 * which libcurl 7.88 does not add (it signs every header we add). hex: the
 * hash computed already, or NULL. */
static void sha256_header(const void *data, size_t len, const char *hex, char out[96])
{
    char own[65] = "";
    if (hex == NULL) {
        unsigned char md[EVP_MAX_MD_SIZE];
        unsigned int n = 0;
        if (EVP_Digest(data != NULL ? data : "", len, md, &n, EVP_sha256(), NULL) != 1)
            n = 0;
        graft__s3_hex(md, n, own);
        hex = own;
    }
    snprintf(out, 96, "x-amz-content-sha256: %s", hex);
}

/* ------------------------------------------------------------ request --- */

static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
    graft__s3_resp_t *r = arg;
    size_t len = size * n;
    if (r->fd >= 0 && r->http >= 200 && r->http < 300) {
        if (r->at_offset && r->written + len > r->limit)
            return 0; /* more than the range asked: the transfer fails */
        for (size_t off = 0; off < len;) {
            ssize_t w = r->at_offset
                            ? pwrite(r->fd, data + off, len - off,
                                     (off_t)(r->offset + r->written + off))
                            : write(r->fd, data + off, len - off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                r->write_failed = true;
                return 0;
            }
            off += (size_t)w;
        }
        r->written += len;
        return len;
    }
    /* Error bodies (and small bodies) are kept, capped. */
    if (r->len + len + 1 > r->cap) {
        size_t cap = GRAFT_MAX(r->cap * 2, r->len + len + 1);
        if (cap > (64u << 20))
            return 0;
        char *b = graft__realloc(r->body, cap);
        if (b == NULL)
            return 0;
        r->body = b;
        r->cap = cap;
    }
    memcpy(r->body + r->len, data, len);
    r->len += len;
    r->body[r->len] = '\0';
    return len;
}

static size_t on_header(char *data, size_t size, size_t n, void *arg)
{
    graft__s3_resp_t *r = arg;
    size_t len = size * n;
    if (len > 5 && strncmp(data, "HTTP/", 5) == 0) {
        /* A new response (after a 100 Continue): the status line. */
        r->http = strtol(strchr(data, ' ') != NULL ? strchr(data, ' ') + 1 : data, NULL, 10);
    } else if (len > 5 && strncasecmp(data, "etag:", 5) == 0) {
        size_t i = 5;
        while (i < len && data[i] == ' ')
            i++;
        size_t e = len;
        while (e > i && (data[e - 1] == '\r' || data[e - 1] == '\n' || data[e - 1] == ' '))
            e--;
        snprintf(r->etag, sizeof(r->etag), "%.*s", (int)(e - i), data + i);
    } else if (len > 12 && strncasecmp(data, "retry-after:", 12) == 0) {
        r->retry_after_s = strtol(data + 12, NULL, 10);
    }
    return len;
}

void graft__s3_resp_reset(graft__s3_resp_t *r)
{
    r->http = 0;
    r->len = 0;
    if (r->body != NULL)
        r->body[0] = '\0';
    r->written = 0;
    r->write_failed = false;
    r->etag[0] = '\0';
    r->retry_after_s = 0;
}

/* Percent-encode a key, keeping '/' (S3's canonical URI does the same). */
static char *key_encode(const char *prefix, const char *key)
{
    size_t n = strlen(prefix) + strlen(key);
    char *out = graft__malloc(n * 3 + 1);
    if (out == NULL)
        return NULL;
    char *o = out;
    for (int pass = 0; pass < 2; pass++)
        for (const char *s = pass == 0 ? prefix : key; *s; s++) {
            unsigned char c = (unsigned char)*s;
            if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                c == '-' || c == '_' || c == '.' || c == '~' || c == '/')
                *o++ = (char)c;
            else
                o += sprintf(o, "%%%02X", c);
        }
    *o = '\0';
    return out;
}

void *graft__s3_easy(graft__s3_t *s3, const char *method, const char *key, const char *query,
                     const uint8_t *body, size_t body_len, const char *content_md5,
                     graft__s3_resp_t *resp, struct curl_slist **hdrs_p)
{
    return graft__s3_easy_hashed(s3, method, key, query, body, body_len, content_md5, NULL, resp,
                                 hdrs_p);
}

void *graft__s3_easy_hashed(graft__s3_t *s3, const char *method, const char *key,
                            const char *query, const uint8_t *body, size_t body_len,
                            const char *content_md5, const char *sha256_hex,
                            graft__s3_resp_t *resp, struct curl_slist **hdrs_p)
{
    char *path = key != NULL ? key_encode(s3->prefix, key) : graft__strdup("");
    char *url = path != NULL ? graft__asprintf("%s/%s%s%s", s3->base, path,
                                               query != NULL ? "?" : "", query != NULL ? query : "")
                             : NULL;
    graft_free(path);
    CURL *e = url != NULL ? curl_easy_init() : NULL;
    struct curl_slist *h = NULL;
    if (e == NULL) {
        graft_free(url);
        return NULL;
    }
    curl_easy_setopt(e, CURLOPT_URL, url);
    graft_free(url);
    curl_easy_setopt(e, CURLOPT_SHARE, s3->share);
    curl_easy_setopt(e, CURLOPT_AWS_SIGV4, s3->sigv4);
    curl_easy_setopt(e, CURLOPT_USERNAME, s3->access_key);
    curl_easy_setopt(e, CURLOPT_PASSWORD, s3->secret_key);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)s3->timeout_ms);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    if (strcmp(method, "HEAD") == 0)
        curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    else if (strcmp(method, "GET") != 0)
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    if (body != NULL || strcmp(method, "PUT") == 0 || strcmp(method, "POST") == 0) {
        /* POSTFIELDS: libcurl signs the payload's SHA-256 itself. */
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body != NULL ? (const char *)body : "");
    }
    char sha[96], md5[64] = "";
    sha256_header(body, body != NULL ? body_len : 0, sha256_hex, sha);
    if (content_md5 != NULL)
        snprintf(md5, sizeof(md5), "Content-MD5: %s", content_md5);
    /* No "Expect:" to suppress 100-continue: libcurl 7.88 would sign it as
     * an empty header it does not send, and AWS would refuse the
     * signature. */
    const char *lines[] = {"Content-Type: application/octet-stream", sha,
                           md5[0] != '\0' ? md5 : NULL, s3->token_header};
    bool ok = true;
    for (size_t i = 0; ok && i < GRAFT_ARRAY_SIZE(lines); i++) {
        if (lines[i] == NULL)
            continue;
        struct curl_slist *n = curl_slist_append(h, lines[i]);
        ok = n != NULL;
        h = n != NULL ? n : h;
    }
    if (!ok) {
        curl_slist_free_all(h);
        h = NULL;
    }
    if (h == NULL) {
        curl_easy_cleanup(e);
        return NULL;
    }
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, resp);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, resp);
    *hdrs_p = h;
    return e;
}

/* The text of <tag>...</tag> in xml, copied into out; false if absent. */
bool graft__s3_xml_tag(const char *xml, const char *tag, char *out, size_t out_len)
{
    char open[64];
    snprintf(open, sizeof(open), "<%s>", tag);
    const char *a = xml != NULL ? strstr(xml, open) : NULL;
    if (a == NULL)
        return false;
    a += strlen(open);
    const char *b = strchr(a, '<');
    if (b == NULL)
        return false;
    snprintf(out, out_len, "%.*s", (int)(b - a), a);
    return true;
}

graft_status_t graft__s3_outcome(const graft__s3_t *s3, int curl_code, const graft__s3_resp_t *r,
                                 const char *what, bool *retry_p, char *why, size_t why_len)
{
    *retry_p = false;
    if (curl_code != CURLE_OK) {
        if (r->write_failed) {
            snprintf(why, why_len, "%s: writing the download: %s", what, strerror(errno));
            return GRAFT_EIO;
        }
        *retry_p = true;
        if (curl_code == CURLE_OPERATION_TIMEDOUT)
            snprintf(why, why_len, "%s: no answer from %s within the request timeout "
                     "(timeout_ms %u)", what, s3->url, s3->timeout_ms);
        else
            snprintf(why, why_len, "%s: %s (store %s)", what,
                     curl_easy_strerror((CURLcode)curl_code), s3->base);
        return GRAFT_EIO;
    }
    char code[64] = "";
    char msg[160] = "";
    graft__s3_xml_tag(r->body, "Code", code, sizeof(code));
    graft__s3_xml_tag(r->body, "Message", msg, sizeof(msg));
    /* CompleteMultipartUpload may answer 200 with an error in its body. */
    if (r->http >= 200 && r->http < 300 && (r->body == NULL || strstr(r->body, "<Error>") == NULL))
        return GRAFT_OK;
    if (r->http == 404) {
        snprintf(why, why_len, "%s: not found in %s (%s)", what, s3->url,
                 code[0] ? code : "404");
        return GRAFT_ENOTFOUND;
    }
    if (r->http == 403 || r->http == 401) {
        snprintf(why, why_len, "%s: refused by %s: HTTP %ld %s%s%s (check AWS_ACCESS_KEY_ID, "
                 "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN and the region)",
                 what, s3->url, r->http, code, msg[0] ? ": " : "", msg);
        return GRAFT_EAUTH;
    }
    *retry_p = r->http >= 500 || r->http == 429 || r->http == 408 ||
               (r->http >= 200 && r->http < 300);
    snprintf(why, why_len, "%s: HTTP %ld %s%s%s", what, r->http, code, msg[0] ? ": " : "", msg);
    return GRAFT_EIO;
}

uint64_t graft__s3_backoff_ms(graft__s3_t *s3, uint32_t attempt, long retry_after_s)
{
    uint64_t cap_ms = (uint64_t)s3->backoff_ms << GRAFT_MIN(attempt - 1u, 10u);
    cap_ms = GRAFT_MIN(cap_ms, 20000u);
    uint32_t rnd = 0;
    if (graft__random_bytes(&rnd, sizeof(rnd)) != GRAFT_OK)
        rnd = (uint32_t)graft__now_ns();
    /* Half fixed, half jitter: spread the retries of many ranks. */
    uint64_t ms = cap_ms / 2 + rnd % (cap_ms / 2 + 1);
    if (retry_after_s > 0)
        ms = GRAFT_MAX(ms, (uint64_t)GRAFT_MIN(retry_after_s, 60L) * 1000u);
    atomic_fetch_add(&s3->retries, 1);
    return ms;
}

bool graft__s3_backoff(graft__s3_t *s3, uint32_t attempt, long retry_after_s)
{
    uint64_t ms = graft__s3_backoff_ms(s3, attempt, retry_after_s);
    for (uint64_t slept = 0; slept < ms; slept += 20) {
        if (s3->stop != NULL && atomic_load(s3->stop))
            return false;
        graft__sleep_ns(20u * 1000000u);
    }
    return true;
}

graft_status_t graft__s3_request(graft__s3_t *s3, const char *method, const char *key,
                              const char *query, const uint8_t *body, size_t body_len,
                              const char *md5, graft__s3_resp_t *resp, const char *what,
                              char *why, size_t why_len)
{
    graft_status_t st = GRAFT_EIO;
    for (uint32_t attempt = 0;; attempt++) {
        if (attempt > 0 && !graft__s3_backoff(s3, attempt, resp->retry_after_s))
            return GRAFT_ECANCELED;
        if (resp->fd >= 0 && (ftruncate(resp->fd, 0) != 0 || lseek(resp->fd, 0, SEEK_SET) != 0)) {
            snprintf(why, why_len, "%s: truncating the download: %s", what, strerror(errno));
            return GRAFT_EIO;
        }
        graft__s3_resp_reset(resp);
        struct curl_slist *h = NULL;
        CURL *e = graft__s3_easy(s3, method, key, query, body, body_len, md5, resp, &h);
        if (e == NULL) {
            snprintf(why, why_len, "%s: out of memory", what);
            return GRAFT_ENOMEM;
        }
        CURLcode cc = curl_easy_perform(e);
        curl_easy_cleanup(e);
        curl_slist_free_all(h);
        bool retry = false;
        st = graft__s3_outcome(s3, (int)cc, resp, what, &retry, why, why_len);
        if (st == GRAFT_OK && body != NULL)
            atomic_fetch_add(&s3->bytes_sent, body_len);
        if (st == GRAFT_OK || !retry || attempt >= s3->max_retries)
            return st;
        GRAFT_DEBUG(GRAFT_MOD_PERSIST, "%s (try %u, retrying)", why, attempt + 1);
    }
}

graft_status_t graft__s3_request_once(graft__s3_t *s3, const char *method, const char *key,
                                     const char *query, long timeout_ms,
                                     graft__s3_resp_t *resp, const char *what, char *why,
                                     size_t why_len)
{
    struct curl_slist *h = NULL;
    graft__s3_resp_reset(resp);
    CURL *e = graft__s3_easy(s3, method, key, query, NULL, 0, NULL, resp, &h);
    if (e == NULL) {
        curl_slist_free_all(h);
        snprintf(why, why_len, "%s: out of memory", what);
        return GRAFT_ENOMEM;
    }
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
    CURLcode cc = curl_easy_perform(e);
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    bool retry;
    return graft__s3_outcome(s3, (int)cc, resp, what, &retry, why, why_len);
}
