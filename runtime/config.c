/*
 * The runtime's configuration: one table of settings drives the setter, the
 * getter, the environment reader and the error messages, so a new setting is
 * one line here and one row in graft.h.
 */
#include <graft/graft.h>

#include "graft_internal.h"
#include "runtime_config.h"

#include <graft/persist.h>
#include <graft/transfer.h>

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FIELD_LEVEL: a FIELD_UINT in [min, max] that also takes "auto"
 * (GRAFT_PERSIST_LEVEL_AUTO, persist's adaptive compression).
 * FIELD_CHOICE: one of a list of words, stored as its index (an int).
 * FIELD_MODE: an octal file mode (persist's graft_persist_config_t::file_mode
 * rule: owner read and write, nothing outside 0666). */
typedef enum { FIELD_STRING, FIELD_UINT, FIELD_CHOICE, FIELD_LEVEL, FIELD_MODE } field_type_t;

typedef struct field {
    const char *name;
    field_type_t type;
    size_t offset;
    uint64_t min, max; /* FIELD_UINT and FIELD_LEVEL only */
    const char *initial; /* text form of the default, NULL: unset */
    const char *const *choices; /* FIELD_CHOICE only, NULL-terminated, index = value */
} field_t;

/* In the order of graft_mode_t and graft_transfer_backend_t. */
static const char *const mode_names[] = {"strict", "elastic", NULL};
static const char *const backend_names[] = {"ucx", "nccl", NULL};
static const char *const steady_names[] = {"peers", "etcd", NULL};
_Static_assert(sizeof(graft_mode_t) == sizeof(int) &&
                   sizeof(graft_transfer_backend_t) == sizeof(int) &&
                   sizeof(graft_steady_path_t) == sizeof(int),
               "FIELD_CHOICE settings are stored as an int");

#define STR(n) {#n, FIELD_STRING, offsetof(graft_config_t, n), 0, 0, NULL, NULL}
#define STRD(n, d) {#n, FIELD_STRING, offsetof(graft_config_t, n), 0, 0, d, NULL}
#define UINT(n, lo, hi, d) {#n, FIELD_UINT, offsetof(graft_config_t, n), lo, hi, d, NULL}
#define CHOICE(n, names) {#n, FIELD_CHOICE, offsetof(graft_config_t, n), 0, 0, names[0], names}

static const field_t fields[] = {
    STR(job),
    STRD(etcd_endpoints, "http://127.0.0.1:2379"),
    STR(etcd_user),
    STR(etcd_password),
    STR(etcd_ca),
    STR(etcd_cert),
    STR(etcd_key),
    UINT(group, 0, 1u << 20, NULL),
    UINT(spare, 0, 1, "0"),
    UINT(spare_follow, 0, 1, "0"),
    STR(spare_group),
    UINT(rank, 0, 1u << 20, "0"),
    UINT(ranks_per_group, 1, 1u << 20, "1"),
    UINT(groups, 1, 1u << 20, NULL),
    UINT(min_groups, 1, 1u << 20, NULL),
    CHOICE(mode, mode_names),
    UINT(lease_ttl_ms, 500, 3600000, "3000"),
    UINT(join_timeout_ms, 10, 3600000, "10000"),
    CHOICE(steady_path, steady_names),
    UINT(gather_timeout_ms, 0, 60000, "200"),
    STRD(transfer_address, "127.0.0.1:0"),
    STR(transfer_advertise),
    UINT(transfer_chunk_bytes, 4096, 1u << 30, "4194304"),
    UINT(transfer_max_recipients, 1, 1024, "4"),
    CHOICE(transfer_backend, backend_names),
    UINT(cuda_device, 0, 1023, "0"),
    STR(job_secret_file),
    STR(persist_root),
    UINT(persist_every, 1, UINT32_MAX, "100"),
    UINT(persist_keep_last, 1, 1u << 20, "3"),
    UINT(persist_milestone_every, 0, UINT32_MAX, "0"),
    STR(persist_second_root),
    STR(persist_remote),
    STR(persist_remote_endpoint),
    STR(persist_remote_region),
    UINT(persist_remote_keep_last, 0, 1u << 20, "0"),
    UINT(persist_final, 0, 1, "1"),
    UINT(drift_check_every, 0, UINT32_MAX, "0"),
    UINT(quorum_timeout_ms, 100, 86400000, "300000"),
    UINT(stall_timeout_ms, 100, 3600000, "5000"),
    UINT(transfer_timeout_ms, 0, 86400000, "0"),
    UINT(fence_timeout_ms, 10, 3600000, "30000"),
    UINT(etcd_connect_timeout_ms, 100, 86400000, "10000"),
    {"persist_compression", FIELD_LEVEL, offsetof(graft_config_t, persist_compression), 0, 19,
     "auto", NULL},
    {"persist_file_mode", FIELD_MODE, offsetof(graft_config_t, persist_file_mode), 0, 0, "0600",
     NULL},
};

#undef STR
#undef STRD
#undef UINT
#undef CHOICE

static const field_t *field_find(const char *name)
{
    for (size_t i = 0; i < GRAFT_ARRAY_SIZE(fields); i++)
        if (strcmp(fields[i].name, name) == 0)
            return &fields[i];
    return NULL;
}

static void error_set(char **error_p, const char *fmt, ...) GRAFT_PRINTF(2, 3);

static void error_set(char **error_p, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    if (error_p == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    *error_p = graft__strdup(msg);
}

graft_status_t graft_config_create(graft_config_t **config_p)
{
    graft_config_t *c = graft__calloc(1, sizeof(*c));
    if (c == NULL)
        return GRAFT_ENOMEM;
    for (size_t i = 0; i < GRAFT_ARRAY_SIZE(fields); i++) {
        if (fields[i].initial == NULL)
            continue;
        graft_status_t st = graft_config_set(c, fields[i].name, fields[i].initial, NULL);
        if (st != GRAFT_OK) {
            graft_config_destroy(c);
            return st;
        }
        /* Defaults do not count as "set by the user". */
        c->set_mask &= ~(1ull << i);
    }
    *config_p = c;
    return GRAFT_OK;
}

void graft_config_destroy(graft_config_t *config)
{
    if (config == NULL)
        return;
    for (size_t i = 0; i < GRAFT_ARRAY_SIZE(fields); i++)
        if (fields[i].type == FIELD_STRING)
            graft_free(*(char **)((char *)config + fields[i].offset));
    graft_free(config);
}

static graft_status_t parse_uint(const field_t *f, const char *value, uint64_t *out_p,
                                 char **error_p)
{
    char *end;
    errno = 0;
    while (isspace((unsigned char)*value))
        value++;
    if (*value == '-' || *value == '\0') {
        error_set(error_p, "config: %s: '%s' is not a non-negative integer%s", f->name, value,
                  f->type == FIELD_LEVEL ? " or auto" : "");
        return GRAFT_EINVAL;
    }
    unsigned long long v = strtoull(value, &end, 10);
    if (errno != 0 || *end != '\0') {
        error_set(error_p, "config: %s: '%s' is not a non-negative integer%s", f->name, value,
                  f->type == FIELD_LEVEL ? " or auto" : "");
        return GRAFT_EINVAL;
    }
    if (v < f->min || v > f->max) {
        error_set(error_p, "config: %s: %llu is out of range [%" PRIu64 ", %" PRIu64 "]",
                  f->name, v, f->min, f->max);
        return GRAFT_EINVAL;
    }
    *out_p = v;
    return GRAFT_OK;
}

graft_status_t graft_config_set(graft_config_t *config, const char *name, const char *value,
                                char **error_p)
{
    if (config == NULL || name == NULL || value == NULL) {
        error_set(error_p, "config: missing argument");
        return GRAFT_EINVAL;
    }
    const field_t *f = field_find(name);
    if (f == NULL) {
        error_set(error_p, "config: no setting named '%s'", name);
        return GRAFT_ENOTFOUND;
    }
    void *slot = (char *)config + f->offset;
    switch (f->type) {
    case FIELD_STRING: {
        char *copy = graft__strdup(value);
        if (copy == NULL)
            return GRAFT_ENOMEM;
        graft_free(*(char **)slot);
        *(char **)slot = copy;
        break;
    }
    case FIELD_LEVEL:
    case FIELD_UINT: {
        uint64_t v = GRAFT_PERSIST_LEVEL_AUTO;
        if (f->type != FIELD_LEVEL || strcmp(value, "auto") != 0) {
            graft_status_t st = parse_uint(f, value, &v, error_p);
            if (st != GRAFT_OK)
                return st;
        }
        *(uint64_t *)slot = v;
        break;
    }
    case FIELD_MODE: {
        char *end;
        errno = 0;
        unsigned long v = strtoul(value, &end, 8);
        if (value[0] < '0' || value[0] > '7' || errno != 0 || *end != '\0' ||
            (v & ~0666ul) != 0 || (v & 0600ul) != 0600ul) {
            error_set(error_p, "config: %s: '%s' is not an octal file mode with owner read and "
                      "write and no bit outside 0666 (e.g. 0600, 0640)", f->name, value);
            return GRAFT_EINVAL;
        }
        *(uint64_t *)slot = v;
        break;
    }
    case FIELD_CHOICE: {
        int i = 0;
        while (f->choices[i] != NULL && strcmp(value, f->choices[i]) != 0)
            i++;
        if (f->choices[i] == NULL) {
            char words[128] = "";
            for (int k = 0; f->choices[k] != NULL; k++)
                snprintf(words + strlen(words), sizeof(words) - strlen(words), "%s%s",
                         k == 0 ? "" : f->choices[k + 1] == NULL ? " or " : ", ", f->choices[k]);
            error_set(error_p, "config: %s: '%s' is not %s", f->name, value, words);
            return GRAFT_EINVAL;
        }
        *(int *)slot = i;
        break;
    }
    }
    config->set_mask |= 1ull << (size_t)(f - fields);
    return GRAFT_OK;
}

graft_status_t graft_config_get(const graft_config_t *config, const char *name, char **value_p)
{
    const field_t *f = field_find(name);
    if (config == NULL || f == NULL)
        return config == NULL ? GRAFT_EINVAL : GRAFT_ENOTFOUND;
    const void *slot = (const char *)config + f->offset;
    char *text = NULL;
    switch (f->type) {
    case FIELD_STRING: {
        const char *s = *(char *const *)slot;
        /* The password is never read back (so no dump of the settings
         * shows it): a fixed text says whether one is set. */
        if (s != NULL && f->offset == offsetof(graft_config_t, etcd_password))
            s = GRAFT_CONFIG_REDACTED;
        text = graft__strdup(s != NULL ? s : "");
        break;
    }
    case FIELD_UINT:
        text = (config->set_mask & (1ull << (size_t)(f - fields))) != 0 || f->initial != NULL
                   ? graft__asprintf("%" PRIu64, *(const uint64_t *)slot)
                   : graft__strdup("");
        break;
    case FIELD_LEVEL:
        text = *(const uint64_t *)slot == GRAFT_PERSIST_LEVEL_AUTO
                   ? graft__strdup("auto")
                   : graft__asprintf("%" PRIu64, *(const uint64_t *)slot);
        break;
    case FIELD_CHOICE:
        text = graft__strdup(f->choices[*(const int *)slot]);
        break;
    case FIELD_MODE:
        text = graft__asprintf("%04" PRIo64, *(const uint64_t *)slot);
        break;
    }
    if (text == NULL)
        return GRAFT_ENOMEM;
    *value_p = text;
    return GRAFT_OK;
}

graft_status_t graft_config_from_env(graft_config_t *config, char **error_p)
{
    for (size_t i = 0; i < GRAFT_ARRAY_SIZE(fields); i++) {
        char env[64] = "GRAFT_";
        size_t n = strlen(env);
        for (const char *p = fields[i].name; *p != '\0' && n + 1 < sizeof(env); p++)
            env[n++] = (char)toupper((unsigned char)*p);
        env[n] = '\0';
        const char *value = getenv(env);
        if (value == NULL)
            continue;
        char *inner = NULL;
        graft_status_t st = graft_config_set(config, fields[i].name, value, &inner);
        if (st != GRAFT_OK) {
            error_set(error_p, "%s: %s", env, inner != NULL ? inner : "invalid");
            graft_free(inner);
            return st;
        }
    }
    return GRAFT_OK;
}

static bool is_set(const graft_config_t *c, const char *name)
{
    const field_t *f = field_find(name);
    return f != NULL && (c->set_mask & (1ull << (size_t)(f - fields))) != 0;
}

uint64_t graft__config_min_groups(const graft_config_t *c)
{
    return is_set(c, "min_groups") ? c->min_groups : c->groups;
}

/* Every comma-separated etcd endpoint is an http:// or https:// URL (the
 * etcd client refuses others; say so here, where the message reaches the
 * caller, not only the log). */
static graft_status_t endpoints_check(const char *list, char **error_p)
{
    for (const char *p = list; *p != '\0';) {
        size_t len = strcspn(p, ",");
        if (len > 0 && strncmp(p, "http://", 7) != 0 && strncmp(p, "https://", 8) != 0) {
            error_set(error_p, "config: etcd_endpoints: '%.*s' is not an http(s) URL "
                               "(write http://%.*s)", (int)len, p, (int)len, p);
            return GRAFT_EINVAL;
        }
        p += len;
        if (*p == ',')
            p++;
    }
    return GRAFT_OK;
}

/* A name etcd keys and records may carry: [A-Za-z0-9_.-]{1,64}. */
static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '-' || ch == '.'))
            return false;
    }
    return true;
}

