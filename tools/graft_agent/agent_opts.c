/*
 * graft-agent: options and environment (flags win over the GRAFT_*
 * variables, which are the trainers' own), and --help. Parsing only: no
 * process is started here.
 */
#include "agent.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char help_text[] =
    "usage: graft-agent [options] -- TRAINER [ARGS...]\n"
    "\n"
    "Runs this host's part of a graft job: the ranks of one replica group\n"
    "(one process each, GRAFT_GROUP and GRAFT_RANK set), or with --launcher one\n"
    "command per group world (torchrun ...). Keeps --spares N spares warm\n"
    "(GRAFT_SPARE=1), restarts what dies with exponential back-off (as a spare\n"
    "when spares are kept: a spare may hold the dead rank's slot already), sees\n"
    "in etcd which spare took a slot, and ends when its processes end with 0.\n"
    "\n"
    "The job (flags win over the environment):\n"
    "  --job NAME              GRAFT_JOB (needed with --spares)\n"
    "  --etcd URL[,URL...]     GRAFT_ETCD_ENDPOINTS (default http://127.0.0.1:2379)\n"
    "  --group G               GRAFT_GROUP: the group this host runs; none: spares only\n"
    "  --ranks LIST            this host's ranks, e.g. 0-3 or 0,2 (default: every\n"
    "                          rank 0..R-1, or GRAFT_RANK when R is unknown)\n"
    "  --ranks-per-group R     GRAFT_RANKS_PER_GROUP (passed to the trainers)\n"
    "  --groups N              GRAFT_GROUPS (passed to the trainers)\n"
    "  --spares N              GRAFT_AGENT_SPARES: spares kept per rank of this host\n"
    "                          (with --launcher: spare worlds); default 0\n"
    "  --follow                the spares are follow spares (GRAFT_SPARE_FOLLOW=1):\n"
    "                          each pulls every step while it waits (docs/RUNTIME.md)\n"
    "  --launcher              the command starts a whole group world; it is\n"
    "                          started once (per spare world too) and restarted whole\n"
    "\n"
    "Restarts:\n"
    "  --max-restarts N        failures in a row before the agent gives up and\n"
    "                          exits 1 (default 5)\n"
    "  --backoff-ms MS         first back-off, doubled per failure in a row (1000)\n"
    "  --backoff-max-ms MS     the longest back-off (30000)\n"
    "  --healthy-ms MS         a process that ran this long starts a new count (60000)\n"
    "  --stop-grace-ms MS      SIGTERM, then SIGKILL after MS at a stop (10000)\n"
    "  --stop-spares-after-ms MS  once every slot this host held ended with 0,\n"
    "                          stop the spares still waiting after MS (default:\n"
    "                          they end by themselves when the whole job finished)\n"
    "\n"
    "Reports:\n"
    "  --status-file FILE      JSON status, rewritten at every change\n"
    "  --metrics-file FILE     Prometheus text (node exporter's textfile collector)\n"
    "  --listen HOST:PORT      serve /metrics and /status over HTTP\n"
    "  --log-dir DIR           each process's stdout and stderr in DIR\n"
    "                          (<kind>-r<rank>-s<slot>-<start>.out/.err)\n"
    "  --dry-run               print what would be started, start nothing\n"
    "  -h, --help              this help\n"
    "\n"
    "In ARGS, {slot}, {start}, {rank} and {group} are replaced for each process\n"
    "({group} is 'spare' for a spare). Exit status: 0 the job finished, 1 a\n"
    "process kept dying (or the agent was stopped), 2 bad usage.\n";

void agent_help_print(void)
{
    fputs(help_text, stdout);
}

static bool parse_u32(const char *s, uint32_t *v_p)
{
    char *end = NULL;
    if (s == NULL || *s < '0' || *s > '9')
        return false;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > UINT32_MAX)
        return false;
    *v_p = (uint32_t)v;
    return true;
}

