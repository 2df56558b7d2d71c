/*
 * The heal: the recipient's side of a step, a pull from the quorum's donors
 * (or from a relay) on a background thread, with CUDA regions over an NCCL
 * pair. graft_heal_wait() (runtime_step_heal.c) joins it and reports it.
 */
#include "runtime_internal.h"
#include "runtime_nccl_pair.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The address of the NCCL donor, for the report ("" when not in the view:
 * the pair then fails at its id exchange). */
static const char *nccl_donor_address(const graft_runtime_t *rt)
{
    for (size_t i = 0; i < rt->heal.n_donors; i++)
        if (rt->heal.donor_groups[i] == rt->heal.nccl_donor)
            return rt->heal.donors[i];
    return "";
}

/* The recipient's side of the NCCL pair with rt->heal.nccl_donor (blocks). */
static graft_status_t nccl_pull(graft_runtime_t *rt, const char *donor_address,
                                graft_transfer_report_t *rep)
{
    graft__rt_pair_t p;
    graft__rt_pair_init(&p, rt, rt->q->round, rt->q->step, rt->heal.nccl_donor, rt->group);
    graft_transfer_pull_options_t po = {
        .donors = &donor_address,
        .n_donors = 1,
        .step = rt->q->step,
        .timeout_ms = graft__rt_pair_timeout_ms(rt),
        .backend = GRAFT_TRANSFER_BACKEND_NCCL,
        .nccl = &p.opts,
    };
    memset(rep, 0, sizeof(*rep));
    return graft_transfer_pull(rt->ep, &po, rep);
}

static void *heal_main(void *arg)
{
    graft_runtime_t *rt = arg;
    bool nccl = graft__rt_nccl_on(rt);
    graft_transfer_pull_options_t po = {
        .donors = (const char *const *)rt->heal.donors,
        .n_donors = rt->heal.n_donors,
        .step = rt->q->step,
        .stall_timeout_ms = (uint32_t)rt->cfg->stall_timeout_ms,
        .connect_timeout_ms = (uint32_t)rt->cfg->stall_timeout_ms,
        .timeout_ms = (uint32_t)rt->cfg->transfer_timeout_ms,
        .host_only = nccl,
    };
    memset(&rt->heal.report, 0, sizeof(rt->heal.report));
    rt->heal.status = GRAFT_OK;
    rt->heal.nccl_status = GRAFT_OK;
    if (!nccl || graft__rt_has_host_regions(rt))
        rt->heal.status = graft_transfer_pull(rt->ep, &po, &rt->heal.report);
    if (nccl) {
        /* Also after a failed UCX pull: the NCCL donor holds its step until
         * this pair is over or times out. */
        graft_transfer_report_t nrep;
        graft_transfer_report_t *rep = &rt->heal.report;
        rt->heal.nccl_status = nccl_pull(rt, nccl_donor_address(rt), &nrep);
        rep->bytes += nrep.bytes;
        rep->chunks += nrep.chunks;
        rep->elapsed_ns += nrep.elapsed_ns;
        if (rt->heal.status == GRAFT_OK) {
            rt->heal.status = rt->heal.nccl_status;
            if (nrep.drift.region[0] != '\0')
                rep->drift = nrep.drift;
        }
    }
    if (rt->heal.relay) {
        /* A relay serves its recipients as soon as its own state is in
         * (they wait queued); a failed heal withdraws the serve, so they
         * are refused instead of waiting. */
        graft_status_t st = rt->heal.status == GRAFT_OK
                                 ? graft_transfer_serve_begin(rt->ep, rt->q->step)
                                 : GRAFT_ECANCELED;
        rt->heal.relay_served = st == GRAFT_OK;
        if (!rt->heal.relay_served) {
            if (rt->heal.status == GRAFT_OK)
                GRAFT_ERROR(GRAFT_MOD_RUNTIME, "relay: cannot serve step %" PRIu64 ": %s",
                            rt->q->step, graft_status_string(st));
            if (graft_transfer_serve_end(rt->ep) != GRAFT_OK)
                GRAFT_DEBUG(GRAFT_MOD_RUNTIME, "relay: no serve to withdraw");
        }
    }
    return NULL;
}

static void free_donors(graft_runtime_t *rt)
{
    for (size_t i = 0; i < rt->heal.n_donors; i++)
        graft_free(rt->heal.donors[i]);
    graft_free(rt->heal.donors);
    rt->heal.donors = NULL;
    rt->heal.n_donors = 0;
}

/* The transfer addresses of rank `rank` of the donor groups that view v
 * has, into rt->heal.donors (empty, allocated for n_donors). */
static graft_status_t donors_in_view(graft_runtime_t *rt, const graft_membership_view_t *v,
                                     const uint32_t *donors, size_t n_donors)
{
    for (size_t d = 0; d < n_donors && rt->heal.n_donors < GRAFT_TRANSFER_MAX_DONORS; d++) {
        for (size_t i = 0; i < v->n_members; i++) {
            const graft_member_t *mb = &v->members[i];
            if (mb->group != donors[d] || mb->rank != rt->rank || mb->transfer_address == NULL ||
                mb->transfer_address[0] == '\0')
                continue;
            rt->heal.donors[rt->heal.n_donors] = graft__strdup(mb->transfer_address);
            if (rt->heal.donors[rt->heal.n_donors] == NULL)
                return GRAFT_ENOMEM;
            rt->heal.donor_groups[rt->heal.n_donors] = donors[d];
            rt->heal.n_donors++;
            break;
        }
    }
    return GRAFT_OK;
}

