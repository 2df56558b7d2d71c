/*
 * A small S3 client over libcurl for the remote tier: configuration and
 * credentials, one signed request with retries, single-request objects,
 * listing. Multipart uploads are in persist_s3_multi.c.
 */
#include "persist_s3.h"
#include "persist_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

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

/* ------------------------------------------------------ configuration --- */

static const char *env_or(const char *v, const char *name)
{
    if (v != NULL && v[0] != '\0')
        return v;
    const char *e = getenv(name);
    return e != NULL && e[0] != '\0' ? e : NULL;
}

/* Trimmed value of "key = value" on line, or NULL. */
static char *ini_value(char *line, const char *key)
{
    size_t kl = strlen(key);
    while (*line == ' ' || *line == '\t')
        line++;
    if (strncmp(line, key, kl) != 0)
        return NULL;
    line += kl;
    while (*line == ' ' || *line == '\t')
        line++;
    if (*line != '=')
        return NULL;
    line++;
    while (*line == ' ' || *line == '\t')
        line++;
    size_t n = strcspn(line, "\r\n");
    while (n > 0 && (line[n - 1] == ' ' || line[n - 1] == '\t'))
        n--;
    line[n] = '\0';
    return line;
}

/* Read the profile's keys from an AWS credentials file. */
static void creds_file(graft__s3_t *s3, const char *path, const char *profile)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char line[1024];
    char want[300];
    snprintf(want, sizeof(want), "[%s]", profile);
    bool in = false;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (line[0] == '[') {
            in = strncmp(line, want, strlen(want)) == 0;
            continue;
        }
        if (!in)
            continue;
        char *v;
        if ((v = ini_value(line, "aws_access_key_id")) != NULL && s3->access_key == NULL)
            s3->access_key = graft__strdup(v);
        else if ((v = ini_value(line, "aws_secret_access_key")) != NULL && s3->secret_key == NULL)
            s3->secret_key = graft__strdup(v);
        else if ((v = ini_value(line, "aws_session_token")) != NULL && s3->token_header == NULL)
            s3->token_header = graft__asprintf("x-amz-security-token: %s", v);
    }
    fclose(f);
}

