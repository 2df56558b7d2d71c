/*
 * graftctl: the options and the dispatch to commands. The connection to
 * etcd is in graftctl_conn.c, the helpers the commands share in
 * graftctl_util.c: both below every command, so that no command calls
 * back up into this file.
 */
#include "graftctl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char usage[] =
    "usage: graftctl [options] COMMAND [args]\n"
    "\n"
    "Commands against a job (need etcd and --job):\n"
    "  status                 groups and ranks: health, state, step, incarnation,\n"
    "                         lease time left, transfer address; the current quorum\n"
    "  watch [--interval-ms N] [--count N]\n"
    "                         the status, redrawn whenever the job changes\n"
    "  events [--kind K[,K]] [--group G] [--since T] [--until T] [--recoveries]\n"
    "                         the job's event history; T is unix milliseconds or an\n"
    "                         age such as 90s, 10m, 2h; --recoveries: each recovery\n"
    "                         with its phases and bytes\n"
    "  drift                  the last replica hash comparison (exit 1 on drift)\n"
    "  evict GROUP            revoke the group's leases and record the eviction\n"
    "                         (asks for confirmation unless --yes)\n"
    "  dashboard [--listen ADDR:PORT] [--token T] [--ckpt-root DIR]\n"
    "            [--allow-host NAME]... [--interval-ms N]\n"
    "                         the job over HTTP: a page, a JSON API, /metrics;\n"
    "                         checkpoints only under DIR; a Host that is not an\n"
    "                         address, localhost or an --allow-host NAME gets 403\n"
    "\n"
    "Commands on a checkpoint root (no etcd):\n"
    "  ckpt ls ROOT [--keep-last N] [--milestone-every M] [--geometric]\n"
    "                         every checkpoint with its retention class under that\n"
    "                         policy (what prune would keep; nothing is deleted)\n"
    "  ckpt verify ROOT [STEP] [--quick] [--secret-file F]  every chunk of one (default:\n"
    "                         every) checkpoint, the manifest.json sidecar, and with F the\n"
    "                         manifest's MAC under the job secret; exit 1 on a fault\n"
    "  ckpt inspect ROOT STEP               the manifest\n"
    "  ckpt prune ROOT --keep-last N [--milestone-every M] [--geometric] [--dry-run]\n"
    "  ckpt restore ROOT --dry-run [--step S] [--secret-file F]\n"
    "                         which checkpoint a restore would load, verified in full\n"
    "\n"
    "Options (flags win over the environment):\n"
    "  --etcd URL[,URL...]    endpoints (GRAFT_ETCD_ENDPOINTS; default http://127.0.0.1:2379)\n"
    "  --job NAME             the job (GRAFT_JOB)\n"
    "  --user NAME            etcd user (GRAFT_ETCD_USER)\n"
    "  --password-file FILE   etcd password: the file's first line; only its owner may\n"
    "                         read it (GRAFT_ETCD_PASSWORD_FILE)\n"
    "  --password PW          etcd password (GRAFT_ETCD_PASSWORD); on the command line\n"
    "                         every user of the host sees it in ps (until graftctl\n"
    "                         wipes it from its arguments): prefer the two above\n"
    "  --cacert FILE          CA bundle for TLS (GRAFT_ETCD_CA)\n"
    "  --cert FILE            client certificate (GRAFT_ETCD_CERT)\n"
    "  --key FILE             client key (GRAFT_ETCD_KEY)\n"
    "  --timeout-ms N         per etcd request (default 3000)\n"
    "  --json, -o json        JSON instead of tables (raw values: unix ms, seconds)\n"
    "  --yes                  do not ask for confirmation\n"
    "  --help                 this text; COMMAND --help: that command's own\n"
    "\n"
    "Exit status: 0 success, 1 failure, 2 bad usage.\n";

static void free_endpoints(graftctl_opts_t *o)
{
    graft_etcd_endpoints_free(o->endpoints, o->n_endpoints);
    o->endpoints = NULL;
    o->n_endpoints = 0;
}

static bool split_endpoints(graftctl_opts_t *o, const char *text)
{
    free_endpoints(o);
    o->endpoints_text = text;
    return graft_etcd_endpoints_split(text, &o->endpoints, &o->n_endpoints) == GRAFT_OK;
}

/* The etcd password from a file: its first line, from a regular file that
 * only its owner may read or write (as the job secret's file). */
