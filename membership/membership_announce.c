/*
 * Announcing ready for a quorum round: the ready records, the transaction
 * that writes them (a rank's own, or a group leader's for its delegating
 * ranks too), and the steady-state fast path that forms the round in that
 * same transaction. Waiting and the compare-and-swap are in
 * membership_quorum.c.
 */
#include "membership_internal.h"

#include <inttypes.h>
#include <string.h>

/* The ready records of a read; garbage is reported, counted and skipped. */
static graft_status_t decode_ready(graft_membership_t *m, const graft_etcd_range_result_t *r,
                                   graft__ready_t **ready_p, size_t *n_p)
{
    graft__ready_t *out = graft__malloc((r->n_kvs + 1) * sizeof(*out));
    size_t n = 0;
    if (out == NULL)
        return GRAFT_ENOMEM;
    for (size_t i = 0; i < r->n_kvs; i++) {
        const graft_etcd_kv_t *kv = &r->kvs[i];
        graft__mkey_t k = graft__mship_key_parse(m->prefix, kv->key);
        graft_status_t st = k.kind == GRAFT__MKEY_READY
                                ? graft__mship_ready_decode(kv->value, kv->value_len, &out[n])
                                : GRAFT_EMALFORMED;
        if (st == GRAFT_ENOMEM) {
            graft_free(out);
            return st;
        }
        if (st == GRAFT_OK &&
            (out[n].group != k.group || out[n].rank != k.rank || out[n].round != k.number))
            st = GRAFT_EMALFORMED;
        if (st != GRAFT_OK) {
            GRAFT_WARN(GRAFT_MOD_MEMBERSHIP, "skipping ready record %s (mod_revision %" PRId64
                       ", %zu bytes): %s", kv->key, kv->mod_revision, kv->value_len,
                       graft_status_string(st));
            pthread_mutex_lock(&m->mu);
            m->view.malformed++;
            pthread_mutex_unlock(&m->mu);
            continue;
        }
        out[n].mod_revision = kv->mod_revision;
        n++;
    }
    *ready_p = out;
    *n_p = n;
    return GRAFT_OK;
}

bool graft__mship_has_group(const graft_quorum_t *q, uint32_t g)
{
    for (size_t i = 0; i < q->n_members; i++)
        if (q->members[i] == g)
            return true;
    return false;
}

/* Copy the view's member records into the decision's input. Called with
 * m->mu held. */
graft_status_t graft__mship_snapshot_members(graft_membership_t *m, graft__qmember_t **mem_p)
{
    const graft__mview_t *v = &m->view;
    graft__qmember_t *mem = graft__malloc((v->n_members + 1) * sizeof(*mem));
    if (mem == NULL)
        return GRAFT_ENOMEM;
    for (size_t i = 0; i < v->n_members; i++)
        mem[i] = (graft__qmember_t){v->members[i].group, v->members[i].rank,
                                    v->members[i].incarnation};
    *mem_p = mem;
    return GRAFT_OK;
}

/*
 * The steady-state fast path (docs/KEYS.md): when the live groups are
 * exactly the previous round's members, with the same processes, and this
 * rank is one step on, the round it announces for will be the previous one
 * one step on, provided every other rank announces the same. The announcing
 * transaction then carries that round as its success branch, guarded by one
 * compare per other rank (its ready record for this round is byte for byte
 * the expected one: same incarnation, one step on) and one on the quorum
 * key (still the previous round). Only the transaction that completes the
 * set can pass, so the round is formed without a second write. Any
 * difference takes the compare-and-swap path as before: a rank late, dead
 * or re-joined, or a group whose vote failed, fails a compare; a group that
 * left or joined makes the view differ, so no fast path is tried.
 */
typedef struct fast_path {
    graft_quorum_t *q; /* the round to form, or NULL: not eligible */
    uint8_t *qbuf;
    size_t qlen;
    char *qkey;
    graft_etcd_compare_t *cmps;
    size_t n_cmps;
    char **keys; /* the compares' keys and values, owned */
    uint8_t **values;
} fast_path_t;

