/*
 * Transfer engine over real UCX on loopback with real donor processes
 * (forked before the recipient touches UCX). Every scenario runs over
 * UCX_TLS=tcp and over shared memory.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "alloc_fail.h"
#include "bench_stats.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include <graft/transfer.h>

#include "proto/graft.pb-c.h"

#define STEP 42
#define TOKEN "job-token-1"
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

typedef struct region_spec {
    const char *name;
    uint64_t bytes;
} region_spec_t;

/* Odd sizes, an unaligned tail, a tiny and an empty region. */
static const region_spec_t small_layout[] = {
    {"weights", (3u << 20) + 12345}, {"optim", 4u << 20}, {"rng", 13}, {"empty", 0},
    {"step", 8},
};
/* Big enough that a donor can be killed mid-pull. */
static const region_spec_t big_layout[] = {{"weights", 24u << 20}, {"optim", 24u << 20}};

typedef struct donor_opts {
    const region_spec_t *layout;
    size_t n_regions;
    uint64_t chunk;
    const char *token;
    uint64_t step;
    int flip_region; /* -1: identical state */
    uint64_t flip_offset;
    uint32_t serve_delay_ms; /* listen at once, begin serving this much later */
    bool host_mem; /* regions inside one graft_transfer_host_alloc() block */
    const char *listen;    /* listen_address; NULL = the default */
    const char *advertise; /* advertise_address */
    uint32_t max_recipients; /* 0: the default */
    /* Announce the step (graft_transfer_serve_expect) instead of serving
     * it; begin serving, or withdraw, this much later (0: never). */
    bool expect;
    uint32_t begin_after_ms;
    uint32_t withdraw_after_ms;
} donor_opts_t;

typedef struct donor_proc {
    pid_t pid;
    int cmd_fd;
    int resp_fd;
    char addr[64];
} donor_proc_t;

/* Word k of the pattern of @seed (splitmix64 of a counter): any piece of a
 * region can be regenerated on its own, 8 bytes per step. */
static uint64_t pattern_word(uint64_t seed, uint64_t k)
{
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + (k + 1) * 0xD1B54A32D192ED03ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Bytes [off, off + n) of the pattern of @seed, to @p. */
static void pattern_at(uint8_t *p, uint64_t off, uint64_t n, uint64_t seed)
{
    uint64_t i = 0;
    while (i < n) {
        uint64_t k = (off + i) / 8, skip = (off + i) % 8;
        uint64_t w = pattern_word(seed, k);
        uint64_t take = 8 - skip < n - i ? 8 - skip : n - i;
        memcpy(p + i, (const uint8_t *)&w + skip, (size_t)take);
        i += take;
    }
}

static void fill_pattern(uint8_t *p, uint64_t n, uint64_t seed)
{
    pattern_at(p, 0, n, seed);
}

/* Whether @p holds the pattern of @seed, compared in 1 MiB pieces. */
static bool pattern_matches(const uint8_t *p, uint64_t n, uint64_t seed)
{
    enum { PIECE = 1u << 20 };
    uint8_t *want = malloc(PIECE);
    bool ok = want != NULL;
    for (uint64_t off = 0; off < n && ok; off += PIECE) {
        uint64_t len = n - off < PIECE ? n - off : PIECE;
        pattern_at(want, off, len, seed);
        ok = memcmp(want, p + off, (size_t)len) == 0;
    }
    free(want);
    return ok;
}

static bool read_full(int fd, void *buf, size_t n, int timeout_ms)
{
    size_t got = 0;
    while (got < n) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int rc = poll(&pfd, 1, timeout_ms);
        if (rc <= 0)
            return false;
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return true;
}

static bool write_full(int fd, const void *buf, size_t n)
{
    size_t put = 0;
    while (put < n) {
        ssize_t w = write(fd, (const char *)buf + put, n - put);
        if (w <= 0)
            return false;
        put += (size_t)w;
    }
    return true;
}

/* Where region @i of a layout lies in a host block: the first at an odd
 * offset, the others each at the next 64-byte boundary, so that regions
 * cover parts of the block, never all of it. */
static uint64_t host_block_offset(const region_spec_t *layout, size_t i)
{
    uint64_t off = 13;
    for (size_t k = 0; k < i; k++)
        off = (off + layout[k].bytes + 63) / 64 * 64;
    return off;
}

static uint64_t host_block_bytes(const region_spec_t *layout, size_t n)
{
    return host_block_offset(layout, n) + 4096;
}

/* The donor process: serve until told to quit; answer fence questions. */
static int donor_main(const donor_opts_t *o, int cmd_fd, int resp_fd)
{
    graft_transfer_config_t cfg = {.job_token = o->token, .chunk_bytes = o->chunk, .group = 1,
                                   .listen_address = o->listen,
                                   .advertise_address = o->advertise,
                                   .max_recipients = o->max_recipients};
    graft_transfer_endpoint_t *ep = NULL;
    uint8_t **mem = calloc(o->n_regions + 1, sizeof(*mem));
    char addr[64] = {0};
    int rc = 1;

    uint8_t *block = NULL;

    if (graft_transfer_endpoint_create(&cfg, &ep) != GRAFT_OK)
        goto out;
    if (o->host_mem && graft_transfer_host_alloc(ep, host_block_bytes(o->layout, o->n_regions),
                                                 (void **)&block) != GRAFT_OK)
        goto out;
    for (size_t i = 0; i < o->n_regions; i++) {
        mem[i] = block != NULL ? block + host_block_offset(o->layout, i)
                               : malloc(o->layout[i].bytes + 1);
        fill_pattern(mem[i], o->layout[i].bytes, i + 1);
        if ((int)i == o->flip_region)
            mem[i][o->flip_offset] ^= 0x40;
        graft_transfer_region_t r = {.name = o->layout[i].name,
                                     .kind = GRAFT_TRANSFER_REGION_PARAM,
                                     .ptr = mem[i],
                                     .bytes = o->layout[i].bytes};
        if (graft_transfer_region_register(ep, &r) != GRAFT_OK)
            goto out;
    }
    if (o->expect && graft_transfer_serve_expect(ep, o->step) != GRAFT_OK)
        goto out;
    if (!o->expect && o->serve_delay_ms == 0 && graft_transfer_serve_begin(ep, o->step) != GRAFT_OK)
        goto out;
    snprintf(addr, sizeof(addr), "%s", graft_transfer_endpoint_address(ep));
    if (!write_full(resp_fd, addr, sizeof(addr)))
        goto out;
    if (o->serve_delay_ms > 0) {
        usleep(o->serve_delay_ms * 1000u);
        if (graft_transfer_serve_begin(ep, o->step) != GRAFT_OK)
            goto out;
    }
    if (o->begin_after_ms > 0) {
        usleep(o->begin_after_ms * 1000u);
        if (graft_transfer_serve_begin(ep, o->step) != GRAFT_OK)
            goto out;
    }
    if (o->withdraw_after_ms > 0) {
        usleep(o->withdraw_after_ms * 1000u);
        if (graft_transfer_serve_end(ep) != GRAFT_OK)
            goto out;
    }
    for (;;) {
        uint32_t cmd[3];
        if (!read_full(cmd_fd, cmd, sizeof(cmd), -1) || cmd[0] == 'Q')
            break;
        if (cmd[0] == 'M') {
            /* Change a byte behind the engine's back (after hashing). */
            mem[cmd[1]][cmd[2]] ^= 0x01;
            int32_t out[2] = {0, 0};
            if (!write_full(resp_fd, out, sizeof(out)))
                break;
        }
        if (cmd[0] == 'R') {
            /* Serve the same step again, as after a rollback. */
            int32_t out[2] = {graft_transfer_serve_end(ep), 0};
            if (out[0] == GRAFT_OK)
                out[0] = graft_transfer_serve_begin(ep, o->step);
            if (!write_full(resp_fd, out, sizeof(out)))
                break;
        }
        if (cmd[0] == 'P') {
            int32_t out[2] = {(int32_t)graft_transfer_serve_peak(ep), 0};
            if (!write_full(resp_fd, out, sizeof(out)))
                break;
        }
        if (cmd[0] == 'F') {
            int32_t st = graft_transfer_fence_wait(ep, o->step, cmd[1], cmd[2]);
            uint32_t count = graft_transfer_fence_count(ep, o->step);
            int32_t out[2] = {st, (int32_t)count};
            if (!write_full(resp_fd, out, sizeof(out)))
                break;
        }
    }
    /* A withdrawn announcement leaves nothing to end. */
    rc = graft_transfer_serve_end(ep) == GRAFT_OK || o->withdraw_after_ms > 0 ? 0 : 1;
out:
    /* The endpoint frees the block (its regions keep it until then). */
    graft_transfer_endpoint_destroy(ep);
    for (size_t i = 0; i < o->n_regions && block == NULL; i++)
        free(mem[i]);
    free(mem);
    return rc;
}

/* The parent's ends of every live donor's pipes: a new donor closes them,
 * so that a donor sees EOF when the test is done with it. */
static int open_fds[64];
static int n_open_fds;
/* Donors spawned and not yet stopped: a failed assertion leaves them to the
 * teardown. */
static pid_t live_donors[32];
static int n_live_donors;

static void track_fd(int fd, bool add)
{
    if (add) {
        assert_true(n_open_fds < (int)ARRAY_SIZE(open_fds));
        open_fds[n_open_fds++] = fd;
        return;
    }
    for (int i = 0; i < n_open_fds; i++) {
        if (open_fds[i] == fd) {
            open_fds[i] = open_fds[--n_open_fds];
            return;
        }
    }
}

/* Forks a donor-like child that runs @child_main(@arg, its command pipe,
 * its answer pipe), dies with the test and holds no other child's pipes
 * open; waits for the address it answers first. */
static void child_spawn(donor_proc_t *d, int (*child_main)(const void *, int, int),
                        const void *arg)
{
    int cmd[2], resp[2];
    assert_int_equal(pipe(cmd), 0);
    assert_int_equal(pipe(resp), 0);
    d->pid = fork();
    assert_true(d->pid >= 0);
    if (d->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (int i = 0; i < n_open_fds; i++)
            close(open_fds[i]);
        close(cmd[1]);
        close(resp[0]);
        _exit(child_main(arg, cmd[0], resp[1]));
    }
    close(cmd[0]);
    close(resp[1]);
    d->cmd_fd = cmd[1];
    d->resp_fd = resp[0];
    track_fd(d->cmd_fd, true);
    track_fd(d->resp_fd, true);
    assert_true(n_live_donors < (int)ARRAY_SIZE(live_donors));
    live_donors[n_live_donors++] = d->pid;
    /* 60 s: a donor of 10,000 regions maps each one, which took over 20 s
     * in a sanitizer build on 2 loaded cores. */
    assert_true(read_full(d->resp_fd, d->addr, sizeof(d->addr), 60000));
}

static int donor_child(const void *arg, int cmd_fd, int resp_fd)
{
    return donor_main(arg, cmd_fd, resp_fd);
}

static void donor_spawn(const donor_opts_t *o, donor_proc_t *d)
{
    child_spawn(d, donor_child, o);
}

static void donor_fence(donor_proc_t *d, uint32_t expected, uint32_t timeout_ms, int32_t *st_p,
                        int32_t *count_p)
{
    uint32_t cmd[3] = {'F', expected, timeout_ms};
    int32_t out[2];
    assert_true(write_full(d->cmd_fd, cmd, sizeof(cmd)));
    assert_true(read_full(d->resp_fd, out, sizeof(out), (int)timeout_ms + 10000));
    *st_p = out[0];
    *count_p = out[1];
}

/* Quit, or reap a donor the test killed. Returns the exit status. */
static int donor_stop(donor_proc_t *d)
{
    int ws = 0;
    uint32_t cmd[3] = {'Q', 0, 0};
    if (!write_full(d->cmd_fd, cmd, sizeof(cmd)))
        kill(d->pid, SIGKILL);
    kill(d->pid, SIGCONT);
    for (int i = 0; i < 200; i++) {
        if (waitpid(d->pid, &ws, WNOHANG) == d->pid)
            goto reaped;
        usleep(50000);
    }
    kill(d->pid, SIGKILL);
    waitpid(d->pid, &ws, 0);
reaped:
    for (int i = 0; i < n_live_donors; i++) {
        if (live_donors[i] == d->pid) {
            live_donors[i] = live_donors[--n_live_donors];
            break;
        }
    }
    if (WIFSIGNALED(ws))
        print_message("# donor %d ended by signal %d\n", (int)d->pid, WTERMSIG(ws));
    track_fd(d->cmd_fd, false);
    track_fd(d->resp_fd, false);
    close(d->cmd_fd);
    close(d->resp_fd);
    return ws;
}

/* The recipient: an endpoint with zeroed regions of a layout. */
typedef struct recipient {
    graft_transfer_endpoint_t *ep;
    bool host_mem; /* mem[] lie in a host block of ep, freed with it */
    uint8_t **mem;
    const region_spec_t *layout;
    size_t n_regions;
} recipient_t;

/* A copy of the recipient a test has not destroyed yet: a failed assertion
 * leaves it behind, and the teardown frees it so that its UCX context is not
 * inherited by the next test's forked donors. */
static recipient_t g_live_recipient;

static void recipient_create_in(recipient_t *r, const region_spec_t *layout, size_t n,
                                uint64_t chunk, const char *token, bool host_mem)
{
    graft_transfer_config_t cfg = {.job_token = token, .chunk_bytes = chunk, .group = 2};
    uint8_t *block = NULL;
    memset(r, 0, sizeof(*r));
    r->layout = layout;
    r->n_regions = n;
    r->host_mem = host_mem;
    r->mem = calloc(n + 1, sizeof(*r->mem));
    graft_status_t st = graft_transfer_endpoint_create(&cfg, &r->ep);
    g_live_recipient = *r; /* shares r->mem, filled in below */
    assert_int_equal(st, GRAFT_OK);
    if (host_mem) {
        uint64_t bytes = host_block_bytes(layout, n);
        assert_int_equal(graft_transfer_host_alloc(r->ep, bytes, (void **)&block), GRAFT_OK);
        memset(block, 0, bytes);
    }
    for (size_t i = 0; i < n; i++) {
        r->mem[i] = host_mem ? block + host_block_offset(layout, i)
                             : calloc(1, layout[i].bytes + 1);
        graft_transfer_region_t reg = {.name = layout[i].name,
                                       .kind = GRAFT_TRANSFER_REGION_PARAM,
                                       .ptr = r->mem[i],
                                       .bytes = layout[i].bytes};
        assert_int_equal(graft_transfer_region_register(r->ep, &reg), GRAFT_OK);
    }
}

static void recipient_create(recipient_t *r, const region_spec_t *layout, size_t n, uint64_t chunk,
                             const char *token)
{
    recipient_create_in(r, layout, n, chunk, token, false);
}

static bool recipient_matches(const recipient_t *r)
{
    bool ok = true;
    for (size_t i = 0; i < r->n_regions && ok; i++)
        ok = pattern_matches(r->mem[i], r->layout[i].bytes, i + 1);
    return ok;
}

static void recipient_destroy(recipient_t *r)
{
    if (g_live_recipient.mem == r->mem)
        memset(&g_live_recipient, 0, sizeof(g_live_recipient));
    graft_transfer_endpoint_destroy(r->ep);
    for (size_t i = 0; i < r->n_regions && !r->host_mem; i++)
        free(r->mem[i]);
    free(r->mem);
}

static donor_opts_t opts_for(const region_spec_t *layout, size_t n, uint64_t chunk)
{
    donor_opts_t o = {.layout = layout,
                      .n_regions = n,
                      .chunk = chunk,
                      .token = TOKEN,
                      .step = STEP,
                      .flip_region = -1};
    return o;
}

/* The read protocol of the group being run. */
static graft_transfer_read_t g_read = GRAFT_TRANSFER_READ_GET;

static graft_status_t do_pull(graft_transfer_endpoint_t *ep,
                              const graft_transfer_pull_options_t *po,
                              graft_transfer_report_t *rep)
{
    graft_transfer_pull_options_t o = *po;
    o.read = g_read;
    graft_status_t st = graft_transfer_pull(ep, &o, rep);
    /* What each donor did, so that a failure in CI explains itself. */
    if (st != GRAFT_OK) {
        print_message("# pull: %s\n", graft_status_name(st));
        for (size_t i = 0; i < rep->n_donors; i++)
            print_message("#   donor %zu: %s, %llu bytes, %llu chunks, %llu reassigned, "
                          "lanes '%s'\n", i, graft_status_name(rep->donors[i].status),
                          (unsigned long long)rep->donors[i].bytes,
                          (unsigned long long)rep->donors[i].chunks,
                          (unsigned long long)rep->donors[i].reassigned,
                          rep->donors[i].transports);
    }
    return st;
}

/* Whether the group being run asked UCX for tcp only. */
static bool group_is_tcp(void)
{
    const char *tls = getenv("UCX_TLS");
    return tls != NULL && strcmp(tls, "tcp") == 0;
}

static bool tl_is_shm(const char *tl)
{
    static const char *const shm[] = {"sysv", "posix", "cma", "xpmem", "knem"};
    for (size_t i = 0; i < ARRAY_SIZE(shm); i++) {
        if (strcmp(tl, shm[i]) == 0)
            return true;
    }
    return false;
}

/* From a donor report's transports ("tl/dev:use,use tl/dev ..."): the
 * transport of the lane that carries active messages (use "am"), and
 * whether every lane is tcp. */
static void lanes_parse(const char *transports, char *am_tl, size_t am_size, bool *all_tcp_p)
{
    char copy[sizeof(((graft_transfer_donor_report_t *)0)->transports)];
    char *save = NULL;
    bool all_tcp = true;
    am_tl[0] = '\0';
    snprintf(copy, sizeof(copy), "%s", transports);
    for (char *lane = strtok_r(copy, " ", &save); lane != NULL;
         lane = strtok_r(NULL, " ", &save)) {
        char *uses = strchr(lane, ':');
        char *slash = strchr(lane, '/');
        if (uses != NULL)
            *uses++ = '\0';
        if (slash != NULL)
            *slash = '\0';
        all_tcp = all_tcp && strcmp(lane, "tcp") == 0;
        char *usave = NULL;
        for (char *u = uses != NULL ? strtok_r(uses, ",", &usave) : NULL; u != NULL;
             u = strtok_r(NULL, ",", &usave)) {
            if (strcmp(u, "am") == 0)
                snprintf(am_tl, am_size, "%s", lane);
        }
    }
    *all_tcp_p = all_tcp;
}

/* The connection to a donor used what the group asked for: over tcp every
 * lane is tcp; over shared memory the lane of the protocol's messages is a
 * shared-memory transport (bulk bytes of malloc'ed memory may still travel
 * on a tcp lane: shared memory cannot map them). A silent fallback to tcp
 * fails here. */
static void assert_group_transports(const graft_transfer_donor_report_t *dr)
{
    char am_tl[32];
    bool all_tcp;
    lanes_parse(dr->transports, am_tl, sizeof(am_tl), &all_tcp);
    if (group_is_tcp()) {
        if (!all_tcp)
            print_message("# lanes: %s\n", dr->transports);
        assert_true(all_tcp);
        assert_string_equal(am_tl, "tcp");
    } else {
        if (!tl_is_shm(am_tl))
            print_message("# lanes: %s\n", dr->transports);
        assert_true(tl_is_shm(am_tl));
    }
}

/* After every wire test: free what a failed assertion left behind. */
static int wire_teardown(void **state)
{
    (void)state;
    if (g_live_recipient.mem != NULL) {
        recipient_t r = g_live_recipient;
        recipient_destroy(&r);
    }
    for (int i = 0; i < n_live_donors; i++) {
        kill(live_donors[i], SIGKILL);
        waitpid(live_donors[i], NULL, 0);
    }
    n_live_donors = 0;
    for (int i = 0; i < n_open_fds; i++)
        close(open_fds[i]);
    n_open_fds = 0;
    return 0;
}

/* ------------------------------------------------------------------------ */

static void pull_from_k(int k)
{
    donor_proc_t d[3];
    donor_opts_t o = opts_for(small_layout, ARRAY_SIZE(small_layout), 256u << 10);
    const char *addrs[3];
    recipient_t r;
    graft_transfer_report_t rep;

    for (int i = 0; i < k; i++) {
        donor_spawn(&o, &d[i]);
        addrs[i] = d[i].addr;
    }
    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), 256u << 10, TOKEN);
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = (size_t)k, .step = STEP};
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(rep.installed);
    assert_true(recipient_matches(&r));
    uint64_t sum = 0;
    for (int i = 0; i < k; i++) {
        assert_int_equal(rep.donors[i].status, GRAFT_OK);
        assert_group_transports(&rep.donors[i]);
        sum += rep.donors[i].bytes;
    }
    assert_int_equal(sum, rep.bytes);
    recipient_destroy(&r);
    for (int i = 0; i < k; i++)
        assert_int_equal(donor_stop(&d[i]), 0);
}

