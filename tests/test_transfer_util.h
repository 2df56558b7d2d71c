/*
 * The fixture of the transfer tests (header-only, static inline; each test
 * program is one file): donor processes forked before the recipient
 * touches UCX, a recipient with zeroed regions, one pull and its checks,
 * and a teardown that frees whatever a failed assertion left behind.
 * Every wire test runs over UCX_TLS=tcp and over shared memory, with gets
 * and with push reads (tf_run_wire()).
 *
 * A wire test, start to end:
 *
 *     tf_t *f = *state;
 *     tf_donor_opts_t o = tf_opts(tf_small_layout, TF_N_SMALL, 256u << 10);
 *     tf_donors_start(f, &o, 2);   // f->d[0..1]; f->po pulls from both
 *     tf_recipient_of(f, &o);      // f->r: the same layout, zeroed
 *     tf_pull_verified(f);         // GRAFT_OK, every byte as the donors wrote it
 *     tf_recipient_destroy(f);
 *     tf_donors_stop(f, 2);        // each donor ends with status 0
 *
 * Donors fill region i with the pattern of seed i + 1 (tf_fill_pattern());
 * a donor answers commands on a pipe (fence, peak, re-serve, change a
 * byte) until it is stopped.
 */
#ifndef GRAFT_TEST_TRANSFER_UTIL_H
#define GRAFT_TEST_TRANSFER_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <graft/transfer.h>

#include "bench_stats.h"

#define STEP 42
/* The job secret donors and recipients share (at least 16 bytes). */
#define SECRET "job-secret-of-the-transfer-tests"
/* A config's secret fields, for endpoints made by hand. */
#define TF_SECRET .job_secret = SECRET, .job_secret_len = sizeof(SECRET) - 1
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
/* Donor slots of a fixture: the most any test runs at once. */
#define TF_MAX_DONORS 4

typedef struct tf_region {
    const char *name;
    uint64_t bytes;
} tf_region_t;

/* Odd sizes, an unaligned tail, a tiny and an empty region. */
static const tf_region_t tf_small_layout[] = {
    {"weights", (3u << 20) + 12345}, {"optim", 4u << 20}, {"rng", 13}, {"empty", 0},
    {"step", 8},
};
/* Big enough that a donor can be killed mid-pull. */
static const tf_region_t tf_big_layout[] = {{"weights", 24u << 20}, {"optim", 24u << 20}};
#define TF_N_SMALL ARRAY_SIZE(tf_small_layout)
#define TF_N_BIG ARRAY_SIZE(tf_big_layout)

/* What a donor process serves, and how. */
typedef struct tf_donor_opts {
    const tf_region_t *layout;
    size_t n_regions;
    uint64_t chunk;
    const char *secret;
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
} tf_donor_opts_t;

/* A forked child of the test: a donor, or any process that answers its
 * address first and then commands. pid 0: the slot is free. */
typedef struct tf_donor {
    pid_t pid;
    int cmd_fd;  /* -1: none */
    int resp_fd; /* -1: none */
    char addr[64];
} tf_donor_t;

/* The recipient: an endpoint with zeroed regions of a layout. */
typedef struct tf_recipient {
    graft_transfer_endpoint_t *ep;
    bool host_mem; /* mem[] lie in a host block of ep, freed with it */
    uint8_t **mem; /* NULL: no recipient */
    const tf_region_t *layout;
    size_t n_regions;
} tf_recipient_t;

/* The fixture of one test (cmocka's state): its donors, its recipient, the
 * options of its next pull (tf_donors_start() points them at the donors)
 * and the report of its last. */
typedef struct tf {
    tf_donor_t d[TF_MAX_DONORS];
    const char *addrs[TF_MAX_DONORS];
    tf_recipient_t r;
    graft_transfer_pull_options_t po;
    graft_transfer_report_t rep;
} tf_t;

/* The read protocol of the group being run (tf_run_wire()). */
static graft_transfer_read_t tf_read = GRAFT_TRANSFER_READ_GET;

/* ---- the pattern donors serve -------------------------------------------- */

/* Word k of the pattern of @seed (splitmix64 of a counter): any piece of a
 * region can be regenerated on its own, 8 bytes per step. */