/* Every announcer of a steady round sends one compare per other member
 * rank, so a round carries (G·R)² compares in all, and etcd's JSON gateway
 * decodes each of them: at 32 ranks that cost etcd more CPU than the
 * formation transaction it saves (docs/PERFORMANCE.md, runtime section).
 * Past this many member ranks rounds take the compare-and-swap path. (etcd
 * itself refuses more than --max-txn-ops = 128 compares.) */
#define FAST_MAX_CMPS 16u

static void fast_path_clear(fast_path_t *f)
{
    for (size_t i = 0; f->keys != NULL && i < f->n_cmps; i++) {
        graft_free(f->keys[i]);
        graft_free(f->values[i]);
    }
    graft_free(f->keys);
    graft_free(f->values);
    graft_free(f->cmps);
    graft_free(f->qkey);
    graft_free(f->qbuf);
    graft_membership_quorum_free(f->q);
    memset(f, 0, sizeof(*f));
}

/* Are the live groups of (sorted) mem exactly the members of prev? */
bool graft__mship_same_live_groups(const graft__qmember_t *mem, size_t n, uint32_t R,
                             const graft_quorum_t *prev)
{
    size_t gi = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && mem[j].group == mem[i].group)
            j++;
        if (j - i == R) {
            if (gi >= prev->n_members || prev->members[gi] != mem[i].group)
                return false;
            gi++;
        }
        i = j;
    }
    return gi == prev->n_members;
}


/* The delegate for @p rank of this group, or NULL. */
static const graft_membership_delegate_t *delegate_of(const graft_membership_delegate_t *dl,
                                                      size_t n_dl, bool own_group, uint32_t rank)
{
    for (size_t j = 0; own_group && j < n_dl; j++)
        if (dl[j].rank == rank)
            return &dl[j];
    return NULL;
}

/* The view says the fast path may apply: the latest round is the one
 * before this, one step behind, with this group, few enough member ranks,
 * and the live members (ranks < R, sorted) are exactly its members with the
 * same processes. Then *prev_p is a copy of that round (its mod_revision in
 * *prev_mod_p) and mem_p/n_p the live members; else *prev_p is NULL. Only
 * allocation failures are errors. */
static graft_status_t fast_path_view(graft_membership_t *m, uint64_t round, uint64_t committed,
                                     graft_quorum_t **prev_p, int64_t *prev_mod_p,
                                     graft__qmember_t **mem_p, size_t *n_p)
{
    graft_status_t st = GRAFT_OK;
    graft_quorum_t *prev = NULL;
    graft__qmember_t *mem = NULL;
    size_t n = 0, k = 0;
    uint32_t R = m->cfg.ranks_per_group;
    *prev_p = NULL;
    pthread_mutex_lock(&m->mu);
    const graft_quorum_t *cur = m->view.quorum;
    bool maybe = !m->fast_path_off && cur != NULL && m->view.quorum_mod > 0 &&
                 cur->round + 1 == round && cur->step + 1 == committed &&
                 graft__mship_has_group(cur, m->cfg.group) &&
                 cur->n_members * (size_t)R <= FAST_MAX_CMPS;
    if (maybe) {
        *prev_mod_p = m->view.quorum_mod;
        n = m->view.n_members;
        st = graft__mship_quorum_copy(cur, &prev);
        if (st == GRAFT_OK)
            st = graft__mship_snapshot_members(m, &mem);
    }
    pthread_mutex_unlock(&m->mu);
    if (!maybe || st != GRAFT_OK)
        goto out;
    /* As in the decision: ranks outside 0..R-1 make no group live. */
    for (size_t i = 0; i < n; i++)
        if (mem[i].rank < R)
            mem[k++] = mem[i];
    n = k;
    if (!graft__mship_same_live_groups(mem, n, R, prev) ||
        graft__quorum_members_hash(mem, n, prev->members, prev->n_members) != prev->members_hash)
        goto out;
    *prev_p = prev;
    *mem_p = mem;
    *n_p = n;
    return GRAFT_OK;
out:
    graft_membership_quorum_free(prev);
    graft_free(mem);
    return st;
}