static void test_pull_1_donor(void **state)
{
    (void)state;
    pull_from_k(1);
}

static void test_pull_2_donors(void **state)
{
    (void)state;
    pull_from_k(2);
}

static void test_pull_3_donors(void **state)
{
    (void)state;
    pull_from_k(3);
}

/* A refusal is precise and the donor keeps serving correct requests. */
static void test_refusals(void **state)
{
    (void)state;
    donor_proc_t d;
    donor_opts_t o = opts_for(small_layout, ARRAY_SIZE(small_layout), 256u << 10);
    const char *addrs[1];
    recipient_t r;
    graft_transfer_report_t rep;
    static const region_spec_t other_layout[] = {{"weights", 1000}};

    donor_spawn(&o, &d);
    addrs[0] = d.addr;

    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), 256u << 10, "wrong-token");
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 1, .step = STEP};
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_ENODONOR);
    assert_int_equal(rep.donors[0].status, GRAFT_ETOKEN);
    assert_false(rep.installed);
    recipient_destroy(&r);

    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), 256u << 10, TOKEN);
    /* A donor at an older step may be about to move on: asked again until
     * the connect deadline, then its refusal is the answer. */
    po.step = STEP + 1;
    po.connect_timeout_ms = 400;
    double t0 = graft_test_now_s();
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_ENODONOR);
    assert_int_equal(rep.donors[0].status, GRAFT_ESTEP);
    assert_true(graft_test_now_s() - t0 >= 0.2);
    po.step = STEP;
    po.connect_timeout_ms = 0;
    recipient_destroy(&r);

    recipient_create(&r, other_layout, 1, 256u << 10, TOKEN);
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_ENODONOR);
    assert_int_equal(rep.donors[0].status, GRAFT_ELAYOUT);
    recipient_destroy(&r);

    /* A different chunk size is caught by the recipient. */
    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), 128u << 10, TOKEN);
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_ENODONOR);
    assert_int_equal(rep.donors[0].status, GRAFT_EPROTO);
    recipient_destroy(&r);

    /* Nobody listening. */
    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), 256u << 10, TOKEN);
    const char *nobody[1] = {"127.0.0.1:1"};
    po.donors = nobody;
    po.connect_timeout_ms = 2000;
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_ENODONOR);
    assert_int_equal(graft_status_class(rep.donors[0].status), GRAFT_CLASS_PEER);
    const char *bad[1] = {"not-an-address"};
    po.donors = bad;
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_ENODONOR);
    assert_int_equal(rep.donors[0].status, GRAFT_EINVAL);

    po.donors = addrs;
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(recipient_matches(&r));
    recipient_destroy(&r);
    assert_int_equal(donor_stop(&d), 0);
}

/* A recipient that asks before its donor has begun serving the step (the
 * quorum reached the recipient first) waits for it instead of failing. */
static void test_donor_serves_late(void **state)
{
    (void)state;
    donor_proc_t d;
    donor_opts_t o = opts_for(small_layout, ARRAY_SIZE(small_layout), 256u << 10);
    const char *addrs[1];
    recipient_t r;
    graft_transfer_report_t rep;

    o.serve_delay_ms = 300;
    donor_spawn(&o, &d);
    addrs[0] = d.addr;
    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), 256u << 10, TOKEN);
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 1, .step = STEP};
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(recipient_matches(&r));
    assert_int_equal(rep.donors[0].status, GRAFT_OK);
    recipient_destroy(&r);
    assert_int_equal(donor_stop(&d), 0);
}

typedef struct injector {
    pid_t victims[3];
    int n_victims;
    int sig;
    uint64_t at;
    bool fired;
    graft_transfer_endpoint_t *cancel_ep;
} injector_t;

static void inject(uint64_t done, uint64_t total, void *arg)
{
    injector_t *in = arg;
    (void)total;
    if (in->fired || done < in->at)
        return;
    in->fired = true;
    for (int i = 0; i < in->n_victims; i++)
        kill(in->victims[i], in->sig);
    if (in->cancel_ep != NULL)
        graft_transfer_pull_cancel(in->cancel_ep);
}

static uint64_t big_total(void)
{
    uint64_t t = 0;
    for (size_t i = 0; i < ARRAY_SIZE(big_layout); i++)
        t += big_layout[i].bytes;
    return t;
}

/* One of three donors is killed (or stopped) after a quarter of the bytes.
 * With @host_mem the donors' regions lie in host blocks: on shared memory
 * the recipient then reads them by itself, so a victim's memory may stay
 * readable after it died and it may legitimately finish its share. */
