/*
 * The donor's side of a step: whom this rank serves (the fan-out plan's
 * recipients), the serve and a relay's announced serve, the followers'
 * serve (docs/RUNTIME.md, "Follow spares"), and the fence that holds the
 * optimizer step until the recipients and followers are done.
 */
#include "runtime_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t member_incarnation(const graft_membership_view_t *v, uint32_t group,
                                   uint32_t rank)
{
    for (size_t i = 0; v != NULL && i < v->n_members; i++)
        if (v->members[i].group == group && v->members[i].rank == rank)
            return v->members[i].incarnation;
    return 0;
}

void graft__rt_peers_free(graft_runtime_t *rt)
{
    graft_free(rt->serve.peers);
    rt->serve.peers = NULL;
    rt->serve.n_peers = 0;
}

/* The recipients this rank serves in q, as the round's fan-out plan has
 * them (runtime_fanout.c). Each pulls over UCX (unless this rank's regions
 * are all CUDA ones that go over NCCL) and, with NCCL pairs, takes its CUDA
 * regions from its first donor. */
graft_status_t graft__rt_peers_list(graft_runtime_t *rt, const graft__fanout_t *plan)
{
    bool nccl = graft__rt_nccl_on(rt);
    bool ucx = !nccl || graft__rt_has_host_regions(rt);
    graft_membership_view_t *v = NULL;
    graft__rt_peers_free(rt); /* the list of a quorum that served nobody */
    rt->serve.peers = graft__calloc(plan->n_serves + 1, sizeof(*rt->serve.peers));
    if (rt->serve.peers == NULL)
        return GRAFT_ENOMEM;
    if (graft_membership_view_get(rt->m, &v) != GRAFT_OK)
        v = NULL; /* incarnations unknown: learnt while the fence waits */
    for (size_t i = 0; i < plan->n_serves; i++) {
        uint32_t g = plan->serves[i].group;
        rt->serve.peers[rt->serve.n_peers++] = (graft__rt_peer_t){
            g, member_incarnation(v, g, rt->rank), ucx, nccl && plan->serves[i].primary, false};
    }
    graft_membership_view_free(v);
    return GRAFT_OK;
}

static void recipients_count(graft_runtime_t *rt)
{
    for (size_t i = 0; i < rt->serve.n_peers; i++)
        rt->serve.n_recipients += (uint32_t)rt->serve.peers[i].ucx + (uint32_t)rt->serve.peers[i].nccl;
    pthread_mutex_lock(&rt->mu);
    rt->metrics.serves++;
    pthread_mutex_unlock(&rt->mu);
}

/* How long a recipient whose member record this rank's view never showed
 * may take to appear before the fence stops waiting for it: the view can
 * lag the quorum by milliseconds, or the recipient left before it came. */
#define FENCE_UNSEEN_GRACE_NS 1000000000ull

/* How long the fence waits before it asks etcd whether its recipients have
 * voted (a normal pull ends well within), and how often it asks again. */
#define FENCE_VOTE_CHECK_NS 500000000ull

/* Completions the fence can no longer get: those of recipients whose rank
 * has left the job since the serve began (its member record is gone or is
 * a new incarnation, which pulls in a later quorum if at all). */
static uint32_t fence_units_gone(graft_runtime_t *rt, uint64_t waited_ns)
{
    graft_membership_view_t *v = NULL;
    uint32_t gone = 0;
    if (rt->serve.n_peers == 0 || graft_membership_view_get(rt->m, &v) != GRAFT_OK)
        return 0;
    for (size_t i = 0; i < rt->serve.n_peers; i++) {
        graft__rt_peer_t *p = &rt->serve.peers[i];
        uint64_t now = member_incarnation(v, p->group, rt->rank);
        if (p->incarnation == 0 && now != 0) {
            p->incarnation = now; /* arrived late in the view */
        } else if (p->incarnation != 0 ? now != p->incarnation
                                       : waited_ns >= FENCE_UNSEEN_GRACE_NS) {
            gone += (uint32_t)p->ucx + (uint32_t)p->nccl;
            p->finished = true;
        }
    }
    graft_membership_view_free(v);
    return gone;
}

/* Is every recipient past this round: voted in it or a later one (a rank
 * votes only once its pull has ended, whether it read from this rank or
 * not), or left the job? A recipient whose pull failed before it reached
 * this rank (e.g. it gave up while this rank was still learning the
 * quorum) sends no TransferDone, and would otherwise hold the fence until
 * fence_timeout_ms. */
static bool fence_peers_finished(graft_runtime_t *rt, const graft_quorum_t *q)
{
    for (size_t i = 0; i < rt->serve.n_peers; i++) {
        graft__rt_peer_t *p = &rt->serve.peers[i];
        bool voted = false;
        if (!p->finished &&
            graft_membership_voted_since(rt->m, p->group, rt->rank, q->round, &voted) == GRAFT_OK)
            p->finished = voted;
        if (!p->finished)
            return false;
    }
    return true;
}

