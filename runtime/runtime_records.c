/*
 * The records the runtime keeps in etcd under /graft/<job>/ (docs/KEYS.md):
 * one function per key, and the encoding of each value. Values are
 * protobuf messages from proto/graft.proto: ProgressRecord at progress and
 * at group_progress/<group>,
 * JobSecret at secret, DriftRecord under drift/, CheckpointRecord under
 * checkpoints/, and under ckpt/ the persist shard records (ShardInfo,
 * encoded by persist/).
 */
#include "runtime_internal.h"
#include "../membership/membership_keys.h"

#include "pb_alloc.h"
#include "proto/graft.pb-c.h"

#include <inttypes.h>
#include <string.h>

#define RECORD_VERSION 1u

/* ---------------------------------------------------------------- keys --- */

char *graft__rt_key_drift_folder(const graft_runtime_t *rt, uint64_t step, uint32_t rank)
{
    return graft__key_drift_rank_folder(rt->prefix, step, rank);
}

char *graft__rt_key_drift(const graft_runtime_t *rt, uint64_t step, uint32_t rank, uint32_t group)
{
    return graft__key_drift(rt->prefix, step, rank, group);
}

/* A key (or folder) under a job's prefix, for the readers tools call. */
static graft_status_t job_key(const char *job, char *(*rest)(const char *), char **key_p)
{
    char *prefix = NULL;
    if (key_p == NULL)
        return GRAFT_EINVAL;
    graft_status_t st = graft_membership_job_prefix(job, &prefix);
    if (st != GRAFT_OK)
        return st;
    char *key = rest(prefix);
    graft_free(prefix);
    if (key == NULL)
        return GRAFT_ENOMEM;
    *key_p = key;
    return GRAFT_OK;
}

graft_status_t graft_drift_key_folder(const char *job, char **folder_p)
{
    return job_key(job, graft__key_drift_folder, folder_p);
}


char *graft__rt_key_progress(const graft_runtime_t *rt)
{
    return graft__key_progress(rt->prefix);
}


char *graft__rt_key_group_progress(const graft_runtime_t *rt)
{
    return graft__key_group_progress(rt->prefix, rt->group);
}

char *graft__rt_key_checkpoint(const graft_runtime_t *rt, uint64_t step)
{
    return graft__key_checkpoint(rt->prefix, step);
}

char *graft__rt_key_shard_folder(const graft_runtime_t *rt, uint64_t step)
{
    return graft__key_ckpt_shards_folder(rt->prefix, step);
}

char *graft__rt_key_shard(const graft_runtime_t *rt, uint64_t step, uint32_t rank)
{
    return graft__key_ckpt_shard(rt->prefix, step, rank);
}

/* Who may read this key is who may read the job (docs/SECURITY.md). */
char *graft__rt_key_secret(const graft_runtime_t *rt)
{
    return graft__key_secret(rt->prefix);
}

/* -------------------------------------------------------------- values --- */

static graft_status_t pack(const ProtobufCMessage *msg, uint8_t **buf_p, size_t *len_p)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = graft__malloc(len + 1);
    if (buf == NULL)
        return GRAFT_ENOMEM;
    protobuf_c_message_pack(msg, buf);
    *buf_p = buf;
    *len_p = len;
    return GRAFT_OK;
}

graft_status_t graft__rt_drift_encode(const graft_runtime_t *rt, const uint64_t *hashes,
                                      uint8_t **buf_p, size_t *len_p)
{
    graft_status_t st = GRAFT_ENOMEM;
    Graft__DriftRecord rec = GRAFT__DRIFT_RECORD__INIT;
    Graft__DriftRecord__Region *regions = graft__calloc(rt->n_regions + 1, sizeof(*regions));
    Graft__DriftRecord__Region **ptrs = graft__calloc(rt->n_regions + 1, sizeof(*ptrs));
    if (regions == NULL || ptrs == NULL)
        goto out;
    for (size_t i = 0; i < rt->n_regions; i++) {
        graft__drift_record__region__init(&regions[i]);
        regions[i].name = rt->regions[i].name;
        regions[i].xxh3 = hashes[i];
        ptrs[i] = &regions[i];
    }
    rec.version = RECORD_VERSION;
    rec.group = rt->group;
    rec.n_regions = rt->n_regions;
    rec.regions = ptrs;
    st = pack(&rec.base, buf_p, len_p);
out:
    graft_free(ptrs);
    graft_free(regions);
    return st;
}

