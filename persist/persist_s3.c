/*
 * A small S3 client over libcurl for the remote tier: configuration and
 * credentials, single-request objects, listing. The requests themselves
 * (signing, outcome, retries) are persist_s3_request.c's; multipart
 * uploads persist_s3_multi.c's.
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

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
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