static graft_status_t resolve_credentials(graft__s3_t *s3, const graft_persist_remote_config_t *cfg,
                                          char *why, size_t why_len)
{
    const char *id = env_or(NULL, "AWS_ACCESS_KEY_ID");
    const char *secret = env_or(NULL, "AWS_SECRET_ACCESS_KEY");
    const char *token = env_or(NULL, "AWS_SESSION_TOKEN");
    if (id != NULL || secret != NULL) {
        if (id == NULL || secret == NULL) {
            snprintf(why, why_len, "%s: %s is set but %s is not", s3->url,
                     id != NULL ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                     id != NULL ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
            return GRAFT_EINVAL;
        }
        s3->access_key = graft__strdup(id);
        s3->secret_key = graft__strdup(secret);
        if (token != NULL)
            s3->token_header = graft__asprintf("x-amz-security-token: %s", token);
        return s3->access_key != NULL && s3->secret_key != NULL ? GRAFT_OK : GRAFT_ENOMEM;
    }
    const char *file = env_or(cfg->credentials_file, "AWS_SHARED_CREDENTIALS_FILE");
    const char *profile = env_or(cfg->profile, "AWS_PROFILE");
    const char *home = getenv("HOME");
    char *path = file != NULL ? graft__strdup(file)
                              : graft__asprintf("%s/.aws/credentials", home != NULL ? home : "");
    if (path == NULL)
        return GRAFT_ENOMEM;
    if (profile == NULL)
        profile = "default";
    creds_file(s3, path, profile);
    graft_status_t st = GRAFT_OK;
    if (s3->access_key == NULL || s3->secret_key == NULL) {
        snprintf(why, why_len,
                 "%s: no credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set, "
                 "and %s has no [%s] profile with %s",
                 s3->url, path, profile,
                 s3->access_key == NULL ? "aws_access_key_id" : "aws_secret_access_key");
        st = GRAFT_EINVAL;
    }
    graft_free(path);
    return st;
}

/* s3://bucket/prefix -> bucket and prefix ("" or ending in '/'). */
static graft_status_t parse_url(graft__s3_t *s3, const char *url, char *why, size_t why_len)
{
    if (url == NULL || strncmp(url, "s3://", 5) != 0 || url[5] == '\0' || url[5] == '/') {
        snprintf(why, why_len, "persist_remote '%s': not an s3://bucket[/prefix] URL",
                 url != NULL ? url : "(null)");
        return GRAFT_EINVAL;
    }
    const char *b = url + 5;
    size_t bl = strcspn(b, "/");
    for (size_t i = 0; i < bl; i++)
        if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '-' ||
              b[i] == '.')) {
            snprintf(why, why_len, "persist_remote '%s': bad bucket name", url);
            return GRAFT_EINVAL;
        }
    s3->bucket = graft__strndup(b, bl);
    const char *p = b[bl] == '/' ? b + bl + 1 : b + bl;
    size_t pl = strlen(p);
    while (pl > 0 && p[pl - 1] == '/')
        pl--;
    for (size_t i = 0; i < pl; i++)
        if ((unsigned char)p[i] < 0x21 || strchr("?#%\\\"<>&", p[i]) != NULL) {
            snprintf(why, why_len, "persist_remote '%s': unsupported character in the prefix",
                     url);
            return GRAFT_EINVAL;
        }
    s3->prefix = pl == 0 ? graft__strdup("") : graft__asprintf("%.*s/", (int)pl, p);
    return s3->bucket != NULL && s3->prefix != NULL ? GRAFT_OK : GRAFT_ENOMEM;
}

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *arg)
{
    graft__s3_t *s3 = arg;
    pthread_mutex_lock(&s3->locks[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *arg)
{
    graft__s3_t *s3 = arg;
    pthread_mutex_unlock(&s3->locks[data]);
}

static graft_status_t share_make(graft__s3_t *s3)
{
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&s3->locks[i], NULL);
    pthread_mutex_init(&s3->orphans_mu, NULL);
    s3->locks_made = true;
    s3->share = curl_share_init();
    if (s3->share == NULL)
        return GRAFT_ENOMEM;
    if (curl_share_setopt(s3->share, CURLSHOPT_LOCKFUNC, share_lock) != CURLSHE_OK ||
        curl_share_setopt(s3->share, CURLSHOPT_UNLOCKFUNC, share_unlock) != CURLSHE_OK ||
        curl_share_setopt(s3->share, CURLSHOPT_USERDATA, s3) != CURLSHE_OK ||
        curl_share_setopt(s3->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT) != CURLSHE_OK ||
        curl_share_setopt(s3->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS) != CURLSHE_OK ||
        curl_share_setopt(s3->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION) != CURLSHE_OK)
        return GRAFT_EINTERNAL;
    return GRAFT_OK;
}

graft_status_t graft__s3_url_check(const char *url, char *why, size_t why_len)
{
    graft__s3_t tmp = {0};
    graft_status_t st = parse_url(&tmp, url, why, why_len);
    graft_free(tmp.bucket);
    graft_free(tmp.prefix);
    return st;
}

graft_status_t graft__s3_create(const graft_persist_remote_config_t *cfg, graft__s3_t **s3_p,
                                char *why, size_t why_len)
{
    graft_status_t st;
    if (cfg == NULL || s3_p == NULL)
        return GRAFT_EINVAL;
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK) {
        snprintf(why, why_len, "curl_global_init: %s", curl_easy_strerror(curl_init_rc));
        return GRAFT_EINTERNAL;
    }
    graft__s3_t *s3 = graft__calloc(1, sizeof(*s3));
    if (s3 == NULL)
        return GRAFT_ENOMEM;
    s3->url = graft__strdup(cfg->url != NULL ? cfg->url : "");
    if (s3->url == NULL) {
        st = GRAFT_ENOMEM;
        goto fail;
    }
    st = parse_url(s3, cfg->url, why, why_len);
    if (st != GRAFT_OK)
        goto fail;
    const char *region = env_or(cfg->region, "AWS_REGION");
    region = region != NULL ? region : env_or(NULL, "AWS_DEFAULT_REGION");
    s3->region = graft__strdup(region != NULL ? region : "us-east-1");
    const char *ep = env_or(cfg->endpoint, "AWS_ENDPOINT_URL_S3");
    ep = ep != NULL ? ep : env_or(NULL, "AWS_ENDPOINT_URL");
    if (ep != NULL && strncmp(ep, "http://", 7) != 0 && strncmp(ep, "https://", 8) != 0) {
        snprintf(why, why_len, "persist_remote_endpoint '%s': not an http:// or https:// URL", ep);
        st = GRAFT_EINVAL;
        goto fail;
    }
    /* A custom endpoint gets path-style URLs (what S3-compatible stores
     * serve); AWS itself the virtual-hosted style. */
    if (ep != NULL) {
        size_t el = strlen(ep);
        while (el > 0 && ep[el - 1] == '/')
            el--;
        s3->base = graft__asprintf("%.*s/%s", (int)el, ep, s3->bucket);
    } else {
        s3->base = graft__asprintf("https://%s.s3.%s.amazonaws.com", s3->bucket,
                                   s3->region != NULL ? s3->region : "");
    }
    s3->sigv4 = graft__asprintf("aws:amz:%s:s3", s3->region != NULL ? s3->region : "");
    if (s3->region == NULL || s3->base == NULL || s3->sigv4 == NULL) {
        st = GRAFT_ENOMEM;
        goto fail;
    }
    st = resolve_credentials(s3, cfg, why, why_len);
    if (st != GRAFT_OK)
        goto fail;
    s3->part_bytes = cfg->part_bytes != 0 ? cfg->part_bytes : GP_S3_DEFAULT_PART_BYTES;
    if (s3->part_bytes < GP_S3_MIN_PART_BYTES || s3->part_bytes > GP_S3_MAX_PART_BYTES) {
        snprintf(why, why_len, "persist_remote part size %llu: must be 5 MiB..5 GiB",
                 (unsigned long long)s3->part_bytes);
        st = GRAFT_EINVAL;
        goto fail;
    }
    s3->parallel = cfg->parallel != 0 ? GRAFT_MIN(cfg->parallel, 64u) : 8u;
    s3->max_retries = cfg->max_retries != 0 ? cfg->max_retries : 8u;
    s3->backoff_ms = cfg->backoff_ms != 0 ? cfg->backoff_ms : 200u;
    s3->timeout_ms = cfg->timeout_ms != 0 ? cfg->timeout_ms : 60000u;
    st = share_make(s3);
    if (st != GRAFT_OK) {
        snprintf(why, why_len, "curl_share_init: %s", graft_status_string(st));
        goto fail;
    }
    *s3_p = s3;
    return GRAFT_OK;
fail:
    graft__s3_destroy(s3);
    return st;
}