graft_status_t graft__rt_drift_decode(const graft_runtime_t *rt, const uint8_t *buf, size_t len,
                                      uint32_t *group_p, uint64_t *hashes, bool *have)
{
    Graft__DriftRecord *rec = graft__drift_record__unpack(&graft__pb_allocator, len, buf);
    if (rec == NULL)
        return GRAFT_EMALFORMED;
    graft_status_t st = GRAFT_OK;
    if (rec->version != RECORD_VERSION) {
        st = rec->version == 0 ? GRAFT_EMALFORMED : GRAFT_EFORMAT;
        goto out;
    }
    for (size_t k = 0; k < rec->n_regions; k++) {
        const Graft__DriftRecord__Region *r = rec->regions[k];
        for (size_t i = 0; r->name != NULL && i < rt->n_regions; i++) {
            if (strcmp(rt->regions[i].name, r->name) != 0)
                continue;
            hashes[i] = r->xxh3;
            have[i] = true;
        }
    }
    *group_p = rec->group;
out:
    graft__drift_record__free_unpacked(rec, &graft__pb_allocator);
    return st;
}

void graft__rt_checkpoint_record_put(graft_runtime_t *rt, graft_etcd_t *etcd, uint64_t step,
                                     const char *status)
{
    Graft__CheckpointRecord rec = GRAFT__CHECKPOINT_RECORD__INIT;
    rec.version = RECORD_VERSION;
    rec.step = step;
    rec.location = rt->cfg->persist_root;
    rec.status = (char *)status;
    rec.unix_ms = graft__wall_ns() / 1000000ull;
    uint8_t *buf = NULL;
    size_t len = 0;
    char *key = graft__rt_key_checkpoint(rt, step);
    if (key != NULL && pack(&rec.base, &buf, &len) == GRAFT_OK) {
        graft_status_t st = graft_etcd_put(etcd, key, buf, len, 0, NULL, NULL);
        if (st != GRAFT_OK)
            GRAFT_WARN(GRAFT_MOD_RUNTIME, "cannot write %s: %s", key, graft_status_string(st));
    }
    graft_free(buf);
    graft_free(key);
}

graft_status_t graft__rt_group_progress_encode(const graft_group_progress_t *gp, uint8_t **buf_p,
                                              size_t *len_p)
{
    Graft__ProgressRecord rec = GRAFT__PROGRESS_RECORD__INIT;
    rec.version = RECORD_VERSION;
    rec.step = gp->step;
    rec.group = gp->group;
    rec.steps_per_second = gp->steps_per_second;
    rec.unix_ms = gp->unix_ms;
    rec.quorum_id = gp->quorum_id;
    return pack(&rec.base, buf_p, len_p);
}

static graft_status_t group_progress_decode(const uint8_t *buf, size_t len,
                                            graft_group_progress_t *gp)
{
    bool oom = false;
    ProtobufCAllocator pa = graft__pb_allocator_tracked(&oom);
    Graft__ProgressRecord *rec = graft__progress_record__unpack(&pa, len, buf);
    if (rec == NULL)
        return oom ? GRAFT_ENOMEM : GRAFT_EMALFORMED;
    graft_status_t st = rec->version != RECORD_VERSION ? GRAFT_EFORMAT : GRAFT_OK;
    if (st == GRAFT_OK) {
        gp->group = rec->group;
        gp->step = rec->step;
        gp->steps_per_second = rec->steps_per_second;
        gp->unix_ms = rec->unix_ms;
        gp->quorum_id = rec->quorum_id;
    }
    graft__progress_record__free_unpacked(rec, &graft__pb_allocator);
    return st;
}

graft_status_t graft__rt_progress_encode(uint64_t step, uint8_t **buf_p, size_t *len_p)
{
    graft_group_progress_t gp = {.step = step};
    return graft__rt_group_progress_encode(&gp, buf_p, len_p);
}