static void failover_in(int sig, bool host_mem)
{
    donor_proc_t d[3];
    donor_opts_t o = opts_for(big_layout, ARRAY_SIZE(big_layout), 64u << 10);
    o.host_mem = host_mem;
    const char *addrs[3];
    recipient_t r;
    graft_transfer_report_t rep;
    injector_t in = {.n_victims = 1, .sig = sig, .at = big_total() / 4};

    for (int i = 0; i < 3; i++) {
        donor_spawn(&o, &d[i]);
        addrs[i] = d[i].addr;
    }
    in.victims[0] = d[1].pid;
    recipient_create(&r, big_layout, ARRAY_SIZE(big_layout), 64u << 10, TOKEN);
    graft_transfer_pull_options_t po = {.donors = addrs,
                                        .n_donors = 3,
                                        .step = STEP,
                                        .window = 2,
                                        .stall_timeout_ms = 1500,
                                        .progress = inject,
                                        .progress_arg = &in};
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(in.fired);
    assert_true(rep.installed);
    assert_true(recipient_matches(&r));
    /* The healthy donors finish; on a machine loaded enough that one of
     * them also goes quiet past the stall timeout it is dropped the same way,
     * and at least one of them must have carried the pull to the end. */
    assert_true(rep.donors[0].status == GRAFT_OK || rep.donors[0].status == GRAFT_EPEER_TIMEOUT);
    assert_true(rep.donors[2].status == GRAFT_OK || rep.donors[2].status == GRAFT_EPEER_TIMEOUT);
    assert_true(rep.donors[0].status == GRAFT_OK || rep.donors[2].status == GRAFT_OK);
    /* Over TCP the victim is dropped; over shared memory a stopped donor's
     * memory stays readable, so it may legitimately finish its share, and
     * so may a killed one's host block, which the recipient has mapped. */
    bool shared = strcmp(getenv("UCX_TLS"), "tcp") != 0;
    if ((sig == SIGKILL && !(host_mem && shared)) || !shared)
        assert_int_equal(graft_status_class(rep.donors[1].status), GRAFT_CLASS_PEER);
    if (rep.donors[1].status != GRAFT_OK)
        assert_int_equal(graft_status_class(rep.donors[1].status), GRAFT_CLASS_PEER);
    if (sig == SIGSTOP && rep.donors[1].status != GRAFT_OK)
        assert_int_equal(rep.donors[1].status, GRAFT_EPEER_TIMEOUT);
    /* Resumed, not restarted: a dropped victim's reads in flight went back
     * to the queue for the others (reassigned), what it delivered before it
     * was stopped stays installed (its chunks count, and every byte is
     * counted exactly once across the donors). */
    if (rep.donors[1].status != GRAFT_OK)
        assert_true(rep.donors[1].reassigned > 0);
    assert_true(rep.donors[1].chunks > 0);
    for (int i = 0; i < 3; i += 2) {
        if (rep.donors[i].status == GRAFT_OK)
            assert_int_equal(rep.donors[i].reassigned, 0);
    }
    assert_int_equal(rep.donors[0].bytes + rep.donors[1].bytes + rep.donors[2].bytes, rep.bytes);
    assert_int_equal(rep.donors[0].chunks + rep.donors[1].chunks + rep.donors[2].chunks,
                     rep.chunks);
    /* Striped: more than one donor served a share. */
    int serving = 0;
    for (int i = 0; i < 3; i++)
        serving += rep.donors[i].chunks > 0;
    assert_true(serving >= 2);
    recipient_destroy(&r);
    /* With host blocks on shared memory no get reaches a donor's progress
     * thread, so the stopped donor, resumed, must end cleanly. */
    int victim_ws = donor_stop(&d[1]);
    if (sig == SIGSTOP && host_mem && shared)
        assert_int_equal(victim_ws, 0);
    (void)donor_stop(&d[0]);
    (void)donor_stop(&d[2]);
}

static void failover(int sig)
{
    failover_in(sig, false);
}

static void test_donor_killed(void **state)
{
    (void)state;
    failover(SIGKILL);
}

static void test_donor_stopped(void **state)
{
    (void)state;
    failover(SIGSTOP);
}

static void test_all_donors_dead(void **state)
{
    (void)state;
    donor_proc_t d[2];
    donor_opts_t o = opts_for(big_layout, ARRAY_SIZE(big_layout), 64u << 10);
    const char *addrs[2];
    recipient_t r;
    graft_transfer_report_t rep;
    injector_t in = {.n_victims = 2, .sig = SIGKILL, .at = big_total() / 5};

    for (int i = 0; i < 2; i++) {
        donor_spawn(&o, &d[i]);
        addrs[i] = d[i].addr;
        in.victims[i] = d[i].pid;
    }
    recipient_create(&r, big_layout, ARRAY_SIZE(big_layout), 64u << 10, TOKEN);
    graft_transfer_pull_options_t po = {.donors = addrs,
                                        .n_donors = 2,
                                        .step = STEP,
                                        .window = 2,
                                        .stall_timeout_ms = 1500,
                                        .progress = inject,
                                        .progress_arg = &in};
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_ENODONOR);
    assert_false(rep.installed);
    assert_int_equal(rep.status, GRAFT_ENODONOR);
    assert_true(rep.donors[0].bytes + rep.donors[1].bytes < rep.bytes);
    /* Both are reported failed. (Their reassigned counts are not checked:
     * once no donor is left the pull ends without reaping the reads that
     * the last ones had in flight.) */
    for (int i = 0; i < 2; i++)
        assert_int_equal(graft_status_class(rep.donors[i].status), GRAFT_CLASS_PEER);
    recipient_destroy(&r);
    for (int i = 0; i < 2; i++)
        (void)donor_stop(&d[i]);
}

static void suicide(uint64_t done, uint64_t total, void *arg)
{
    (void)arg;
    if (done >= total / 4)
        raise(SIGKILL);
}

/* A recipient that dies mid-pull must not hurt the donor. */
static void test_recipient_killed(void **state)
{
    (void)state;
    donor_proc_t d;
    donor_opts_t o = opts_for(big_layout, ARRAY_SIZE(big_layout), 64u << 10);
    const char *addrs[1];
    recipient_t r;
    graft_transfer_report_t rep;
    int ws = 0;

    /* With one-sided gets UCX 1.13 serves the reads by emulation in the
     * donor's progress thread, and a recipient that vanishes with reads
     * queued can abort the donor ("ucp_get_req_handler: Fatal"; see
     * graft_transfer_read_t and docs/TRANSFER.md). That is why push is the
     * default; only push promises a donor that outlives its recipient. */
    if (g_read != GRAFT_TRANSFER_READ_PUSH) {
        skip();
        return;
    }
    donor_spawn(&o, &d);
    addrs[0] = d.addr;
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        recipient_create(&r, big_layout, ARRAY_SIZE(big_layout), 64u << 10, TOKEN);
        graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 1, .step = STEP,
                                            .window = 2, .progress = suicide};
        graft_status_t st = do_pull(r.ep, &po, &rep);
        _exit(st == GRAFT_OK ? 3 : 4);
    }
    assert_int_equal(waitpid(child, &ws, 0), child);
    assert_true(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);
    /* The lost connection counts for the fence at once (UCX reports the
     * dead peer), not after the fence timeout. */
    int32_t st, count;
    donor_fence(&d, 1, 10000, &st, &count);
    assert_int_equal(st, GRAFT_OK);
    assert_int_equal(count, 1);

    recipient_create(&r, big_layout, ARRAY_SIZE(big_layout), 64u << 10, TOKEN);
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 1, .step = STEP};
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(recipient_matches(&r));
    recipient_destroy(&r);
    /* The finished pull counts once, though its connection closes too. */
    donor_fence(&d, 2, 5000, &st, &count);
    assert_int_equal(st, GRAFT_OK);
    usleep(300000);
    donor_fence(&d, 3, 0, &st, &count);
    assert_int_equal(count, 2);
    assert_int_equal(donor_stop(&d), 0);
}

static void test_drift(void **state)
{
    (void)state;
    donor_proc_t d[2];
    donor_opts_t o = opts_for(small_layout, ARRAY_SIZE(small_layout), 256u << 10);
    const char *addrs[2];
    recipient_t r;
    graft_transfer_report_t rep;

    donor_spawn(&o, &d[0]);
    o.flip_region = 1;
    o.flip_offset = (5u << 18) + 77; /* chunk 5 of "optim" */
    donor_spawn(&o, &d[1]);
    addrs[0] = d[0].addr;
    addrs[1] = d[1].addr;
    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), 256u << 10, TOKEN);
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 2, .step = STEP};
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_EDRIFT);
    assert_false(rep.installed);
    assert_string_equal(rep.drift.region, "optim");
    assert_int_equal(rep.drift.chunk, 5);
    assert_true((rep.drift.donor_a == 0 && rep.drift.donor_b == 1) ||
                (rep.drift.donor_a == 1 && rep.drift.donor_b == 0));
    assert_true(rep.drift.hash_a != rep.drift.hash_b);
    recipient_destroy(&r);
    for (int i = 0; i < 2; i++)
        assert_int_equal(donor_stop(&d[i]), 0);
}

/* A donor whose memory changes after hashing is caught by the recipient
 * (its bytes no longer match its own hash) and its chunks refetched. */
static void test_donor_bytes_changed(void **state)
{
    (void)state;
    donor_proc_t d[2];
    donor_opts_t o = opts_for(small_layout, ARRAY_SIZE(small_layout), 256u << 10);
    const char *addrs[2];
    recipient_t r;
    graft_transfer_report_t rep;
    int32_t out[2];

    for (int i = 0; i < 2; i++)
        donor_spawn(&o, &d[i]);
    usleep(300000); /* hashing of the 7 MiB is long done */
    uint32_t cmd[3] = {'M', 1, (3u << 18) + 5};
    assert_true(write_full(d[1].cmd_fd, cmd, sizeof(cmd)));
    assert_true(read_full(d[1].resp_fd, out, sizeof(out), 10000));

    addrs[0] = d[1].addr;
    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), 256u << 10, TOKEN);
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 1, .step = STEP};
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_ENODONOR);
    assert_int_equal(rep.donors[0].status, GRAFT_EHASH);
    assert_false(rep.installed);

    addrs[1] = d[0].addr;
    po.n_donors = 2;
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(rep.donors[0].status == GRAFT_OK || rep.donors[0].status == GRAFT_EHASH);
    assert_int_equal(rep.donors[1].status, GRAFT_OK);
    assert_true(recipient_matches(&r));
    recipient_destroy(&r);
    for (int i = 0; i < 2; i++)
        assert_int_equal(donor_stop(&d[i]), 0);
}

/* 10,000 small regions of odd sizes (a manifest of about a megabyte, sent
 * by rendezvous) and a 1 KiB state. */
static void test_many_small_regions(void **state)
{
    (void)state;
    enum { N = 10000 };
    static region_spec_t many[N];
    static char names[N][16];
    static const region_spec_t tiny[] = {{"kib", 1024}};
    donor_proc_t d[2];
    const char *addrs[2];
    recipient_t r;
    graft_transfer_report_t rep;

    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "r%05d", i);
        many[i].name = names[i];
        many[i].bytes = (uint64_t)((i * 7919) % 3001);
    }
    donor_opts_t o = opts_for(many, N, 4096);
    for (int i = 0; i < 2; i++) {
        donor_spawn(&o, &d[i]);
        addrs[i] = d[i].addr;
    }
    recipient_create(&r, many, N, 4096, TOKEN);
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 2, .step = STEP,
                                        .window = 16};
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(recipient_matches(&r));
    recipient_destroy(&r);
    for (int i = 0; i < 2; i++)
        assert_int_equal(donor_stop(&d[i]), 0);

    o = opts_for(tiny, 1, 256u << 10);
    donor_spawn(&o, &d[0]);
    addrs[0] = d[0].addr;
    recipient_create(&r, tiny, 1, 256u << 10, TOKEN);
    po.n_donors = 1;
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_int_equal(rep.bytes, 1024);
    assert_true(recipient_matches(&r));
    recipient_destroy(&r);
    assert_int_equal(donor_stop(&d[0]), 0);
}

/* The largest pull the issue asks for: 1 GiB in two regions (one with an
 * odd size, so the last chunk of each is short) from one donor process,
 * every byte compared with the pattern the donor wrote. AddressSanitizer
 * builds pull 256 MiB instead: a GiB took 22-32 s per group there
 * (instrumented filling, hashing and comparing; 2 cores under load),
 * against 4-8 s uninstrumented. */
#ifdef __SANITIZE_ADDRESS__
#define BIG_PULL_BYTES (256ull << 20)
#else
#define BIG_PULL_BYTES (1ull << 30)
#endif
static void test_pull_1gib(void **state)
{
    (void)state;
    static const region_spec_t gib[] = {
        {"weights", BIG_PULL_BYTES / 8 * 5 + 4097},
        {"optim", BIG_PULL_BYTES - (BIG_PULL_BYTES / 8 * 5 + 4097)},
    };
    donor_proc_t d;
    donor_opts_t o = opts_for(gib, ARRAY_SIZE(gib), 0); /* default chunk size */
    const char *addrs[1];
    recipient_t r;
    graft_transfer_report_t rep;

    assert_int_equal(gib[0].bytes + gib[1].bytes, BIG_PULL_BYTES);
    donor_spawn(&o, &d);
    addrs[0] = d.addr;
    recipient_create(&r, gib, ARRAY_SIZE(gib), 0, TOKEN);
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 1, .step = STEP};
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(rep.installed);
    assert_int_equal(rep.bytes, BIG_PULL_BYTES);
    assert_int_equal(rep.donors[0].bytes, BIG_PULL_BYTES);
    assert_int_equal(rep.chunks, rep.donors[0].chunks);
    assert_group_transports(&rep.donors[0]);
    assert_int_equal(rep.chunks, (gib[0].bytes + GRAFT_TRANSFER_DEFAULT_CHUNK_BYTES - 1) /
                                         GRAFT_TRANSFER_DEFAULT_CHUNK_BYTES +
                                     (gib[1].bytes + GRAFT_TRANSFER_DEFAULT_CHUNK_BYTES - 1) /
                                         GRAFT_TRANSFER_DEFAULT_CHUNK_BYTES);
    double t0 = graft_test_now_s();
    assert_true(recipient_matches(&r));
    print_message("# %llu MiB pulled in %.2f s (%.2f GB/s), compared in %.2f s\n",
                  (unsigned long long)(BIG_PULL_BYTES >> 20), rep.elapsed_ns / 1e9,
                  BIG_PULL_BYTES / (rep.elapsed_ns / 1e9) / 1e9, graft_test_now_s() - t0);
    recipient_destroy(&r);
    assert_int_equal(donor_stop(&d), 0);
}

