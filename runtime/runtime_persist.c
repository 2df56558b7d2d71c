/*
 * The persistent tier as the runtime drives it. Every persist_every steps,
 * at the commit of step s, rank r's shard is written by member group
 * members[(s / K + r) % n] (so the I/O moves around the groups from one
 * checkpoint to the next). Each writer publishes its shard record under
 * ckpt/<s>/shard/<r> once the shard is durable; the writer of shard 0
 * collects the R records, writes the manifest (the commit point) and the
 * checkpoint record checkpoints/<s> that tools read. Keys and records:
 * runtime_records.c, docs/KEYS.md.
 */
#include "runtime_internal.h"

#include "proto/graft.pb-c.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* How long the closing step waits for the final checkpoint's upload (as
 * long as the writer's own last wait at graft_destroy()). */
#define FINAL_UPLOAD_WAIT_MS 30000

/* Checkpoints are committed by a different group each time, so a newer one
 * can complete while an older one's committer still waits for its shards
 * (up to twice the fence timeout, collect_and_commit()): its directory is
 * not a leftover until then. */
static uint32_t leftover_age_ms(const graft_runtime_t *rt)
{
    return (uint32_t)GRAFT_MIN(rt->cfg->fence_timeout_ms * 2 + 60000u, UINT32_MAX);
}

/* The remote tier's settings (credentials come from AWS_* or the
 * credentials file, never from the configuration). */
static graft_persist_remote_config_t remote_config(const graft_runtime_t *rt)
{
    graft_persist_remote_config_t rc = {
        .url = rt->cfg->persist_remote,
        .endpoint = rt->cfg->persist_remote_endpoint,
        .region = rt->cfg->persist_remote_region,
        .keep_last = (uint32_t)rt->cfg->persist_remote_keep_last,
        .milestone_every = rt->cfg->persist_milestone_every,
    };
    return rc;
}

graft_status_t graft__rt_persist_open(graft_runtime_t *rt)
{
    if (rt->cfg->persist_root == NULL)
        return GRAFT_OK;
    graft_persist_remote_config_t rc = remote_config(rt);
    graft_persist_config_t pc = {
        .root = rt->cfg->persist_root,
        .second_root = rt->cfg->persist_second_root,
        .compression_level = (int)rt->cfg->persist_compression,
        .chunk_bytes = 0,
        /* Recorded per shard in the manifest: which group wrote it. */
        .group = rt->group,
        .retention = {.keep_last = (uint32_t)rt->cfg->persist_keep_last,
                      .milestone_every = rt->cfg->persist_milestone_every,
                      .leftover_min_age_ms = leftover_age_ms(rt)},
        .file_mode = (uint32_t)rt->cfg->persist_file_mode,
        /* Every manifest carries a MAC under the job secret, and a restore
         * takes only a checkpoint whose MAC verifies (docs/SECURITY.md). */
        .secret = rt->secret_len > 0 ? rt->secret : NULL,
        .secret_len = rt->secret_len,
        .remote = rt->cfg->persist_remote != NULL ? &rc : NULL,
    };
    return graft_persist_writer_create(&pc, &rt->tier.writer);
}

void graft__rt_persist_close(graft_runtime_t *rt)
{
    graft__rt_persist_join(rt);
    graft_persist_writer_destroy(rt->tier.writer);
    rt->tier.writer = NULL;
}

static graft_status_t persist_regions(graft_runtime_t *rt, graft_persist_region_t **out_p)
{
    graft_persist_region_t *pr = graft__calloc(rt->n_regions, sizeof(*pr));
    if (pr == NULL)
        return GRAFT_ENOMEM;
    for (size_t i = 0; i < rt->n_regions; i++) {
        const graft_region_t *r = &rt->regions[i].r;
        pr[i].name = rt->regions[i].persist_name;
        pr[i].kind = r->kind;
        pr[i].dtype = r->dtype;
        pr[i].device = r->device;
        pr[i].ptr = r->ptr;
        pr[i].bytes = r->bytes;
        pr[i].global_offset = r->global_offset;
        pr[i].global_bytes = r->global_bytes;
    }
    *out_p = pr;
    return GRAFT_OK;
}