static bool password_from_file(const char *path, char *buf, size_t len)
{
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    bool ok = false;
    if (fd < 0) {
        fprintf(stderr, "graftctl: --password-file '%s': %s\n", path, strerror(errno));
        return false;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fprintf(stderr, "graftctl: --password-file '%s': not a regular file\n", path);
    } else if ((sb.st_mode & 077) != 0) {
        fprintf(stderr, "graftctl: --password-file '%s': mode %04o lets group or others read "
                "or write it; refused (chmod 600 it)\n", path, (unsigned)(sb.st_mode & 07777));
    } else {
        ssize_t n = read(fd, buf, len - 1);
        if (n < 0) {
            fprintf(stderr, "graftctl: --password-file '%s': %s\n", path, strerror(errno));
        } else {
            buf[n] = '\0';
            buf[strcspn(buf, "\r\n")] = '\0';
            ok = buf[0] != '\0';
            if (!ok)
                fprintf(stderr, "graftctl: --password-file '%s': empty\n", path);
        }
    }
    close(fd);
    return ok;
}

/* Where the password would cross a network in clear, say so: graftctl
 * keeps the library's log off. */
static void password_warnings(const graftctl_opts_t *o, bool on_command_line)
{
    if (o->password == NULL)
        return;
    if (on_command_line)
        fprintf(stderr, "graftctl: warning: --password on the command line is visible to every "
                "user of this host (ps, /proc); use --password-file FILE or "
                "GRAFT_ETCD_PASSWORD\n");
    for (size_t i = 0; i < o->n_endpoints; i++) {
        if (strncmp(o->endpoints[i], "http://", 7) == 0 &&
            !graft_etcd_endpoint_is_loopback(o->endpoints[i])) {
            fprintf(stderr, "graftctl: warning: the etcd password goes over plain http to %s: "
                    "anyone on the path reads it; use https://\n", o->endpoints[i]);
            return;
        }
    }
}

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v != NULL && *v != '\0' ? v : dflt;
}

typedef int (*graftctl_cmd_fn)(const graftctl_opts_t *o, int argc, char **argv);

static graftctl_cmd_fn find_command(const char *name)
{
    static const struct {
        const char *name;
        graftctl_cmd_fn fn;
    } cmds[] = {
        {"status", graftctl_cmd_status}, {"watch", graftctl_cmd_watch},
        {"events", graftctl_cmd_events}, {"drift", graftctl_cmd_drift},
        {"evict", graftctl_cmd_evict},   {"ckpt", graftctl_cmd_ckpt},
        {"dashboard", graftctl_cmd_dashboard},
    };
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        if (strcmp(cmds[i].name, name) == 0)
            return cmds[i].fn;
    return NULL;
}

/* What the global options give besides graftctl_opts_t: the endpoints'
 * list, the password's sources, --help, and the command's arguments. */
typedef struct {
    const char *endpoints;
    const char *password_file;
    bool password_flag, want_help;
    char **rest;
    int nrest;
    char password_buf[1024];
} graftctl_args_t;

/* The global options that take a value, in the order set_valued() takes. */
static const char *const valued[] = {"--etcd",   "--job",  "--user", "--password",
                                     "--cacert", "--cert", "--key",  "--timeout-ms",
                                     "--password-file"};

/* valued[k] given the value argv[i]. false on a bad value (said). */
static bool set_valued(graftctl_opts_t *o, graftctl_args_t *a, size_t k, char **argv, int i)
{
    const char *v = argv[i];
    uint64_t t;
    switch (k) {
    case 0: a->endpoints = v; break;
    case 1: o->job = v; break;
    case 2: o->user = v; break;
    case 3:
        /* Kept in our own buffer, and wiped from the arguments that
         * ps shows (it was visible until now: hence the warning). */
        snprintf(a->password_buf, sizeof(a->password_buf), "%s", v);
        memset(argv[i], 'x', strlen(argv[i]));
        o->password = a->password_buf;
        a->password_flag = true;
        break;
    case 4: o->ca_file = v; break;
    case 5: o->cert_file = v; break;
    case 6: o->key_file = v; break;
    case 8: a->password_file = v; break;
    default:
        if (!graftctl_parse_u64(v, &t) || t == 0 || t > 600000) {
            fprintf(stderr, "graftctl: --timeout-ms: '%s' is not 1..600000\n", v);
            return false;
        }
        o->timeout_ms = (uint32_t)t;
    }
    return true;
}

/* Global options anywhere on the line; the rest goes to the command
 * (a->rest). false on a usage error (said). */
