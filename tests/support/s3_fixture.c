/* A real S3-compatible server (moto_server) for tests; see s3_fixture.h. */
#include "s3_fixture.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

/* A free port below the ephemeral range: one that the system's own
 * choice (bind to port 0) gives may be taken by an outgoing connection
 * before the server binds it, or when it restarts (seen with tens of
 * thousands of connections in TIME_WAIT on a shared machine). */
static int free_port(void)
{
    int low = 32768, high = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f != NULL) {
        if (fscanf(f, "%d %d", &low, &high) != 2)
            low = 32768;
        fclose(f);
    }
    int lo = 10000, hi = low > 12000 ? low : 65535;
    if (low <= 12000)
        lo = high + 1 < 60000 ? high + 1 : 10000;
    unsigned seed = (unsigned)getpid() ^ (unsigned)time(NULL);
    for (int i = 0; i < 200; i++) {
        int port = lo + (int)(rand_r(&seed) % (unsigned)(hi - lo));
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int ok = s >= 0 && bind(s, (struct sockaddr *)&a, sizeof(a)) == 0;
        if (s >= 0)
            close(s);
        if (ok)
            return port;
    }
    return -1;
}

static int executable(const char *path)
{
    return access(path, X_OK) == 0;
}

/* The server is started from inside its temp dir: a relative path (BUILD
 * is "build" under make check) would no longer name it. */
static int found(graft_test_s3_t *t)
{
    char abs[PATH_MAX];
    if (realpath(t->server, abs) != NULL && strlen(abs) < sizeof(t->server))
        memcpy(t->server, abs, strlen(abs) + 1);
    return 0;
}

/* $GRAFT_MOTO_SERVER, then $BUILD/venv/bin/moto_server (build/venv when
 * BUILD is unset), then moto_server on the PATH. */
static int find_server(graft_test_s3_t *t)
{
    const char *env = getenv("GRAFT_MOTO_SERVER");
    if (env != NULL && env[0] != '\0' && executable(env)) {
        snprintf(t->server, sizeof(t->server), "%s", env);
        return found(t);
    }
    const char *build = getenv("BUILD");
    snprintf(t->server, sizeof(t->server), "%s/venv/bin/moto_server",
             build != NULL && build[0] != '\0' ? build : "build");
    if (executable(t->server))
        return found(t);
    const char *path = getenv("PATH");
    char *copy = strdup(path != NULL ? path : "");
    char *save = NULL;
    for (char *d = strtok_r(copy, ":", &save); d != NULL; d = strtok_r(NULL, ":", &save)) {
        snprintf(t->server, sizeof(t->server), "%s/moto_server", d);
        if (executable(t->server)) {
            free(copy);
            return 0;
        }
    }
    free(copy);
    snprintf(t->skip_reason, sizeof(t->skip_reason),
             "no moto_server (PyPI moto[server]): not in $GRAFT_MOTO_SERVER, %s/venv/bin or the "
             "PATH; `BUILD=%s sh scripts/python-env.sh` installs it from "
             "tests/python-requirements.txt",
             build != NULL ? build : "build", build != NULL ? build : "build");
    return 1;
}

typedef struct sink {
    char *data;
    size_t len;
} sink_t;

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
    sink_t *s = arg;
    char *d = realloc(s->data, s->len + size * n + 1);
    if (d == NULL)
        return 0;
    memcpy(d + s->len, p, size * n);
    s->data = d;
    s->len += size * n;
    d[s->len] = '\0';
    return size * n;
}

static long request(const graft_test_s3_t *t, const char *method, const char *key,
                    const uint8_t *body, size_t len, char **out_p, size_t *out_len_p);

static int spawn(graft_test_s3_t *t)
{
    char port[16];
    snprintf(port, sizeof(port), "%d", t->port);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        char log[300];
        snprintf(log, sizeof(log), "%s/moto.log", t->dir);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (chdir(t->dir) != 0)
            _exit(126);
        /* Requests are signed but not checked (moto's default), or checked
         * from the second one on (the first creates the bucket). */
        if (t->auth)
            setenv("INITIAL_NO_AUTH_ACTION_COUNT", t->auth == 2 ? "4" : "1", 1);
        else
            unsetenv("INITIAL_NO_AUTH_ACTION_COUNT");
        execl(t->server, t->server, "-H", "127.0.0.1", "-p", port, (char *)NULL);
        _exit(127);
    }
    t->pid = pid;
    /* Up when the bucket can be created (moto imports for a second or two;
     * much longer on a loaded machine). */
    for (int i = 0; i < 600; i++) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            char cmd[400];
            fprintf(stderr, "moto_server exited (status %d); the end of %s/moto.log:\n", status,
                    t->dir);
            snprintf(cmd, sizeof(cmd), "tail -5 '%s/moto.log' >&2", t->dir);
            if (system(cmd) != 0)
                fprintf(stderr, "(no log)\n");
            t->pid = 0;
            return -1;
        }
        long code = request(t, "PUT", NULL, NULL, 0, NULL, NULL);
        if (code == 200)
            return 0;
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "moto_server did not answer on port %d\n", t->port);
    graft_test_s3_kill(t);
    return -1;
}