/* No local checkpoint verifies (every host lost its disk): the bucket's
 * newest intact one, downloaded into the local root. Skipped local
 * checkpoints stay in the reasons. */
static graft_status_t restore_remote(graft_runtime_t *rt, const graft_persist_restore_params_t *p,
                                     graft_persist_restore_result_t *res)
{
    graft_persist_remote_config_t rc = remote_config(rt);
    graft_persist_restore_result_t remote_res;
    memset(&remote_res, 0, sizeof(remote_res));
    graft_status_t st = graft_persist_remote_restore(&rc, rt->cfg->persist_root, p, &remote_res);
    if (st == GRAFT_ENOCHECKPOINT && remote_res.skipped == 0)
        return res->skipped > 0 ? GRAFT_ENOCHECKPOINT : st; /* an empty bucket */
    size_t used = strlen(res->skipped_reasons);
    snprintf(res->skipped_reasons + used, sizeof(res->skipped_reasons) - used, "%s",
             remote_res.skipped_reasons);
    remote_res.skipped += res->skipped;
    memcpy(remote_res.skipped_reasons, res->skipped_reasons, sizeof(res->skipped_reasons));
    *res = remote_res;
    if (st == GRAFT_OK)
        GRAFT_INFO(GRAFT_MOD_RUNTIME, "restored step %" PRIu64 " from %s (no checkpoint under "
                   "%s verified)", res->step, rt->cfg->persist_remote, rt->cfg->persist_root);
    return st;
}

graft_status_t graft__rt_restore(graft_runtime_t *rt, uint64_t *step_p)
{
    graft_persist_region_t *pr = NULL;
    graft_persist_restore_result_t res;
    graft_persist_entry_t *entries = NULL;
    size_t n_entries = 0;
    /* An empty root is the normal first start, not an error to log. */
    graft_status_t st = graft_persist_list(rt->cfg->persist_root, &entries, &n_entries);
    graft_free(entries);
    if (st == GRAFT_OK && n_entries == 0 && rt->cfg->persist_remote == NULL)
        return GRAFT_ENOCHECKPOINT;
    st = persist_regions(rt, &pr);
    if (st != GRAFT_OK)
        return st;
    graft_persist_restore_params_t p = {
        .rank = rt->rank,
        .ranks = rt->ranks,
        .regions = pr,
        .nregions = rt->n_regions,
        /* Every rank of the group must pick the same checkpoint: a quick
         * check reads only this rank's shard, so one rank could take a
         * checkpoint whose other shard is corrupt while its peer skips it. */
        .verify_full = true,
        /* The manifest's fingerprint is rank 0's. */
        .fingerprint_fn = rt->rank == 0 ? rt->fp_fn : NULL,
        .fingerprint_arg = rt->fp_arg,
        .secret = rt->secret_len > 0 ? rt->secret : NULL,
        .secret_len = rt->secret_len,
    };
    memset(&res, 0, sizeof(res));
    uint64_t t0 = graft__now_ns();
    st = n_entries > 0 ? graft_persist_restore(rt->cfg->persist_root, &p, &res)
                       : GRAFT_ENOCHECKPOINT;
    if (st == GRAFT_ENOCHECKPOINT && rt->cfg->persist_remote != NULL)
        st = restore_remote(rt, &p, &res);
    graft_free(pr);
    if (st == GRAFT_ENOCHECKPOINT && res.skipped > 0) {
        /* Checkpoints are there but none may be loaded (corrupt, or not
         * written under this job's secret): starting the job over would
         * throw them away unseen, so the operator decides. */
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "none of the %" PRIu32 " checkpoints under %s verifies, "
                    "so the job is neither restored nor started over; give the job the secret "
                    "they were written with (job_secret_file), or move them away to start "
                    "anew:\n%s", res.skipped, rt->cfg->persist_root, res.skipped_reasons);
        return GRAFT_ESTATELOST;
    }
    if (st == GRAFT_ENOCHECKPOINT)
        return st;
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "restore from %s failed: %s", rt->cfg->persist_root,
                    graft_status_string(st));
        return st;
    }
    if (res.skipped > 0)
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "restored step %" PRIu64 " after skipping %" PRIu32
                   " checkpoints that did not verify:\n%s", res.step, res.skipped,
                   res.skipped_reasons);
    pthread_mutex_lock(&rt->mu);
    rt->metrics.restores++;
    pthread_mutex_unlock(&rt->mu);
    char detail[128];
    snprintf(detail, sizeof(detail), "step %" PRIu64 " from %s (%" PRIu32 " skipped)", res.step,
             rt->cfg->persist_root, res.skipped);
    graft_runtime_event_t ev = {.kind = GRAFT_RUNTIME_EVENT_RESTORE, .step = res.step,
                                .bytes = res.bytes, .transfer_ns = graft__now_ns() - t0,
                                .detail = detail};
    graft__rt_emit(rt, &ev);
    graft__rt_job_event(rt, GRAFT_EVENT_CHECKPOINT, res.step, true, (graft__now_ns() - t0) / 1000,
                        detail);
    *step_p = res.step;
    return GRAFT_OK;
}