static bool parse_global(int argc, char **argv, graftctl_opts_t *o, graftctl_args_t *a)
{
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            a->want_help = true;
            continue;
        }
        if (strcmp(arg, "--json") == 0) {
            o->json = true;
            continue;
        }
        if (strcmp(arg, "-o") == 0 || strcmp(arg, "--output") == 0) {
            /* kubectl's spelling: -o json (raw values), -o table (for a person) */
            const char *v = i + 1 < argc ? argv[++i] : "";
            if (strcmp(v, "json") != 0 && strcmp(v, "table") != 0) {
                fprintf(stderr, "graftctl: %s takes json or table, not '%s'\n", arg, v);
                return false;
            }
            o->json = strcmp(v, "json") == 0;
            continue;
        }
        if (strcmp(arg, "--yes") == 0 || strcmp(arg, "-y") == 0) {
            o->yes = true;
            continue;
        }
        size_t k;
        for (k = 0; k < sizeof(valued) / sizeof(valued[0]); k++)
            if (strcmp(arg, valued[k]) == 0)
                break;
        if (k == sizeof(valued) / sizeof(valued[0])) {
            a->rest[a->nrest++] = argv[i];
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "graftctl: %s needs a value\n", arg);
            return false;
        }
        if (!set_valued(o, a, k, argv, ++i))
            return false;
    }
    return true;
}

/* The password from its sources: a file given wins over
 * GRAFT_ETCD_PASSWORD, --password over both. GRAFTCTL_OK, or the exit
 * status (said). */
static int resolve_password(graftctl_opts_t *o, graftctl_args_t *a)
{
    if (a->password_flag && a->password_file != NULL &&
        getenv("GRAFT_ETCD_PASSWORD_FILE") != a->password_file) {
        fprintf(stderr, "graftctl: --password and --password-file: give one\n");
        return GRAFTCTL_USAGE;
    }
    if (a->password_file != NULL && !a->password_flag) {
        if (!password_from_file(a->password_file, a->password_buf, sizeof(a->password_buf)))
            return GRAFTCTL_FAIL;
        o->password = a->password_buf;
    }
    password_warnings(o, a->password_flag);
    return GRAFTCTL_OK;
}

int main(int argc, char **argv)
{
    int rc = GRAFTCTL_USAGE;
    graftctl_opts_t o = {
        .job = env_or("GRAFT_JOB", NULL),
        .user = env_or("GRAFT_ETCD_USER", NULL),
        .password = env_or("GRAFT_ETCD_PASSWORD", NULL),
        .ca_file = env_or("GRAFT_ETCD_CA", NULL),
        .cert_file = env_or("GRAFT_ETCD_CERT", NULL),
        .key_file = env_or("GRAFT_ETCD_KEY", NULL),
        .timeout_ms = 3000,
    };
    graftctl_args_t a = {
        .endpoints = env_or("GRAFT_ETCD_ENDPOINTS", "http://127.0.0.1:2379"),
        .password_file = env_or("GRAFT_ETCD_PASSWORD_FILE", NULL),
        .rest = calloc((size_t)argc + 1, sizeof(char *)),
    };
    if (a.rest == NULL) {
        fprintf(stderr, "graftctl: out of memory\n");
        return GRAFTCTL_FAIL;
    }
    if (!parse_global(argc, argv, &o, &a))
        goto out; /* rc is still GRAFTCTL_USAGE */
    /* --help: the command's own help, or this one without a command. */
    if (a.want_help && (a.nrest == 0 || find_command(a.rest[0]) != NULL)) {
        if (a.nrest == 0 || !graftctl_help_print(a.rest[0], a.nrest > 1 ? a.rest[1] : NULL))
            fputs(usage, stdout);
        rc = GRAFTCTL_OK;
        goto out;
    }
    if (a.nrest == 0) {
        fputs(usage, stderr);
        goto out;
    }
    graftctl_cmd_fn fn = find_command(a.rest[0]);
    if (fn == NULL) {
        fprintf(stderr, "graftctl: unknown command '%s' (see graftctl --help)\n", a.rest[0]);
        goto out;
    }
    if (!split_endpoints(&o, a.endpoints)) {
        fprintf(stderr, "graftctl: --etcd: no endpoint in '%s'\n", a.endpoints);
        goto out;
    }
    rc = resolve_password(&o, &a);
    if (rc != GRAFTCTL_OK)
        goto out;
    graft_log_level_set(getenv("GRAFTCTL_DEBUG") != NULL ? GRAFT_LOG_DEBUG : GRAFT_LOG_OFF);
    rc = fn(&o, a.nrest, a.rest);
out:
    explicit_bzero(a.password_buf, sizeof(a.password_buf));
    free_endpoints(&o);
    free(a.rest);
    return rc;
}