void graft__s3_destroy(graft__s3_t *s3)
{
    if (s3 == NULL)
        return;
    if (s3->share != NULL)
        curl_share_cleanup(s3->share);
    for (int i = 0; s3->locks_made && i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_destroy(&s3->locks[i]);
    if (s3->locks_made)
        pthread_mutex_destroy(&s3->orphans_mu);
    if (s3->secret_key != NULL)
        memset(s3->secret_key, 0, strlen(s3->secret_key));
    graft_free(s3->url);
    graft_free(s3->bucket);
    graft_free(s3->prefix);
    graft_free(s3->base);
    graft_free(s3->region);
    graft_free(s3->sigv4);
    graft_free(s3->access_key);
    graft_free(s3->secret_key);
    graft_free(s3->token_header);
    graft_free(s3);
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

graft_status_t graft__s3_put_bytes(graft__s3_t *s3, const char *key, const uint8_t *data,
                                   size_t len, char *why, size_t why_len)
{
    char md5[32];
    graft__s3_md5_b64(data, len, md5);
    graft__s3_resp_t r = {.fd = -1};
    char what[300];
    snprintf(what, sizeof(what), "PUT %s%s", s3->prefix, key);
    graft_status_t st = graft__s3_request(s3, "PUT", key, NULL, data, len, md5, &r, what, why, why_len);
    graft_free(r.body);
    return st;
}

graft_status_t graft__s3_put_file(graft__s3_t *s3, const char *key, int fd, uint64_t bytes,
                                  char *why, size_t why_len)
{
    if (bytes > s3->part_bytes)
        return graft__s3_multipart(s3, key, fd, bytes, why, why_len);
    uint8_t *buf = graft__malloc(bytes > 0 ? bytes : 1);
    if (buf == NULL)
        return GRAFT_ENOMEM;
    graft_status_t st = GRAFT_OK;
    ssize_t got = pread(fd, buf, bytes, 0);
    if (got < 0 || (uint64_t)got != bytes) {
        snprintf(why, why_len, "%s: reading the local file: %s", key,
                 got < 0 ? strerror(errno) : "short read");
        st = GRAFT_EIO;
    }
    if (st == GRAFT_OK)
        st = graft__s3_put_bytes(s3, key, buf, bytes, why, why_len);
    graft_free(buf);
    return st;
}

graft_status_t graft__s3_get_file(graft__s3_t *s3, const char *key, int fd, uint64_t *bytes_p,
                                  char *why, size_t why_len)
{
    graft__s3_resp_t r = {.fd = fd};
    char what[300];
    snprintf(what, sizeof(what), "GET %s%s", s3->prefix, key);
    graft_status_t st = graft__s3_request(s3, "GET", key, NULL, NULL, 0, NULL, &r, what, why, why_len);
    if (st == GRAFT_OK && bytes_p != NULL)
        *bytes_p = r.written;
    graft_free(r.body);
    return st;
}

graft_status_t graft__s3_head(graft__s3_t *s3, const char *key, uint64_t *bytes_p, char *why,
                              size_t why_len)
{
    graft__s3_resp_t r = {.fd = -1};
    char what[300];
    snprintf(what, sizeof(what), "HEAD %s%s", s3->prefix, key);
    struct curl_slist *h = NULL;
    graft_status_t st = GRAFT_EIO;
    for (uint32_t attempt = 0;; attempt++) {
        if (attempt > 0 && !graft__s3_backoff(s3, attempt, r.retry_after_s)) {
            st = GRAFT_ECANCELED;
            break;
        }
        graft__s3_resp_reset(&r);
        CURL *e = graft__s3_easy(s3, "HEAD", key, NULL, NULL, 0, NULL, &r, &h);
        if (e == NULL) {
            st = GRAFT_ENOMEM;
            break;
        }
        CURLcode cc = curl_easy_perform(e);
        curl_off_t len = -1;
        curl_easy_getinfo(e, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &len);
        curl_easy_cleanup(e);
        curl_slist_free_all(h);
        bool retry = false;
        st = graft__s3_outcome(s3, (int)cc, &r, what, &retry, why, why_len);
        if (st == GRAFT_OK && bytes_p != NULL)
            *bytes_p = len >= 0 ? (uint64_t)len : 0;
        if (st == GRAFT_OK || !retry || attempt >= s3->max_retries)
            break;
    }
    graft_free(r.body);
    return st;
}

graft_status_t graft__s3_delete(graft__s3_t *s3, const char *key, char *why, size_t why_len)
{
    graft__s3_resp_t r = {.fd = -1};
    char what[300];
    snprintf(what, sizeof(what), "DELETE %s%s", s3->prefix, key);
    graft_status_t st = graft__s3_request(s3, "DELETE", key, NULL, NULL, 0, NULL, &r, what, why, why_len);
    graft_free(r.body);
    return st;
}

void graft__s3_keys_free(char **keys, size_t n)
{
    for (size_t i = 0; keys != NULL && i < n; i++)
        graft_free(keys[i]);
    graft_free(keys);
}

/* Append every <Key> of a ListObjectsV2 page, relative to the prefix. */
static graft_status_t list_page(graft__s3_t *s3, const char *xml, char ***keys_p, size_t *n_p)
{
    size_t pl = strlen(s3->prefix);
    for (const char *p = strstr(xml, "<Key>"); p != NULL; p = strstr(p, "<Key>")) {
        p += 5;
        const char *q = strstr(p, "</Key>");
        if (q == NULL)
            break;
        if ((size_t)(q - p) > pl && strncmp(p, s3->prefix, pl) == 0) {
            char **k = graft__realloc(*keys_p, (*n_p + 1) * sizeof(*k));
            if (k == NULL)
                return GRAFT_ENOMEM;
            *keys_p = k;
            k[*n_p] = graft__strndup(p + pl, (size_t)(q - p) - pl);
            if (k[*n_p] == NULL)
                return GRAFT_ENOMEM;
            (*n_p)++;
        }
        p = q;
    }
    return GRAFT_OK;
}

graft_status_t graft__s3_list(graft__s3_t *s3, const char *sub, char ***keys_p, size_t *n_p,
                              char *why, size_t why_len)
{
    graft_status_t st = GRAFT_OK;
    char **keys = NULL;
    size_t n = 0;
    /* Keys and the prefix hold only characters that need no escaping in a
     * query (parse_url() refuses the others), and libcurl 7.88 escapes the
     * canonical query itself: values go as they are. Pages continue with
     * start-after (our own key) rather than an opaque token that would
     * need escaping. */
    char *enc_prefix = graft__asprintf("%s%s", s3->prefix, sub);
    char after[1024] = "";
    graft__s3_resp_t r = {.fd = -1};
    char what[300];
    snprintf(what, sizeof(what), "LIST %s%s", s3->prefix, sub);
    if (enc_prefix == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    for (;;) {
        /* Parameters in sorted order, as SigV4 signs them. */
        char *query = graft__asprintf("list-type=2&prefix=%s%s%s", enc_prefix,
                                      after[0] ? "&start-after=" : "", after);
        if (query == NULL) {
            st = GRAFT_ENOMEM;
            goto out;
        }
        st = graft__s3_request(s3, "GET", NULL, query, NULL, 0, NULL, &r, what, why, why_len);
        graft_free(query);
        size_t before = n;
        if (st == GRAFT_OK)
            st = list_page(s3, r.body != NULL ? r.body : "", &keys, &n);
        if (st != GRAFT_OK)
            goto out;
        char trunc[16] = "";
        graft__s3_xml_tag(r.body, "IsTruncated", trunc, sizeof(trunc));
        if (strcmp(trunc, "true") != 0 || n == before)
            break;
        snprintf(after, sizeof(after), "%s%s", s3->prefix, keys[n - 1]);
    }
out:
    graft_free(enc_prefix);
    graft_free(r.body);
    if (st != GRAFT_OK) {
        graft__s3_keys_free(keys, n);
        return st;
    }
    *keys_p = keys;
    *n_p = n;
    return GRAFT_OK;
}
