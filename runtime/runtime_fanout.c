/*
 * Fan-out: who pulls from whom in a quorum round, so that no donor has
 * every recipient of a cold start or of several recoveries at once.
 *
 * The sources hold the round's state: the lowest member at a cold start
 * (step 0, where every other member takes its initial state), otherwise
 * the up-to-date groups. The sinks need it: every other member at a cold
 * start, otherwise the quorum's recoveries in their order. Every rank of
 * the job computes the same plan from the same quorum record.
 *
 * With S sources and a fan-out of K (transfer_max_recipients, the
 * recipients a donor serves at once):
 *  - sink i < S*K pulls from the first min(D, S) groups of its donor list
 *    (D = GRAFT__FANOUT_DONORS); the quorum rotates each recipient's list,
 *    so their first donors differ;
 *  - sink S*K + j*K + c (c < K) pulls from sink j alone, which serves the
 *    step once its own pull has ended (a relay): a K-ary broadcast tree of
 *    depth about log_K(G / S) under the sources.
 * A donor queues recipients beyond K (transfer/), so a source listed by
 * up to K*D first-level sinks serves K at a time; a queued sink takes its
 * chunks from its other donors meanwhile.
 *
 * With NCCL pairs there are no relays (a relay would have to serve pairs
 * too): every sink pulls from the sources.
 */
#include "runtime_internal.h"

#include <string.h>

/* Is g one of the groups the quorum assigns as recoveries? */
static bool is_sink(const graft_quorum_t *q, uint32_t g)
{
    for (size_t i = 0; i < q->n_recoveries; i++)
        if (q->recoveries[i].recipient == g)
            return true;
    return false;
}

/* The round's sinks, in order: sink i's group and donor list. */
typedef struct {
    const graft_quorum_t *q;
    bool cold;
    size_t n_sinks, n_sources;
} round_t;

static uint32_t sink_group(const round_t *r, size_t i)
{
    return r->cold ? r->q->members[i + 1] : r->q->recoveries[i].recipient;
}

/* Sink i's donors (at most GRAFT__FANOUT_DONORS) into out; their number. */
static size_t sink_donors(const round_t *r, size_t i, uint32_t k, bool relays, uint32_t *out)
{
    uint64_t first_level = (uint64_t)r->n_sources * k;
    if (relays && i >= first_level) {
        out[0] = sink_group(r, (size_t)((i - first_level) / k));
        return 1;
    }
    if (r->cold) {
        out[0] = r->q->members[0];
        return 1;
    }
    const graft_recovery_t *rec = &r->q->recoveries[i];
    size_t n = GRAFT_MIN(rec->n_donors, (size_t)GRAFT__FANOUT_DONORS);
    memcpy(out, rec->donors, n * sizeof(*out));
    return n;
}

graft_status_t graft__fanout_plan(const graft_quorum_t *q, uint32_t group, uint32_t k,
                                  bool relays, graft__fanout_t *plan)
{
    round_t r = {.q = q, .cold = q->step == 0 && q->n_members > 1};
    memset(plan, 0, sizeof(*plan));
    if (k == 0)
        return GRAFT_EINVAL;
    r.n_sinks = r.cold ? q->n_members - 1 : q->n_recoveries;
    r.n_sources = r.cold ? 1 : q->n_members - q->n_recoveries;
    if (r.n_sinks == 0 || r.n_sources == 0)
        return GRAFT_OK;
    uint64_t first_level = (uint64_t)r.n_sources * k;
    plan->serves = graft__calloc(r.n_sinks, sizeof(*plan->serves));
    if (plan->serves == NULL)
        return GRAFT_ENOMEM;
    bool source = r.cold ? q->members[0] == group : !is_sink(q, group);
    for (size_t i = 0; i < r.n_sinks; i++) {
        uint32_t donors[GRAFT__FANOUT_DONORS];
        size_t n = sink_donors(&r, i, k, relays, donors);
        if (sink_group(&r, i) == group) {
            memcpy(plan->donors, donors, n * sizeof(*donors));
            plan->n_donors = n;
            /* A relay's children: the next level's sinks under it. */
            for (uint64_t c = 0; relays && c < k; c++) {
                uint64_t child = first_level + (uint64_t)i * k + c;
                if (child >= r.n_sinks)
                    break;
                plan->serves[plan->n_serves++] =
                    (graft__fanout_peer_t){sink_group(&r, (size_t)child), true};
            }
            plan->relay = plan->n_serves > 0;
            continue;
        }
        for (size_t d = 0; source && d < n; d++)
            if (donors[d] == group)
                plan->serves[plan->n_serves++] =
                    (graft__fanout_peer_t){sink_group(&r, i), d == 0};
    }
    return GRAFT_OK;
}

void graft__fanout_free(graft__fanout_t *plan)
{
    graft_free(plan->serves);
    memset(plan, 0, sizeof(*plan));
}