static int start(graft_test_s3_t *t, const char *bucket, int auth)
{
    memset(t, 0, sizeof(*t));
    t->auth = auth;
    snprintf(t->key_id, sizeof(t->key_id), "%s", GRAFT_TEST_S3_KEY_ID);
    snprintf(t->secret, sizeof(t->secret), "%s", GRAFT_TEST_S3_SECRET);
    if (find_server(t) != 0)
        return 1;
    snprintf(t->dir, sizeof(t->dir), "%s/graft-s3.XXXXXX",
             getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(t->dir) == NULL) {
        perror("mkdtemp");
        return -1;
    }
    snprintf(t->bucket, sizeof(t->bucket), "%s", bucket);
    setenv("AWS_ACCESS_KEY_ID", GRAFT_TEST_S3_KEY_ID, 1);
    setenv("AWS_SECRET_ACCESS_KEY", GRAFT_TEST_S3_SECRET, 1);
    setenv("AWS_REGION", "us-east-1", 1);
    unsetenv("AWS_SESSION_TOKEN");
    /* A port found free may be taken before the server binds it (another
     * test's connection): then another one. */
    for (int attempt = 0; attempt < 5; attempt++) {
        t->port = free_port();
        if (t->port <= 0)
            return -1;
        snprintf(t->endpoint, sizeof(t->endpoint), "http://127.0.0.1:%d", t->port);
        if (spawn(t) == 0)
            return 0;
    }
    return -1;
}

int graft_test_s3_start(graft_test_s3_t *t, const char *bucket)
{
    return start(t, bucket, 0);
}

int graft_test_s3_setup(graft_test_s3_t *t, const char *bucket)
{
    int rc = start(t, bucket, 0);
    if (rc != 0)
        fprintf(stderr, "%s\n", rc > 0 ? t->skip_reason : "moto_server did not start");
    return rc;
}

/* One call of the server's IAM API (form-encoded), its answer in *out_p. */
static long iam(const graft_test_s3_t *t, const char *form, char **out_p)
{
    CURL *e = curl_easy_init();
    if (e == NULL)
        return -1;
    sink_t s = {0};
    curl_easy_setopt(e, CURLOPT_URL, t->endpoint);
    curl_easy_setopt(e, CURLOPT_AWS_SIGV4, "aws:amz:us-east-1:iam");
    curl_easy_setopt(e, CURLOPT_USERNAME, t->key_id);
    curl_easy_setopt(e, CURLOPT_PASSWORD, t->secret);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, form);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 20000L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &s);
    long code = -1;
    if (curl_easy_perform(e) == CURLE_OK)
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(e);
    *out_p = s.data;
    return code;
}

static void xml_text(const char *xml, const char *tag, char *out, size_t len)
{
    char open[64];
    snprintf(open, sizeof(open), "<%s>", tag);
    const char *a = xml != NULL ? strstr(xml, open) : NULL;
    const char *b = a != NULL ? strchr(a + strlen(open), '<') : NULL;
    if (b != NULL)
        snprintf(out, len, "%.*s", (int)(b - a - (long)strlen(open)), a + strlen(open));
}

int graft_test_s3_start_signed(graft_test_s3_t *t, const char *bucket)
{
    int rc = start(t, bucket, 2);
    if (rc != 0)
        return rc;
    static const char *const calls[] = {
        "Action=CreateUser&UserName=graft&Version=2010-05-08",
        "Action=PutUserPolicy&UserName=graft&PolicyName=all&Version=2010-05-08&PolicyDocument="
        "%7B%22Version%22%3A%222012-10-17%22%2C%22Statement%22%3A%5B%7B%22Effect%22%3A%22Allow"
        "%22%2C%22Action%22%3A%22*%22%2C%22Resource%22%3A%22*%22%7D%5D%7D",
        "Action=CreateAccessKey&UserName=graft&Version=2010-05-08"};
    char *out = NULL;
    for (size_t i = 0; i < 3; i++) {
        free(out);
        out = NULL;
        if (iam(t, calls[i], &out) != 200) {
            fprintf(stderr, "moto IAM %s: %s\n", calls[i], out != NULL ? out : "(no answer)");
            free(out);
            graft_test_s3_stop(t);
            return -1;
        }
    }
    xml_text(out, "AccessKeyId", t->key_id, sizeof(t->key_id));
    xml_text(out, "SecretAccessKey", t->secret, sizeof(t->secret));
    free(out);
    setenv("AWS_ACCESS_KEY_ID", t->key_id, 1);
    setenv("AWS_SECRET_ACCESS_KEY", t->secret, 1);
    return 0;
}