/* What graft__quorum_decide() gives for the round after prev when every
 * member is one step on: same members and processes, so the same id;
 * everyone at the max, so no recoveries. Encoded into f->qbuf. */
static graft_status_t fast_path_round(graft_membership_t *m, const graft_quorum_t *prev,
                                      uint64_t round, uint64_t committed, fast_path_t *f)
{
    graft_quorum_t *q = graft__calloc(1, sizeof(*q));
    if (q == NULL || (q->members = graft__malloc(prev->n_members * sizeof(uint32_t))) == NULL) {
        graft_membership_quorum_free(q);
        return GRAFT_ENOMEM;
    }
    memcpy(q->members, prev->members, prev->n_members * sizeof(uint32_t));
    q->n_members = prev->n_members;
    q->id = prev->id;
    q->round = round;
    q->step = committed;
    q->max_committed_step = committed;
    q->min_groups = m->cfg.min_groups;
    q->members_hash = prev->members_hash;
    q->formed_unix_ms = graft__wall_ns() / 1000000u;
    graft_status_t st = graft__mship_quorum_encode(q, &f->qbuf, &f->qlen);
    if (st != GRAFT_OK) {
        graft_membership_quorum_free(q);
        return st;
    }
    f->q = q;
    return GRAFT_OK;
}

/* Fill *f when the fast path applies to this announcement; f->q stays NULL
 * when it does not. Only allocation failures are errors. */