static void test_cancel(void **state)
{
    (void)state;
    donor_proc_t d;
    donor_opts_t o = opts_for(big_layout, ARRAY_SIZE(big_layout), 64u << 10);
    const char *addrs[1];
    recipient_t r;
    graft_transfer_report_t rep;
    injector_t in = {.n_victims = 0, .at = big_total() / 4};

    donor_spawn(&o, &d);
    addrs[0] = d.addr;
    recipient_create(&r, big_layout, ARRAY_SIZE(big_layout), 64u << 10, TOKEN);
    in.cancel_ep = r.ep;
    graft_transfer_pull_options_t po = {.donors = addrs,
                                        .n_donors = 1,
                                        .step = STEP,
                                        .window = 2,
                                        .progress = inject,
                                        .progress_arg = &in};
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_ECANCELED);
    assert_false(rep.installed);
    /* A cancel outside a pull is a no-op; the next pull works. */
    graft_transfer_pull_cancel(r.ep);
    po.progress = NULL;
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(recipient_matches(&r));
    recipient_destroy(&r);
    assert_int_equal(donor_stop(&d), 0);
}

/* Two recipients pull from one donor at the same time (each connection has
 * a UCX worker of its own on the donor); both get every byte, and the
 * donor's fence counts both. */
static void test_two_recipients_at_once(void **state)
{
    (void)state;
    donor_proc_t d;
    donor_opts_t o = opts_for(big_layout, ARRAY_SIZE(big_layout), 64u << 10);
    const char *addrs[1];
    recipient_t r;
    graft_transfer_report_t rep;
    int32_t st, count;
    int ws = 0;

    donor_spawn(&o, &d);
    addrs[0] = d.addr;
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 1, .step = STEP};
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        recipient_create(&r, big_layout, ARRAY_SIZE(big_layout), 64u << 10, TOKEN);
        graft_status_t pst = do_pull(r.ep, &po, &rep);
        _exit(pst == GRAFT_OK && recipient_matches(&r) ? 0 : 5);
    }
    recipient_create(&r, big_layout, ARRAY_SIZE(big_layout), 64u << 10, TOKEN);
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(recipient_matches(&r));
    recipient_destroy(&r);
    assert_int_equal(waitpid(child, &ws, 0), child);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
    donor_fence(&d, 2, 10000, &st, &count);
    assert_int_equal(st, GRAFT_OK);
    assert_int_equal(count, 2);
    assert_int_equal(donor_stop(&d), 0);
}

/* One verified pull of the small layout from the donor at @addr. */
static void pull_small(const char *addr)
{
    const char *addrs[1] = {addr};
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 1, .step = STEP};
    graft_transfer_report_t rep;
    recipient_t r;
    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), 256u << 10, TOKEN);
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    recipient_destroy(&r);
}

/* Ask the donor's fence for @expected recipients; check what it says. */
static void fence_is(donor_proc_t *d, uint32_t expected, uint32_t timeout_ms, int32_t want_st,
                     int32_t want_count)
{
    int32_t st, count;
    donor_fence(d, expected, timeout_ms, &st, &count);
    assert_int_equal(st, want_st);
    assert_int_equal(count, want_count);
}

static void test_fence(void **state)
{
    (void)state;
    donor_proc_t d;
    donor_opts_t o = opts_for(small_layout, ARRAY_SIZE(small_layout), 256u << 10);

    donor_spawn(&o, &d);
    fence_is(&d, 2, 0, GRAFT_ETIMEOUT, 0);
    pull_small(d.addr);
    /* One recipient of two: the fence holds. */
    fence_is(&d, 2, 300, GRAFT_ETIMEOUT, 1);
    pull_small(d.addr);
    fence_is(&d, 2, 5000, GRAFT_OK, 2);

    /* The same step served again (a job that rolled back to a checkpoint):
     * the earlier serve's recipients do not open the new fence. */
    uint32_t cmd[3] = {'R', 0, 0};
    int32_t out[2];
    assert_true(write_full(d.cmd_fd, cmd, sizeof(cmd)));
    assert_true(read_full(d.resp_fd, out, sizeof(out), 10000));
    assert_int_equal(out[0], GRAFT_OK);
    fence_is(&d, 1, 0, GRAFT_ETIMEOUT, 0);
    pull_small(d.addr);
    fence_is(&d, 1, 5000, GRAFT_OK, 1);
    assert_int_equal(donor_stop(&d), 0);
}

/* ---- admission: a donor serves max_recipients at once, queues the rest -- */

static int32_t donor_peak(donor_proc_t *d)
{
    uint32_t cmd[3] = {'P', 0, 0};
    int32_t out[2];
    assert_true(write_full(d->cmd_fd, cmd, sizeof(cmd)));
    assert_true(read_full(d->resp_fd, out, sizeof(out), 10000));
    return out[0];
}

/* Three recipients at once, a donor that serves one at a time: each is
 * queued, then admitted in turn, and none times out (the connect timeout
 * restarts with each queue answer, the stall timeout counts from
 * admission); the donor never had two at once, and its fence counts all. */
static void test_queue_admits_in_turn(void **state)
{
    (void)state;
    enum { N = 3 };
    donor_proc_t d;
    donor_opts_t o = opts_for(big_layout, ARRAY_SIZE(big_layout), 64u << 10);
    o.max_recipients = 1;
    const char *addrs[1];
    recipient_t r;
    graft_transfer_report_t rep;
    int pfd[2];
    pid_t kids[N - 1];

    donor_spawn(&o, &d);
    addrs[0] = d.addr;
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 1, .step = STEP,
                                        .connect_timeout_ms = 300, .stall_timeout_ms = 2000};
    assert_int_equal(pipe(pfd), 0);
    for (int k = 0; k < N - 1; k++) {
        kids[k] = fork();
        assert_true(kids[k] >= 0);
        if (kids[k] == 0) {
            recipient_create(&r, big_layout, ARRAY_SIZE(big_layout), 64u << 10, TOKEN);
            graft_status_t pst = do_pull(r.ep, &po, &rep);
            uint64_t out[2] = {pst == GRAFT_OK && recipient_matches(&r), rep.donors[0].queued_ns};
            _exit(write_full(pfd[1], out, sizeof(out)) ? 0 : 5);
        }
    }
    recipient_create(&r, big_layout, ARRAY_SIZE(big_layout), 64u << 10, TOKEN);
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(recipient_matches(&r));
    uint64_t queued_ns = rep.donors[0].queued_ns, most_queued = queued_ns;
    recipient_destroy(&r);
    for (int k = 0; k < N - 1; k++) {
        uint64_t out[2];
        int ws = 0;
        assert_true(read_full(pfd[0], out, sizeof(out), 60000));
        assert_int_equal(out[0], 1);
        most_queued = out[1] > most_queued ? out[1] : most_queued;
        assert_int_equal(waitpid(kids[k], &ws, 0), kids[k]);
        assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    }
    close(pfd[0]);
    close(pfd[1]);
    /* Someone waited in the queue (here about 400 ms, longer than the
     * connect timeout; test_expected_serve asserts that case). */
    print_message("# longest queue wait %.0f ms\n", most_queued / 1e6);
    assert_true(most_queued > 0);
    assert_int_equal(donor_peak(&d), 1);
    fence_is(&d, N, 10000, GRAFT_OK, N);
    assert_int_equal(donor_stop(&d), 0);
}

/* A donor that announced the step but serves it only later (a relay still
 * healing) keeps its recipients queued past their connect timeout; they
 * are then served. */
static void test_expected_serve(void **state)
{
    (void)state;
    donor_proc_t d;
    donor_opts_t o = opts_for(small_layout, ARRAY_SIZE(small_layout), 256u << 10);
    o.expect = true;
    o.begin_after_ms = 1500;
    const char *addrs[1];
    recipient_t r;
    graft_transfer_report_t rep;

    donor_spawn(&o, &d);
    addrs[0] = d.addr;
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 1, .step = STEP,
                                        .connect_timeout_ms = 500};
    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), 256u << 10, TOKEN);
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(recipient_matches(&r));
    assert_true(rep.donors[0].queued_ns > 500ull * 1000000ull);
    recipient_destroy(&r);
    fence_is(&d, 1, 5000, GRAFT_OK, 1);
    assert_int_equal(donor_stop(&d), 0);
}

/* The announcement withdrawn (the relay's own heal failed): the queued
 * recipient is refused and gives up within its connect timeout; a second
 * donor that serves gives it everything, without waiting for the queue. */
static void test_expected_serve_withdrawn(void **state)
{
    (void)state;
    donor_proc_t relay, src;
    donor_opts_t o = opts_for(small_layout, ARRAY_SIZE(small_layout), 256u << 10);
    donor_opts_t ro = o;
    ro.expect = true;
    ro.withdraw_after_ms = 700;
    const char *addrs[2];
    recipient_t r;
    graft_transfer_report_t rep;

    donor_spawn(&ro, &relay);
    addrs[0] = relay.addr;
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 1, .step = STEP,
                                        .connect_timeout_ms = 500};
    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), 256u << 10, TOKEN);
    double t0 = graft_test_now_s();
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_ENODONOR);
    assert_int_equal(rep.donors[0].status, GRAFT_ESTEP);
    assert_true(graft_test_now_s() - t0 < 10.0);
    recipient_destroy(&r);
    assert_int_equal(donor_stop(&relay), 0);

    /* Queued at one donor, served by the other: the pull ends when every
     * chunk is in, and the queued donor's fence counts it. */
    ro.withdraw_after_ms = 0;
    donor_spawn(&ro, &relay);
    donor_spawn(&o, &src);
    addrs[0] = relay.addr;
    addrs[1] = src.addr;
    po.n_donors = 2;
    po.connect_timeout_ms = 5000;
    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), 256u << 10, TOKEN);
    t0 = graft_test_now_s();
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(recipient_matches(&r));
    assert_true(graft_test_now_s() - t0 < 4.0);
    assert_int_equal(rep.donors[0].chunks, 0);
    recipient_destroy(&r);
    fence_is(&relay, 1, 5000, GRAFT_OK, 1);
    fence_is(&src, 1, 5000, GRAFT_OK, 1);
    assert_int_equal(donor_stop(&relay), 0);
    assert_int_equal(donor_stop(&src), 0);
}

/* ---- bad input on the wire ---------------------------------------------- */

typedef struct raw_client {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h ep;
    int replies;
    int32_t last_status;
} raw_client_t;

static ucs_status_t raw_reply_cb(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param)
{
    raw_client_t *c = arg;
    (void)header;
    (void)header_length;
    (void)param;
    Graft__TransferManifest *m = graft__transfer_manifest__unpack(NULL, length, data);
    c->last_status = m != NULL ? m->status : 1;
    graft__transfer_manifest__free_unpacked(m, NULL);
    c->replies++;
    return UCS_OK;
}

/* Push-read answers: a 16-byte header (echo, tag, status) and no bytes
 * when refused. */
static ucs_status_t raw_chunk_cb(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param)
{
    raw_client_t *c = arg;
    (void)data;
    (void)param;
    int32_t st = 1;
    if (header_length == 16 && length == 0)
        memcpy(&st, (const char *)header + 12, sizeof(st));
    c->last_status = st;
    c->replies++;
    return UCS_OK;
}

static void raw_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)arg;
    (void)ep;
    (void)status;
}

static void raw_connect(raw_client_t *c, const char *addr)
{
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    struct sockaddr_in sa = {.sin_family = AF_INET};
    char host[32];
    const char *colon = strrchr(addr, ':');
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    assert_int_equal(inet_pton(AF_INET, host, &sa.sin_addr), 1);
    memset(c, 0, sizeof(*c));
    assert_int_equal(ucp_init(&p, NULL, &c->ctx), UCS_OK);
    assert_int_equal(ucp_worker_create(c->ctx, &wp, &c->worker), UCS_OK);
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                               UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                 .id = 12,
                                 .cb = raw_reply_cb,
                                 .arg = c};
    assert_int_equal(ucp_worker_set_am_recv_handler(c->worker, &hp), UCS_OK);
    hp.id = 15;
    hp.cb = raw_chunk_cb;
    assert_int_equal(ucp_worker_set_am_recv_handler(c->worker, &hp), UCS_OK);
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                          .sockaddr = {.addr = (struct sockaddr *)&sa, .addrlen = sizeof(sa)},
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {.cb = raw_err_cb}};
    assert_int_equal(ucp_ep_create(c->worker, &ep, &c->ep), UCS_OK);
}

