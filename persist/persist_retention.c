/*
 * Retention: which checkpoints to keep. The plan is a pure function of the
 * valid steps so it can be tested exactly; apply() lists the root, plans,
 * and deletes (manifest first). The newest valid checkpoint is never
 * deleted, whatever the policy says.
 */
#include "persist_internal.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static int band_of(uint64_t distance)
{
    int b = 0;
    while (distance > 1) {
        distance >>= 1;
        b++;
    }
    return b;
}

graft_status_t graft_persist_retention_plan(const graft_persist_retention_t *policy,
                                            const uint64_t *steps, const bool *marked, size_t n,
                                            bool *keep)
{
    if (policy == NULL || (n > 0 && (steps == NULL || keep == NULL)))
        return GRAFT_EINVAL;
    if (n == 0)
        return GRAFT_OK;
    uint64_t newest = 0;
    for (size_t i = 0; i < n; i++)
        newest = GRAFT_MAX(newest, steps[i]);
    /* the newest distance kept in each band [2^k, 2^(k+1)), by band */
    uint64_t best[65];
    for (int b = 0; b < 65; b++)
        best[b] = UINT64_MAX;
    for (size_t i = 0; i < n; i++) {
        size_t newer = 0;
        for (size_t k = 0; k < n; k++)
            newer += steps[k] > steps[i];
        bool k = policy->keep_last == 0 || newer < policy->keep_last || steps[i] == newest ||
                 (policy->milestone_every != 0 && steps[i] % policy->milestone_every == 0) ||
                 (marked != NULL && marked[i]);
        keep[i] = k;
        if (!k && policy->geometric) {
            int b = band_of(newest - steps[i]);
            best[b] = GRAFT_MIN(best[b], newest - steps[i]);
        }
    }
    if (policy->keep_last != 0 && policy->geometric)
        for (size_t i = 0; i < n; i++)
            if (!keep[i] && best[band_of(newest - steps[i])] == newest - steps[i])
                keep[i] = true;
    return GRAFT_OK;
}

/* Nothing was added to the incomplete directory for the policy's minimum
 * age (a shard's rename or the manifest's would change its mtime). */
static bool leftover_old_enough(const char *dir, const graft_persist_retention_t *policy)
{
    struct stat sb;
    if (policy->leftover_min_age_ms == 0 || lstat(dir, &sb) != 0)
        return true;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t age_ms = ((int64_t)now.tv_sec - (int64_t)sb.st_mtim.tv_sec) * 1000 +
                     ((int64_t)now.tv_nsec - (int64_t)sb.st_mtim.tv_nsec) / 1000000;
    return age_ms >= (int64_t)policy->leftover_min_age_ms;
}

/* Complete, and under the policy's secret (when it has one) genuine: a
 * checkpoint someone forged in the root does not count toward what is
 * kept. */
static bool genuine(const char *root, const graft_persist_entry_t *e,
                    const graft_persist_retention_t *policy)
{
    if (policy->secret == NULL)
        return true;
    graft_persist_entry_t why;
    if (graft_persist_verify_mac(root, e->step, GRAFT_PERSIST_VERIFY_QUICK, policy->secret,
                                 policy->secret_len, &why) == GRAFT_OK)
        return true;
    GRAFT_WARN(GRAFT_MOD_PERSIST, "retention under %s: step %llu is not counted: %s", root,
               (unsigned long long)e->step, why.reason);
    return false;
}

graft_status_t graft_persist_retention_apply(const char *root,
                                             const graft_persist_retention_t *policy,
                                             size_t *deleted_p)
{
    if (root == NULL || policy == NULL)
        return GRAFT_EINVAL;
    graft_persist_entry_t *e = NULL;
    size_t n = 0, deleted = 0;
    uint64_t *steps = NULL;
    bool *marked = NULL, *keep = NULL;
    graft_status_t st = graft_persist_list(root, &e, &n);
    if (st != GRAFT_OK)
        return st;
    size_t nvalid = 0;
    uint64_t newest_valid = 0;
    for (size_t i = 0; i < n; i++) {
        /* From here on, a forged checkpoint is handled as a corrupt one. */
        if (e[i].state == GRAFT_PERSIST_COMPLETE && !genuine(root, &e[i], policy))
            e[i].state = GRAFT_PERSIST_CORRUPT;
        if (e[i].state == GRAFT_PERSIST_COMPLETE) {
            newest_valid = nvalid == 0 ? e[i].step : GRAFT_MAX(newest_valid, e[i].step);
            nvalid++;
        }
    }
    if (nvalid == 0)
        goto out; /* nothing valid: touch nothing */
    steps = graft__calloc(nvalid, sizeof(*steps));
    marked = graft__calloc(nvalid, sizeof(*marked));
    keep = graft__calloc(nvalid, sizeof(*keep));
    if (steps == NULL || marked == NULL || keep == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (e[i].state == GRAFT_PERSIST_COMPLETE) {
            steps[k] = e[i].step;
            marked[k] = e[i].before_config_change;
            k++;
        }
    st = graft_persist_retention_plan(policy, steps, marked, nvalid, keep);
    if (st != GRAFT_OK)
        goto out;
    for (size_t i = 0, v = 0; i < n; i++) {
        bool drop;
        if (e[i].state == GRAFT_PERSIST_COMPLETE)
            drop = !keep[v++] && e[i].step != newest_valid;
        else
            drop = e[i].step < newest_valid; /* a crash's leftovers */
        if (!drop)
            continue;
        char *dir = graft__persist_step_dir(root, e[i].step);
        if (dir == NULL) {
            st = GRAFT_ENOMEM;
            goto out;
        }
        bool young = e[i].state != GRAFT_PERSIST_COMPLETE && !leftover_old_enough(dir, policy);
        graft_free(dir);
        if (young)
            continue; /* perhaps still being committed by another writer */
        graft_status_t s1 = graft__persist_remove_dir(root, e[i].step);
        if (s1 != GRAFT_OK) {
            st = s1;
            continue;
        }
        deleted++;
    }
    if (deleted > 0) {
        graft_status_t s1 = graft__persist_fsync_dir(root);
        st = st == GRAFT_OK ? s1 : st;
    }
out:
    if (deleted_p != NULL)
        *deleted_p = deleted;
    graft_free(e);
    graft_free(steps);
    graft_free(marked);
    graft_free(keep);
    return st;
}