/* ------------------------------------------------------ background work --- */

/* The committer: wait for the R shard records, then write the manifest. */
static graft_status_t collect_and_commit(graft_runtime_t *rt, graft_etcd_t *etcd, uint64_t step)
{
    graft_status_t st;
    graft_etcd_range_result_t res;
    memset(&res, 0, sizeof(res));
    char *prefix = graft__rt_key_shard_folder(rt, step);
    if (prefix == NULL)
        return GRAFT_ENOMEM;
    uint64_t deadline = graft__now_ns() + rt->cfg->fence_timeout_ms * 1000000ull * 2;
    graft_etcd_range_opts_t ro = {.prefix = true};
    for (;;) {
        graft_etcd_range_result_clear(&res);
        memset(&res, 0, sizeof(res));
        st = graft_etcd_range(etcd, prefix, &ro, &res);
        if (st == GRAFT_OK && res.n_kvs >= rt->ranks)
            break;
        if (atomic_load(&rt->tier.superseded)) {
            GRAFT_WARN(GRAFT_MOD_RUNTIME, "checkpoint %" PRIu64 ": %zu of %" PRIu32
                       " shards durable when the next checkpoint began: given up", step,
                       st == GRAFT_OK ? res.n_kvs : 0, rt->ranks);
            st = GRAFT_ECANCELED;
            goto out;
        }
        if (graft__now_ns() >= deadline) {
            GRAFT_ERROR(GRAFT_MOD_RUNTIME, "checkpoint %" PRIu64 ": %zu of %" PRIu32
                        " shards durable before the timeout", step,
                        st == GRAFT_OK ? res.n_kvs : 0, rt->ranks);
            st = GRAFT_ETIMEOUT;
            goto out;
        }
        graft__sleep_ns(20000000ull);
    }
    {
        const uint8_t *infos[res.n_kvs];
        size_t lens[res.n_kvs];
        for (size_t i = 0; i < res.n_kvs; i++) {
            infos[i] = res.kvs[i].value;
            lens[i] = res.kvs[i].value_len;
        }
        graft_persist_commit_opts_t opts = rt->tier.ckpt.opts;
        opts.file_mode = (uint32_t)rt->cfg->persist_file_mode;
        opts.secret = rt->secret_len > 0 ? rt->secret : NULL;
        opts.secret_len = rt->secret_len;
        st = graft_persist_commit(rt->cfg->persist_root, step, rt->ranks, infos, lens, NULL,
                                  &opts);
    }
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "checkpoint %" PRIu64 ": manifest not written: %s", step,
                    graft_status_string(st));
        goto out;
    }
    graft_persist_retention_t pol = {.keep_last = (uint32_t)rt->cfg->persist_keep_last,
                                     .milestone_every = rt->cfg->persist_milestone_every,
                                     .leftover_min_age_ms = leftover_age_ms(rt),
                                     .secret = rt->secret_len > 0 ? rt->secret : NULL,
                                     .secret_len = rt->secret_len};
    size_t deleted = 0;
    if (graft_persist_retention_apply(rt->cfg->persist_root, &pol, &deleted) != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "retention under %s failed", rt->cfg->persist_root);
    /* The committer's uploader sends it to the bucket in the background. */
    if (rt->cfg->persist_remote != NULL && rt->tier.writer != NULL &&
        graft_persist_remote_upload(rt->tier.writer, step) != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "checkpoint %" PRIu64 ": not handed to the uploader", step);
    int64_t ndel = 0;
    /* The shard records did their job; the checkpoint record stays. */
    if (graft_etcd_delete(etcd, prefix, true, &ndel, NULL) != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "could not delete %s", prefix);
