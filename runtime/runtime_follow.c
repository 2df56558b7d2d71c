/*
 * A follow spare's follower (docs/RUNTIME.md, "Follow spares"): while the
 * spare waits for a slot, a thread pulls each step's state from rank
 * `rank` of the lowest healthy group, verified like any heal, so that the
 * spare promoted at the step it holds joins without pulling.
 *
 * It asks the donor for the step after the one it holds. The donor serves
 * a step to followers only once one asked for it (a refusal remembered by
 * its endpoint: graft_transfer_followers_wanted()), from its graft_quorum()
 * to its commit's fence, which waits for the follower. A donor serving a
 * later step answers with it, and the follower asks for that one.
 */
#include "runtime_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* While the donor does not serve the step yet: ask again this often, and
 * keep asking this long in one pull (a step of the job may take that). */
#define FOLLOW_RETRY_MS 5u
#define FOLLOW_CONNECT_MS 10000u
/* After a failed pull (no donor, a donor lost, one that refuses this
 * spare's region table): wait, from 100 ms doubling to 2 s. */
#define FOLLOW_PAUSE_NS 100000000ull
#define FOLLOW_PAUSE_MAX_NS 2000000000ull

static void pause_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Wait @p ns, or less once the follower is told to stop. */
static void pause_unless_stopped(graft_runtime_t *rt, uint64_t ns)
{
    for (uint64_t slept = 0; slept < ns && !atomic_load(&rt->follow.stop); slept += 10000000ull)
        pause_ns(GRAFT_MIN(ns - slept, 10000000ull));
}

/* The transfer address of rank `rank` of the lowest group whose record
 * says healthy, or NULL (none, or out of memory). */
static char *donor_pick(graft_runtime_t *rt)
{
    graft_membership_view_t *v = NULL;
    char *addr = NULL;
    if (graft_membership_spare_view_get(rt->follow.sp, &v) != GRAFT_OK)
        return NULL;
    uint32_t best = UINT32_MAX;
    for (size_t i = 0; i < v->n_members; i++) {
        const graft_member_t *mb = &v->members[i];
        if (mb->rank != rt->rank || mb->group >= best || mb->state != GRAFT_MEMBER_HEALTHY ||
            mb->transfer_address == NULL || mb->transfer_address[0] == '\0')
            continue;
        graft_free(addr);
        addr = graft__strdup(mb->transfer_address);
        best = mb->group;
    }
    graft_membership_view_free(v);
    return addr;
}

/* The pull's progress: bytes are moving (a promotion lets it finish). */
static void on_progress(uint64_t done, uint64_t total, void *arg)
{
    (void)total;
    graft_runtime_t *rt = arg;
    if (done > 0)
        atomic_store(&rt->follow.moving, true);
}

static void *follow_main(void *arg)
{
    graft_runtime_t *rt = arg;
    uint64_t want = rt->follow.step + 1;
    uint64_t pause = FOLLOW_PAUSE_NS;
    while (!atomic_load(&rt->follow.stop)) {
        char *addr = donor_pick(rt);
        if (addr == NULL) {
            pause_unless_stopped(rt, FOLLOW_PAUSE_NS);
            continue;
        }
        const char *donors[1] = {addr};
        graft_transfer_pull_options_t po = {
            .donors = donors,
            .n_donors = 1,
            .step = want,
            .stall_timeout_ms = (uint32_t)rt->cfg->stall_timeout_ms,
            .connect_timeout_ms = FOLLOW_CONNECT_MS,
            .timeout_ms = (uint32_t)rt->cfg->transfer_timeout_ms,
            .step_retry_ms = FOLLOW_RETRY_MS,
            .follower = true,
            .progress = on_progress,
            .progress_arg = rt,
        };
        graft_transfer_report_t rep;
        atomic_store(&rt->follow.moving, false);
        graft_status_t st = graft_transfer_pull(rt->ep, &po, &rep);
        graft_free(addr);
        if (st == GRAFT_OK) {
            pause = FOLLOW_PAUSE_NS;
            GRAFT_DEBUG(GRAFT_MOD_RUNTIME, "follower of rank %" PRIu32 ": holds step %" PRIu64,
                        rt->rank, rep.step);
            rt->follow.step = rep.step;
            want = rep.step + 1;
            pthread_mutex_lock(&rt->mu);
            rt->metrics.follow_pulls++;
            rt->metrics.follow_bytes += rep.bytes;
            pthread_mutex_unlock(&rt->mu);
            continue;
        }
        if (rep.n_donors > 0 && rep.donors[0].chunks > 0)
            rt->follow.step = 0; /* installed in part: the regions hold no step */
        if (rep.n_donors > 0 && rep.donors[0].serving_step > want) {
            want = rep.donors[0].serving_step; /* the job is further on: that one */
            continue;
        }
        GRAFT_DEBUG(GRAFT_MOD_RUNTIME, "follower of rank %" PRIu32 ": step %" PRIu64 ": %s",
                    rt->rank, want, graft_status_string(st));
        pause_unless_stopped(rt, pause);
        pause = GRAFT_MIN(2 * pause, FOLLOW_PAUSE_MAX_NS);
    }
    atomic_store(&rt->follow.done, true);
    return NULL;
}

graft_status_t graft__rt_follow_start(graft_runtime_t *rt, graft_membership_spare_t *sp)
{
    rt->follow.sp = sp;
    rt->follow.step = 0;
    atomic_store(&rt->follow.stop, false);
    atomic_store(&rt->follow.done, false);
    int rc = pthread_create(&rt->follow.thread, NULL, follow_main, rt);
    if (rc != 0) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "follower: pthread_create: %s", strerror(rc));
        return GRAFT_ESYS;
    }
    rt->follow.running = true;
    return GRAFT_OK;
}

uint64_t graft__rt_follow_stop(graft_runtime_t *rt)
{
    if (!rt->follow.running)
        return 0;
    atomic_store(&rt->follow.stop, true);
    /* A pull that is moving bytes finishes: they are bytes the join would
     * pull anyway, and it may bring the step the job waits at. One that
     * waits for its step is cancelled (one begun after the flag was read
     * would not see a single cancel). */
    while (!atomic_load(&rt->follow.done)) {
        if (!atomic_load(&rt->follow.moving))
            graft_transfer_pull_cancel(rt->ep);
        pause_ns(1000000ull);
    }
    pthread_join(rt->follow.thread, NULL);
    rt->follow.running = false;
    rt->follow.sp = NULL;
    return rt->follow.step;
}