int graft_test_s3_start_auth(graft_test_s3_t *t, const char *bucket)
{
    return start(t, bucket, 1);
}

void graft_test_s3_kill(graft_test_s3_t *t)
{
    if (t->pid > 0) {
        kill(t->pid, SIGKILL);
        waitpid(t->pid, NULL, 0);
        t->pid = 0;
    }
}

int graft_test_s3_restart(graft_test_s3_t *t)
{
    graft_test_s3_kill(t);
    for (int attempt = 0; attempt < 5; attempt++) {
        if (spawn(t) == 0)
            return 0;
        struct timespec ts = {0, 300 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return -1;
}

void graft_test_s3_stop(graft_test_s3_t *t)
{
    graft_test_s3_kill(t);
    if (t->dir[0] != '\0') {
        char log[300];
        snprintf(log, sizeof(log), "%s/moto.log", t->dir);
        unlink(log);
        rmdir(t->dir);
    }
    memset(t, 0, sizeof(*t));
}

graft_persist_remote_config_t graft_test_s3_remote(const graft_test_s3_t *t, const char *prefix)
{
    static char url[2][256];
    static int which;
    which ^= 1;
    snprintf(url[which], sizeof(url[which]), "s3://%s/%s", t->bucket, prefix);
    graft_persist_remote_config_t r = {0};
    r.url = url[which];
    r.endpoint = t->endpoint;
    r.part_bytes = 5u << 20;
    r.parallel = 4;
    r.backoff_ms = 50;
    r.max_retries = 12;
    r.timeout_ms = 20000;
    return r;
}

/* One signed request to the bucket (key NULL: the bucket itself, or a
 * query when key starts with '?'). */
static long request(const graft_test_s3_t *t, const char *method, const char *key,
                    const uint8_t *body, size_t len, char **out_p, size_t *out_len_p)
{
    CURL *e = curl_easy_init();
    if (e == NULL)
        return -1;
    char url[1024];
    snprintf(url, sizeof(url), "%s/%s%s%s", t->endpoint, t->bucket,
             key != NULL && key[0] != '?' ? "/" : "", key != NULL ? key : "");
    sink_t s = {0};
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_AWS_SIGV4, "aws:amz:us-east-1:s3");
    curl_easy_setopt(e, CURLOPT_USERNAME, t->key_id);
    curl_easy_setopt(e, CURLOPT_PASSWORD, t->secret);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 20000L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    if (strcmp(method, "GET") != 0)
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    if (strcmp(method, "PUT") == 0) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body != NULL ? (const char *)body : "");
    }
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &s);
    /* Not curl's form type for a body: the store would read it as a form. */
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/octet-stream");
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    long code = -1;
    if (curl_easy_perform(e) == CURLE_OK)
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    if (out_p != NULL && code >= 0) {
        *out_p = s.data != NULL ? s.data : calloc(1, 1);
        if (out_len_p != NULL)
            *out_len_p = s.len;
    } else {
        free(s.data);
    }
    return code;
}

long graft_test_s3_get(const graft_test_s3_t *t, const char *key, uint8_t **data_p, size_t *len_p)
{
    return request(t, "GET", key, NULL, 0, (char **)data_p, len_p);
}

long graft_test_s3_put(const graft_test_s3_t *t, const char *key, const uint8_t *data, size_t len)
{
    return request(t, "PUT", key, data, len, NULL, NULL);
}

long graft_test_s3_delete(const graft_test_s3_t *t, const char *key)
{
    return request(t, "DELETE", key, NULL, 0, NULL, NULL);
}

char *graft_test_s3_keys(const graft_test_s3_t *t, const char *prefix)
{
    char q[512];
    snprintf(q, sizeof(q), "?list-type=2&prefix=%s", prefix);
    char *xml = NULL;
    if (request(t, "GET", q, NULL, 0, &xml, NULL) != 200) {
        free(xml);
        return NULL;
    }
    size_t cap = strlen(xml) + 1, n = 0;
    char *out = calloc(1, cap);
    for (const char *p = strstr(xml, "<Key>"); out != NULL && p != NULL;
         p = strstr(p, "<Key>")) {
        p += 5;
        const char *end = strstr(p, "</Key>");
        if (end == NULL)
            break;
        n += (size_t)snprintf(out + n, cap - n, "%.*s\n", (int)(end - p), p);
        p = end;
    }
    free(xml);
    return out;
}