out:
    graft_etcd_range_result_clear(&res);
    graft_free(prefix);
    return st;
}

static void *ckpt_main(void *arg)
{
    graft_runtime_t *rt = arg;
    graft__rt_ckpt_t *c = &rt->tier.ckpt;
    graft_etcd_t *etcd = NULL;
    uint8_t *info = NULL;
    size_t len = 0;
    char *key = NULL;
    uint64_t t0 = graft__now_ns();
    /* A client of its own: the training thread's is never shared. */
    graft_status_t st = graft_etcd_create(&rt->etcd_cfg, &etcd);
    if (st != GRAFT_OK)
        goto out;
    if (c->commit_manifest)
        graft__rt_checkpoint_record_put(rt, etcd, c->step, "writing");
    if (c->write_shard) {
        {
            uint32_t r = rt->rank;
            st = graft_persist_shard_wait(rt->tier.writer, c->step, r, &info, &len);
            if (st != GRAFT_OK) {
                GRAFT_ERROR(GRAFT_MOD_RUNTIME, "checkpoint %" PRIu64 ": shard %" PRIu32
                            " not durable: %s", c->step, r, graft_status_string(st));
                goto out;
            }
            key = graft__rt_key_shard(rt, c->step, r);
            if (key == NULL) {
                st = GRAFT_ENOMEM;
                goto out;
            }
            st = graft_etcd_put(etcd, key, info, len, 0, NULL, NULL);
            if (st != GRAFT_OK) {
                GRAFT_ERROR(GRAFT_MOD_RUNTIME,
                            "cannot publish %s: %s", key, graft_status_string(st));
                goto out;
            }
            pthread_mutex_lock(&rt->mu);
            rt->metrics.checkpoints_written++;
            rt->metrics.last_write_ns = graft__now_ns() - t0;
            pthread_mutex_unlock(&rt->mu);
        }
    }
    if (c->commit_manifest) {
        st = collect_and_commit(rt, etcd, c->step);
        graft__rt_checkpoint_record_put(rt, etcd, c->step, st == GRAFT_OK ? "complete" : "failed");
        if (st == GRAFT_OK) {
            pthread_mutex_lock(&rt->mu);
            rt->metrics.checkpoints_committed++;
            rt->metrics.last_checkpoint_step = c->step;
            pthread_mutex_unlock(&rt->mu);
        }
    }
out:
    rt->tier.status = st;
    if (st != GRAFT_OK) {
        pthread_mutex_lock(&rt->mu);
        rt->metrics.checkpoints_failed++;
        pthread_mutex_unlock(&rt->mu);
    }
    char detail[160];
    snprintf(detail, sizeof(detail), "%s%s at %s: %s", c->write_shard ? "shard" : "",
             c->commit_manifest ? (c->write_shard ? "+manifest" : "manifest") : "",
             rt->cfg->persist_root, graft_status_string(st));
    graft_runtime_event_t ev = {.kind = GRAFT_RUNTIME_EVENT_CHECKPOINT, .status = st,
                                .step = c->step, .detail = detail};
    graft__rt_emit(rt, &ev);
    if (c->commit_manifest)
        graft__rt_job_event(rt, GRAFT_EVENT_CHECKPOINT, c->step, st == GRAFT_OK,
                            (graft__now_ns() - t0) / 1000, detail);
    graft_free(info);
    graft_free(key);
    graft_etcd_destroy(etcd);
    return NULL;
}

void graft__rt_persist_join(graft_runtime_t *rt)
{
    if (!rt->tier.running)
        return;
    pthread_join(rt->tier.thread, NULL);
    rt->tier.running = false;
}