/* Only the recipients the round's plan gives this group (rt->serve.peers, from
 * the quorum record) may pull this step: any other holder of the job
 * secret is refused (docs/SECURITY.md). */
static graft_status_t serve_only_recipients(graft_runtime_t *rt)
{
    uint32_t *groups = graft__calloc(rt->serve.n_peers + 1, sizeof(*groups));
    if (groups == NULL)
        return GRAFT_ENOMEM;
    for (size_t i = 0; i < rt->serve.n_peers; i++)
        groups[i] = rt->serve.peers[i].group;
    size_t n = rt->serve.n_peers;
    /* The followers, while their serve is open; serving nobody, a group
     * that cannot exist (group ids are below 2^20): an empty list would
     * lift the restriction. */
    if (rt->serve.follow)
        groups[n++] = GRAFT_TRANSFER_FOLLOWER_GROUP;
    else if (n == 0)
        groups[n++] = UINT32_MAX - 1;
    graft_status_t st = graft_transfer_serve_recipients(rt->ep, groups, n);
    graft_free(groups);
    return st;
}

/* Requests refused for who sent them (no proof of the job secret, or not a
 * recipient of the step) since the last look: one event in the job's
 * history per serve that saw any, for the operator. */
static void refusals_record(graft_runtime_t *rt, const graft_quorum_t *q)
{
    uint64_t n = graft_transfer_refused_count(rt->ep);
    if (n == rt->serve.refused_seen)
        return;
    char detail[128];
    snprintf(detail, sizeof(detail), "%" PRIu64 " transfer request(s) refused while serving: "
             "no proof of the job secret, or not a recipient of the step", n - rt->serve.refused_seen);
    rt->serve.refused_seen = n;
    graft__rt_job_event(rt, GRAFT_EVENT_ERROR, q->step, false, 0, detail);
}

/* Serve q's step to rt->serve.peers: over UCX (every region, or the host ones
 * when CUDA regions go over NCCL pairs) and over NCCL to the peers that
 * pair with this rank. rt->serve.n_recipients becomes the number of completions
 * the fence waits for. */
graft_status_t graft__rt_serve_start(graft_runtime_t *rt, const graft_quorum_t *q)
{
    if (rt->serve.follow && rt->serve.follow_step != q->step)
        graft__rt_follow_serve_close(rt);
    graft_status_t st = serve_only_recipients(rt);
    if (st == GRAFT_OK)
        st = graft_transfer_serve_begin(rt->ep, q->step);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "cannot serve step %" PRIu64 ": %s", q->step,
                    graft_status_string(st));
        return st;
    }
    rt->serve.serving = true;
    recipients_count(rt);
    if (graft__rt_nccl_on(rt))
        st = graft__rt_nccl_serve_start(rt, q);
    return st;
}

/* A relay announces its serve before its heal: its recipients queue at it
 * instead of being refused, and the heal thread begins the serve once the
 * state is in (heal_main). */
graft_status_t graft__rt_relay_start(graft_runtime_t *rt, const graft_quorum_t *q)
{
    graft__rt_follow_serve_close(rt); /* a relay heals first */
    graft_status_t st = serve_only_recipients(rt);
    if (st == GRAFT_OK)
        st = graft_transfer_serve_expect(rt->ep, q->step);
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "cannot announce the serve of step %" PRIu64 ": %s", q->step,
                    graft_status_string(st));
        return st;
    }
    rt->serve.serving = true;
    rt->serve.relay = true;
    recipients_count(rt);
    return GRAFT_OK;
}

/* The relay's heal ended without its serve (it failed): there is nothing
 * to fence; its recipients were refused and vote no. */
void graft__rt_relay_abandon(graft_runtime_t *rt, bool served)
{
    if (!rt->serve.relay || served)
        return;
    if (graft_transfer_serve_end(rt->ep) != GRAFT_OK)
        GRAFT_DEBUG(GRAFT_MOD_RUNTIME, "relay: the announced serve was withdrawn already");
    rt->serve.serving = false;
    rt->serve.relay = false;
    graft__rt_peers_free(rt);
}

void graft__rt_follow_serve_open(graft_runtime_t *rt)
{
    uint64_t step = graft_step(rt);
    if (rt->serve.serving || rt->serve.follow || !rt->state_valid || rt->need_state ||
        !graft_transfer_followers_wanted(rt->ep, step))
        return;
    rt->serve.follow = true;
    graft__rt_peers_free(rt); /* no recipients before the quorum says so */
    graft_status_t st = serve_only_recipients(rt);
    if (st == GRAFT_OK)
        st = graft_transfer_serve_begin(rt->ep, step);
    if (st != GRAFT_OK) {
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": cannot serve step %"
                   PRIu64 " to followers: %s", rt->group, rt->rank, step,
                   graft_status_string(st));
        rt->serve.follow = false;
        return;
    }
    rt->serve.follow_step = step;
    GRAFT_DEBUG(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": serving step %" PRIu64
                " to followers", rt->group, rt->rank, step);
    pthread_mutex_lock(&rt->mu);
    rt->metrics.follow_serves++;
    pthread_mutex_unlock(&rt->mu);
}

