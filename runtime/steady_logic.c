/*
 * The steady path's decisions (steady_logic.h): pure, no I/O.
 */
#include "steady_logic.h"

#include <stddef.h>

bool graft__steady_asks_own_ranks(const graft__epoch_facts_t *f, graft__epoch_check_t check)
{
    return f->known && f->lease_fresh && f->round_current && !f->epoch_intact &&
           check == GRAFT__CHECK_VOTE_WAIT;
}

graft__epoch_state_t graft__steady_epoch_state(const graft__epoch_facts_t *f,
                                               graft__epoch_check_t check, const char **why)
{
    if (!f->known) {
        *why = "membership state unavailable";
        return GRAFT__EPOCH_NO_LEASE;
    }
    if (!f->lease_fresh) {
        *why = "the lease may have expired";
        return GRAFT__EPOCH_NO_LEASE;
    }
    if (check == GRAFT__CHECK_READY) {
        if (f->epoch_intact)
            return GRAFT__EPOCH_HOLDS;
        *why = "the members changed";
        return GRAFT__EPOCH_CHANGED;
    }
    if (!f->round_current) {
        *why = "a later round formed";
        return GRAFT__EPOCH_CHANGED;
    }
    if (graft__steady_asks_own_ranks(f, check) && !f->own_ranks_same) {
        *why = "a rank of this group left or was replaced";
        return GRAFT__EPOCH_CHANGED;
    }
    return GRAFT__EPOCH_HOLDS;
}

bool graft__steady_drains(const graft__epoch_facts_t *f, graft__epoch_check_t check)
{
    return check != GRAFT__CHECK_READY || !f->newcomer;
}

bool graft__steady_newcomer(const graft__steady_proc_t *was, size_t n_was,
                            const graft__steady_proc_t *now, size_t n_now)
{
    for (size_t i = 0; i < n_now; i++) {
        bool known = false;
        for (size_t k = 0; k < n_was && !known; k++)
            known = was[k].group == now[i].group && was[k].rank == now[i].rank &&
                    was[k].incarnation == now[i].incarnation;
        if (!known)
            return true;
    }
    return false;
}

bool graft__steady_may_ready(bool ready, uint64_t committed, uint64_t step, bool state_valid,
                             bool need_state, const char **why)
{
    if (ready && committed == step && state_valid && !need_state)
        return true;
    *why = "this rank did not commit the last step";
    return false;
}

uint32_t graft__steady_barrier_rounds(uint32_t G)
{
    uint32_t k = 0;
    for (uint64_t dist = 1; dist < G; dist <<= 1)
        k++;
    return k;
}

bool graft__steady_barrier_partners(uint32_t G, uint32_t i, uint32_t k, uint32_t *to_p,
                                    uint32_t *from_p)
{
    if (G == 0 || i >= G || k >= graft__steady_barrier_rounds(G))
        return false;
    uint32_t dist = (uint32_t)(1ull << k) % G;
    *to_p = (i + dist) % G;
    *from_p = (i + G - dist) % G;
    return true;
}