/* Send @p len bytes as active message @p id and wait for the refusal. */
static int32_t raw_send_id(raw_client_t *c, unsigned id, const void *data, size_t len)
{
    static uint64_t header = 0;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_AM_SEND_FLAG_REPLY};
    int before = c->replies;
    ucs_status_ptr_t req = ucp_am_send_nbx(c->ep, id, &header, sizeof(header), data, len, &prm);
    assert_false(UCS_PTR_IS_ERR(req));
    for (int i = 0; i < 2000000 && c->replies == before; i++) {
        ucp_worker_progress(c->worker);
        if (i % 1000 == 999)
            usleep(1000);
    }
    if (UCS_PTR_IS_PTR(req))
        ucp_request_free(req);
    assert_int_equal(c->replies, before + 1);
    return c->last_status;
}

static int32_t raw_send(raw_client_t *c, const void *data, size_t len)
{
    return raw_send_id(c, 11, data, len);
}

static void raw_close(raw_client_t *c)
{
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t req = ucp_ep_close_nbx(c->ep, &prm);
    if (UCS_PTR_IS_PTR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS)
            ucp_worker_progress(c->worker);
        ucp_request_free(req);
    }
    ucp_worker_destroy(c->worker);
    ucp_cleanup(c->ctx);
}

static void test_garbage_clients(void **state)
{
    (void)state;
    donor_proc_t d;
    donor_opts_t o = opts_for(small_layout, ARRAY_SIZE(small_layout), 256u << 10);
    const char *addrs[1];
    recipient_t r;
    graft_transfer_report_t rep;

    donor_spawn(&o, &d);
    addrs[0] = d.addr;

    /* A raw TCP client that sends junk to the listener and hangs up. */
    {
        struct sockaddr_in sa = {.sin_family = AF_INET};
        const char *colon = strrchr(d.addr, ':');
        sa.sin_port = htons((uint16_t)atoi(colon + 1));
        inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
        for (int k = 0; k < 3; k++) {
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            assert_true(fd >= 0);
            assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
            uint8_t junk[4096];
            fill_pattern(junk, sizeof(junk), 99 + (uint64_t)k);
            (void)!write(fd, junk, k == 0 ? 3 : sizeof(junk));
            usleep(50000);
            close(fd);
        }
    }

    /* A UCX client: junk, a truncated request, a request without a token. */
    raw_client_t c;
    raw_connect(&c, d.addr);
    uint8_t junk[300];
    fill_pattern(junk, sizeof(junk), 7);
    assert_int_equal(raw_send(&c, junk, sizeof(junk)), GRAFT_EPROTO);

    Graft__TransferRequest req = GRAFT__TRANSFER_REQUEST__INIT;
    req.version = 1;
    req.job_token = (char *)TOKEN;
    req.step = STEP;
    req.layout_hash = 0x1234567890abcdefull;
    uint8_t packed[256];
    size_t n = graft__transfer_request__pack(&req, packed);
    assert_int_equal(raw_send(&c, packed, n - 3), GRAFT_EPROTO);
    assert_int_equal(raw_send(&c, packed, n), GRAFT_ELAYOUT);
    req.version = 9;
    n = graft__transfer_request__pack(&req, packed);
    assert_int_equal(raw_send(&c, packed, n), GRAFT_EFORMAT);
    assert_int_equal(raw_send(&c, "", 0), GRAFT_EFORMAT);
    req.version = 1;
    req.job_token = (char *)"";
    n = graft__transfer_request__pack(&req, packed);
    assert_int_equal(raw_send(&c, packed, n), GRAFT_ETOKEN);
    req.job_token = (char *)TOKEN;
    req.step = STEP + 1;
    n = graft__transfer_request__pack(&req, packed);
    assert_int_equal(raw_send(&c, packed, n), GRAFT_ESTEP);

    /* Push reads: junk, and a well-formed request without a manifest. */
    assert_int_equal(raw_send_id(&c, 14, junk, sizeof(junk)), GRAFT_EPROTO);
    Graft__ChunkRequest cr = GRAFT__CHUNK_REQUEST__INIT;
    cr.version = 1;
    cr.region = 0;
    cr.chunk = 0;
    n = graft__chunk_request__pack(&cr, packed);
    assert_int_equal(raw_send_id(&c, 14, packed, n), GRAFT_ESTEP);
    raw_close(&c);

    /* The donor is unaffected. */
    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), 256u << 10, TOKEN);
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 1, .step = STEP};
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(recipient_matches(&r));
    recipient_destroy(&r);
    assert_int_equal(donor_stop(&d), 0);
}

/* ---- hostile donors ------------------------------------------------------ */

/* A donor that speaks the wire protocol over raw UCX and answers with bad
 * contents. The recipient must end with a precise error for it, install
 * nothing from it, and neither crash nor hang. */
enum hostile_mode {
    H_GARBAGE = 1, /* junk bytes as the manifest */
    H_TRUNCATED,   /* a valid manifest cut in half */
    H_NO_RKEY,     /* valid, but the regions' remote keys are empty */
    H_BAD_RKEY,    /* valid, but the remote keys are junk */
    H_HASH_REGION, /* a hash part for a region that does not exist */
    H_HASH_CHUNK,  /* a hash part that runs past its region's chunks */
    H_FINAL_SHORT, /* hashes_final with hashes missing */
    H_CHUNK_LEN,   /* valid; pushed chunks one byte short (gets: wrong hashes) */
    H_CHUNK_TAG,   /* valid; pushed chunks for a slot nobody asked for */
    H_SILENT,      /* accepts the connection, never answers */
    H_IMPERSONATE, /* a valid manifest (zero hashes) sent as the next donor */
    H_BAD_ADDR,    /* keys of UCX-allocated blocks, addresses 1 TiB past them */
};

#define HOSTILE_CHUNK (256u << 10)
#define HOSTILE_QUEUE 64

typedef struct hostile {
    ucp_context_h ctx;
    ucp_worker_h w;
    int mode;
    uint64_t layout_hash;
    uint8_t *mem[ARRAY_SIZE(small_layout)];
    ucp_mem_h memh[ARRAY_SIZE(small_layout)];
    void *rkey[ARRAY_SIZE(small_layout)];
    size_t rkey_len[ARRAY_SIZE(small_layout)];
    /* H_BAD_ADDR: a block per region that UCX allocated (shared memory). */
    void *bmem[ARRAY_SIZE(small_layout)];
    ucp_mem_h bmemh[ARRAY_SIZE(small_layout)];
    void *brkey[ARRAY_SIZE(small_layout)];
    size_t brkey_len[ARRAY_SIZE(small_layout)];
    ucp_ep_h conns[64];
    int n_conns;
    int n_req;
    ucp_ep_h req_ep[HOSTILE_QUEUE];
    uint64_t req_hdr[HOSTILE_QUEUE];
    int n_creq;
    ucp_ep_h creq_ep[HOSTILE_QUEUE];
    uint64_t creq_hdr[HOSTILE_QUEUE];
    uint32_t creq_tag[HOSTILE_QUEUE], creq_region[HOSTILE_QUEUE];
    uint64_t creq_chunk[HOSTILE_QUEUE];
} hostile_t;

static void hostile_conn_cb(ucp_conn_request_h req, void *arg)
{
    hostile_t *h = arg;
    ucp_ep_params_t prm = {.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST |
                                         UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                         UCP_EP_PARAM_FIELD_ERR_HANDLER,
                           .conn_request = req,
                           .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                           .err_handler = {.cb = raw_err_cb}};
    if (h->n_conns < (int)ARRAY_SIZE(h->conns) &&
        ucp_ep_create(h->w, &prm, &h->conns[h->n_conns]) == UCS_OK)
        h->n_conns++;
}

static ucs_status_t hostile_request_cb(void *arg, const void *header, size_t header_length,
                                       void *data, size_t length,
                                       const ucp_am_recv_param_t *param)
{
    hostile_t *h = arg;
    (void)data;
    (void)length;
    if (header_length == 8 && (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) &&
        h->n_req < HOSTILE_QUEUE) {
        h->req_ep[h->n_req] = param->reply_ep;
        memcpy(&h->req_hdr[h->n_req], header, 8);
        h->n_req++;
    }
    return UCS_OK;
}

static ucs_status_t hostile_chunk_req_cb(void *arg, const void *header, size_t header_length,
                                         void *data, size_t length,
                                         const ucp_am_recv_param_t *param)
{
    hostile_t *h = arg;
    Graft__ChunkRequest *cr = graft__chunk_request__unpack(NULL, length, data);
    if (cr != NULL && header_length == 8 &&
        (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) && h->n_creq < HOSTILE_QUEUE) {
        int i = h->n_creq++;
        h->creq_ep[i] = param->reply_ep;
        memcpy(&h->creq_hdr[i], header, 8);
        h->creq_tag[i] = cr->tag;
        h->creq_region[i] = cr->region;
        h->creq_chunk[i] = cr->chunk;
    }
    graft__chunk_request__free_unpacked(cr, NULL);
    return UCS_OK;
}

static ucs_status_t hostile_ignore_cb(void *arg, const void *header, size_t header_length,
                                      void *data, size_t length,
                                      const ucp_am_recv_param_t *param)
{
    (void)arg, (void)header, (void)header_length, (void)data, (void)length, (void)param;
    return UCS_OK;
}

/* Send and wait (at most 2 s: a peer that drops a rendezvous may never
 * complete it; the request is then left to the process's end). */
static void hostile_send(hostile_t *h, ucp_ep_h ep, unsigned id, const void *hdr, size_t hlen,
                         const void *data, size_t len)
{
    ucp_request_param_t prm = {.op_attr_mask = 0};
    ucs_status_ptr_t r = ucp_am_send_nbx(ep, id, hdr, hlen, data, len, &prm);
    if (!UCS_PTR_IS_PTR(r))
        return;
    double end = graft_test_now_s() + 2.0;
    while (ucp_request_check_status(r) == UCS_INPROGRESS && graft_test_now_s() < end)
        ucp_worker_progress(h->w);
    if (ucp_request_check_status(r) != UCS_INPROGRESS)
        ucp_request_free(r);
}

static uint64_t chunks_of(uint64_t bytes)
{
    return (bytes + HOSTILE_CHUNK - 1) / HOSTILE_CHUNK;
}

/* The manifest @mode answers a request with, packed into @buf. */
static size_t hostile_manifest(hostile_t *h, uint8_t *buf, size_t size)
{
    enum { NR = ARRAY_SIZE(small_layout) };
    Graft__TransferManifest m = GRAFT__TRANSFER_MANIFEST__INIT;
    Graft__RegionManifest rms[NR], *rmp[NR];
    Graft__RegionDesc descs[NR];
    Graft__ChunkHashes parts[NR + 1], *pp[NR + 1];
    static uint64_t zeros[64];
    static uint8_t junk_key[24];
    size_t np = 0;

    if (h->mode == H_GARBAGE) {
        fill_pattern(buf, 300, 5);
        return 300;
    }
    memset(junk_key, 0xff, sizeof(junk_key));
    m.version = 1;
    m.step = STEP;
    m.layout_hash = h->layout_hash;
    m.chunk_bytes = HOSTILE_CHUNK;
    m.donor_group = 9;
    for (size_t i = 0; i < NR; i++) {
        graft__region_desc__init(&descs[i]);
        descs[i].name = (char *)small_layout[i].name;
        descs[i].kind = GRAFT__REGION_KIND__REGION_PARAM;
        descs[i].bytes = small_layout[i].bytes;
        graft__region_manifest__init(&rms[i]);
        rms[i].region = &descs[i];
        rms[i].remote_address = (uint64_t)(uintptr_t)h->mem[i];
        rms[i].rkey.data = h->rkey[i];
        rms[i].rkey.len = h->rkey_len[i];
        if (h->mode == H_BAD_ADDR && small_layout[i].bytes > 0) {
            rms[i].remote_address = (uint64_t)(uintptr_t)h->bmem[i] + (1ull << 40);
            rms[i].rkey.data = h->brkey[i];
            rms[i].rkey.len = h->brkey_len[i];
        } else if (h->mode == H_NO_RKEY) {
            rms[i].rkey.data = NULL;
            rms[i].rkey.len = 0;
        } else if (h->mode == H_BAD_RKEY && small_layout[i].bytes > 0) {
            rms[i].rkey.data = junk_key;
            rms[i].rkey.len = sizeof(junk_key);
        }
        rmp[i] = &rms[i];
        /* All hashes (zeros: never the hash of real bytes), region by region. */
        uint64_t n = chunks_of(small_layout[i].bytes);
        if (n == 0 || (h->mode == H_FINAL_SHORT && i > 0))
            continue;
        graft__chunk_hashes__init(&parts[np]);
        parts[np].region = (uint32_t)i;
        parts[np].n_hashes = (size_t)n;
        parts[np].hashes = zeros;
        pp[np] = &parts[np];
        np++;
    }
    if (h->mode == H_HASH_REGION || h->mode == H_HASH_CHUNK) {
        graft__chunk_hashes__init(&parts[np]);
        parts[np].region = h->mode == H_HASH_REGION ? NR + 5 : 1;
        parts[np].first_chunk = h->mode == H_HASH_REGION ? 0 : chunks_of(small_layout[1].bytes) - 1;
        parts[np].n_hashes = 2;
        parts[np].hashes = zeros;
        pp[np] = &parts[np];
        np++;
    }
    m.n_regions = NR;
    m.regions = rmp;
    m.n_hash_parts = np;
    m.hash_parts = pp;
    m.hashes_final = true;
    size_t len = graft__transfer_manifest__get_packed_size(&m);
    if (len > size)
        return 0;
    graft__transfer_manifest__pack(&m, buf);
    return h->mode == H_TRUNCATED ? len / 2 : len;
}

