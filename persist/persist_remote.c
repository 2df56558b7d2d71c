/*
 * The remote tier's uploader: one background thread per writer that sends
 * each checkpoint committed locally to the bucket, shards first, the
 * manifest last (docs/FORMAT.md, "Remote layout"). It never blocks a save:
 * while one checkpoint uploads, only the newest waiting one is kept.
 */
#include "persist_remote.h"
#include "persist_internal.h"
#include "persist_s3.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct graft__remote {
    graft__s3_t *s3; /* NULL when the configuration could not be resolved */
    char *root;
    uint8_t secret[GRAFT_PERSIST_SECRET_MAX_BYTES];
    size_t secret_len;
    uint32_t keep_last;
    uint64_t milestone_every;
    uint64_t abandoned_ms;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    atomic_bool cancel;
    bool has_next;
    uint64_t next_step;
    bool busy;
    uint64_t busy_step;
    graft_persist_remote_stats_t stats;
};

/* One local checkpoint opened for upload: the files stay readable even if
 * local retention removes them meanwhile. */
typedef struct local_ckpt {
    uint64_t step;
    char prefix[32]; /* "step-<20 digits>/" */
    Graft__CheckpointManifest *m;
    int *fds;
    int json_fd;
    int pb_fd;
    uint64_t json_bytes;
    uint64_t pb_bytes;
} local_ckpt_t;

static void local_close(local_ckpt_t *c)
{
    for (size_t i = 0; c->m != NULL && c->fds != NULL && i < c->m->n_shards; i++)
        if (c->fds[i] >= 0)
            close(c->fds[i]);
    graft_free(c->fds);
    if (c->json_fd >= 0)
        close(c->json_fd);
    if (c->pb_fd >= 0)
        close(c->pb_fd);
    if (c->m != NULL)
        graft__manifest_free(c->m);
}

static int open_in(const char *dir, const char *name, uint64_t *bytes_p)
{
    char *path = graft__asprintf("%s/%s", dir, name);
    int fd = path != NULL ? open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
    struct stat sb;
    if (fd >= 0 && bytes_p != NULL && fstat(fd, &sb) == 0)
        *bytes_p = (uint64_t)sb.st_size;
    graft_free(path);
    return fd;
}

/* Verify the local checkpoint (quick, with the MAC) and open its files. */
static graft_status_t local_open(graft__remote_t *r, uint64_t step, local_ckpt_t *c, char *why,
                                 size_t why_len)
{
    graft_persist_entry_t e;
    c->step = step;
    c->json_fd = c->pb_fd = -1;
    snprintf(c->prefix, sizeof(c->prefix), "step-%020llu/", (unsigned long long)step);
    graft_status_t st = graft_persist_verify_mac(r->root, step, GRAFT_PERSIST_VERIFY_QUICK,
                                                 r->secret_len > 0 ? r->secret : NULL,
                                                 r->secret_len, &e);
    if (st != GRAFT_OK) {
        snprintf(why, why_len, "step %llu: the local checkpoint does not verify: %s",
                 (unsigned long long)step, e.reason);
        return st;
    }
    char *dir = graft__persist_step_dir(r->root, step);
    char mwhy[256];
    st = dir != NULL ? graft__manifest_read(dir, step, &c->m, mwhy, sizeof(mwhy)) : GRAFT_ENOMEM;
    if (st != GRAFT_OK) {
        snprintf(why, why_len, "step %llu: %s", (unsigned long long)step, mwhy);
        graft_free(dir);
        return st;
    }
    c->fds = graft__calloc(c->m->n_shards + 1, sizeof(int));
    for (size_t i = 0; c->fds != NULL && i < c->m->n_shards; i++)
        c->fds[i] = open_in(dir, c->m->shards[i]->file, NULL);
    c->json_fd = open_in(dir, GP_MANIFEST_JSON, &c->json_bytes);
    c->pb_fd = open_in(dir, GP_MANIFEST_PB, &c->pb_bytes);
    graft_free(dir);
    if (c->fds == NULL)
        return GRAFT_ENOMEM;
    for (size_t i = 0; i < c->m->n_shards; i++)
        if (c->fds[i] < 0) {
            snprintf(why, why_len, "step %llu: %s: %s", (unsigned long long)step,
                     c->m->shards[i]->file, strerror(errno));
            return GRAFT_EIO;
        }
    if (c->json_fd < 0 || c->pb_fd < 0) {
        snprintf(why, why_len, "step %llu: the local manifest is gone (%s)",
                 (unsigned long long)step, strerror(errno));
        return GRAFT_EIO;
    }
    return GRAFT_OK;
}

