/*
 * Where the job's secret comes from (docs/SECURITY.md, "The job secret"):
 * GRAFT_JOB_SECRET in the environment (unset once read), else the file
 * job_secret_file names, else the job's `secret` record in etcd, which the
 * job's first process creates, and only where etcd is reached over https
 * with authentication or on loopback. The transfer handshake and the steady path's messages are keyed
 * with it. The secret is read here and nowhere else: it is not a setting
 * (so no configuration dump can print it), no message names more than where
 * it came from, and graft_destroy() wipes the runtime's copy.
 */
#include "runtime_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SECRET_ENV "GRAFT_JOB_SECRET"
/* A secret the job makes for itself. */
#define GENERATED_BYTES 32u

static graft_status_t secret_set(graft_runtime_t *rt, const uint8_t *bytes, size_t len,
                                 const char *source)
{
    if (bytes == NULL || len < GRAFT_TRANSFER_SECRET_MIN_BYTES ||
        len > GRAFT_TRANSFER_SECRET_MAX_BYTES) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "config: %s: the job secret has %zu bytes; it must have "
                    "%u to %u", source, len, GRAFT_TRANSFER_SECRET_MIN_BYTES,
                    GRAFT_TRANSFER_SECRET_MAX_BYTES);
        return GRAFT_EINVAL;
    }
    memcpy(rt->secret, bytes, len);
    rt->secret_len = len;
    return GRAFT_OK;
}

/* Up to cap bytes of fd into buf; *n_p == cap means there may be more. */
static graft_status_t read_all(int fd, uint8_t *buf, size_t cap, size_t *n_p)
{
    size_t n = 0;
    while (n < cap) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return GRAFT_ESYS;
        if (r == 0)
            break;
        n += (size_t)r;
    }
    *n_p = n;
    return GRAFT_OK;
}

/* A file that only its owner may read or write, as ssh wants of a private
 * key: checked on the open descriptor, so the file read is the file
 * checked. The trailing newline (and a carriage return before it) is not
 * part of the secret. */
static graft_status_t secret_from_file(graft_runtime_t *rt, const char *path)
{
    /* Room for the longest secret, its line end, and one byte to tell a
     * longer file. */
    uint8_t buf[GRAFT_TRANSFER_SECRET_MAX_BYTES + 3];
    size_t n = 0;
    graft_status_t st = GRAFT_EINVAL;
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "config: job_secret_file '%s': %s", path, strerror(errno));
        return GRAFT_EINVAL;
    }
    if (fstat(fd, &sb) != 0) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "config: job_secret_file '%s': %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "config: job_secret_file '%s': not a regular file", path);
        goto out;
    }
    if ((sb.st_mode & 077) != 0) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "config: job_secret_file '%s': mode %04o lets group or "
                    "others read or write it; refused (chmod 600 it)", path,
                    (unsigned)(sb.st_mode & 07777));
        goto out;
    }
    if (read_all(fd, buf, sizeof(buf), &n) != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "config: job_secret_file '%s': %s", path, strerror(errno));
        goto out;
    }
    if (n > 0 && buf[n - 1] == '\n') {
        n--;
        if (n > 0 && buf[n - 1] == '\r')
            n--;
    }
    char source[64 + 32];
    snprintf(source, sizeof(source), "job_secret_file '%.64s'", path);
    st = secret_set(rt, buf, n, source);
out:
    explicit_bzero(buf, sizeof(buf));
    close(fd);
    return st;
}

/* The job's record, created if absent in one transaction: the first
 * process's random bytes win, every later one (of any group, or the same
 * job restarted) reads them. */
static graft_status_t secret_from_etcd(graft_runtime_t *rt)
{
    uint8_t fresh[GENERATED_BYTES];
    uint8_t *val = NULL;
    size_t val_len = 0;
    graft_etcd_txn_result_t res = {0};
    char *key = graft__rt_key_secret(rt);
    graft_status_t st = key == NULL ? GRAFT_ENOMEM : graft__random_bytes(fresh, sizeof(fresh));
    if (st == GRAFT_OK)
        st = graft__rt_secret_encode(fresh, sizeof(fresh), &val, &val_len);
    if (st != GRAFT_OK)
        goto out;
    graft_etcd_compare_t absent = {.key = key, .target = GRAFT_ETCD_CMP_CREATE,
                                   .op = GRAFT_ETCD_CMP_EQUAL, .number = 0};
    graft_etcd_op_t put = {.type = GRAFT_ETCD_OP_PUT, .key = key, .value = val,
                           .value_len = val_len};
    graft_etcd_op_t get = {.type = GRAFT_ETCD_OP_RANGE, .key = key};
    st = graft_etcd_txn(rt->etcd, &absent, 1, &put, 1, &get, 1, &res);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "job secret: cannot read or create %s: %s", key,
                    graft_status_string(st));
        goto out;
    }
    if (res.succeeded) {
        GRAFT_INFO(GRAFT_MOD_RUNTIME, "job secret: created %s (the job's first start)", key);
        st = secret_set(rt, fresh, sizeof(fresh), key);
        goto out;
    }
    /* The compare failed, so the key existed when the same transaction
     * read it. */
    if (res.n_ranges != 1 || res.ranges[0].n_kvs != 1) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "job secret: %s exists but etcd returned no value", key);
        st = GRAFT_EMALFORMED;
        goto out;
    }
    graft_etcd_kv_t *kv = &res.ranges[0].kvs[0];
    st = graft__rt_secret_decode(kv->value, kv->value_len, rt->secret, sizeof(rt->secret),
                                 &rt->secret_len);
    if (kv->value != NULL)
        explicit_bzero(kv->value, kv->value_len);
    if (st != GRAFT_OK && st != GRAFT_ENOMEM)
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "job secret: %s does not hold a JobSecret this version "
                    "reads (%s); remove it only when no process of the job runs",
                    key, graft_status_string(st));