static void hostile_answer(hostile_t *h)
{
    static uint8_t buf[8192];
    for (int i = 0; i < h->n_req; i++) {
        if (h->mode == H_SILENT)
            continue;
        size_t len = hostile_manifest(h, buf, sizeof(buf));
        uint64_t hdr = h->req_hdr[i];
        if (h->mode == H_IMPERSONATE)
            hdr ^= 1; /* the request's echo names donor 0: speak as donor 1 */
        hostile_send(h, h->req_ep[i], 12, &hdr, 8, buf, len);
    }
    h->n_req = 0;
    for (int i = 0; i < h->n_creq; i++) {
        struct {
            uint64_t echo;
            uint32_t tag;
            int32_t status;
        } hdr = {h->creq_hdr[i], h->creq_tag[i], 0};
        uint32_t r = h->creq_region[i];
        if (r >= ARRAY_SIZE(small_layout))
            continue;
        uint64_t off = h->creq_chunk[i] * HOSTILE_CHUNK;
        uint64_t len = small_layout[r].bytes - off < HOSTILE_CHUNK ? small_layout[r].bytes - off
                                                                   : HOSTILE_CHUNK;
        if (h->mode == H_CHUNK_LEN)
            len--;
        if (h->mode == H_CHUNK_TAG)
            hdr.tag = 0xfffff;
        hostile_send(h, h->creq_ep[i], 15, &hdr, sizeof(hdr), h->mem[r] + off, (size_t)len);
    }
    h->n_creq = 0;
}

/* The hostile donor process: listens, takes a mode from @cmd_fd (anything
 * else quits), answers with it. */
static int hostile_main(uint64_t layout_hash, int cmd_fd, int resp_fd)
{
    hostile_t *h = calloc(1, sizeof(*h));
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features = UCP_FEATURE_AM | UCP_FEATURE_RMA};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    struct sockaddr_in sa = {.sin_family = AF_INET};
    ucp_listener_h l;
    char addr[64] = {0};

    h->layout_hash = layout_hash;
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (ucp_init(&p, NULL, &h->ctx) != UCS_OK || ucp_worker_create(h->ctx, &wp, &h->w) != UCS_OK)
        return 1;
    for (size_t i = 0; i < ARRAY_SIZE(small_layout); i++) {
        h->mem[i] = calloc(1, small_layout[i].bytes + 1);
        if (small_layout[i].bytes == 0)
            continue;
        ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                                 UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                                   .address = h->mem[i],
                                   .length = small_layout[i].bytes};
        if (ucp_mem_map(h->ctx, &mp, &h->memh[i]) != UCS_OK ||
            ucp_rkey_pack(h->ctx, h->memh[i], &h->rkey[i], &h->rkey_len[i]) != UCS_OK)
            return 1;
        ucp_mem_map_params_t bp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                                                 UCP_MEM_MAP_PARAM_FIELD_FLAGS,
                                   .length = small_layout[i].bytes,
                                   .flags = UCP_MEM_MAP_ALLOCATE};
        ucp_mem_attr_t ba = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
        if (ucp_mem_map(h->ctx, &bp, &h->bmemh[i]) != UCS_OK ||
            ucp_mem_query(h->bmemh[i], &ba) != UCS_OK ||
            ucp_rkey_pack(h->ctx, h->bmemh[i], &h->brkey[i], &h->brkey_len[i]) != UCS_OK)
            return 1;
        h->bmem[i] = ba.address;
    }
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                               UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                 .arg = h};
    hp.id = 11, hp.cb = hostile_request_cb;
    if (ucp_worker_set_am_recv_handler(h->w, &hp) != UCS_OK)
        return 1;
    hp.id = 14, hp.cb = hostile_chunk_req_cb;
    if (ucp_worker_set_am_recv_handler(h->w, &hp) != UCS_OK)
        return 1;
    hp.id = 13, hp.cb = hostile_ignore_cb;
    if (ucp_worker_set_am_recv_handler(h->w, &hp) != UCS_OK)
        return 1;
    ucp_listener_params_t lp = {
        .field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
        .sockaddr = {.addr = (struct sockaddr *)&sa, .addrlen = sizeof(sa)},
        .conn_handler = {.cb = hostile_conn_cb, .arg = h}};
    if (ucp_listener_create(h->w, &lp, &l) != UCS_OK)
        return 1;
    ucp_listener_attr_t la = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    if (ucp_listener_query(l, &la) != UCS_OK)
        return 1;
    snprintf(addr, sizeof(addr), "127.0.0.1:%u",
             (unsigned)ntohs(((struct sockaddr_in *)&la.sockaddr)->sin_port));
    if (!write_full(resp_fd, addr, sizeof(addr)))
        return 1;
    for (;;) {
        struct pollfd pfd = {.fd = cmd_fd, .events = POLLIN};
        while (ucp_worker_progress(h->w) != 0) {
        }
        hostile_answer(h);
        if (poll(&pfd, 1, 0) > 0) {
            int32_t mode;
            if (!read_full(cmd_fd, &mode, sizeof(mode), 1000) || mode < H_GARBAGE ||
                mode > H_BAD_ADDR)
                break;
            h->mode = mode;
            h->n_req = h->n_creq = 0;
            if (!write_full(resp_fd, &mode, sizeof(mode)))
                break;
        }
        usleep(200);
    }
    return 0;
}

static int hostile_child(const void *arg, int cmd_fd, int resp_fd)
{
    return hostile_main(*(const uint64_t *)arg, cmd_fd, resp_fd);
}

static void hostile_spawn(uint64_t layout_hash, donor_proc_t *d)
{
    child_spawn(d, hostile_child, &layout_hash);
}

static void hostile_mode(donor_proc_t *d, int32_t mode)
{
    int32_t ack = 0;
    assert_true(write_full(d->cmd_fd, &mode, sizeof(mode)));
    assert_true(read_full(d->resp_fd, &ack, sizeof(ack), 10000));
    assert_int_equal(ack, mode);
}

static bool recipient_untouched(const recipient_t *r)
{
    for (size_t i = 0; i < r->n_regions; i++) {
        for (uint64_t k = 0; k < r->layout[i].bytes; k++) {
            if (r->mem[i][k] != 0)
                return false;
        }
    }
    return true;
}

/* A plain TCP listener (not UCX) that answers a connection with junk. */
static pid_t junk_listener(char *addr, size_t size)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(fd, 4), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(addr, size, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;) {
            int c = accept(fd, NULL, NULL);
            if (c < 0)
                _exit(0);
            uint8_t junk[1024];
            fill_pattern(junk, sizeof(junk), 77);
            (void)!write(c, junk, sizeof(junk));
            usleep(100000);
            close(c);
        }
    }
    close(fd);
    live_donors[n_live_donors++] = pid;
    return pid;
}

static void test_hostile_donor(void **state)
{
    (void)state;
    static const struct {
        int32_t mode;
        graft_status_t push, get; /* the donor's status with each protocol */
        bool untouched;           /* failed before any byte was read */
    } cases[] = {
        {H_GARBAGE, GRAFT_EPROTO, GRAFT_EPROTO, true},
        {H_TRUNCATED, GRAFT_EPROTO, GRAFT_EPROTO, true},
        {H_NO_RKEY, GRAFT_EPROTO, GRAFT_EPROTO, true},
        {H_BAD_RKEY, GRAFT_EPROTO, GRAFT_EPROTO, true},
        {H_HASH_REGION, GRAFT_EPROTO, GRAFT_EPROTO, true},
        {H_HASH_CHUNK, GRAFT_EPROTO, GRAFT_EPROTO, true},
        {H_FINAL_SHORT, GRAFT_EPROTO, GRAFT_EPROTO, true},
        {H_CHUNK_LEN, GRAFT_EPROTO, GRAFT_EHASH, false},
        {H_CHUNK_TAG, GRAFT_EPEER_TIMEOUT, GRAFT_EHASH, false},
        {H_SILENT, GRAFT_EPEER_TIMEOUT, GRAFT_EPEER_TIMEOUT, true},
    };
    donor_opts_t o = opts_for(small_layout, ARRAY_SIZE(small_layout), HOSTILE_CHUNK);
    donor_proc_t bad, good;
    recipient_t r;
    graft_transfer_report_t rep;
    uint64_t layout_hash;
    const char *only = getenv("HOSTILE_CASE"); /* one case (while debugging) */

    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), HOSTILE_CHUNK, TOKEN);
    assert_int_equal(graft_transfer_layout_hash(r.ep, &layout_hash), GRAFT_OK);
    recipient_destroy(&r);
    hostile_spawn(layout_hash, &bad);
    donor_spawn(&o, &good);
    char junk_addr[64];
    pid_t junk = junk_listener(junk_addr, sizeof(junk_addr));
    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), HOSTILE_CHUNK, TOKEN);

    const char *one[1] = {bad.addr};
    graft_transfer_pull_options_t po = {.donors = one, .n_donors = 1, .step = STEP,
                                        .connect_timeout_ms = 500, .stall_timeout_ms = 500,
                                        .timeout_ms = 20000};
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        if (only != NULL && atoi(only) != cases[i].mode)
            continue;
        graft_status_t want = g_read == GRAFT_TRANSFER_READ_PUSH ? cases[i].push : cases[i].get;
        hostile_mode(&bad, cases[i].mode);
        for (size_t k = 0; k < r.n_regions; k++)
            memset(r.mem[k], 0, r.layout[k].bytes);
        print_message("# hostile case %d\n", cases[i].mode);
        assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_ENODONOR);
        assert_int_equal(rep.donors[0].status, want);
        assert_false(rep.installed);
        assert_int_equal(rep.donors[0].chunks, 0);
        if (cases[i].untouched)
            assert_true(recipient_untouched(&r));
    }

    /* Over shared memory the recipient maps a donor's UCX-allocated block
     * and copies out of it: an address past the block is refused before any
     * read (UCX itself does not check; the copy would fault). Over tcp such
     * gets are served, and would fault, in the donor itself. */
    if (strcmp(getenv("UCX_TLS"), "tcp") != 0) {
        hostile_mode(&bad, H_BAD_ADDR);
        for (size_t k = 0; k < r.n_regions; k++)
            memset(r.mem[k], 0, r.layout[k].bytes);
        assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_ENODONOR);
        assert_int_equal(rep.donors[0].status, GRAFT_EPROTO);
        assert_false(rep.installed);
        assert_true(recipient_untouched(&r));
    }

    /* Not UCX at all: a peer-class error, in bounded time. */
    const char *junk_one[1] = {junk_addr};
    po.donors = junk_one;
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_ENODONOR);
    assert_int_equal(graft_status_class(rep.donors[0].status), GRAFT_CLASS_PEER);
    assert_true(recipient_untouched(&r));

    /* Beside an honest donor the pull completes from it alone. */
    hostile_mode(&bad, H_GARBAGE);
    const char *two[2] = {bad.addr, good.addr};
    po.donors = two;
    po.n_donors = 2;
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_int_equal(rep.donors[0].status, GRAFT_EPROTO);
    assert_int_equal(rep.donors[1].status, GRAFT_OK);
    assert_int_equal(rep.donors[1].bytes, rep.bytes);
    assert_true(recipient_matches(&r));

    /* A donor that sends its manifest as another donor is not heard (each
     * donor has its own worker): it times out, and the one it impersonated
     * still serves every chunk with its own hashes. */
    hostile_mode(&bad, H_IMPERSONATE);
    for (size_t k = 0; k < r.n_regions; k++)
        memset(r.mem[k], 0, r.layout[k].bytes);
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_int_equal(rep.donors[0].status, GRAFT_EPEER_TIMEOUT);
    assert_int_equal(rep.donors[1].status, GRAFT_OK);
    assert_int_equal(rep.donors[1].bytes, rep.bytes);
    assert_true(recipient_matches(&r));
    recipient_destroy(&r);

    int ws = donor_stop(&bad); /* its 'Q' is no mode: it quits */
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    assert_int_equal(donor_stop(&good), 0);
    kill(junk, SIGKILL);
    waitpid(junk, NULL, 0);
    for (int i = 0; i < n_live_donors; i++) {
        if (live_donors[i] == junk) {
            live_donors[i] = live_donors[--n_live_donors];
            break;
        }
    }
}

/* ---- UCX_MM_ERROR_HANDLING ---------------------------------------------- */

