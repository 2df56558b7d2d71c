/*
 * The serve's bookkeeping that the engine and its backends both write: the
 * recipients' fence, one count per recent step (a backend notes a
 * recipient done or lost, the training thread waits for the count), and
 * the recipient groups a serve admits. Under ep->lock; below transfer.c
 * and the backends, calling neither.
 */
#include "transfer_int.h"

#include <errno.h>
#include <time.h>

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
    graft__fence_slot_t *fs = fence_slot(ep, step, true);
    fs->done = 0;
    fs->gen = ep->serve_gen;
}