/* Start pulling this rank's regions from rank `rank` of the donor groups;
 * CUDA regions over NCCL come from the first of them (runtime_nccl.c). */
graft_status_t graft__rt_heal_start(graft_runtime_t *rt, const uint32_t *donors, size_t n_donors,
                                    bool relay)
{
    graft_membership_view_t *v = NULL;
    graft_status_t st = GRAFT_OK;
    uint64_t deadline = graft__now_ns() + rt->cfg->join_timeout_ms * 1000000ull;
    rt->heal.nccl_donor = n_donors > 0 ? donors[0] : UINT32_MAX;
    rt->heal.relay = relay;
    rt->heal.relay_served = false;
    rt->heal.donors = graft__calloc(GRAFT_MAX(n_donors, 1), sizeof(char *));
    if (rt->heal.donors == NULL)
        return GRAFT_ENOMEM;
    /* The quorum record and the member records reach this rank by
     * different paths, so the donors' records can still be on their way:
     * wait for the view (up to the join timeout) until one donor is in it. */
    for (;;) {
        st = graft_membership_view_get(rt->m, &v);
        if (st == GRAFT_OK)
            st = donors_in_view(rt, v, donors, n_donors);
        uint64_t now = graft__now_ns();
        if (st != GRAFT_OK || rt->heal.n_donors > 0 || now >= deadline)
            break;
        uint64_t version = v->version;
        graft_membership_view_free(v);
        v = NULL;
        if (graft_membership_view_wait(rt->m, version,
                                       (uint32_t)((deadline - now) / 1000000ull) + 1,
                                       NULL) != GRAFT_OK)
            continue; /* timed out: one last look at the view */
    }
    if (st != GRAFT_OK)
        goto out;
    if (rt->heal.n_donors == 0) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32
                    ": no donor of step %" PRIu64 " is in the view", rt->group, rt->rank,
                    rt->q->step);
        st = GRAFT_ENODONOR;
        goto out;
    }
    rt->state_valid = false; /* the pull overwrites the regions */
    graft__rt_skip_save(rt);
    if (pthread_create(&rt->heal.thread, NULL, heal_main, rt) != 0) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "pthread_create: %s", strerror(errno));
        st = GRAFT_ESYS;
        goto out;
    }
    rt->heal.running = true;
out:
    if (st != GRAFT_OK)
        free_donors(rt);
    graft_membership_view_free(v);
    return st;
}

/* The donors a pull dropped, for the recovery's detail: "; donor group G
 * lost (why) after C chunks, N reassigned" each. A pull that completes
 * after losing a donor is a success that would otherwise look like any
 * other; operators (and the simulator) need to see that a donor failed
 * under it and that its chunks moved to the others. */
static void lost_donors(const graft_runtime_t *rt, char *buf, size_t len)
{
    const graft_transfer_report_t *rep = &rt->heal.report;
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < rep->n_donors && i < rt->heal.n_donors && used < len; i++) {
        const graft_transfer_donor_report_t *d = &rep->donors[i];
        if (d->status == GRAFT_OK)
            continue;
        int n = snprintf(buf + used, len - used, "; donor group %" PRIu32 " lost (%s) after %"
                         PRIu64 " chunks, %" PRIu64 " reassigned", rt->heal.donor_groups[i],
                         graft_status_string(d->status), d->chunks, d->reassigned);
        if (n < 0)
            break;
        used += (size_t)n;
    }
}

/* Whether every donor of a pull refused this rank's region table: such a
 * heal can never succeed, and says so (GRAFT_ELAYOUT), not "no donor". */
static bool every_donor_refused_layout(const graft_transfer_report_t *rep)
{
    if (rep->n_donors == 0)
        return false;
    for (size_t i = 0; i < rep->n_donors; i++)
        if (rep->donors[i].status != GRAFT_ELAYOUT)
            return false;
    return true;
}

graft_status_t graft__rt_heal_join(graft_runtime_t *rt, char *lost, size_t lost_len)
{
    pthread_join(rt->heal.thread, NULL);
    rt->heal.running = false;
    graft_status_t st = rt->heal.status;
    lost_donors(rt, lost, lost_len);
    if (rt->heal.nccl_status != GRAFT_OK) {
        size_t used = strlen(lost);
        snprintf(lost + used, lost_len - used, "; NCCL pair with donor group %" PRIu32 ": %s",
                 rt->heal.nccl_donor, graft_status_string(rt->heal.nccl_status));
    }
    free_donors(rt);
    if (st == GRAFT_ENODONOR && every_donor_refused_layout(&rt->heal.report))
        st = GRAFT_ELAYOUT;
    return st;
}