/* What a recipient in a child process saw. */
typedef struct env_probe {
    int32_t status;    /* the pull's */
    int32_t matches;   /* every byte as the donor wrote it */
    char mm[16];       /* UCX_MM_ERROR_HANDLING after its endpoint was created */
    char transports[sizeof(((graft_transfer_donor_report_t *)0)->transports)];
} env_probe_t;

/* The child: no cmocka here (a failed assertion would unwind into the
 * parent's copy of the test runner), only a result on @fd. */
static void env_child(const char *addr, int fd)
{
    env_probe_t res = {.status = GRAFT_EINTERNAL};
    graft_transfer_config_t cfg = {.job_token = TOKEN, .chunk_bytes = 256u << 10, .group = 2};
    graft_transfer_endpoint_t *ep = NULL;
    uint8_t *mem[ARRAY_SIZE(small_layout)] = {0};
    graft_transfer_report_t rep;
    const char *addrs[1] = {addr};

    if (graft_transfer_endpoint_create(&cfg, &ep) == GRAFT_OK) {
        const char *v = getenv("UCX_MM_ERROR_HANDLING");
        snprintf(res.mm, sizeof(res.mm), "%s", v != NULL ? v : "(unset)");
        res.status = GRAFT_OK;
        for (size_t i = 0; i < ARRAY_SIZE(small_layout) && res.status == GRAFT_OK; i++) {
            mem[i] = calloc(1, small_layout[i].bytes + 1);
            graft_transfer_region_t r = {.name = small_layout[i].name,
                                         .kind = GRAFT_TRANSFER_REGION_PARAM,
                                         .ptr = mem[i],
                                         .bytes = small_layout[i].bytes};
            res.status = mem[i] != NULL ? graft_transfer_region_register(ep, &r) : GRAFT_ENOMEM;
        }
        graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 1, .step = STEP};
        if (res.status == GRAFT_OK)
            res.status = graft_transfer_pull(ep, &po, &rep);
        if (res.status == GRAFT_OK) {
            res.matches = 1;
            for (size_t i = 0; i < ARRAY_SIZE(small_layout); i++)
                res.matches = res.matches && pattern_matches(mem[i], small_layout[i].bytes, i + 1);
            snprintf(res.transports, sizeof(res.transports), "%s", rep.donors[0].transports);
        }
    }
    graft_transfer_endpoint_destroy(ep);
    for (size_t i = 0; i < ARRAY_SIZE(small_layout); i++)
        free(mem[i]);
    _exit(write_full(fd, &res, sizeof(res)) ? 0 : 1);
}

/* A donor and a recipient process started with UCX_MM_ERROR_HANDLING set to
 * @value (NULL: unset) and UCX_TLS=sm,self,tcp; the test's own environment
 * is put back before it returns. */
static void env_case(const char *value, env_probe_t *res)
{
    const char *old = getenv("UCX_MM_ERROR_HANDLING");
    const char *old_tls = getenv("UCX_TLS");
    char saved[32] = "", saved_tls[64] = "";
    bool had = old != NULL, had_tls = old_tls != NULL;
    donor_opts_t o = opts_for(small_layout, ARRAY_SIZE(small_layout), 256u << 10);
    donor_proc_t d;
    int fds[2], ws = 0;

    if (had)
        snprintf(saved, sizeof(saved), "%s", old);
    if (had_tls)
        snprintf(saved_tls, sizeof(saved_tls), "%s", old_tls);
    setenv("UCX_TLS", "sm,self,tcp", 1);
    if (value != NULL)
        setenv("UCX_MM_ERROR_HANDLING", value, 1);
    else
        unsetenv("UCX_MM_ERROR_HANDLING");
    donor_spawn(&o, &d);
    assert_int_equal(pipe(fds), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(fds[0]);
        env_child(d.addr, fds[1]);
    }
    close(fds[1]);
    if (had)
        setenv("UCX_MM_ERROR_HANDLING", saved, 1);
    else
        unsetenv("UCX_MM_ERROR_HANDLING");
    if (had_tls)
        setenv("UCX_TLS", saved_tls, 1);
    else
        unsetenv("UCX_TLS");
    memset(res, 0, sizeof(*res));
    bool got = read_full(fds[0], res, sizeof(*res), 30000);
    close(fds[0]);
    if (!got)
        kill(child, SIGKILL);
    assert_int_equal(waitpid(child, &ws, 0), child);
    assert_true(got);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    res->transports[sizeof(res->transports) - 1] = '\0';
    res->mm[sizeof(res->mm) - 1] = '\0';
    print_message("# UCX_MM_ERROR_HANDLING %s: %s, lanes '%s'\n", value != NULL ? value : "unset",
                  graft_status_name(res->status), res->transports);
    assert_int_equal(donor_stop(&d), 0);
}

/* Unset, the endpoint sets it to y, so that shared memory carries a pull
 * even with peer error handling; set by the user (n), it is left alone and
 * the pull still works, over tcp, which is what UCX does with n. */
static void test_mm_error_handling_env(void **state)
{
    (void)state;
    env_probe_t res;
    char am_tl[32];
    bool all_tcp;

    env_case(NULL, &res);
    assert_int_equal(res.status, GRAFT_OK);
    assert_true(res.matches);
    assert_string_equal(res.mm, "y");
    lanes_parse(res.transports, am_tl, sizeof(am_tl), &all_tcp);
    assert_true(tl_is_shm(am_tl));

    env_case("n", &res);
    assert_int_equal(res.status, GRAFT_OK);
    assert_true(res.matches);
    assert_string_equal(res.mm, "n");
    lanes_parse(res.transports, am_tl, sizeof(am_tl), &all_tcp);
    assert_string_equal(am_tl, "tcp");
    assert_true(all_tcp);
}

/* ---- local API checks ---------------------------------------------------- */

static void test_api_misuse(void **state)
{
    (void)state;
    graft_transfer_endpoint_t *ep = NULL;
    uint8_t buf[64];
    graft_transfer_region_t r = {.name = "a", .kind = GRAFT_TRANSFER_REGION_PARAM, .ptr = buf,
                                 .bytes = sizeof(buf)};
    graft_transfer_config_t bad = {.listen_address = "not-an-ip"};
    uint64_t h0, h1;

    assert_int_equal(graft_transfer_endpoint_create(NULL, NULL), GRAFT_EINVAL);
    assert_int_equal(graft_transfer_endpoint_create(&bad, &ep), GRAFT_EINVAL);
    assert_null(ep);
    graft_transfer_endpoint_destroy(NULL);
    assert_int_equal(graft_transfer_endpoint_create(NULL, &ep), GRAFT_OK);
    assert_non_null(strchr(graft_transfer_endpoint_address(ep), ':'));
    assert_int_equal(graft_transfer_layout_hash(ep, &h0), GRAFT_OK);
    assert_int_equal(graft_transfer_region_register(ep, &r), GRAFT_OK);
    assert_int_equal(graft_transfer_layout_hash(ep, &h1), GRAFT_OK);
    assert_true(h0 != h1);
    assert_int_equal(graft_transfer_region_register(ep, &r), GRAFT_EEXIST);
    r.name = "b";
    r.kind = (graft_transfer_region_kind_t)99;
    assert_int_equal(graft_transfer_region_register(ep, &r), GRAFT_EINVAL);
    r.kind = GRAFT_TRANSFER_REGION_OPTIM;
    r.ptr = NULL;
    assert_int_equal(graft_transfer_region_register(ep, &r), GRAFT_EINVAL);
    r.ptr = buf;
    r.device = GRAFT_TRANSFER_CUDA;
    assert_int_equal(graft_transfer_region_register(ep, &r), GRAFT_ENOTSUP);
    r.device = GRAFT_TRANSFER_HOST;

    assert_int_equal(graft_transfer_serve_end(ep), GRAFT_ESTATE);
    assert_int_equal(graft_transfer_serve_begin(ep, 5), GRAFT_OK);
    assert_int_equal(graft_transfer_serve_begin(ep, 5), GRAFT_OK);
    assert_int_equal(graft_transfer_serve_begin(ep, 6), GRAFT_ESTATE);
    assert_int_equal(graft_transfer_region_register(ep, &r), GRAFT_ESTATE);
    const char *donors[1] = {"127.0.0.1:9"};
    graft_transfer_pull_options_t po = {.donors = donors, .n_donors = 1, .step = 5};
    graft_transfer_report_t rep;
    assert_int_equal(graft_transfer_pull(ep, &po, &rep), GRAFT_ESTATE);
    assert_int_equal(graft_transfer_serve_end(ep), GRAFT_OK);
    po.n_donors = 0;
    assert_int_equal(graft_transfer_pull(ep, &po, &rep), GRAFT_EINVAL);
    po.n_donors = GRAFT_TRANSFER_MAX_DONORS + 1;
    assert_int_equal(graft_transfer_pull(ep, &po, &rep), GRAFT_EINVAL);
    assert_int_equal(graft_transfer_fence_wait(ep, 5, 0, 0), GRAFT_OK);
    assert_int_equal(graft_transfer_fence_wait(ep, 5, 1, 10), GRAFT_ETIMEOUT);
    graft_transfer_endpoint_destroy(ep);
}


/* An endpoint's published address for @cfg, or its status. */
static graft_status_t address_for(const graft_transfer_config_t *cfg, char *addr, size_t size)
{
    graft_transfer_endpoint_t *ep = NULL;
    graft_status_t st = graft_transfer_endpoint_create(cfg, &ep);
    if (st == GRAFT_OK)
        snprintf(addr, size, "%s", graft_transfer_endpoint_address(ep));
    else
        assert_null(ep);
    graft_transfer_endpoint_destroy(ep);
    return st;
}

static unsigned port_of(const char *addr)
{
    const char *colon = strrchr(addr, ':');
    return colon != NULL ? (unsigned)atoi(colon + 1) : 0;
}

/* Listening on an interface by name, with a port in the address, and on the
 * wildcard (only with an advertised address, which is what is published and
 * what a recipient reaches the donor at). */
static void test_listen_address(void **state)
{
    (void)state;
    char addr[64], want[64], spec[64];
    graft_transfer_config_t cfg = {.listen_address = "lo"};

    assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_OK);
    assert_int_equal(strncmp(addr, "127.0.0.1:", 10), 0);
    unsigned port = port_of(addr);
    assert_true(port > 0);
    /* "name:port", and the same port in both places. */
    snprintf(spec, sizeof(spec), "lo:%u", port);
    cfg.listen_address = spec;
    assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_OK);
    snprintf(want, sizeof(want), "127.0.0.1:%u", port);
    assert_string_equal(addr, want);
    cfg.port = (uint16_t)port;
    assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_OK);
    assert_string_equal(addr, want);
    cfg.port = (uint16_t)(port == 65535 ? 1 : port + 1); /* disagrees */
    assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_EINVAL);
    cfg.port = 0;

    /* Refused: no such interface, junk ports, the wildcard without an
     * advertised address, a wildcard advertised. */
    static const char *const bad[] = {"no-such-if0", "lo:", "lo:65536", "lo:x", ":80", ""};
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        cfg.listen_address = bad[i];
        assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_EINVAL);
    }
    cfg.listen_address = "0.0.0.0";
    assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_EINVAL);
    cfg.listen_address = "lo";
    cfg.advertise_address = "0.0.0.0";
    assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_EINVAL);
    cfg.advertise_address = "no-such-if0";
    assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_EINVAL);
    cfg.advertise_address = NULL;

    /* Another interface with an IPv4 address, if the machine has one. */
    struct ifaddrs *ifs = NULL;
    assert_int_equal(getifaddrs(&ifs), 0);
    for (const struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET ||
            strcmp(i->ifa_name, "lo") == 0)
            continue;
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr, ip,
                  sizeof(ip));
        cfg.listen_address = i->ifa_name;
        assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_OK);
        snprintf(want, sizeof(want), "%s:", ip);
        print_message("# interface %s: %s\n", i->ifa_name, addr);
        assert_int_equal(strncmp(addr, want, strlen(want)), 0);
        break;
    }
    freeifaddrs(ifs);

    /* A donor on the wildcard that advertises "lo" is pulled from at the
     * address it published. */
    donor_opts_t o = opts_for(small_layout, ARRAY_SIZE(small_layout), 256u << 10);
    o.listen = "0.0.0.0";
    o.advertise = "lo";
    donor_proc_t d;
    recipient_t r;
    graft_transfer_report_t rep;
    donor_spawn(&o, &d);
    assert_int_equal(strncmp(d.addr, "127.0.0.1:", 10), 0);
    const char *addrs[1] = {d.addr};
    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), 256u << 10, TOKEN);
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 1, .step = STEP};
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(recipient_matches(&r));
    recipient_destroy(&r);
    assert_int_equal(donor_stop(&d), 0);
}

