/*
 * The asynchronous writer's staging buffers: the snapshot's copy of the
 * regions, taken from a small pool of warm buffers under w->mu and given
 * back to it when the shard is written (persist_writer.c) or when the last
 * compression helper stops reading it (persist_pool.c). Below both, calling
 * neither.
 */
#include "persist_internal.h"

gp_staging_t *graft__persist_staging_get(graft_persist_writer_t *w, uint64_t need)
{
    gp_staging_t **best = NULL;
    pthread_mutex_lock(&w->mu);
    for (gp_staging_t **p = &w->pool; *p; p = &(*p)->next)
        if ((*p)->cap >= need && (best == NULL || (*p)->cap < (*best)->cap))
            best = p;
    gp_staging_t *s = NULL;
    if (best != NULL) {
        s = *best;
        *best = s->next;
    }
    pthread_mutex_unlock(&w->mu);
    if (s != NULL)
        return s;
    s = graft__calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->buf = graft__malloc((size_t)(need ? need : 1));
    if (s->buf == NULL) {
        graft_free(s);
        return NULL;
    }
    s->cap = need;
    return s;
}

void graft__persist_staging_free(gp_staging_t *s)
{
    if (s != NULL) {
        graft_free(s->buf);
        graft_free(s);
    }
}

/* Keep a few buffers so the next snapshot copies into warm memory. */
void graft__persist_staging_put(graft_persist_writer_t *w, gp_staging_t *s)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&w->mu);
    size_t n = 0;
    for (gp_staging_t *p = w->pool; p; p = p->next)
        n++;
    if (n < 2u * w->max_pending + 8u) {
        s->next = w->pool;
        w->pool = s;
        s = NULL;
    }
    pthread_mutex_unlock(&w->mu);
    graft__persist_staging_free(s);
}