static bool valid_job(const char *job)
{
    size_t n = strlen(job);
    if (n == 0 || n > 64)
        return false;
    return strspn(job, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == n;
}

/* "0-3", "0,2", "1": appended to o->ranks; false on bad text or a repeat. */
static bool parse_ranks(const char *s, agent_opts_t *o)
{
    char buf[256];
    if (strlen(s) >= sizeof(buf))
        return false;
    snprintf(buf, sizeof(buf), "%s", s);
    char *save = NULL;
    for (char *part = strtok_r(buf, ",", &save); part != NULL; part = strtok_r(NULL, ",", &save)) {
        uint32_t lo, hi;
        char *dash = strchr(part, '-');
        if (dash != NULL)
            *dash = '\0';
        if (!parse_u32(part, &lo) || (dash != NULL ? !parse_u32(dash + 1, &hi) : !(hi = lo, true)))
            return false;
        if (hi < lo)
            return false;
        for (uint64_t r = lo; r <= hi; r++) {
            if (o->n_ranks >= AGENT_MAX_RANKS)
                return false;
            for (size_t i = 0; i < o->n_ranks; i++)
                if (o->ranks[i] == r)
                    return false;
            o->ranks[o->n_ranks++] = (uint32_t)r;
        }
    }
    return o->n_ranks > 0;
}

static bool split_endpoints(agent_opts_t *o, char *why, size_t len)
{
    char *copy = strdup(o->endpoints_text), *save = NULL;
    if (copy == NULL)
        return false;
    for (char *p = strtok_r(copy, ",", &save); p != NULL; p = strtok_r(NULL, ",", &save)) {
        if (o->n_endpoints >= AGENT_MAX_ENDPOINTS || (o->endpoints[o->n_endpoints] = strdup(p)) == NULL) {
            snprintf(why, len, "--etcd: at most %d endpoints", AGENT_MAX_ENDPOINTS);
            free(copy);
            return false;
        }
        o->n_endpoints++;
    }
    free(copy);
    if (o->n_endpoints == 0)
        snprintf(why, len, "--etcd: no endpoint in '%s'", o->endpoints_text);
    return o->n_endpoints > 0;
}

static void defaults(agent_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->max_restarts = 5;
    o->backoff_ms = 1000;
    o->backoff_max_ms = 30000;
    o->healthy_ms = 60000;
    o->stop_grace_ms = 10000;
    o->stop_spares_ms = -1;
    o->job = getenv("GRAFT_JOB");
    o->endpoints_text = getenv("GRAFT_ETCD_ENDPOINTS");
}

/* The environment's numbers, before the flags that override them. */
static bool env_numbers(agent_opts_t *o, char *why, size_t len)
{
    static const char *const names[] = {"GRAFT_GROUP", "GRAFT_RANKS_PER_GROUP", "GRAFT_GROUPS",
                                        "GRAFT_AGENT_SPARES"};
    uint32_t *dst[] = {&o->group, &o->ranks_per_group, &o->groups, &o->spares};
    for (size_t i = 0; i < 4; i++) {
        const char *v = getenv(names[i]);
        if (v == NULL || *v == '\0')
            continue;
        if (!parse_u32(v, dst[i])) {
            snprintf(why, len, "%s='%s' is not a number", names[i], v);
            return false;
        }
        if (i == 0)
            o->have_group = true;
    }
    return true;
}

typedef struct num_flag {
    const char *name;
    uint32_t *dst;
} num_flag_t;

/* One flag at argv[*i]; false with why on a usage error. */
static bool parse_flag(agent_opts_t *o, int argc, char **argv, int *i, char *why, size_t len)
{
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    const num_flag_t nums[] = {
        {"--group", &o->group},         {"--ranks-per-group", &o->ranks_per_group},
        {"--groups", &o->groups},       {"--spares", &o->spares},
        {"--max-restarts", &o->max_restarts}, {"--backoff-ms", &o->backoff_ms},
        {"--backoff-max-ms", &o->backoff_max_ms}, {"--healthy-ms", &o->healthy_ms},
        {"--stop-grace-ms", &o->stop_grace_ms},
    };
    const char **strs[] = {&o->job, &o->endpoints_text, &o->status_file, &o->metrics_file,
                                 &o->listen, &o->log_dir};
    static const char *const str_names[] = {"--job", "--etcd", "--status-file", "--metrics-file",
                                            "--listen", "--log-dir"};
    if (strcmp(a, "--launcher") == 0) {
        o->mode = AGENT_MODE_LAUNCHER;
        return true;
    }
    if (strcmp(a, "--dry-run") == 0) {
        o->dry_run = true;
        return true;
    }
    if (strcmp(a, "--follow") == 0) {
        o->follow = true;
        return true;
    }
    for (size_t k = 0; k < sizeof(nums) / sizeof(nums[0]); k++) {
        if (strcmp(a, nums[k].name) != 0)
            continue;
        if (!parse_u32(v, nums[k].dst)) {
            snprintf(why, len, "%s needs a number, not '%s'", a, v != NULL ? v : "(nothing)");
            return false;
        }
        o->have_group |= nums[k].dst == &o->group;
        (*i)++;
        return true;
    }
    for (size_t k = 0; k < sizeof(strs) / sizeof(strs[0]); k++) {
        if (strcmp(a, str_names[k]) != 0)
            continue;
        if (v == NULL || *v == '\0') {
            snprintf(why, len, "%s needs a value", a);
            return false;
        }
        *strs[k] = v;
        (*i)++;
        return true;
    }
    if (strcmp(a, "--ranks") == 0 || strcmp(a, "--stop-spares-after-ms") == 0) {
        uint32_t ms;
        bool ok = v != NULL && (a[2] == 'r' ? parse_ranks(v, o) : parse_u32(v, &ms));
        if (!ok) {
            snprintf(why, len, "%s: bad value '%s'%s", a, v != NULL ? v : "(nothing)",
                     a[2] == 'r' ? " (a list such as 0-3 or 0,2, no repeats)" : "");
            return false;
        }
        if (a[2] == 's')
            o->stop_spares_ms = ms;
        (*i)++;
        return true;
    }
    snprintf(why, len, "unknown option '%s' (graft-agent --help lists them)", a);
    return false;
}

/* The checks between options, once all are read. */
static bool check(agent_opts_t *o, char *why, size_t len)
{
    if (o->n_cmd == 0)
        return snprintf(why, len, "no command: give the trainer after --"), false;
    if (o->mode == AGENT_MODE_LAUNCHER && o->n_ranks > 0)
        return snprintf(why, len, "--ranks is for one process per rank; a launcher starts "
                                  "its whole world (leave --ranks out)"), false;
    if (!o->have_group && o->spares == 0)
        return snprintf(why, len, "no group: give --group G or set GRAFT_GROUP (an agent "
                                  "without a group runs spares only: --spares N)"), false;
    if (o->follow && o->spares == 0)
        return snprintf(why, len, "--follow makes the spares followers: it needs --spares N"),
               false;
    if (o->spares > 0 && o->job == NULL)
        return snprintf(why, len, "--spares needs the job's name to see promotions in etcd: "
                                  "give --job NAME or set GRAFT_JOB"), false;
    if (o->job != NULL && !valid_job(o->job))
        return snprintf(why, len, "bad job name '%s' (1-64 of [A-Za-z0-9_.-])", o->job), false;
    if (o->backoff_max_ms < o->backoff_ms)
        return snprintf(why, len, "--backoff-max-ms %u is below --backoff-ms %u",
                        o->backoff_max_ms, o->backoff_ms), false;
    if (o->have_group && o->groups > 0 && o->group >= o->groups)
        return snprintf(why, len, "group %u is not below --groups %u", o->group, o->groups), false;
    for (size_t i = 0; i < o->n_ranks; i++)
        if (o->ranks_per_group > 0 && o->ranks[i] >= o->ranks_per_group)
            return snprintf(why, len, "rank %u is not below --ranks-per-group %u", o->ranks[i],
                            o->ranks_per_group), false;
    return true;
}

/* This host's ranks when --ranks was not given. */
static bool default_ranks(agent_opts_t *o, char *why, size_t len)
{
    if (o->mode == AGENT_MODE_LAUNCHER || o->n_ranks > 0)
        return true;
    if (o->ranks_per_group > 0) {
        if (o->ranks_per_group > AGENT_MAX_RANKS)
            return snprintf(why, len, "%u ranks per group: give this host's --ranks",
                            o->ranks_per_group), false;
        for (uint32_t r = 0; r < o->ranks_per_group; r++)
            o->ranks[o->n_ranks++] = r;
        return true;
    }
    const char *r = getenv("GRAFT_RANK");
    if (r != NULL && parse_ranks(r, o))
        return true;
    o->ranks[o->n_ranks++] = 0; /* graft's default: one rank per group */
    return true;
}

int agent_opts_parse(int argc, char **argv, agent_opts_t *o, char *why, size_t len)
{
    defaults(o);
    if (!env_numbers(o, why, len))
        return AGENT_USAGE;
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return -1;
        if (!parse_flag(o, argc, argv, &i, why, len))
            return AGENT_USAGE;
    }
    if (i < argc) {
        o->cmd = &argv[i + 1];
        o->n_cmd = argc - i - 1;
    }
    if (o->endpoints_text == NULL || *o->endpoints_text == '\0')
        o->endpoints_text = "http://127.0.0.1:2379";
    if (!check(o, why, len) || !default_ranks(o, why, len) || !split_endpoints(o, why, len))
        return AGENT_USAGE;
    size_t per = o->mode == AGENT_MODE_LAUNCHER ? 1 : o->n_ranks;
    if (per * ((o->have_group ? 1u : 0u) + (size_t)o->spares) > AGENT_MAX_UNITS)
        return snprintf(why, len, "more than %d processes asked for", AGENT_MAX_UNITS), AGENT_USAGE;
    return AGENT_OK;
}

void agent_opts_clear(agent_opts_t *o)
{
    for (size_t i = 0; i < o->n_endpoints; i++)
        free(o->endpoints[i]);
    o->n_endpoints = 0;
}