out:
    explicit_bzero(fresh, sizeof(fresh));
    if (val != NULL)
        explicit_bzero(val, val_len);
    graft_free(val);
    graft_etcd_txn_result_clear(&res);
    graft_free(key);
    return st;
}

/* The variable's bytes, then the variable is gone from the environment, so
 * that the processes this one starts do not inherit the secret. */
static graft_status_t secret_from_env(graft_runtime_t *rt, const char *env, const char *file)
{
    char copy[GRAFT_TRANSFER_SECRET_MAX_BYTES + 1];
    size_t len = strlen(env);
    if (file != NULL)
        GRAFT_INFO(GRAFT_MOD_RUNTIME, "job secret from " SECRET_ENV "; job_secret_file '%s' "
                   "not read", file);
    if (len < sizeof(copy))
        memcpy(copy, env, len);
    if (unsetenv(SECRET_ENV) != 0)
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "unsetenv " SECRET_ENV ": %s", strerror(errno));
    graft_status_t st = len < sizeof(copy) ? secret_set(rt, (const uint8_t *)copy, len, SECRET_ENV)
                                           : secret_set(rt, NULL, len, SECRET_ENV);
    explicit_bzero(copy, sizeof(copy));
    return st;
}

/* The job keeps its secret in etcd only where neither the network nor
 * whoever reaches etcd can read it (docs/SECURITY.md, "The job secret"). */
static graft_status_t secret_etcd_allowed(const graft_runtime_t *rt)
{
    const char *endpoint = NULL, *why = NULL;
    if (graft_etcd_config_is_private(&rt->etcd_cfg, &endpoint, &why))
        return GRAFT_OK;
    GRAFT_ERROR(GRAFT_MOD_RUNTIME, "job secret: neither " SECRET_ENV " nor job_secret_file "
                "gives it, and the job does not keep it in etcd at %s: %s. Give every process "
                "of the job the same secret (16 to 256 bytes) in a file only its owner can "
                "read, named by job_secret_file (GRAFT_JOB_SECRET_FILE), or in " SECRET_ENV
                "; or reach etcd over https with a user or a client certificate, or on "
                "loopback (docs/SECURITY.md)", endpoint, why);
    return GRAFT_EINVAL;
}

graft_status_t graft__rt_secret_load(graft_runtime_t *rt)
{
    const char *env = getenv(SECRET_ENV);
    const char *file = rt->cfg->job_secret_file;
    /* The setting it replaced was read from here too: say it is not. */
    if (getenv("GRAFT_JOB_TOKEN") != NULL)
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "GRAFT_JOB_TOKEN is no longer read: the job secret comes "
                   "from " SECRET_ENV ", job_secret_file or the job's record in etcd "
                   "(docs/SECURITY.md)");
    if (env != NULL)
        return secret_from_env(rt, env, file);
    if (file != NULL && file[0] != '\0')
        return secret_from_file(rt, file);
    graft_status_t allowed = secret_etcd_allowed(rt);
    if (allowed != GRAFT_OK)
        return allowed;
    /* A process started while etcd is away (restarting, electing a leader)
     * waits for it up to etcd_connect_timeout_ms (at most quorum_timeout_ms)
     * instead of failing its start; an etcd that is not there at all fails
     * the start within that bound, naming where it was looked for. */
    uint64_t wait_ms = GRAFT_MIN(rt->cfg->etcd_connect_timeout_ms, rt->cfg->quorum_timeout_ms);
    uint64_t deadline = graft__now_ns() + wait_ms * 1000000ull;
    uint64_t backoff = 50000000ull;
    for (;;) {
        graft_status_t st = secret_from_etcd(rt);
        if (st != GRAFT_EUNREACHABLE && st != GRAFT_EETCD_TIMEOUT)
            return st;
        if (graft__now_ns() + backoff >= deadline) {
            GRAFT_ERROR(GRAFT_MOD_RUNTIME, "etcd at %s did not answer within %llu ms "
                        "(etcd_connect_timeout_ms): %s", rt->cfg->etcd_endpoints,
                        (unsigned long long)wait_ms, graft_status_string(st));
            return st;
        }
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "job secret: etcd not answering (%s); asking again in %llu "
                   "ms", graft_status_string(st), (unsigned long long)(backoff / 1000000ull));
        graft__sleep_ns(backoff);
        backoff = GRAFT_MIN(backoff * 2, 1000000000ull);
    }
}