void graft__rt_follow_serve_close(graft_runtime_t *rt)
{
    if (!rt->serve.follow)
        return;
    rt->serve.follow = false;
    if (!rt->serve.serving && graft_transfer_serve_end(rt->ep) != GRAFT_OK)
        GRAFT_DEBUG(GRAFT_MOD_RUNTIME, "followers' serve: ended already");
}

/* The followers of this serve, before the optimizer step may change what
 * they read: bounded by stall_timeout_ms, since a follower is no member
 * and must not hold the job (one that is cut off fails its chunk hashes
 * and asks again). */
static void followers_fence(graft_runtime_t *rt)
{
    uint64_t t0 = graft__now_ns();
    /* Info, not a warning: with a state whose pull is longer than a step
     * it happens every step, and the follower simply takes a later one. */
    if (graft_transfer_followers_wait(rt->ep, (uint32_t)rt->cfg->stall_timeout_ms) != GRAFT_OK)
        GRAFT_INFO(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": a follower of step %"
                   PRIu64 " was not done after %" PRIu64 " ms; not waiting for it", rt->group,
                   rt->rank, rt->serve.follow_step, rt->cfg->stall_timeout_ms);
    pthread_mutex_lock(&rt->mu);
    rt->metrics.follow_wait_ns += graft__now_ns() - t0;
    pthread_mutex_unlock(&rt->mu);
}

void graft__rt_serve_stop(graft_runtime_t *rt, const graft_quorum_t *q)
{
    if (rt->serve.follow && !rt->serve.serving) {
        followers_fence(rt);
        graft__rt_follow_serve_close(rt);
        return;
    }
    if (!rt->serve.serving)
        return;
    /* Wait in slices: between them, a recipient that has left the job (a
     * process killed before it reached this donor cannot be seen by the
     * transport) stops holding the fence, and so, once every recipient has
     * voted or left, does the whole fence (fence_peers_finished). A count
     * can then include one that was done before it left, and the fence
     * opens early: a recipient still reading is then refused or fails its
     * chunk hashes and heals again, so nothing unverified is installed. */
    uint64_t start = graft__now_ns();
    uint64_t deadline = start + rt->cfg->fence_timeout_ms * 1000000ull;
    uint64_t vote_check = start + FENCE_VOTE_CHECK_NS;
    graft_status_t st;
    for (;;) {
        uint64_t now = graft__now_ns();
        uint32_t slice =
            now >= deadline ? 0 : (uint32_t)GRAFT_MIN(100, (deadline - now) / 1000000ull);
        st = graft_transfer_fence_wait(rt->ep, q->step, rt->serve.n_recipients, slice);
        if (st != GRAFT_ETIMEOUT || graft__now_ns() >= deadline)
            break;
        uint32_t gone = fence_units_gone(rt, graft__now_ns() - start);
        if (gone > 0 && graft_transfer_fence_count(rt->ep, q->step) + gone >= rt->serve.n_recipients) {
            GRAFT_WARN(GRAFT_MOD_RUNTIME,
                       "group %" PRIu32 " rank %" PRIu32 ": fence of step %" PRIu64
                       ": %" PRIu32 " of %" PRIu32 " recipients done, the rest left the job; "
                       "not waiting for them", rt->group, rt->rank, q->step,
                       graft_transfer_fence_count(rt->ep, q->step), rt->serve.n_recipients);
            st = GRAFT_OK;
            break;
        }
        if (graft__now_ns() >= vote_check) {
            vote_check = graft__now_ns() + FENCE_VOTE_CHECK_NS;
            if (fence_peers_finished(rt, q)) {
                GRAFT_WARN(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": fence of step %"
                           PRIu64 ": %" PRIu32 " of %" PRIu32 " recipients done, every one "
                           "has voted or left; not waiting for the rest", rt->group, rt->rank,
                           q->step, graft_transfer_fence_count(rt->ep, q->step),
                           rt->serve.n_recipients);
                st = GRAFT_OK;
                break;
            }
        }
    }
    if (st != GRAFT_OK) {
        /* A recipient that died or stalled must not hold the job: it
         * verifies every chunk, so bytes changed under it are caught. */
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": fence of step %" PRIu64
                   ": %" PRIu32 " of %" PRIu32 " recipients done after %" PRIu64 " ms",
                   rt->group, rt->rank, q->step, graft_transfer_fence_count(rt->ep, q->step),
                   rt->serve.n_recipients, rt->cfg->fence_timeout_ms);
        pthread_mutex_lock(&rt->mu);
        rt->metrics.fence_timeouts++;
        pthread_mutex_unlock(&rt->mu);
    }
    graft__rt_nccl_serve_join(rt); /* they read the regions until they end */
    if (rt->serve.follow) {
        followers_fence(rt);
        rt->serve.follow = false;
    }
    if (graft_transfer_serve_end(rt->ep) != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "serve_end: not serving");
    refusals_record(rt, q);
    rt->serve.serving = false;
    graft__rt_peers_free(rt);
}
