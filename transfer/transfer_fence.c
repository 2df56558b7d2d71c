/*
 * The serve's bookkeeping that the engine and its backends both write: the
 * recipients' fence, one count per recent step (a backend notes a
 * recipient done or lost, the training thread waits for the count), and
 * the recipient groups a serve admits, and the followers a serve owes
 * (graft_transfer_followers_wanted/_wait). Under ep->lock; below
 * transfer.c and the backends, calling neither.
 */
#include "transfer_int.h"

#include <errno.h>
#include <time.h>

/* How long a follower's ask stands: a follower asks again every few ms
 * while it waits, so without an ask this long it stopped (or hangs). */
#define FOLLOW_WANT_FRESH_NS 500000000ull

static graft__fence_slot_t *fence_slot(graft_transfer_endpoint_t *ep, uint64_t step, bool create)
{
    graft__fence_slot_t *oldest = NULL;
    for (size_t i = 0; i < GRAFT__FENCE_SLOTS; i++) {
        graft__fence_slot_t *s = &ep->fence[i];
        if (s->used && s->step == step)
            return s;
        if (!s->used || oldest == NULL || (oldest->used && s->step < oldest->step))
            oldest = s;
    }
    if (!create)
        return NULL;
    /* Old steps fall out: a fence is only ever waited on for recent steps. */
    oldest->used = true;
    oldest->step = step;
    oldest->gen = 0;
    oldest->done = 0;
    return oldest;
}

void graft__transfer_fence_note(graft_transfer_endpoint_t *ep, uint64_t step, uint64_t gen)
{
    pthread_mutex_lock(&ep->lock);
    graft__fence_slot_t *s = fence_slot(ep, step, true);
    if (s->gen == 0)
        s->gen = gen;
    if (s->gen == gen) {
        s->done++;
        pthread_cond_broadcast(&ep->cond);
    } else {
        GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "a recipient of an earlier serve of step %llu is not "
                    "counted", (unsigned long long)step);
    }
    pthread_mutex_unlock(&ep->lock);
}

void graft__transfer_follow_note(graft_transfer_endpoint_t *ep, uint64_t gen)
{
    pthread_mutex_lock(&ep->lock);
    if (gen == ep->serve_gen && ep->follow_owed > 0) {
        ep->follow_owed--;
        pthread_cond_broadcast(&ep->cond);
    }
    pthread_mutex_unlock(&ep->lock);
}

void graft__transfer_follow_ask(graft_transfer_endpoint_t *ep, bool *wanting, uint64_t step)
{
    if (!*wanting)
        ep->follow_wanting++;
    *wanting = true;
    ep->follow_want_step = step;
    ep->follow_want_ns = graft__now_ns();
    ep->follow_seen_ns = ep->follow_want_ns;
}

void graft__transfer_follow_unask(graft_transfer_endpoint_t *ep, bool *wanting, bool locked)
{
    if (!*wanting)
        return;
    if (!locked)
        pthread_mutex_lock(&ep->lock);
    *wanting = false;
    ep->follow_wanting--;
    ep->follow_seen_ns = graft__now_ns();
    pthread_cond_broadcast(&ep->cond);
    if (!locked)
        pthread_mutex_unlock(&ep->lock);
}

/* A follower still asks for a step at or before @p step (under lock). */
static bool follow_wanted_locked(const graft_transfer_endpoint_t *ep, uint64_t step)
{
    uint64_t now = graft__now_ns();
    return ep->follow_wanting > 0 && now - ep->follow_want_ns < FOLLOW_WANT_FRESH_NS &&
           ep->follow_want_step <= step;
}

/* A serve of @p step would give a follower a step it has not got: one asks
 * for it, or one asked or was admitted lately and none asks for a later
 * step (one still reading an earlier step asks for this one next). */