graft_status_t graft_config_validate(const graft_config_t *c, char **error_p)
{
    if (c == NULL)
        return GRAFT_EINVAL;
    if (c->job == NULL || c->job[0] == '\0' || strchr(c->job, '/') != NULL) {
        error_set(error_p, "config: job: required, and must not contain '/'");
        return GRAFT_EINVAL;
    }
    if (!is_set(c, "groups")) {
        error_set(error_p, "config: groups: required (number of replica groups)");
        return GRAFT_EINVAL;
    }
    if (!is_set(c, "group") && c->spare == 0) {
        error_set(error_p, "config: group: required (this process's group id), unless the "
                           "process is a spare (spare = 1)");
        return GRAFT_EINVAL;
    }
    if (c->spare_follow != 0 && c->spare == 0) {
        error_set(error_p, "config: spare_follow: only a spare follows (spare = 1)");
        return GRAFT_EINVAL;
    }
    if (c->spare_group != NULL && !name_ok(c->spare_group)) {
        error_set(error_p, "config: spare_group: [A-Za-z0-9_.-]{1,64} (one name per world "
                           "of spares)");
        return GRAFT_EINVAL;
    }
    if (c->spare == 0 && c->group >= c->groups) {
        error_set(error_p, "config: group: must be below groups");
        return GRAFT_EINVAL;
    }
    if (c->rank >= c->ranks_per_group) {
        error_set(error_p, "config: rank: must be below ranks_per_group");
        return GRAFT_EINVAL;
    }
    if (c->etcd_endpoints == NULL || c->etcd_endpoints[0] == '\0') {
        error_set(error_p, "config: etcd_endpoints: required");
        return GRAFT_EINVAL;
    }
    if (endpoints_check(c->etcd_endpoints, error_p) != GRAFT_OK)
        return GRAFT_EINVAL;
    if ((c->etcd_user == NULL) != (c->etcd_password == NULL)) {
        error_set(error_p, "config: %s: %s", c->etcd_user == NULL ? "etcd_user" : "etcd_password",
                  "etcd_user and etcd_password go together");
        return GRAFT_EINVAL;
    }
    if ((c->etcd_cert == NULL) != (c->etcd_key == NULL)) {
        error_set(error_p, "config: %s: %s", c->etcd_cert == NULL ? "etcd_cert" : "etcd_key",
                  "etcd_cert and etcd_key go together");
        return GRAFT_EINVAL;
    }
    uint64_t min_groups = is_set(c, "min_groups") ? c->min_groups : c->groups;
    if (c->mode == GRAFT_MODE_STRICT && min_groups != c->groups) {
        error_set(error_p, "config: min_groups: strict mode needs min_groups == groups "
                           "(use mode=elastic for fewer)");
        return GRAFT_EINVAL;
    }
    if (min_groups > c->groups) {
        error_set(error_p, "config: min_groups: must not exceed groups");
        return GRAFT_EINVAL;
    }
    if (c->join_timeout_ms < c->lease_ttl_ms / 3) {
        error_set(error_p, "config: join_timeout_ms: must be at least lease_ttl_ms / 3 "
                           "so a live group is not left out");
        return GRAFT_EINVAL;
    }
#ifndef GRAFT_HAVE_CUDA
    if (c->transfer_backend == GRAFT_TRANSFER_BACKEND_NCCL) {
        error_set(error_p, "config: transfer_backend: nccl needs a build with CUDA and NCCL "
                           "(this one has neither)");
        return GRAFT_EINVAL;
    }
#endif
    if (c->persist_second_root != NULL && c->persist_root == NULL) {
        error_set(error_p, "config: persist_second_root: needs persist_root");
        return GRAFT_EINVAL;
    }
    if (c->persist_remote != NULL && c->persist_root == NULL) {
        error_set(error_p, "config: persist_remote: needs persist_root (the local tier "
                           "comes first)");
        return GRAFT_EINVAL;
    }
    if (c->persist_remote != NULL && strncmp(c->persist_remote, "s3://", 5) != 0) {
        error_set(error_p, "config: persist_remote: not an s3://bucket[/prefix] URL");
        return GRAFT_EINVAL;
    }
    return GRAFT_OK;
}