graft_status_t graft__rt_progress_decode(const uint8_t *buf, size_t len, uint64_t *step_p)
{
    graft_group_progress_t gp;
    graft_status_t st = group_progress_decode(buf, len, &gp);
    if (st == GRAFT_OK)
        *step_p = gp.step;
    return st;
}

graft_status_t graft_progress_read(graft_etcd_t *etcd, const char *job, uint64_t *step_p)
{
    char *key = NULL;
    graft_etcd_kv_t kv;
    if (etcd == NULL || step_p == NULL)
        return GRAFT_EINVAL;
    graft_status_t st = job_key(job, graft__key_progress, &key);
    if (st != GRAFT_OK)
        return st;
    memset(&kv, 0, sizeof(kv));
    st = graft_etcd_get(etcd, key, &kv, NULL);
    if (st == GRAFT_OK)
        st = graft__rt_progress_decode(kv.value, kv.value_len, step_p);
    graft_etcd_kv_clear(&kv);
    graft_free(key);
    return st;
}

graft_status_t graft_group_progress_read(graft_etcd_t *etcd, const char *job,
                                         graft_group_progress_t **recs_p, size_t *n_p)
{
    char *folder = NULL;
    graft_etcd_range_result_t res;
    graft_group_progress_t *recs = NULL;
    size_t n = 0;
    if (etcd == NULL || recs_p == NULL || n_p == NULL)
        return GRAFT_EINVAL;
    graft_status_t st = job_key(job, graft__key_group_progress_folder, &folder);
    if (st != GRAFT_OK)
        return st;
    memset(&res, 0, sizeof(res));
    graft_etcd_range_opts_t ro = {.prefix = true};
    st = graft_etcd_range(etcd, folder, &ro, &res);
    if (st == GRAFT_OK && res.n_kvs > 0) {
        recs = graft__calloc(res.n_kvs, sizeof(*recs));
        if (recs == NULL)
            st = GRAFT_ENOMEM;
    }
    /* A record that does not decode is left out: the others still tell
     * how far their groups got. */
    for (size_t i = 0; st == GRAFT_OK && i < res.n_kvs; i++) {
        graft_status_t dst = group_progress_decode(res.kvs[i].value, res.kvs[i].value_len,
                                                   &recs[n]);
        if (dst == GRAFT_ENOMEM)
            st = dst;
        else if (dst == GRAFT_OK)
            n++;
    }
    graft_etcd_range_result_clear(&res);
    graft_free(folder);
    if (st != GRAFT_OK) {
        graft_free(recs);
        return st;
    }
    *recs_p = recs;
    *n_p = n;
    return GRAFT_OK;
}

void graft_group_progress_free(graft_group_progress_t *recs)
{
    graft_free(recs);
}

graft_status_t graft__rt_secret_encode(const uint8_t *secret, size_t len, uint8_t **buf_p,
                                       size_t *len_p)
{
    Graft__JobSecret rec = GRAFT__JOB_SECRET__INIT;
    rec.version = RECORD_VERSION;
    rec.secret.data = (uint8_t *)secret;
    rec.secret.len = len;
    return pack(&rec.base, buf_p, len_p);
}

graft_status_t graft__rt_secret_decode(const uint8_t *buf, size_t len, uint8_t *secret, size_t cap,
                                       size_t *len_p)
{
    bool oom = false;
    ProtobufCAllocator pa = graft__pb_allocator_tracked(&oom);
    Graft__JobSecret *rec = graft__job_secret__unpack(&pa, len, buf);
    if (rec == NULL)
        return oom ? GRAFT_ENOMEM : GRAFT_EMALFORMED;
    graft_status_t st = GRAFT_OK;
    if (rec->version != RECORD_VERSION)
        st = rec->version == 0 ? GRAFT_EMALFORMED : GRAFT_EFORMAT;
    else if (rec->secret.len < GRAFT_TRANSFER_SECRET_MIN_BYTES || rec->secret.len > cap)
        st = GRAFT_EMALFORMED;
    if (st == GRAFT_OK) {
        memcpy(secret, rec->secret.data, rec->secret.len);
        *len_p = rec->secret.len;
    }
    if (rec->secret.data != NULL)
        explicit_bzero(rec->secret.data, rec->secret.len);
    graft__job_secret__free_unpacked(rec, &graft__pb_allocator);
    return st;
}
