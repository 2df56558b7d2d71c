/*
 * The fixture of the transfer tests (compiled once, tests/support; linked
 * into every test program): donor processes forked before the recipient
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
#ifndef GRAFT_TEST_TRANSFER_FIXTURE_H
#define GRAFT_TEST_TRANSFER_FIXTURE_H

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
#define TF_N_SMALL 5
extern const tf_region_t tf_small_layout[TF_N_SMALL];
/* Big enough that a donor can be killed mid-pull. */
#define TF_N_BIG 2
extern const tf_region_t tf_big_layout[TF_N_BIG];

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
extern graft_transfer_read_t tf_read;

/* ---- the pattern donors serve -------------------------------------------- */

void tf_fill_pattern(uint8_t *p, uint64_t n, uint64_t seed);

/* Whether @p holds the pattern of @seed, compared in 1 MiB pieces. */
bool tf_pattern_matches(const uint8_t *p, uint64_t n, uint64_t seed);

/* ---- pipes between the test and its children ---------------------------- */

bool tf_read_full(int fd, void *buf, size_t n, int timeout_ms);

bool tf_write_full(int fd, const void *buf, size_t n);

/* ---- the donor process ---------------------------------------------------- */

/* Where region @i of a layout lies in a host block: the first at an odd
 * offset, the others each at the next 64-byte boundary, so that regions
 * cover parts of the block, never all of it. */
uint64_t tf_host_block_offset(const tf_region_t *layout, size_t i);

uint64_t tf_host_block_bytes(const tf_region_t *layout, size_t n);

/* Options for a donor of @layout (@n regions, chunks of @chunk bytes) that
 * serves step STEP with the job secret SECRET, its state unchanged. */
tf_donor_opts_t tf_opts(const tf_region_t *layout, size_t n, uint64_t chunk);

/* ---- the fixture: children ------------------------------------------------ */

/* Forks child @i of the fixture, which runs @child_main(@arg, its command
 * pipe, its answer pipe), dies with the test and holds no other child's
 * pipes open; waits for the address it answers first. */
tf_donor_t *tf_child_start(tf_t *f, int i,
                           int (*child_main)(const void *, int, int),
                           const void *arg);

/* A process the test forked by itself (@pid, no pipes) in slot @i, so that
 * the teardown kills it if the test does not (tf_child_kill()). */
tf_donor_t *tf_child_adopt(tf_t *f, int i, pid_t pid, const char *addr);

/* Donor @i serving what @o says, at f->addrs[i]. */
tf_donor_t *tf_donor_start(tf_t *f, int i, const tf_donor_opts_t *o);

/* Donors 0..@n-1 serving what @o says; the next pull asks all of them for
 * step STEP (the other pull options stay as they are). */
void tf_donors_start(tf_t *f, const tf_donor_opts_t *o, int n);

/* Kill and reap a child without asking it anything. */
void tf_child_kill(tf_donor_t *d);

/* Quit, or reap a donor the test killed. Returns the wait status. */
int tf_donor_stop(tf_donor_t *d);

/* Stop donors 0..@n-1: each must end with status 0. */
void tf_donors_stop(tf_t *f, int n);

/* Send donor @d command @op with arguments @a and @b, and read its answer
 * into @out (2 words) within @timeout_ms. Ops: 'M' flips a bit of byte @b
 * of region @a (after hashing), 'R' serves the step again, 'P' answers the
 * most recipients served at once, 'X' answers the requests refused for who
 * sent them, 'G' serves only group @a (@b == 1) or any
 * group (@b == 0), 'S' serves only groups @a and @b, 'F' waits for the
 * fence (tf_fence()), 'L' answers whether a serve of step @a would give a
 * follower a step and waits @b ms for the followers reading. */
void tf_donor_ask(tf_donor_t *d, uint32_t op, uint32_t a, uint32_t b, int timeout_ms,
                  int32_t out[2]);

/* The donor's fence for @expected recipients: its status and its count. */
void tf_fence(tf_donor_t *d, uint32_t expected, uint32_t timeout_ms,
              int32_t *st_p, int32_t *count_p);

/* Ask the donor's fence for @expected recipients; check what it says. */
void tf_fence_is(tf_donor_t *d, uint32_t expected, uint32_t timeout_ms,
                 int32_t want_st, int32_t want_count);

/* ---- the fixture: the recipient ------------------------------------------- */

/* The recipient f->r: @n regions of @layout, zeroed, chunks of @chunk
 * bytes, job secret @secret; with @host_mem the regions lie in one block of
 * graft_transfer_host_alloc(). */
void tf_recipient_create(tf_t *f, const tf_region_t *layout, size_t n,
                         uint64_t chunk, const char *secret, bool host_mem);

/* The recipient of what donors of @o serve: their layout, chunk size and
 * secret, in malloc'ed memory. */
void tf_recipient_of(tf_t *f, const tf_donor_opts_t *o);

/* Whether every region holds what the donors wrote. */
bool tf_recipient_matches(const tf_t *f);

/* Whether every region is still all zeroes (nothing was written). */
bool tf_recipient_untouched(const tf_t *f);

/* Zero every region again, for the next pull. */
void tf_recipient_zero(tf_t *f);

void tf_recipient_destroy(tf_t *f);

/* ---- the fixture: the pull -------------------------------------------------- */

/* f->po with the group's read protocol, by f->r, into f->rep. */
graft_status_t tf_pull(tf_t *f);

/* The pull succeeds and the recipient holds every byte the donors wrote. */
void tf_pull_verified(tf_t *f);

/* ---- transports ------------------------------------------------------------- */

/* From a donor report's transports ("tl/dev:use,use tl/dev ..."): the
 * transport of the lane that carries active messages (use "am"), and
 * whether every lane is tcp. */
void tf_lanes_parse(const char *transports, char *am_tl, size_t am_size,
                    bool *all_tcp_p);

/* The connection to a donor is tcp in every group: the listener offers
 * no shared memory (docs/SECURITY.md), whatever UCX_TLS allows. Where
 * UCX_TLS allows it, the donor (on this host) offered its second
 * connection after the handshake, shared memory only, and the chunks came
 * over it; over tcp alone there is none. */
void tf_assert_group_transports(const graft_transfer_donor_report_t *dr);

/* ---- setup, teardown, groups ------------------------------------------------ */

/* Before every test that starts a child or a recipient: an empty fixture. */
int tf_setup(void **state);

/* After it: free what a failed assertion left behind, the recipient first
 * so that its UCX context is not inherited by the next test's donors. */
int tf_teardown(void **state);

#define TF_TEST(t) cmocka_unit_test_setup_teardown(t, tf_setup, tf_teardown)

int tf_use_tcp_push(void **state);

int tf_use_shm_push(void **state);

/* Runs @n @tests once, over tcp, as group "transfer_@prog". Returns the
 * number of failures. */
int tf_run_local(const char *prog, const struct CMUnitTest *tests, size_t n);

/* Runs @n @tests in every group: tcp and shared memory, each with gets and
 * with push reads, as "transfer_@prog_<group>"; TRANSFER_GROUP=<group>
 * (e.g. "shm_push") runs one only. Returns the number of failures. */
int tf_run_wire(const char *prog, const struct CMUnitTest *tests, size_t n);

#endif
