/*
 * Network namespaces for `graft-sim run --netns` (see sim_netns.h for the
 * layout). Everything is done with iproute2's `ip` and `tc`, run as child
 * processes, like scripts/netns.sh: the kernel's netlink interface would
 * need a netlink library or a hand-written message builder for the same
 * few operations.
 */
#include "sim_netns.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define SIM_NETNS_MAX_GROUPS 200
#define SIM_NETNS_MAX_ARGS 24
#define SIM_NETNS_RATE_MAX 64

/*
 * The shapes of a link (graft_sim_link_shape_t), as tc qdisc arguments.
 *
 * Base: tbf at the run's rate with a 1 MB bucket and at most 50 ms of
 * queue, as scripts/netns.sh.
 *
 * netem, at the same rate: 20 ms +- 5 ms of delay each way (a link between
 * racks or across a campus, ~40 ms round trip), 1 % loss (TCP retransmits,
 * after 200 ms at least: a lease renewal or a chunk late, not lost), and
 * reordering: 10 % of packets (correlated 50 % with the previous one) go
 * out at once, ahead of delayed ones. The jitter reorders too. A limit of
 * 10000 packets holds a round trip at 1gbit even in 1500-byte packets, so
 * netem's own queue drops nothing beyond the 1 %.
 *
 * Throttle: 10 Mbit/s (a 16 MiB ballast takes ~13 s) with a small bucket
 * and at most 20 ms of queue, so that a heal filling the link delays the
 * group's lease renewals by tens of ms, not by a second (a 1 MB bucket at
 * 10 Mbit/s would queue 0.8 s).
 */
#define SIM_NETNS_BASE_FMT "tbf rate %s burst 1mb latency 50ms"
#define SIM_NETNS_NETEM_FMT "netem limit 10000 rate %s delay 20ms 5ms loss 1%% reorder 10%% 50%%"
#define SIM_NETNS_THROTTLE "tbf rate 10mbit burst 32kb latency 20ms"

struct graft_sim_netns {
    char prefix[32];   /* gsim<pid> */
    int groups;
    int subnet;        /* S in 10.78.S.0/24 */
    char hub[32];      /* 10.78.S.1 */
    char rate[SIM_NETNS_RATE_MAX]; /* the links' tc rate */
    char dir[PATH_MAX];
    char trainer[PATH_MAX + 32];
    char etcd[PATH_MAX + 32];
};

/* What the exit and signal handlers tear down: one run per process. */
static char sim_netns_live_prefix[32];
static int sim_netns_live_groups;
static pid_t sim_netns_owner;

/* Runs argv (argv[0] from PATH) with output to /dev/null unless verbose;
 * returns the exit status, -1 if it could not run. Only fork, dup2, execvp
 * and waitpid: also used from signal handlers. */