static graft_status_t fast_path_prepare(graft_membership_t *m, uint64_t round, uint64_t committed,
                                        uint64_t inc, const graft_membership_delegate_t *dl,
                                        size_t n_dl, fast_path_t *f)
{
    graft_quorum_t *prev = NULL;
    graft__qmember_t *mem = NULL;
    size_t n = 0;
    int64_t prev_mod = 0;
    uint32_t R = m->cfg.ranks_per_group;
    bool self_seen = false;
    size_t dl_seen = 0;
    memset(f, 0, sizeof(*f));
    for (size_t j = 0; j < n_dl; j++)
        if (dl[j].step != committed)
            return GRAFT_OK; /* not everyone one step on */
    graft_status_t st = fast_path_view(m, round, committed, &prev, &prev_mod, &mem, &n);
    if (st != GRAFT_OK || prev == NULL)
        return st;
    f->cmps = graft__calloc(prev->n_members * (size_t)R, sizeof(*f->cmps));
    f->keys = graft__calloc(prev->n_members * (size_t)R, sizeof(*f->keys));
    f->values = graft__calloc(prev->n_members * (size_t)R, sizeof(*f->values));
    f->qkey = graft__key_quorum(m->prefix);
    if (f->cmps == NULL || f->keys == NULL || f->values == NULL || f->qkey == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    f->cmps[f->n_cmps++] = (graft_etcd_compare_t){f->qkey, GRAFT_ETCD_CMP_MOD,
                                                  GRAFT_ETCD_CMP_EQUAL, prev_mod, NULL, 0};
    for (size_t i = 0; i < n; i++) {
        if (!graft__mship_has_group(prev, mem[i].group))
            continue;
        if (mem[i].group == m->cfg.group && mem[i].rank == m->cfg.rank) {
            /* The view must know this very process, or the hash was of
             * another incarnation's record. */
            self_seen = mem[i].incarnation == inc;
            continue;
        }
        const graft_membership_delegate_t *d = delegate_of(dl, n_dl, mem[i].group == m->cfg.group,
                                                           mem[i].rank);
        if (d != NULL) {
            /* Written by this very transaction: no compare, but the view
             * must know the process it is written for, as above. */
            dl_seen += d->incarnation == mem[i].incarnation;
            continue;
        }
        graft__ready_t r = {mem[i].group, mem[i].rank, mem[i].incarnation, round, committed, 0, 0};
        size_t len = 0;
        size_t c = f->n_cmps;
        f->keys[c] = graft__key_ready(m->prefix, round, mem[i].group, mem[i].rank);
        if (f->keys[c] == NULL) {
            st = GRAFT_ENOMEM;
            goto out;
        }
        f->n_cmps++; /* counted now so that fast_path_clear frees the key */
        st = graft__mship_ready_encode(&r, &f->values[c], &len);
        if (st != GRAFT_OK)
            goto out;
        f->cmps[c] = (graft_etcd_compare_t){f->keys[c], GRAFT_ETCD_CMP_VALUE,
                                            GRAFT_ETCD_CMP_EQUAL, 0, f->values[c], len};
    }
    if (self_seen && dl_seen == n_dl)
        st = fast_path_round(m, prev, round, committed, f);
out:
    graft_membership_quorum_free(prev);
    graft_free(mem);
    if (f->q == NULL) {
        /* Not eligible (or out of memory): nothing of it is kept. */
        fast_path_clear(f);
    }
    return st;
}

/* Put a round this rank formed into its view at once: its next
 * announcement can come before the watch delivers the record, and must
 * count from this round (and may take the fast path again). */
void graft__mship_view_adopt(graft_membership_t *m, const graft_quorum_t *q, int64_t revision)
{
    graft_quorum_t *copy = NULL;
    if (graft__mship_quorum_copy(q, &copy) != GRAFT_OK)
        return; /* the watch brings it a little later */
    pthread_mutex_lock(&m->mu);
    if (revision > m->view.quorum_mod) {
        graft_membership_quorum_free(m->view.quorum);
        m->view.quorum = copy;
        copy = NULL;
        m->view.quorum_mod = revision;
        m->view.quorum_bad_mod = 0;
        m->view.quorum_followed = true;
        m->view.version++;
        pthread_cond_broadcast(&m->cv);
    }
    pthread_mutex_unlock(&m->mu);
    graft_membership_quorum_free(copy);
}

/* Member records in the view that can make a group live (rank < R). Called
 * with m->mu held. */
static size_t live_ranks(const graft_membership_t *m)
{
    size_t n = 0;
    for (size_t i = 0; i < m->view.n_members; i++)
        n += m->view.members[i].rank < m->cfg.ranks_per_group;
    return n;
}

/* One ready record an announcement writes: its key, bytes and lease, and
 * the key of the same rank's record of its previous round, which goes. */
typedef struct ready_write {
    char *key, *old;
    uint8_t *buf;
    size_t len;
    int64_t lease;
} ready_write_t;

static void writes_clear(ready_write_t *w, size_t n)
{
    for (size_t i = 0; w != NULL && i < n; i++) {
        graft_free(w[i].key);
        graft_free(w[i].old);
        graft_free(w[i].buf);
    }
    graft_free(w);
}

static graft_status_t write_prepare(graft_membership_t *m, uint32_t rank, uint64_t inc,
                                    int64_t lease, uint64_t round, uint64_t committed,
                                    uint64_t old_round, ready_write_t *w)
{
    /* No wall-clock time in the record: the fast path compares records
     * byte for byte with what the other ranks expect. */
    graft__ready_t r = {m->cfg.group, rank, inc, round, committed, 0, 0};
    w->lease = lease;
    w->key = graft__key_ready(m->prefix, round, m->cfg.group, rank);
    if (old_round != 0 && old_round != round)
        w->old = graft__key_ready(m->prefix, old_round, m->cfg.group, rank);
    if (w->key == NULL || (old_round != 0 && old_round != round && w->old == NULL))
        return GRAFT_ENOMEM;
    return graft__mship_ready_encode(&r, &w->buf, &w->len);
}

/* The announcing transaction's branches. Failure branch (or no fast
 * path), ops: the puts, the count, the deletes. Success branch of the fast
 * path, form: the puts, the round, the deletes. The count gives an
 * announcer O(1) bytes back, not the records. */
static void announce_ops(const ready_write_t *w, size_t n_w, char *prefix, const fast_path_t *f,
                         graft_etcd_op_t *ops, size_t *n_ops_p, graft_etcd_op_t *form,
                         size_t *n_form_p)
{
    size_t n_ops = 0, n_form = 0;
    for (size_t i = 0; i < n_w; i++) {
        ops[n_ops++] = (graft_etcd_op_t){GRAFT_ETCD_OP_PUT, w[i].key, w[i].buf, w[i].len,
                                         w[i].lease, false, false};
        form[n_form++] = ops[n_ops - 1];
    }
    ops[n_ops++] = (graft_etcd_op_t){GRAFT_ETCD_OP_RANGE, prefix, NULL, 0, 0, true, true};
    if (f->q != NULL)
        form[n_form++] = (graft_etcd_op_t){GRAFT_ETCD_OP_PUT, f->qkey, f->qbuf, f->qlen, 0, false,
                                           false};
    for (size_t i = 0; i < n_w; i++) {
        if (w[i].old == NULL)
            continue;
        ops[n_ops++] = (graft_etcd_op_t){GRAFT_ETCD_OP_DELETE, w[i].old, NULL, 0, 0, false, false};
        form[n_form++] = ops[n_ops - 1];
    }
    *n_ops_p = n_ops;
    *n_form_p = n_form;
}

/* After the announcing transaction: the round it formed on the fast path
 * (*formed_p, taken from f), or, when the count reached the live member
 * ranks, the round's ready records. */
static graft_status_t announce_result(graft_membership_t *m, uint64_t round, fast_path_t *f,
                                      const graft_etcd_txn_result_t *res,
                                      graft__ready_t **ready_p, size_t *n_p,
                                      graft_quorum_t **formed_p)
{
    pthread_mutex_lock(&m->mu);
    m->ready_round = round;
    pthread_mutex_unlock(&m->mu);
    if (f->q != NULL && res->succeeded) {
        atomic_fetch_add(&m->n_quorum_fast, 1);
        GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP, "job %s: formed round %" PRIu64 " id %" PRIu64
                    " on the fast path", m->job, f->q->round, f->q->id);
        graft__mship_view_adopt(m, f->q, res->revision);
        *formed_p = f->q;
        f->q = NULL;
        return GRAFT_OK;
    }
    if (f->q != NULL)
        GRAFT_DEBUG(GRAFT_MOD_MEMBERSHIP,
                    "job %s group %" PRIu32 " rank %" PRIu32 ": round %" PRIu64
                    " not complete at announcement: compare-and-swap path", m->job, m->cfg.group,
                    m->cfg.rank, round);
    if (res->n_ranges != 1)
        return GRAFT_EMALFORMED;
    pthread_mutex_lock(&m->mu);
    int64_t live = (int64_t)live_ranks(m);
    pthread_mutex_unlock(&m->mu);
    if (res->ranges[0].count >= live)
        return graft__mship_read_ready(m, round, ready_p, n_p);
    return GRAFT_OK;
}