static graft_status_t put(graft__remote_t *r, local_ckpt_t *c, const char *name, int fd,
                          uint64_t bytes, char *why, size_t why_len)
{
    char key[300];
    snprintf(key, sizeof(key), "%s%s", c->prefix, name);
    return graft__s3_put_file(r->s3, key, fd, bytes, why, why_len);
}

/* Every shard and manifest.json stored with its size; what the store does
 * not hold (lost in a restart) is sent again. */
static graft_status_t check_and_repair(graft__remote_t *r, local_ckpt_t *c, bool *all_p,
                                       char *why, size_t why_len)
{
    graft_status_t st = GRAFT_OK;
    *all_p = true;
    for (size_t i = 0; i <= c->m->n_shards && st == GRAFT_OK; i++) {
        bool json = i == c->m->n_shards;
        const char *name = json ? GP_MANIFEST_JSON : c->m->shards[i]->file;
        uint64_t want = json ? c->json_bytes : c->m->shards[i]->file_bytes;
        char key[300];
        uint64_t have = 0;
        snprintf(key, sizeof(key), "%s%s", c->prefix, name);
        st = graft__s3_head(r->s3, key, &have, why, why_len);
        if (st == GRAFT_OK && have == want)
            continue;
        if (st != GRAFT_OK && st != GRAFT_ENOTFOUND)
            break;
        *all_p = false;
        GRAFT_WARN(GRAFT_MOD_PERSIST, "s3://%s/%s%s: %s in the store; sending it again",
                   r->s3->bucket, r->s3->prefix, key, st == GRAFT_OK ? "wrong size" : "missing");
        st = put(r, c, name, json ? c->json_fd : c->fds[i], want, why, why_len);
    }
    return st;
}

static graft_status_t upload_checkpoint(graft__remote_t *r, uint64_t step, char *why,
                                        size_t why_len)
{
    local_ckpt_t c = {0};
    graft_status_t st = local_open(r, step, &c, why, why_len);
    for (size_t i = 0; st == GRAFT_OK && i < c.m->n_shards; i++)
        st = put(r, &c, c.m->shards[i]->file, c.fds[i], c.m->shards[i]->file_bytes, why,
                 why_len);
    if (st == GRAFT_OK)
        st = put(r, &c, GP_MANIFEST_JSON, c.json_fd, c.json_bytes, why, why_len);
    /* The commit point: manifest.pb only once the store holds everything
     * it names, checked again after it (a store that lost objects while
     * the manifest was sent gets the manifest removed and the objects
     * resent). */
    bool all = false;
    for (int round = 0; st == GRAFT_OK && round < 4; round++) {
        for (int k = 0; st == GRAFT_OK && !all && k < 3; k++)
            st = check_and_repair(r, &c, &all, why, why_len);
        if (st == GRAFT_OK)
            st = put(r, &c, GP_MANIFEST_PB, c.pb_fd, c.pb_bytes, why, why_len);
        if (st == GRAFT_OK)
            st = check_and_repair(r, &c, &all, why, why_len);
        if (st == GRAFT_OK && all)
            break;
        char key[300];
        snprintf(key, sizeof(key), "%s" GP_MANIFEST_PB, c.prefix);
        if (st == GRAFT_OK && graft__s3_delete(r->s3, key, why, why_len) != GRAFT_OK)
            GRAFT_WARN(GRAFT_MOD_PERSIST, "%s", why);
        if (st == GRAFT_OK && round == 3) {
            snprintf(why, why_len, "step %llu: the store keeps losing objects",
                     (unsigned long long)step);
            st = GRAFT_EIO;
        }
    }
    local_close(&c);
    return st;
}