static inline uint64_t tf_pattern_word(uint64_t seed, uint64_t k)
{
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + (k + 1) * 0xD1B54A32D192ED03ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Bytes [off, off + n) of the pattern of @seed, to @p. */
static inline void tf_pattern_at(uint8_t *p, uint64_t off, uint64_t n, uint64_t seed)
{
    uint64_t i = 0;
    while (i < n) {
        uint64_t k = (off + i) / 8, skip = (off + i) % 8;
        uint64_t w = tf_pattern_word(seed, k);
        uint64_t take = 8 - skip < n - i ? 8 - skip : n - i;
        memcpy(p + i, (const uint8_t *)&w + skip, (size_t)take);
        i += take;
    }
}

static inline void tf_fill_pattern(uint8_t *p, uint64_t n, uint64_t seed)
{
    tf_pattern_at(p, 0, n, seed);
}

/* Whether @p holds the pattern of @seed, compared in 1 MiB pieces. */
static inline bool tf_pattern_matches(const uint8_t *p, uint64_t n, uint64_t seed)
{
    enum { PIECE = 1u << 20 };
    uint8_t *want = malloc(PIECE);
    bool ok = want != NULL;
    for (uint64_t off = 0; off < n && ok; off += PIECE) {
        uint64_t len = n - off < PIECE ? n - off : PIECE;
        tf_pattern_at(want, off, len, seed);
        ok = memcmp(want, p + off, (size_t)len) == 0;
    }
    free(want);
    return ok;
}

/* ---- pipes between the test and its children ---------------------------- */

static inline bool tf_read_full(int fd, void *buf, size_t n, int timeout_ms)
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

static inline bool tf_write_full(int fd, const void *buf, size_t n)
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

/* ---- the donor process ---------------------------------------------------- */

/* Where region @i of a layout lies in a host block: the first at an odd
 * offset, the others each at the next 64-byte boundary, so that regions
 * cover parts of the block, never all of it. */
static inline uint64_t tf_host_block_offset(const tf_region_t *layout, size_t i)
{
    uint64_t off = 13;
    for (size_t k = 0; k < i; k++)
        off = (off + layout[k].bytes + 63) / 64 * 64;
    return off;
}

static inline uint64_t tf_host_block_bytes(const tf_region_t *layout, size_t n)
{
    return tf_host_block_offset(layout, n) + 4096;
}

/* Options for a donor of @layout (@n regions, chunks of @chunk bytes) that
 * serves step STEP with the job secret SECRET, its state unchanged. */
static inline tf_donor_opts_t tf_opts(const tf_region_t *layout, size_t n, uint64_t chunk)
{
    tf_donor_opts_t o = {.layout = layout,
                         .n_regions = n,
                         .chunk = chunk,
                         .secret = SECRET,
                         .step = STEP,
                         .flip_region = -1};
    return o;
}

/* The donor does command @cmd (3 words: an op and its two arguments) and
 * writes its 2-word answer to @resp_fd (see tf_donor_ask()); an unknown op
 * is ignored. Returns false when the test is gone. */
static inline bool tf_donor_answer(graft_transfer_endpoint_t *ep, const tf_donor_opts_t *o,
                                   uint8_t **mem, const uint32_t cmd[3], int resp_fd)
{
    int32_t out[2] = {0, 0};
    switch (cmd[0]) {
    case 'M': /* change a byte behind the engine's back (after hashing) */
        mem[cmd[1]][cmd[2]] ^= 0x01;
        break;
    case 'R': /* serve the same step again, as after a rollback */
        out[0] = graft_transfer_serve_end(ep);
        if (out[0] == GRAFT_OK)
            out[0] = graft_transfer_serve_begin(ep, o->step);
        break;
    case 'P': /* the most recipients served at once */
        out[0] = (int32_t)graft_transfer_serve_peak(ep);
        break;
    case 'X': /* requests refused for who sent them */
        out[0] = (int32_t)graft_transfer_refused_count(ep);
        break;
    case 'G': /* serve only group @cmd[1] (@cmd[2] == 1), or any group (0) */
        out[0] = graft_transfer_serve_recipients(ep, &cmd[1], cmd[2] == 1 ? 1 : 0);
        break;
    case 'F': /* wait for @cmd[1] recipients, at most @cmd[2] ms */
        out[0] = graft_transfer_fence_wait(ep, o->step, cmd[1], cmd[2]);
        out[1] = (int32_t)graft_transfer_fence_count(ep, o->step);
        break;
    default:
        return true;
    }
    return tf_write_full(resp_fd, out, sizeof(out));
}

/* After its address, the donor's timed steps: a late serve, a late begin
 * of an announced step, a withdrawn announcement. */
static inline bool tf_donor_schedule(graft_transfer_endpoint_t *ep, const tf_donor_opts_t *o)
{
    if (o->serve_delay_ms > 0) {
        usleep(o->serve_delay_ms * 1000u);
        if (graft_transfer_serve_begin(ep, o->step) != GRAFT_OK)
            return false;
    }
    if (o->begin_after_ms > 0) {
        usleep(o->begin_after_ms * 1000u);
        if (graft_transfer_serve_begin(ep, o->step) != GRAFT_OK)
            return false;
    }
    if (o->withdraw_after_ms > 0) {
        usleep(o->withdraw_after_ms * 1000u);
        if (graft_transfer_serve_end(ep) != GRAFT_OK)
            return false;
    }
    return true;
}

/* The donor process: serve until told to quit; answer commands. */
static inline int tf_donor_main(const tf_donor_opts_t *o, int cmd_fd, int resp_fd)
{
    graft_transfer_config_t cfg = {.job_secret = o->secret, .job_secret_len = strlen(o->secret),
                                   .chunk_bytes = o->chunk, .group = 1,
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
    if (o->host_mem && graft_transfer_host_alloc(ep, tf_host_block_bytes(o->layout, o->n_regions),
                                                 (void **)&block) != GRAFT_OK)
        goto out;
    for (size_t i = 0; i < o->n_regions; i++) {
        mem[i] = block != NULL ? block + tf_host_block_offset(o->layout, i)
                               : malloc(o->layout[i].bytes + 1);
        tf_fill_pattern(mem[i], o->layout[i].bytes, i + 1);
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
    if (!tf_write_full(resp_fd, addr, sizeof(addr)) || !tf_donor_schedule(ep, o))
        goto out;
    for (;;) {
        uint32_t cmd[3];
        if (!tf_read_full(cmd_fd, cmd, sizeof(cmd), -1) || cmd[0] == 'Q')
            break;
        if (!tf_donor_answer(ep, o, mem, cmd, resp_fd))
            break;
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

/* ---- the fixture: children ------------------------------------------------ */

/* Forks child @i of the fixture, which runs @child_main(@arg, its command
 * pipe, its answer pipe), dies with the test and holds no other child's
 * pipes open; waits for the address it answers first. */
static inline tf_donor_t *tf_child_start(tf_t *f, int i,
                                         int (*child_main)(const void *, int, int),
                                         const void *arg)
{
    tf_donor_t *d = &f->d[i];
    int cmd[2], resp[2];
    assert_true(i >= 0 && i < TF_MAX_DONORS);
    assert_int_equal(d->pid, 0);
    assert_int_equal(pipe(cmd), 0);
    assert_int_equal(pipe(resp), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (int k = 0; k < TF_MAX_DONORS; k++) {
            if (f->d[k].pid > 0 && f->d[k].cmd_fd >= 0)
                close(f->d[k].cmd_fd);
            if (f->d[k].pid > 0 && f->d[k].resp_fd >= 0)
                close(f->d[k].resp_fd);
        }
        close(cmd[1]);
        close(resp[0]);
        _exit(child_main(arg, cmd[0], resp[1]));
    }
    close(cmd[0]);
    close(resp[1]);
    d->pid = pid;
    d->cmd_fd = cmd[1];
    d->resp_fd = resp[0];
    f->addrs[i] = d->addr;
    /* 60 s: a donor of 10,000 regions maps each one, which took over 20 s
     * in a sanitizer build on 2 loaded cores. */
    assert_true(tf_read_full(d->resp_fd, d->addr, sizeof(d->addr), 60000));
    return d;
}

/* A process the test forked by itself (@pid, no pipes) in slot @i, so that
 * the teardown kills it if the test does not (tf_child_kill()). */
static inline tf_donor_t *tf_child_adopt(tf_t *f, int i, pid_t pid, const char *addr)
{
    tf_donor_t *d = &f->d[i];
    assert_true(i >= 0 && i < TF_MAX_DONORS);
    assert_int_equal(d->pid, 0);
    d->pid = pid;
    d->cmd_fd = d->resp_fd = -1;
    snprintf(d->addr, sizeof(d->addr), "%s", addr);
    f->addrs[i] = d->addr;
    return d;
}

static inline int tf_donor_child(const void *arg, int cmd_fd, int resp_fd)
{
    return tf_donor_main(arg, cmd_fd, resp_fd);
}

/* Donor @i serving what @o says, at f->addrs[i]. */
static inline tf_donor_t *tf_donor_start(tf_t *f, int i, const tf_donor_opts_t *o)
{
    return tf_child_start(f, i, tf_donor_child, o);
}

/* Donors 0..@n-1 serving what @o says; the next pull asks all of them for
 * step STEP (the other pull options stay as they are). */
static inline void tf_donors_start(tf_t *f, const tf_donor_opts_t *o, int n)
{
    for (int i = 0; i < n; i++)
        tf_donor_start(f, i, o);
    f->po.donors = f->addrs;
    f->po.n_donors = (size_t)n;
    f->po.step = STEP;
}

static inline void tf_child_forget(tf_donor_t *d)
{
    if (d->cmd_fd >= 0)
        close(d->cmd_fd);
    if (d->resp_fd >= 0)
        close(d->resp_fd);
    d->pid = 0;
    d->cmd_fd = d->resp_fd = -1;
}

/* Kill and reap a child without asking it anything. */
static inline void tf_child_kill(tf_donor_t *d)
{
    if (d->pid <= 0)
        return;
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
    tf_child_forget(d);
}

/* Quit, or reap a donor the test killed. Returns the wait status. */
static inline int tf_donor_stop(tf_donor_t *d)
{
    int ws = 0;
    uint32_t cmd[3] = {'Q', 0, 0};
    if (!tf_write_full(d->cmd_fd, cmd, sizeof(cmd)))
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
    if (WIFSIGNALED(ws))
        print_message("# donor %d ended by signal %d\n", (int)d->pid, WTERMSIG(ws));
    tf_child_forget(d);
    return ws;
}

/* Stop donors 0..@n-1: each must end with status 0. */
static inline void tf_donors_stop(tf_t *f, int n)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(tf_donor_stop(&f->d[i]), 0);
}

/* Send donor @d command @op with arguments @a and @b, and read its answer
 * into @out (2 words) within @timeout_ms. Ops: 'M' flips a bit of byte @b
 * of region @a (after hashing), 'R' serves the step again, 'P' answers the
 * most recipients served at once, 'X' answers the requests refused for who
 * sent them, 'G' serves only group @a (@b == 1) or any
 * group (@b == 0), 'F' waits for the fence (tf_fence()). */
static inline void tf_donor_ask(tf_donor_t *d, uint32_t op, uint32_t a, uint32_t b, int timeout_ms,
                                int32_t out[2])
{
    uint32_t cmd[3] = {op, a, b};
    assert_true(tf_write_full(d->cmd_fd, cmd, sizeof(cmd)));
    assert_true(tf_read_full(d->resp_fd, out, 2 * sizeof(out[0]), timeout_ms));
}

/* The donor's fence for @expected recipients: its status and its count. */
static inline void tf_fence(tf_donor_t *d, uint32_t expected, uint32_t timeout_ms,
                            int32_t *st_p, int32_t *count_p)
{
    int32_t out[2];
    tf_donor_ask(d, 'F', expected, timeout_ms, (int)timeout_ms + 10000, out);
    *st_p = out[0];
    *count_p = out[1];
}

/* Ask the donor's fence for @expected recipients; check what it says. */
static inline void tf_fence_is(tf_donor_t *d, uint32_t expected, uint32_t timeout_ms,
                               int32_t want_st, int32_t want_count)
{
    int32_t st, count;
    tf_fence(d, expected, timeout_ms, &st, &count);
    assert_int_equal(st, want_st);
    assert_int_equal(count, want_count);
}

/* ---- the fixture: the recipient ------------------------------------------- */

/* The recipient f->r: @n regions of @layout, zeroed, chunks of @chunk
 * bytes, job secret @secret; with @host_mem the regions lie in one block of
 * graft_transfer_host_alloc(). */
static inline void tf_recipient_create(tf_t *f, const tf_region_t *layout, size_t n,
                                       uint64_t chunk, const char *secret, bool host_mem)
{
    graft_transfer_config_t cfg = {.job_secret = secret, .job_secret_len = strlen(secret),
                                   .chunk_bytes = chunk, .group = 2};
    tf_recipient_t *r = &f->r;
    uint8_t *block = NULL;
    assert_null(r->mem); /* one recipient at a time */
    r->layout = layout;
    r->n_regions = n;
    r->host_mem = host_mem;
    r->mem = calloc(n + 1, sizeof(*r->mem));
    assert_int_equal(graft_transfer_endpoint_create(&cfg, &r->ep), GRAFT_OK);
    if (host_mem) {
        uint64_t bytes = tf_host_block_bytes(layout, n);
        assert_int_equal(graft_transfer_host_alloc(r->ep, bytes, (void **)&block), GRAFT_OK);
        memset(block, 0, bytes);
    }
    for (size_t i = 0; i < n; i++) {
        r->mem[i] = host_mem ? block + tf_host_block_offset(layout, i)
                             : calloc(1, layout[i].bytes + 1);
        graft_transfer_region_t reg = {.name = layout[i].name,
                                       .kind = GRAFT_TRANSFER_REGION_PARAM,
                                       .ptr = r->mem[i],
                                       .bytes = layout[i].bytes};
        assert_int_equal(graft_transfer_region_register(r->ep, &reg), GRAFT_OK);
    }
}

/* The recipient of what donors of @o serve: their layout, chunk size and
 * secret, in malloc'ed memory. */
static inline void tf_recipient_of(tf_t *f, const tf_donor_opts_t *o)
{
    tf_recipient_create(f, o->layout, o->n_regions, o->chunk, o->secret, false);
}

/* Whether every region holds what the donors wrote. */
static inline bool tf_recipient_matches(const tf_t *f)
{
    bool ok = true;
    for (size_t i = 0; i < f->r.n_regions && ok; i++)
        ok = tf_pattern_matches(f->r.mem[i], f->r.layout[i].bytes, i + 1);
    return ok;
}

/* Whether every region is still all zeroes (nothing was written). */
static inline bool tf_recipient_untouched(const tf_t *f)
{
    for (size_t i = 0; i < f->r.n_regions; i++) {
        for (uint64_t k = 0; k < f->r.layout[i].bytes; k++) {
            if (f->r.mem[i][k] != 0)
                return false;
        }
    }
    return true;
}

/* Zero every region again, for the next pull. */
static inline void tf_recipient_zero(tf_t *f)
{
    for (size_t i = 0; i < f->r.n_regions; i++)
        memset(f->r.mem[i], 0, f->r.layout[i].bytes);
}

static inline void tf_recipient_destroy(tf_t *f)
{
    tf_recipient_t *r = &f->r;
    graft_transfer_endpoint_destroy(r->ep);
    for (size_t i = 0; i < r->n_regions && !r->host_mem && r->mem != NULL; i++)
        free(r->mem[i]);
    free(r->mem);
    memset(r, 0, sizeof(*r));
}

/* ---- the fixture: the pull -------------------------------------------------- */

/* f->po with the group's read protocol, by f->r, into f->rep. */
static inline graft_status_t tf_pull(tf_t *f)
{
    graft_transfer_pull_options_t o = f->po;
    graft_transfer_report_t *rep = &f->rep;
    o.read = tf_read;
    graft_status_t st = graft_transfer_pull(f->r.ep, &o, rep);
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

/* The pull succeeds and the recipient holds every byte the donors wrote. */
static inline void tf_pull_verified(tf_t *f)
{
    assert_int_equal(tf_pull(f), GRAFT_OK);
    assert_true(tf_recipient_matches(f));
}

/* ---- transports ------------------------------------------------------------- */

/* From a donor report's transports ("tl/dev:use,use tl/dev ..."): the
 * transport of the lane that carries active messages (use "am"), and
 * whether every lane is tcp. */
static inline void tf_lanes_parse(const char *transports, char *am_tl, size_t am_size,
                                  bool *all_tcp_p)
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

/* The connection to a donor is tcp in every group: the listener offers
 * no shared memory (docs/SECURITY.md), whatever UCX_TLS allows. Where
 * UCX_TLS allows it, the donor (on this host) offered its second
 * connection after the handshake, shared memory only, and the chunks came
 * over it; over tcp alone there is none. */
static inline void tf_assert_group_transports(const graft_transfer_donor_report_t *dr)
{
    char am_tl[32];
    bool all_tcp;
    tf_lanes_parse(dr->transports, am_tl, sizeof(am_tl), &all_tcp);
    if (!all_tcp)
        print_message("# lanes: %s\n", dr->transports);
    assert_true(all_tcp);
    assert_string_equal(am_tl, "tcp");
    if (strcmp(getenv("UCX_TLS"), "tcp") == 0 || dr->chunks == 0) {
        assert_string_equal(dr->shm_transports, "");
        return;
    }
    tf_lanes_parse(dr->shm_transports, am_tl, sizeof(am_tl), &all_tcp);
    if (strstr(dr->shm_transports, "tcp") != NULL || am_tl[0] == '\0')
        print_message("# second connection's lanes: '%s'\n", dr->shm_transports);
    assert_null(strstr(dr->shm_transports, "tcp"));
    assert_true(strcmp(am_tl, "posix") == 0 || strcmp(am_tl, "sysv") == 0);
}

/* ---- setup, teardown, groups ------------------------------------------------ */

/* Before every test that starts a child or a recipient: an empty fixture. */
static inline int tf_setup(void **state)
{
    tf_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return -1;
    for (int i = 0; i < TF_MAX_DONORS; i++)
        f->d[i].cmd_fd = f->d[i].resp_fd = -1;
    *state = f;
    return 0;
}

/* After it: free what a failed assertion left behind, the recipient first
 * so that its UCX context is not inherited by the next test's donors. */
static inline int tf_teardown(void **state)
{
    tf_t *f = *state;
    if (f == NULL)
        return 0;
    if (f->r.mem != NULL)
        tf_recipient_destroy(f);
    for (int i = 0; i < TF_MAX_DONORS; i++)
        tf_child_kill(&f->d[i]);
    free(f);
    *state = NULL;
    return 0;
}

#define TF_TEST(t) cmocka_unit_test_setup_teardown(t, tf_setup, tf_teardown)

static inline int tf_group(graft_transfer_read_t read, const char *tls)
{
    tf_read = read;
    return setenv("UCX_TLS", tls, 1);
}

static inline int tf_use_tcp(void **state)
{
    return tf_group(GRAFT_TRANSFER_READ_GET, "tcp");
}

static inline int tf_use_shm(void **state)
{
    return tf_group(GRAFT_TRANSFER_READ_GET, "sm,self,tcp");
}

static inline int tf_use_tcp_push(void **state)
{
    return tf_group(GRAFT_TRANSFER_READ_PUSH, "tcp");
}

static inline int tf_use_shm_push(void **state)
{
    return tf_group(GRAFT_TRANSFER_READ_PUSH, "sm,self,tcp");
}

/* Once per program: quiet logs (GRAFT_LOG overrides), no SIGPIPE, and
 * TRANSFER_FILTER=<glob> to run some tests only (while debugging). */
static inline void tf_program_init(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (getenv("GRAFT_LOG") == NULL)
        graft_log_level_set(GRAFT_LOG_ERROR);
    if (getenv("TRANSFER_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TRANSFER_FILTER"));
    setenv("UCX_TLS", "tcp", 1);
}

/* Runs @n @tests once, over tcp, as group "transfer_@prog". Returns the
 * number of failures. */
static inline int tf_run_local(const char *prog, const struct CMUnitTest *tests, size_t n)
{
    char name[64];
    tf_program_init();
    snprintf(name, sizeof(name), "transfer_%s", prog);
    return _cmocka_run_group_tests(name, tests, n, NULL, NULL);
}

/* Runs @n @tests in every group: tcp and shared memory, each with gets and
 * with push reads, as "transfer_@prog_<group>"; TRANSFER_GROUP=<group>
 * (e.g. "shm_push") runs one only. Returns the number of failures. */
static inline int tf_run_wire(const char *prog, const struct CMUnitTest *tests, size_t n)
{
    static const struct {
        const char *name;
        CMFixtureFunction setup;
    } groups[] = {{"tcp", tf_use_tcp},
                  {"shm", tf_use_shm},
                  {"tcp_push", tf_use_tcp_push},
                  {"shm_push", tf_use_shm_push}};
    const char *only = getenv("TRANSFER_GROUP");
    int failed = 0;
    tf_program_init();
    for (size_t g = 0; g < ARRAY_SIZE(groups); g++) {
        char name[64];
        if (only != NULL && strcmp(only, groups[g].name) != 0)
            continue;
        snprintf(name, sizeof(name), "transfer_%s_%s", prog, groups[g].name);
        failed += _cmocka_run_group_tests(name, tests, n, groups[g].setup, NULL);
    }
    return failed;
}

#endif