/*
 * Write this rank's ready record for a round (and, as its group's leader,
 * those of the ranks that delegated theirs, each on its own rank's lease),
 * drop each one's record of its round before, and count the round's ready
 * records, in one transaction: the count sees the writes, so of the
 * announcers the last one always sees the complete set, and only it reads
 * the records (graft__mship_read_ready) and decides. One folder per round.
 * With formed_p, the transaction also tries the fast path; *formed_p is
 * the round it formed, or NULL. *delegated_p tells whether the delegates'
 * records were written: a delegate's lease that etcd no longer knows fails
 * the batch, and this rank then announces alone.
 */
graft_status_t graft__mship_announce(graft_membership_t *m, uint64_t round, uint64_t committed,
                                     const graft_membership_delegate_t *dl, size_t n_dl,
                                     uint64_t deadline_ns, graft__ready_t **ready_p, size_t *n_p,
                                     graft_quorum_t **formed_p, bool *delegated_p)
{
    int64_t lease = 0;
    uint64_t inc = 0;
    char *prefix = NULL;
    ready_write_t *w = NULL;
    graft_etcd_op_t *ops = NULL, *form = NULL;
    graft_etcd_txn_result_t res = {0};
    fast_path_t f = {0};
    size_t n_w = 0, n_ops = 0, n_form = 0;
    *ready_p = NULL;
    *n_p = 0;
    if (delegated_p != NULL)
        *delegated_p = false;
    if (formed_p != NULL)
        *formed_p = NULL;
    graft_status_t st = graft__mship_check_joined(m, &lease, &inc);
    if (st != GRAFT_OK)
        return st;
    pthread_mutex_lock(&m->mu);
    uint64_t old_round = m->ready_round;
    pthread_mutex_unlock(&m->mu);
    w = graft__calloc(n_dl + 1, sizeof(*w));
    ops = graft__calloc(2 * (n_dl + 1) + 1, sizeof(*ops));
    form = graft__calloc(2 * (n_dl + 1) + 1, sizeof(*form));
    prefix = graft__key_ready_folder(m->prefix, round);
    if (w == NULL || ops == NULL || form == NULL || prefix == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    st = write_prepare(m, m->cfg.rank, inc, lease, round, committed, old_round, &w[n_w++]);
    for (size_t j = 0; st == GRAFT_OK && j < n_dl; j++)
        st = write_prepare(m, dl[j].rank, dl[j].incarnation, dl[j].lease, round, dl[j].step,
                           dl[j].prev_round, &w[n_w++]);
    if (st == GRAFT_OK && formed_p != NULL)
        st = fast_path_prepare(m, round, committed, inc, dl, n_dl, &f);
    if (st != GRAFT_OK)
        goto out;
    announce_ops(w, n_w, prefix, &f, ops, &n_ops, form, &n_form);
    const char *what = n_dl > 0 ? "the group's ready records" : "ready record";
    if (f.q != NULL)
        st = graft__mship_txn_retry(m, f.cmps, f.n_cmps, form, n_form, ops, n_ops,
                                    n_dl > 0 ? 0 : lease, deadline_ns, what, &res);
    else
        st = graft__mship_txn_retry(m, NULL, 0, ops, n_ops, NULL, 0, n_dl > 0 ? 0 : lease,
                                    deadline_ns, what, &res);
    if (st == GRAFT_ENOTFOUND && n_dl > 0) {
        /* A lease of the batch is gone: a delegate's (it died or was cut
         * off), or this rank's own. Alone, the next try tells which. */
        GRAFT_INFO(GRAFT_MOD_MEMBERSHIP, "job %s group %" PRIu32 ": a delegating rank's lease "
                   "is gone; announcing rank %" PRIu32 " alone", m->job, m->cfg.group,
                   m->cfg.rank);
        fast_path_clear(&f);
        graft_free(prefix);
        writes_clear(w, n_w);
        graft_free(ops);
        graft_free(form);
        return graft__mship_announce(m, round, committed, NULL, 0, deadline_ns, ready_p, n_p,
                                     formed_p, NULL);
    }
    if (st != GRAFT_OK)
        goto out;
    if (delegated_p != NULL)
        *delegated_p = n_dl > 0;
    st = announce_result(m, round, &f, &res, ready_p, n_p, formed_p);
out:
    fast_path_clear(&f);
    graft_etcd_txn_result_clear(&res);
    graft_free(prefix);
    writes_clear(w, n_w);
    graft_free(ops);
    graft_free(form);
    return st;
}

/* Read the round's ready records (after the join timeout, or when members
 * change). */
graft_status_t graft__mship_read_ready(graft_membership_t *m, uint64_t round, graft__ready_t **ready_p,
                                 size_t *n_p)
{
    graft_etcd_range_result_t res = {0};
    graft_etcd_range_opts_t opts = {0};
    char *prefix = graft__key_ready_folder(m->prefix, round);
    graft_status_t st;
    if (prefix == NULL)
        return GRAFT_ENOMEM;
    opts.prefix = true;
    GRAFT__MSHIP_REQ(m);
    st = graft_etcd_range(m->ops, prefix, &opts, &res);
    if (st == GRAFT_OK)
        st = decode_ready(m, &res, ready_p, n_p);
    else
        atomic_fetch_add(&m->n_etcd_errors, 1);
    graft_etcd_range_result_clear(&res);
    graft_free(prefix);
    return st;
}