static void upload_one(graft__remote_t *r, uint64_t step)
{
    char why[512] = "";
    graft_status_t st;
    if (r->s3 == NULL) {
        st = r->stats.last_status;
        snprintf(why, sizeof(why), "%s", r->stats.last_error);
    } else {
        uint64_t t0 = graft__now_ns();
        st = upload_checkpoint(r, step, why, sizeof(why));
        if (st == GRAFT_OK) {
            GRAFT_INFO(GRAFT_MOD_PERSIST, "step %llu uploaded to %s in %.1f s",
                       (unsigned long long)step, r->s3->url,
                       (double)(graft__now_ns() - t0) / 1e9);
            /* Also after a failed upload's leftovers: they are removed
             * once a newer checkpoint is complete. */
            size_t deleted = 0, leftovers = 0;
            char rwhy[512] = "";
            if (graft__persist_remote_retention(r->s3, r->keep_last, r->milestone_every,
                                                &deleted, &leftovers, rwhy,
                                                sizeof(rwhy)) != GRAFT_OK)
                GRAFT_WARN(GRAFT_MOD_PERSIST, "remote retention in %s failed", r->s3->url);
            pthread_mutex_lock(&r->mu);
            r->stats.deleted += deleted;
            r->stats.leftovers_removed += leftovers;
            pthread_mutex_unlock(&r->mu);
        } else if (r->s3 != NULL) {
            GRAFT_ERROR(GRAFT_MOD_PERSIST, "upload of step %llu to %s failed: %s",
                        (unsigned long long)step, r->s3->url, why);
        }
    }
    pthread_mutex_lock(&r->mu);
    r->stats.last_status = st;
    if (st == GRAFT_OK) {
        r->stats.uploaded++;
        r->stats.has_uploaded = true;
        r->stats.last_uploaded_step = step;
    } else {
        r->stats.failed++;
        snprintf(r->stats.last_error, sizeof(r->stats.last_error), "%s", why);
    }
    pthread_mutex_unlock(&r->mu);
}

/* Abort the multipart uploads left behind (docs/FORMAT.md, "Remote
 * layout"): best effort, tried again after the next upload. */
static void sweep(graft__remote_t *r)
{
    char why[512] = "";
    size_t aborted = 0;
    if (r->s3 == NULL)
        return;
    if (graft__s3_sweep_uploads(r->s3, r->abandoned_ms, &aborted, why, sizeof(why)) != GRAFT_OK)
        GRAFT_WARN(GRAFT_MOD_PERSIST, "%s: abandoned multipart uploads not cleaned: %s",
                   r->s3->url, why);
    pthread_mutex_lock(&r->mu);
    r->stats.aborted_uploads += aborted;
    pthread_mutex_unlock(&r->mu);
}

static void *uploader_main(void *arg)
{
    graft__remote_t *r = arg;
    sweep(r);
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && !r->has_next)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop)
            break;
        uint64_t step = r->next_step;
        r->has_next = false;
        r->busy = true;
        r->busy_step = step;
        pthread_mutex_unlock(&r->mu);
        upload_one(r, step);
        sweep(r);
        pthread_mutex_lock(&r->mu);
        r->busy = false;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

graft_status_t graft__persist_remote_create(const graft_persist_remote_config_t *cfg,
                                            const char *root, const uint8_t *secret,
                                            size_t secret_len, graft__remote_t **r_p)
{
    char why[512] = "";
    graft_status_t st = graft__s3_url_check(cfg->url, why, sizeof(why));
    if (st != GRAFT_OK) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "%s", why);
        return st;
    }
    graft__remote_t *r = graft__calloc(1, sizeof(*r));
    if (r == NULL)
        return GRAFT_ENOMEM;
    r->root = graft__strdup(root);
    if (r->root == NULL) {
        graft_free(r);
        return GRAFT_ENOMEM;
    }
    memcpy(r->secret, secret, secret_len);
    r->secret_len = secret_len;
    r->keep_last = cfg->keep_last;
    r->milestone_every = cfg->milestone_every;
    r->abandoned_ms = cfg->abandoned_after_ms != 0
                          ? cfg->abandoned_after_ms
                          : 2ull * (cfg->timeout_ms != 0 ? cfg->timeout_ms : 60000u) + 60000u;
    r->stats.enabled = true;
    st = graft__s3_create(cfg, &r->s3, why, sizeof(why));
    if (st != GRAFT_OK) {
        /* The local tier goes on; every checkpoint counts as a failed
         * upload with this reason. */
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "remote tier disabled: %s", why);
        r->stats.last_status = st;
        snprintf(r->stats.last_error, sizeof(r->stats.last_error), "%s", why);
    } else {
        r->s3->stop = &r->cancel;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (pthread_create(&r->thread, NULL, uploader_main, r) != 0) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "pthread_create: %s", strerror(errno));
        graft__persist_remote_destroy(r);
        return GRAFT_ESYS;
    }
    r->started = true;
    *r_p = r;
    return GRAFT_OK;
}