static int sim_netns_exec(char *const argv[], int quiet)
{
    pid_t pid = fork();
    if (pid < 0) {
        return -1;
    }
    if (pid == 0) {
        if (quiet) {
            int fd = open("/dev/null", O_WRONLY);
            if (fd >= 0) {
                dup2(fd, STDOUT_FILENO);
                dup2(fd, STDERR_FILENO);
            }
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) {
            return -1;
        }
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* One command from printf-style words separated by single spaces (no word
 * of ours has a space); logs it when it fails. */
static int sim_netns_cmd(int quiet, const char *fmt, ...) GRAFT_PRINTF(2, 3);
static int sim_netns_cmd(int quiet, const char *fmt, ...)
{
    char line[512];
    char *argv[SIM_NETNS_MAX_ARGS + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    char copy[512];
    snprintf(copy, sizeof(copy), "%s", line);
    int n = 0;
    for (char *save = NULL, *w = strtok_r(copy, " ", &save); w != NULL && n < SIM_NETNS_MAX_ARGS;
         w = strtok_r(NULL, " ", &save)) {
        argv[n++] = w;
    }
    argv[n] = NULL;
    int rc = sim_netns_exec(argv, quiet);
    if (rc != 0 && !quiet) {
        fprintf(stderr, "graft-sim run: error: --netns: '%s' failed (status %d)\n", line, rc);
    }
    return rc;
}

/* Deletes PREFIX-0 .. PREFIX-groups; deleting the hub also removes the
 * veth into the caller's namespace. Async-signal-tolerant (see above). */
static void sim_netns_delete(const char *prefix, int groups)
{
    for (int i = 0; i <= groups; i++) {
        char ns[48];
        snprintf(ns, sizeof(ns), "%s-%d", prefix, i);
        char *argv[] = {"ip", "netns", "delete", ns, NULL};
        (void)sim_netns_exec(argv, 1);
    }
}

static void sim_netns_teardown(void)
{
    if (sim_netns_owner == getpid() && sim_netns_live_prefix[0] != '\0') {
        sim_netns_delete(sim_netns_live_prefix, sim_netns_live_groups);
        sim_netns_live_prefix[0] = '\0';
    }
}

static void sim_netns_on_signal(int sig)
{
    sim_netns_teardown();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Namespaces "gsim<pid>-<i>" whose pid no longer runs: a run killed with
 * SIGKILL could not clean up after itself. */
static void sim_netns_remove_stale(void)
{
    DIR *d = opendir("/var/run/netns");
    if (d == NULL) {
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid = 0;
        int idx = 0, used = 0;
        if (sscanf(e->d_name, "gsim%ld-%d%n", &pid, &idx, &used) != 2 ||
            e->d_name[used] != '\0' || pid <= 0) {
            continue;
        }
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) {
            continue;
        }
        char *argv[] = {"ip", "netns", "delete", e->d_name, NULL};
        if (sim_netns_exec(argv, 1) == 0) {
            fprintf(stderr, "graft-sim run: removed stale namespace %s\n", e->d_name);
        }
    }
    closedir(d);
}

static int sim_netns_write_script(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "graft-sim run: error: --netns: %s: %s\n", path, strerror(errno));
        return -1;
    }
    int bad = fputs(text, f) < 0;
    bad |= fclose(f) != 0;
    bad |= chmod(path, 0755) != 0;
    if (bad) {
        fprintf(stderr, "graft-sim run: error: --netns: writing %s failed\n", path);
    }
    return bad ? -1 : 0;
}

static int sim_netns_scripts(graft_sim_netns_t *n, const char *trainer)
{
    char text[PATH_MAX + 1024];
    snprintf(n->trainer, sizeof(n->trainer), "%s/trainer.sh", n->dir);
    snprintf(n->etcd, sizeof(n->etcd), "%s/etcd.sh", n->dir);
    /* The trainer's transfer endpoint listens on its namespace's address
     * (it is published to the peers); tcp by default so that transfers
     * cross the shaped link instead of shared memory between namespaces,
     * and over eth0 whatever UCX_NET_DEVICES named outside (the only
     * other device in the namespace is its own loopback). */
    snprintf(text, sizeof(text),
             "#!/bin/sh\n"
             "# graft-sim --netns: the trainer of group $GRAFT_GROUP in its namespace\n"
             "g=${GRAFT_GROUP:?}\n"
             "GRAFT_TRANSFER_ADDRESS=10.78.%d.$((g + 2)):0\n"
             "UCX_TLS=${UCX_TLS:-tcp}\n"
             "UCX_NET_DEVICES=eth0\n"
             "export GRAFT_TRANSFER_ADDRESS UCX_TLS UCX_NET_DEVICES\n"
             "exec ip netns exec %s-$((g + 1)) '%s' \"$@\"\n",
             n->subnet, n->prefix, trainer);
    if (sim_netns_write_script(n->trainer, text) != 0) {
        return -1;
    }
    /* etcd also listens on the hub address, same port: the library picks
     * the port, so the URL is rewritten here rather than passed in. */
    snprintf(text, sizeof(text),
             "#!/bin/sh\n"
             "# graft-sim --netns: etcd's client URL also on the hub address\n"
             "prev=\n"
             "for a do\n"
             "    b=$a\n"
             "    if [ \"$prev\" = --listen-client-urls ]; then b=\"$a,http://%s:${a##*:}\"; fi\n"
             "    prev=$a\n"
             "    set -- \"$@\" \"$b\"\n"
             "    shift\n"
             "done\n"
             "exec etcd \"$@\"\n",
             n->hub);
    return sim_netns_write_script(n->etcd, text);
}

const char *graft_sim_netns_shape_text(const graft_sim_netns_t *net, graft_sim_link_shape_t shape,
                                       char *buf, size_t len)
{
    switch (shape) {
    case GRAFT_SIM_LINK_NETEM:
        snprintf(buf, len, SIM_NETNS_NETEM_FMT, net->rate);
        break;
    case GRAFT_SIM_LINK_THROTTLE:
        snprintf(buf, len, "%s", SIM_NETNS_THROTTLE);
        break;
    default:
        snprintf(buf, len, SIM_NETNS_BASE_FMT, net->rate);
        break;
    }
    return buf;
}

/* tc qdisc VERB (add, replace) of a shape at the root of both ends of group
 * g's link: eth0 in its namespace, p<g+1> in the hub. 0, or the first
 * failing command's status. */
static int sim_netns_qdisc(const graft_sim_netns_t *n, int g, const char *verb,
                           graft_sim_link_shape_t shape, int quiet)
{
    char q[160];
    graft_sim_netns_shape_text(n, shape, q, sizeof(q));
    int rc = sim_netns_cmd(quiet, "tc -n %s-%d qdisc %s dev eth0 root %s", n->prefix, g + 1, verb,
                           q);
    if (rc == 0) {
        rc = sim_netns_cmd(quiet, "tc -n %s-0 qdisc %s dev p%d root %s", n->prefix, verb, g + 1, q);
    }
    return rc;
}

static int sim_netns_build(graft_sim_netns_t *n)
{
    const char *p = n->prefix;
    int S = n->subnet;
    if (sim_netns_cmd(0, "ip netns add %s-0", p) != 0 ||
        sim_netns_cmd(0, "ip -n %s-0 link set lo up", p) != 0 ||
        sim_netns_cmd(0, "ip -n %s-0 link add br0 type bridge", p) != 0 ||
        sim_netns_cmd(0, "ip -n %s-0 link set br0 up", p) != 0 ||
        /* The caller's side: the hub address, on a veth into the bridge. */
        sim_netns_cmd(0, "ip link add %sh type veth peer name uplink netns %s-0", p, p) != 0 ||
        sim_netns_cmd(0, "ip -n %s-0 link set dev uplink master br0", p) != 0 ||
        sim_netns_cmd(0, "ip -n %s-0 link set dev uplink up", p) != 0 ||
        sim_netns_cmd(0, "ip addr add %s/24 dev %sh", n->hub, p) != 0 ||
        sim_netns_cmd(0, "ip link set %sh up", p) != 0) {
        return -1;
    }
    for (int g = 0; g < n->groups; g++) {
        int i = g + 1;
        if (sim_netns_cmd(0, "ip netns add %s-%d", p, i) != 0 ||
            sim_netns_cmd(0, "ip -n %s-%d link set lo up", p, i) != 0 ||
            sim_netns_cmd(0, "ip -n %s-0 link add p%d type veth peer name eth0 netns %s-%d", p, i,
                          p, i) != 0 ||
            sim_netns_cmd(0, "ip -n %s-0 link set p%d master br0", p, i) != 0 ||
            sim_netns_cmd(0, "ip -n %s-0 link set p%d up", p, i) != 0 ||
            sim_netns_cmd(0, "ip -n %s-%d addr add 10.78.%d.%d/24 dev eth0", p, i, S, g + 2) != 0 ||
            sim_netns_cmd(0, "ip -n %s-%d link set eth0 up", p, i) != 0 ||
            sim_netns_qdisc(n, g, "add", GRAFT_SIM_LINK_BASE, 0) != 0) {
            return -1;
        }
    }
    return 0;
}

graft_status_t graft_sim_netns_create(int groups, const char *rate, const char *trainer,
                                      graft_sim_netns_t **net_p)
{
    graft_status_t st = GRAFT_OK;
    graft_sim_netns_t *n = NULL;
    if (groups < 1 || groups > SIM_NETNS_MAX_GROUPS || rate == NULL || trainer == NULL ||
        strchr(rate, ' ') != NULL || strlen(rate) >= SIM_NETNS_RATE_MAX ||
        strchr(trainer, '\'') != NULL || net_p == NULL) {
        return GRAFT_EINVAL;
    }
    if (geteuid() != 0) {
        fprintf(stderr, "graft-sim run: error: --netns needs root for network namespaces\n");
        return GRAFT_ENOTSUP;
    }
    char *probe[] = {"ip", "netns", "list", NULL};
    if (sim_netns_exec(probe, 1) != 0) {
        fprintf(stderr, "graft-sim run: error: --netns: 'ip netns' is unavailable\n");
        return GRAFT_ENOTSUP;
    }
    if (sim_netns_live_prefix[0] != '\0') {
        return GRAFT_ESTATE; /* one set per process: the handlers know one */
    }
    sim_netns_remove_stale();
    n = calloc(1, sizeof(*n));
    if (n == NULL) {
        return GRAFT_ENOMEM;
    }
    n->groups = groups;
    snprintf(n->rate, sizeof(n->rate), "%s", rate);
    n->subnet = 1 + (int)(getpid() % 250);
    snprintf(n->prefix, sizeof(n->prefix), "gsim%ld", (long)getpid());
    snprintf(n->hub, sizeof(n->hub), "10.78.%d.1", n->subnet);
    snprintf(n->dir, sizeof(n->dir), "%s/graft-sim-netns-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (mkdtemp(n->dir) == NULL) {
        fprintf(stderr, "graft-sim run: error: mkdtemp %s: %s\n", n->dir, strerror(errno));
        n->dir[0] = '\0';
        st = GRAFT_ESYS;
        goto fail;
    }
    if (sim_netns_scripts(n, trainer) != 0) {
        st = GRAFT_ESYS;
        goto fail;
    }
    /* Handlers first: a signal during the build still tears down. */
    snprintf(sim_netns_live_prefix, sizeof(sim_netns_live_prefix), "%s", n->prefix);
    sim_netns_live_groups = groups;
    sim_netns_owner = getpid();
    static int registered;
    if (!registered) {
        registered = 1;
        atexit(sim_netns_teardown);
    }
    signal(SIGINT, sim_netns_on_signal);
    signal(SIGTERM, sim_netns_on_signal);
    signal(SIGHUP, sim_netns_on_signal);
    if (sim_netns_build(n) != 0) {
        st = GRAFT_ESYS;
        goto fail;
    }
    *net_p = n;
    return GRAFT_OK;
fail:
    graft_sim_netns_destroy(n);
    return st;
}

void graft_sim_netns_destroy(graft_sim_netns_t *net)
{
    if (net == NULL) {
        return;
    }
    if (strcmp(sim_netns_live_prefix, net->prefix) == 0) {
        sim_netns_teardown();
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
    }
    if (net->dir[0] != '\0') {
        unlink(net->trainer);
        unlink(net->etcd);
        rmdir(net->dir);
    }
    free(net);
}

const char *graft_sim_netns_hub(const graft_sim_netns_t *net)
{
    return net->hub;
}

const char *graft_sim_netns_trainer(const graft_sim_netns_t *net)
{
    return net->trainer;
}

const char *graft_sim_netns_etcd(const graft_sim_netns_t *net)
{
    return net->etcd;
}

graft_status_t graft_sim_netns_partition(graft_sim_netns_t *net, int group, int cut)
{
    if (net == NULL || group < 0 || group >= net->groups) {
        return GRAFT_EINVAL;
    }
    return sim_netns_cmd(0, "ip -n %s-0 link set p%d %s", net->prefix, group + 1,
                         cut ? "down" : "up") == 0
               ? GRAFT_OK
               : GRAFT_ESYS;
}

/* Blackhole routes between groups a and b, both ways (cut) or removed;
 * 0, or 1 when a command failed. */
static int sim_netns_blackhole(const graft_sim_netns_t *net, int a, int b, int cut)
{
    const char *op = cut ? "add" : "del";
    int bad = sim_netns_cmd(0, "ip -n %s-%d route %s blackhole 10.78.%d.%d/32", net->prefix,
                            a + 1, op, net->subnet, b + 2) != 0;
    bad |= sim_netns_cmd(0, "ip -n %s-%d route %s blackhole 10.78.%d.%d/32", net->prefix, b + 1,
                         op, net->subnet, a + 2) != 0;
    return bad;
}

graft_status_t graft_sim_netns_isolate(graft_sim_netns_t *net, int group, int cut)
{
    if (net == NULL || group < 0 || group >= net->groups) {
        return GRAFT_EINVAL;
    }
    int bad = 0;
    for (int x = 0; x < net->groups; x++) {
        if (x != group) {
            bad |= sim_netns_blackhole(net, group, x, cut);
        }
    }
    return bad ? GRAFT_ESYS : GRAFT_OK;
}

graft_status_t graft_sim_netns_cut_pair(graft_sim_netns_t *net, int a, int b, int cut)
{
    if (net == NULL || a < 0 || a >= net->groups || b < 0 || b >= net->groups || a == b) {
        return GRAFT_EINVAL;
    }
    return sim_netns_blackhole(net, a, b, cut) ? GRAFT_ESYS : GRAFT_OK;
}

graft_status_t graft_sim_netns_shape(graft_sim_netns_t *net, int group,
                                     graft_sim_link_shape_t shape)
{
    if (net == NULL || group < 0 || group >= net->groups) {
        return GRAFT_EINVAL;
    }
    return sim_netns_qdisc(net, group, "replace", shape, 0) == 0 ? GRAFT_OK : GRAFT_ESYS;
}

graft_status_t graft_sim_netns_probe(graft_sim_netns_t *net, graft_sim_link_shape_t shape)
{
    if (net == NULL) {
        return GRAFT_EINVAL;
    }
    if (sim_netns_qdisc(net, 0, "replace", shape, 1) != 0) {
        /* Half of it may have been applied: back to the base shape. */
        return graft_sim_netns_shape(net, 0, GRAFT_SIM_LINK_BASE) == GRAFT_OK ? GRAFT_ENOTSUP
                                                                               : GRAFT_ESYS;
    }
    return graft_sim_netns_shape(net, 0, GRAFT_SIM_LINK_BASE);
}