/* Fail each allocation in turn: every path returns ENOMEM cleanly. */
static void test_alloc_failures(void **state)
{
    (void)state;
    static uint8_t a[100000], b[5000];
    bool completed = false;

    for (int n = 0; n < 64 && !completed; n++) {
        graft_transfer_endpoint_t *ep = NULL;
        graft_transfer_config_t cfg = {.chunk_bytes = 4096};
        graft_transfer_region_t ra = {.name = "a", .kind = 1, .ptr = a, .bytes = sizeof(a)};
        graft_transfer_region_t rb = {.name = "b", .kind = 2, .ptr = b, .bytes = sizeof(b)};
        graft_status_t st;

        graft_test_alloc_fail_after(n);
        st = graft_transfer_endpoint_create(&cfg, &ep);
        if (st == GRAFT_OK)
            st = graft_transfer_region_register(ep, &ra);
        if (st == GRAFT_OK)
            st = graft_transfer_region_register(ep, &rb);
        if (st == GRAFT_OK)
            st = graft_transfer_serve_begin(ep, 1);
        if (st == GRAFT_OK) {
            st = graft_transfer_serve_end(ep);
            completed = st == GRAFT_OK;
        }
        if (!completed)
            assert_int_equal(st, GRAFT_ENOMEM);
        graft_transfer_endpoint_destroy(ep);
        graft_test_alloc_restore();
    }
    assert_true(completed);
}


/* Fail each allocation of a pull in turn: the pull returns GRAFT_ENOMEM (or
 * succeeds once enough are allowed), never crashes, hangs or leaks, and the
 * donor keeps serving. */
static void test_pull_alloc_failures(void **state)
{
    (void)state;
    donor_proc_t d;
    donor_opts_t o = opts_for(small_layout, ARRAY_SIZE(small_layout), 1u << 20);
    const char *addrs[1];
    recipient_t r;
    graft_transfer_report_t rep;

    donor_spawn(&o, &d);
    addrs[0] = d.addr;
    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), 1u << 20, TOKEN);
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 1, .step = STEP,
                                        .connect_timeout_ms = 3000};
    graft_test_alloc_fail_after(-1); /* count only */
    graft_status_t st = do_pull(r.ep, &po, &rep);
    graft_test_alloc_restore();
    assert_int_equal(st, GRAFT_OK);
    int needed = graft_test_alloc_calls();
    assert_true(needed > 5);

    for (int n = 0; n < needed; n++) {
        graft_test_alloc_fail_after(n);
        st = do_pull(r.ep, &po, &rep);
        graft_test_alloc_restore();
        /* The recipient's allocations failed: its own error, not the donor's. */
        if (st != GRAFT_OK)
            assert_int_equal(st, GRAFT_ENOMEM);
        assert_int_equal(rep.installed, st == GRAFT_OK);
    }
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(recipient_matches(&r));
    recipient_destroy(&r);
    assert_int_equal(donor_stop(&d), 0);
}

/* ------------------------------------------------------------------------ */
/* Host memory from graft_transfer_host_alloc()                            */
/* ------------------------------------------------------------------------ */

/* Allocate, use, register parts of, and free blocks; misuse is refused. */
static void test_host_alloc(void **state)
{
    (void)state;
    graft_transfer_endpoint_t *ep = NULL;
    uint8_t *a = NULL, *b = NULL, *c = NULL;
    uint8_t foreign[64];
    void *untouched = (void *)0x1;

    assert_int_equal(graft_transfer_endpoint_create(NULL, &ep), GRAFT_OK);
    assert_int_equal(graft_transfer_host_alloc(NULL, 64, (void **)&a), GRAFT_EINVAL);
    assert_int_equal(graft_transfer_host_alloc(ep, 64, NULL), GRAFT_EINVAL);
    assert_int_equal(graft_transfer_host_alloc(ep, 0, &untouched), GRAFT_EINVAL);
    assert_ptr_equal(untouched, (void *)0x1);
#ifndef __SANITIZE_ADDRESS__
    /* More than any machine has: a clean error, no block. (UCX's last
     * resort is posix_memalign, which AddressSanitizer aborts on for such
     * a size instead of failing; the hook torture covers that build.) */
    assert_int_equal(graft_transfer_host_alloc(ep, 1ull << 62, &untouched), GRAFT_ENOMEM);
    assert_ptr_equal(untouched, (void *)0x1);
#endif

    /* Round trip: aligned, writable, readable, freed. */
    assert_int_equal(graft_transfer_host_alloc(ep, 1u << 20, (void **)&a), GRAFT_OK);
    assert_non_null(a);
    assert_int_equal((uintptr_t)a % 64, 0);
    fill_pattern(a, 1u << 20, 7);
    uint8_t *want = malloc(1u << 20);
    fill_pattern(want, 1u << 20, 7);
    assert_memory_equal(a, want, 1u << 20);
    free(want);
    assert_int_equal(graft_transfer_host_free(ep, a), GRAFT_OK);
    assert_int_equal(graft_transfer_host_free(ep, a), GRAFT_EINVAL); /* twice */
    assert_int_equal(graft_transfer_host_free(ep, NULL), GRAFT_OK);
    assert_int_equal(graft_transfer_host_free(NULL, a), GRAFT_EINVAL);
    assert_int_equal(graft_transfer_host_free(ep, foreign), GRAFT_EINVAL);

    /* Regions over parts of one block; a region that runs past its end is
     * refused and leaves the table as it was. */
    assert_int_equal(graft_transfer_host_alloc(ep, 100000, (void **)&b), GRAFT_OK);
    assert_int_equal(graft_transfer_host_free(ep, b + 1), GRAFT_EINVAL); /* inside, not it */
    graft_transfer_region_t r1 = {.name = "r1", .kind = GRAFT_TRANSFER_REGION_PARAM,
                                  .ptr = b + 13, .bytes = 50000};
    graft_transfer_region_t r2 = {.name = "r2", .kind = GRAFT_TRANSFER_REGION_OPTIM,
                                  .ptr = b + 50048, .bytes = 49952};
    graft_transfer_region_t over = {.name = "over", .kind = GRAFT_TRANSFER_REGION_OPTIM,
                                    .ptr = b + 99000, .bytes = 1u << 20};
    uint64_t h0, h1;
    assert_int_equal(graft_transfer_region_register(ep, &r1), GRAFT_OK);
    assert_int_equal(graft_transfer_layout_hash(ep, &h0), GRAFT_OK);
    assert_int_equal(graft_transfer_region_register(ep, &over), GRAFT_EINVAL);
    assert_int_equal(graft_transfer_layout_hash(ep, &h1), GRAFT_OK);
    assert_true(h0 == h1);
    assert_int_equal(graft_transfer_region_register(ep, &r2), GRAFT_OK);
    /* Its regions keep it: freeing it now is refused. */
    assert_int_equal(graft_transfer_host_free(ep, b), GRAFT_ESTATE);
    /* A block without regions, left for the endpoint to free. */
    assert_int_equal(graft_transfer_host_alloc(ep, 4096, (void **)&c), GRAFT_OK);
    assert_true(c != b);
    c[4095] = 1;
    assert_int_equal(graft_transfer_serve_begin(ep, 3), GRAFT_OK);
    assert_int_equal(graft_transfer_serve_end(ep), GRAFT_OK);
    graft_transfer_endpoint_destroy(ep);
}

/* Fail each allocation of graft_transfer_host_alloc() in turn: GRAFT_ENOMEM,
 * nothing left behind (the sanitizer build checks), and the endpoint still
 * allocates afterwards. */
static void test_host_alloc_failures(void **state)
{
    (void)state;
    graft_transfer_endpoint_t *ep = NULL;
    bool completed = false;

    assert_int_equal(graft_transfer_endpoint_create(NULL, &ep), GRAFT_OK);
    for (int n = 0; n < 16 && !completed; n++) {
        void *p = (void *)0x1;
        graft_test_alloc_fail_after(n);
        graft_status_t st = graft_transfer_host_alloc(ep, 8192, &p);
        graft_test_alloc_restore();
        if (st == GRAFT_OK) {
            completed = true;
            assert_int_equal(graft_transfer_host_free(ep, p), GRAFT_OK);
        } else {
            assert_int_equal(st, GRAFT_ENOMEM);
            assert_ptr_equal(p, (void *)0x1);
        }
    }
    assert_true(completed);
    graft_transfer_endpoint_destroy(ep);
}

/* Donors and recipient with their regions in host blocks: pulls are
 * verified and complete, twice in a row (keys are unpacked per pull). */
static void test_pull_host_mem(void **state)
{
    (void)state;
    donor_proc_t d[2];
    donor_opts_t o = opts_for(small_layout, ARRAY_SIZE(small_layout), 256u << 10);
    const char *addrs[2];
    recipient_t r;
    graft_transfer_report_t rep;

    o.host_mem = true;
    for (int i = 0; i < 2; i++) {
        donor_spawn(&o, &d[i]);
        addrs[i] = d[i].addr;
    }
    recipient_create_in(&r, small_layout, ARRAY_SIZE(small_layout), 256u << 10, TOKEN, true);
    graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 2, .step = STEP};
    for (int round = 0; round < 2; round++) {
        for (size_t i = 0; i < r.n_regions; i++)
            memset(r.mem[i], 0, r.layout[i].bytes);
        assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
        assert_true(rep.installed);
        assert_true(recipient_matches(&r));
        assert_int_equal(rep.donors[0].status, GRAFT_OK);
        assert_int_equal(rep.donors[1].status, GRAFT_OK);
        assert_int_equal(rep.donors[0].bytes + rep.donors[1].bytes, rep.bytes);
    }
    recipient_destroy(&r);
    /* A recipient with malloc'ed memory reads host blocks as well. */
    recipient_create(&r, small_layout, ARRAY_SIZE(small_layout), 256u << 10, TOKEN);
    po.n_donors = 1;
    assert_int_equal(do_pull(r.ep, &po, &rep), GRAFT_OK);
    assert_true(recipient_matches(&r));
    recipient_destroy(&r);
    for (int i = 0; i < 2; i++)
        assert_int_equal(donor_stop(&d[i]), 0);
}

static void test_donor_killed_host_mem(void **state)
{
    (void)state;
    failover_in(SIGKILL, true);
}

/* A stopped donor resumed after it was dropped must survive (its exit
 * status is checked): with host blocks the recipient's gets never reach
 * its progress thread. */
static void test_donor_stopped_host_mem(void **state)
{
    (void)state;
    failover_in(SIGSTOP, true);
}

static int use_tcp(void **state)
{
    (void)state;
    g_read = GRAFT_TRANSFER_READ_GET;
    return setenv("UCX_TLS", "tcp", 1);
}

static int use_shm(void **state)
{
    (void)state;
    g_read = GRAFT_TRANSFER_READ_GET;
    return setenv("UCX_TLS", "sm,self,tcp", 1);
}

static int use_tcp_push(void **state)
{
    (void)state;
    g_read = GRAFT_TRANSFER_READ_PUSH;
    return setenv("UCX_TLS", "tcp", 1);
}

static int use_shm_push(void **state)
{
    (void)state;
    g_read = GRAFT_TRANSFER_READ_PUSH;
    return setenv("UCX_TLS", "sm,self,tcp", 1);
}

int main(void)
{
    const struct CMUnitTest local[] = {
        cmocka_unit_test(test_api_misuse),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_host_alloc),
        cmocka_unit_test(test_host_alloc_failures),
        cmocka_unit_test_teardown(test_mm_error_handling_env, wire_teardown),
        cmocka_unit_test_teardown(test_listen_address, wire_teardown),
    };
#define WIRE(t) cmocka_unit_test_teardown(t, wire_teardown)
    const struct CMUnitTest wire[] = {
        WIRE(test_pull_1_donor),    WIRE(test_pull_2_donors),
        WIRE(test_pull_3_donors),   WIRE(test_refusals),   WIRE(test_donor_serves_late),
        WIRE(test_donor_killed),    WIRE(test_donor_stopped),
        WIRE(test_all_donors_dead), WIRE(test_drift),
        WIRE(test_recipient_killed), WIRE(test_two_recipients_at_once),
        WIRE(test_donor_bytes_changed),
        WIRE(test_many_small_regions), WIRE(test_pull_1gib),
        WIRE(test_pull_alloc_failures),
        WIRE(test_cancel),          WIRE(test_fence),
        WIRE(test_garbage_clients), WIRE(test_hostile_donor),
        WIRE(test_pull_host_mem),   WIRE(test_donor_killed_host_mem),
        WIRE(test_donor_stopped_host_mem),
        WIRE(test_queue_admits_in_turn), WIRE(test_expected_serve),
        WIRE(test_expected_serve_withdrawn),
    };
    int failed = 0;
    signal(SIGPIPE, SIG_IGN);
    if (getenv("GRAFT_LOG") == NULL)
        graft_log_level_set(GRAFT_LOG_ERROR);
    /* TRANSFER_FILTER=<glob> runs some tests only (while debugging). */
    if (getenv("TRANSFER_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TRANSFER_FILTER"));
    const char *only = getenv("TRANSFER_GROUP"); /* e.g. "shm_push" */
#define RUN_GROUP(name, setup)                                                           \
    if (only == NULL || strcmp(only, name) == 0)                                         \
        failed += cmocka_run_group_tests_name("transfer_" name, wire, setup, NULL);
    setenv("UCX_TLS", "tcp", 1);
    failed += cmocka_run_group_tests_name("transfer_local", local, NULL, NULL);
    RUN_GROUP("tcp", use_tcp);
    RUN_GROUP("shm", use_shm);
    RUN_GROUP("tcp_push", use_tcp_push);
    RUN_GROUP("shm_push", use_shm_push);
    return failed;
}