void graft__persist_remote_destroy(graft__remote_t *r)
{
    if (r == NULL)
        return;
    if (r->started) {
        /* The last checkpoint of a job that ends is worth a short wait. */
        uint64_t deadline = graft__now_ns() + GP_REMOTE_DRAIN_MS * 1000000ull;
        pthread_mutex_lock(&r->mu);
        while ((r->has_next || r->busy) && graft__now_ns() < deadline) {
            pthread_mutex_unlock(&r->mu);
            graft__sleep_ns(10u * 1000000u);
            pthread_mutex_lock(&r->mu);
        }
        bool waiting = r->has_next, busy = r->busy;
        uint64_t next = r->next_step, running = r->busy_step;
        r->stop = true;
        atomic_store(&r->cancel, true);
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thread, NULL);
        if (busy && !(r->stats.has_uploaded && r->stats.last_uploaded_step == running))
            GRAFT_WARN(GRAFT_MOD_PERSIST, "writer destroyed: the upload of step %llu was "
                       "canceled after %d s; it is not in the bucket", (unsigned long long)running,
                       GP_REMOTE_DRAIN_MS / 1000);
        if (waiting)
            GRAFT_WARN(GRAFT_MOD_PERSIST, "writer destroyed: step %llu was never uploaded",
                       (unsigned long long)next);
    }
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    graft__s3_destroy(r->s3);
    explicit_bzero(r->secret, sizeof(r->secret));
    graft_free(r->root);
    graft_free(r);
}

void graft__persist_remote_enqueue(graft__remote_t *r, uint64_t step)
{
    pthread_mutex_lock(&r->mu);
    if (r->has_next) {
        r->stats.superseded++;
        GRAFT_WARN(GRAFT_MOD_PERSIST, "remote tier behind: step %llu superseded by step %llu "
                   "before its upload began (%llu superseded so far)",
                   (unsigned long long)r->next_step, (unsigned long long)step,
                   (unsigned long long)r->stats.superseded);
    }
    r->next_step = step;
    r->has_next = true;
    r->stats.newest_local_step = step;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

graft_status_t graft_persist_remote_stats(graft_persist_writer_t *w,
                                          graft_persist_remote_stats_t *stats_p)
{
    if (w == NULL || stats_p == NULL)
        return GRAFT_EINVAL;
    graft__remote_t *r = w->remote;
    memset(stats_p, 0, sizeof(*stats_p));
    if (r == NULL)
        return GRAFT_OK;
    pthread_mutex_lock(&r->mu);
    *stats_p = r->stats;
    stats_p->waiting = (uint32_t)r->has_next + (uint32_t)r->busy;
    pthread_mutex_unlock(&r->mu);
    if (r->s3 != NULL) {
        stats_p->retries = atomic_load(&r->s3->retries);
        stats_p->bytes_sent = atomic_load(&r->s3->bytes_sent);
    }
    return GRAFT_OK;
}

graft_status_t graft_persist_remote_upload(graft_persist_writer_t *w, uint64_t step)
{
    if (w == NULL)
        return GRAFT_EINVAL;
    if (w->remote == NULL)
        return GRAFT_ENOTSUP;
    graft__persist_remote_enqueue(w->remote, step);
    return GRAFT_OK;
}

graft_status_t graft_persist_remote_flush(graft_persist_writer_t *w, uint32_t timeout_ms)
{
    if (w == NULL)
        return GRAFT_EINVAL;
    /* The commit job hands the checkpoint over: wait for the writer's own
     * queue first. */
    graft_status_t st = GRAFT_OK;
    uint64_t deadline = graft__now_ns() + (uint64_t)timeout_ms * 1000000u;
    graft__remote_t *r = w->remote;
    if (r == NULL)
        return GRAFT_OK;
    pthread_mutex_lock(&r->mu);
    while (r->has_next || r->busy) {
        if (graft__now_ns() >= deadline) {
            st = GRAFT_ETIMEOUT;
            break;
        }
        pthread_mutex_unlock(&r->mu);
        graft__sleep_ns(10u * 1000000u);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return st;
}