/* Snapshot (blocking) and start the background part. */
static graft_status_t ckpt_start(graft_runtime_t *rt, uint64_t step, bool write_shard,
                                 bool commit_manifest, bool whole_group)
{
    graft_status_t st = GRAFT_OK;
    graft_persist_region_t *pr = NULL;
    /* A checkpoint still collecting shards when the next one begins is
     * superseded: one of its writers is gone or late by a whole interval,
     * and waiting for it would hold the training thread. */
    atomic_store(&rt->tier.superseded, true);
    graft__rt_persist_join(rt);
    atomic_store(&rt->tier.superseded, false);
    memset(&rt->tier.ckpt, 0, sizeof(rt->tier.ckpt));
    rt->tier.ckpt.step = step;
    rt->tier.ckpt.write_shard = write_shard;
    rt->tier.ckpt.commit_manifest = commit_manifest;
    rt->tier.ckpt.whole_group = whole_group;
    if (commit_manifest && rt->fp_fn != NULL && rt->rank == 0) {
        uint64_t fp = 0;
        if (rt->fp_fn(rt->fp_arg, &fp) == GRAFT_OK) {
            rt->tier.ckpt.opts.has_fingerprint = true;
            rt->tier.ckpt.opts.fingerprint = fp;
        }
    }
    if (write_shard) {
        st = persist_regions(rt, &pr);
        if (st != GRAFT_OK)
            return st;
        uint64_t t0 = graft__now_ns();
        st = graft_persist_shard_write(rt->tier.writer, step, rt->rank, rt->ranks, pr, rt->n_regions);
        uint64_t snap = graft__now_ns() - t0;
        graft_free(pr);
        if (st != GRAFT_OK) {
            GRAFT_ERROR(GRAFT_MOD_RUNTIME,
                        "checkpoint %" PRIu64 ": shard %" PRIu32 " not taken: %s",
                        step, rt->rank, graft_status_string(st));
            pthread_mutex_lock(&rt->mu);
            rt->metrics.checkpoints_failed++;
            pthread_mutex_unlock(&rt->mu);
            return st;
        }
        pthread_mutex_lock(&rt->mu);
        rt->metrics.last_snapshot_ns = snap;
        for (size_t i = 0; i < rt->n_regions; i++)
            rt->metrics.checkpoint_bytes += rt->regions[i].r.bytes;
        pthread_mutex_unlock(&rt->mu);
    }
    if (pthread_create(&rt->tier.thread, NULL, ckpt_main, rt) != 0) {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "pthread_create: %s", strerror(errno));
        return GRAFT_ESYS;
    }
    rt->tier.running = true;
    return GRAFT_OK;
}

/* A checkpoint of @p step is on disk already, written under this job's
 * secret (a planted manifest does not stop this job writing its own). */
static bool persist_verified(const graft_runtime_t *rt, uint64_t step)
{
    return graft_persist_verify_mac(rt->cfg->persist_root, step, GRAFT_PERSIST_VERIFY_QUICK,
                                    rt->secret_len > 0 ? rt->secret : NULL, rt->secret_len,
                                    NULL) == GRAFT_OK;
}

/* This rank's part in the checkpoint of q's step, as the schedule assigns
 * it (due or not: the final one is taken off the schedule). */
static graft_status_t persist_step(graft_runtime_t *rt, const graft_quorum_t *q)
{
    uint64_t k = rt->cfg->persist_every;
    size_t n = q->n_members;
    uint32_t my_writer = q->members[(q->step / k + rt->rank) % n];
    uint32_t committer = q->members[(q->step / k) % n];
    bool write = my_writer == rt->group;
    bool commit = committer == rt->group && rt->rank == 0;
    if (!write && !commit)
        return GRAFT_OK;
    /* A group restored from this very checkpoint, or another group wrote
     * it already: nothing to do. */
    if (persist_verified(rt, q->step))
        return GRAFT_OK;
    return ckpt_start(rt, q->step, write, commit, false);
}

graft_status_t graft__rt_persist_at_commit(graft_runtime_t *rt, const graft_quorum_t *q)
{
    if (rt->tier.writer == NULL || q->step == 0 || q->step % rt->cfg->persist_every != 0 ||
        q->n_members == 0)
        return GRAFT_OK;
    return persist_step(rt, q);
}