static bool follow_due_locked(const graft_transfer_endpoint_t *ep, uint64_t step)
{
    uint64_t now = graft__now_ns();
    if (follow_wanted_locked(ep, step))
        return true;
    bool later = ep->follow_wanting > 0 && now - ep->follow_want_ns < FOLLOW_WANT_FRESH_NS;
    return !later && ep->follow_seen_ns != 0 && now - ep->follow_seen_ns < FOLLOW_WANT_FRESH_NS;
}

bool graft_transfer_followers_wanted(graft_transfer_endpoint_t *ep, uint64_t step)
{
    if (ep == NULL)
        return false;
    pthread_mutex_lock(&ep->lock);
    bool due = follow_due_locked(ep, step);
    pthread_mutex_unlock(&ep->lock);
    return due;
}

graft_status_t graft_transfer_followers_wait(graft_transfer_endpoint_t *ep, uint32_t timeout_ms)
{
    if (ep == NULL)
        return GRAFT_EINVAL;
    uint64_t deadline = graft__now_ns() + (uint64_t)timeout_ms * 1000000ull;
    graft_status_t status = GRAFT_OK;
    pthread_mutex_lock(&ep->lock);
    while (ep->serving && (ep->follow_owed > 0 || follow_wanted_locked(ep, ep->serve_step))) {
        uint64_t now = graft__now_ns();
        if (now >= deadline) {
            status = GRAFT_ETIMEOUT;
            break;
        }
        /* Slices: an ask that goes stale wakes nobody. */
        uint64_t slice = GRAFT_MIN(deadline - now, 5000000ull);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)slice;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        (void)pthread_cond_timedwait(&ep->cond, &ep->lock, &ts);
    }
    pthread_mutex_unlock(&ep->lock);
    return status;
}

uint32_t graft_transfer_fence_count(graft_transfer_endpoint_t *ep, uint64_t step)
{
    uint32_t n = 0;
    if (ep == NULL)
        return 0;
    pthread_mutex_lock(&ep->lock);
    graft__fence_slot_t *s = fence_slot(ep, step, false);
    if (s != NULL)
        n = s->done;
    pthread_mutex_unlock(&ep->lock);
    return n;
}

graft_status_t graft_transfer_fence_wait(graft_transfer_endpoint_t *ep, uint64_t step,
                                         uint32_t expected_recipients, uint32_t timeout_ms)
{
    graft_status_t status = GRAFT_OK;
    struct timespec deadline;

    if (ep == NULL)
        return GRAFT_EINVAL;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += timeout_ms / 1000;
    deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }

    pthread_mutex_lock(&ep->lock);
    for (;;) {
        graft__fence_slot_t *s = fence_slot(ep, step, false);
        if ((s != NULL ? s->done : 0) >= expected_recipients)
            break;
        if (timeout_ms == 0 ||
            pthread_cond_timedwait(&ep->cond, &ep->lock, &deadline) == ETIMEDOUT) {
            s = fence_slot(ep, step, false);
            if ((s != NULL ? s->done : 0) < expected_recipients)
                status = GRAFT_ETIMEOUT;
            break;
        }
    }
    pthread_mutex_unlock(&ep->lock);
    return status;
}

bool graft__transfer_serves_group(const graft_transfer_endpoint_t *ep, uint32_t group)
{
    if (ep->n_recipients == 0)
        return true;
    for (size_t i = 0; i < ep->n_recipients; i++) {
        if (ep->recipients[i] == group)
            return true;
    }
    return false;
}

/* A new serve of @p step (under ep->lock): a new generation, and a new
 * count, since the step may have been served before (a rollback). */
void graft__transfer_fence_restart(graft_transfer_endpoint_t *ep, uint64_t step)
{
    ep->serve_gen++;
    ep->follow_owed = 0; /* those admitted before read another serve */
    graft__fence_slot_t *fs = fence_slot(ep, step, true);
    fs->done = 0;
    fs->gen = ep->serve_gen;
}