graft_status_t graft__rt_persist_final(graft_runtime_t *rt, const graft_quorum_t *q)
{
    if (rt->tier.writer == NULL || rt->cfg->persist_final == 0 || q->step == 0 || q->n_members == 0)
        return GRAFT_OK;
    /* One group writes every shard (the group that commits a scheduled
     * checkpoint of this step): the groups of one quorum need not all
     * commit their closing step, and a writer must not wait for another
     * group's shard that may never come (docs/RUNTIME.md, "A clean end").
     * A group closing later, in a round without the writer, finds it on
     * disk or, if the writer did not commit, writes it itself. */
    uint32_t writer = q->members[(q->step / rt->cfg->persist_every) % q->n_members];
    graft_status_t st = GRAFT_OK;
    /* A scheduled checkpoint still under way ends first, as graft_destroy()
     * would let it, instead of being superseded by this one. */
    graft__rt_persist_join(rt);
    if (writer == rt->group && !persist_verified(rt, q->step))
        st = ckpt_start(rt, q->step, true, rt->rank == 0, true);
    if (st != GRAFT_OK)
        return st;
    /* The trainer ends after this commit: its part (and a scheduled
     * checkpoint's before it) is durable when the call returns. */
    graft__rt_persist_join(rt);
    bool mine = rt->tier.ckpt.step == q->step; /* else none of it is this rank's, or it was on disk */
    if (mine && rt->tier.status == GRAFT_OK)
        GRAFT_INFO(GRAFT_MOD_RUNTIME, "final checkpoint of step %" PRIu64 ": %s%s durable",
                   q->step, rt->tier.ckpt.write_shard ? "shard" : "",
                   rt->tier.ckpt.commit_manifest ? (rt->tier.ckpt.write_shard ? "+manifest" : "manifest")
                                            : "");
    /* And in the bucket, when this rank's uploader has it: the wait that
     * graft_destroy() would make anyway, made here so that the metrics read
     * after the closing step count the upload. */
    if (rt->cfg->persist_remote != NULL &&
        graft_persist_remote_flush(rt->tier.writer, FINAL_UPLOAD_WAIT_MS) != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_RUNTIME, "the upload of the final checkpoint (step %" PRIu64
                   ") did not end within %d s; graft_destroy() waits for it again",
                   q->step, FINAL_UPLOAD_WAIT_MS / 1000);
    return mine ? rt->tier.status : GRAFT_OK;
}

graft_status_t graft_checkpoint_wait(graft_runtime_t *rt)
{
    if (rt == NULL)
        return GRAFT_EINVAL;
    graft__rt_persist_join(rt);
    return rt->tier.status;
}

graft_status_t graft_checkpoint_now(graft_runtime_t *rt)
{
    if (rt == NULL)
        return GRAFT_EINVAL;
    if (rt->tier.writer == NULL)
        return GRAFT_ENOTSUP;
    uint64_t step = graft_step(rt);
    if (rt->q != NULL || !rt->joined || step == 0 || !rt->state_valid)
        return GRAFT_ESTATE;
    graft__rt_persist_join(rt);
    if (persist_verified(rt, step))
        return GRAFT_EEXIST;
    graft_status_t st = ckpt_start(rt, step, true, rt->rank == 0, true);
    if (st != GRAFT_OK)
        return st;
    graft__rt_persist_join(rt);
    return rt->tier.status;
}

void graft__rt_persist_metrics(graft_runtime_t *rt, graft_metrics_t *metrics_p)
{
    graft_persist_remote_stats_t rs;
    if (rt->tier.writer == NULL || graft_persist_remote_stats(rt->tier.writer, &rs) != GRAFT_OK ||
        !rs.enabled)
        return;
    uint64_t done = rs.has_uploaded ? rs.last_uploaded_step : 0;
    metrics_p->remote_uploaded = rs.uploaded;
    metrics_p->remote_superseded = rs.superseded;
    metrics_p->remote_failed = rs.failed;
    metrics_p->remote_lag_steps = rs.newest_local_step > done ? rs.newest_local_step - done : 0;
}
