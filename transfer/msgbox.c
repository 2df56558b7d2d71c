/*
 * Short messages between endpoints: the inbox every endpoint keeps, and the
 * public calls over it. The backend delivers into the inbox from its
 * progress thread and sends over its own connections (ucx_msg.c).
 */
#include "transfer_int.h"

#include <string.h>
#include <time.h>

typedef struct graft__msg {
    struct graft__msg *next;
    size_t len;
    uint8_t data[];
} graft__msg_t;

void graft__transfer_msg_deliver(graft_transfer_endpoint_t *ep, const void *data, size_t len)
{
    if (len == 0 || len > GRAFT_TRANSFER_MSG_MAX) {
        GRAFT_DEBUG(GRAFT_MOD_TRANSFER, "a message of %zu bytes dropped", len);
        return;
    }
    graft__msg_t *m = graft__malloc(sizeof(*m) + len);
    pthread_mutex_lock(&ep->msg_lock);
    bool full = ep->n_msgs >= GRAFT_TRANSFER_MSG_INBOX;
    if (m == NULL || full) {
        /* The first of a run is worth a line; the count says the rest. */
        if (ep->msgs_dropped++ == 0)
            GRAFT_WARN(GRAFT_MOD_TRANSFER, "message dropped: %s",
                       full ? "the inbox is full" : "out of memory");
        pthread_mutex_unlock(&ep->msg_lock);
        graft_free(m);
        return;
    }
    m->next = NULL;
    m->len = len;
    memcpy(m->data, data, len);
    if (ep->msg_tail != NULL)
        ep->msg_tail->next = m;
    else
        ep->msg_head = m;
    ep->msg_tail = m;
    ep->n_msgs++;
    pthread_cond_signal(&ep->msg_cond);
    pthread_mutex_unlock(&ep->msg_lock);
}

graft_status_t graft__transfer_msgbox_init(graft_transfer_endpoint_t *ep)
{
    pthread_condattr_t ca;
    if (pthread_mutex_init(&ep->msg_lock, NULL) != 0)
        return GRAFT_ESYS;
    /* Waits are timed on the monotonic clock: a step of the wall clock
     * must not stretch or cut a protocol's timeout. */
    bool ok = pthread_condattr_init(&ca) == 0;
    ok = ok && pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
         pthread_cond_init(&ep->msg_cond, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!ok) {
        pthread_mutex_destroy(&ep->msg_lock);
        return GRAFT_ESYS;
    }
    return GRAFT_OK;
}

static void msgbox_clear(graft_transfer_endpoint_t *ep)
{
    pthread_mutex_lock(&ep->msg_lock);
    while (ep->msg_head != NULL) {
        graft__msg_t *m = ep->msg_head;
        ep->msg_head = m->next;
        graft_free(m);
    }
    ep->msg_tail = NULL;
    ep->n_msgs = 0;
    pthread_mutex_unlock(&ep->msg_lock);
}

void graft__transfer_msgbox_destroy(graft_transfer_endpoint_t *ep)
{
    msgbox_clear(ep);
    pthread_cond_destroy(&ep->msg_cond);
    pthread_mutex_destroy(&ep->msg_lock);
}

graft_status_t graft_transfer_msg_send(graft_transfer_endpoint_t *ep, const char *address,
                                       const void *msg, size_t len, uint32_t timeout_ms)
{
    if (ep == NULL || address == NULL || msg == NULL || len == 0 || len > GRAFT_TRANSFER_MSG_MAX)
        return GRAFT_EINVAL;
    if (ep->ops->msg_send == NULL)
        return GRAFT_ENOTSUP;
    return ep->ops->msg_send(ep, address, msg, len,
                             graft__now_ns() + (uint64_t)timeout_ms * 1000000ull);
}

graft_status_t graft_transfer_msg_recv(graft_transfer_endpoint_t *ep, void *buf, size_t *len_p,
                                       uint32_t timeout_ms)
{
    if (ep == NULL || buf == NULL || len_p == NULL)
        return GRAFT_EINVAL;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)timeout_ms * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    pthread_mutex_lock(&ep->msg_lock);
    while (ep->msg_head == NULL && timeout_ms > 0) {
        if (pthread_cond_timedwait(&ep->msg_cond, &ep->msg_lock, &ts) != 0)
            break;
    }
    graft__msg_t *m = ep->msg_head;
    if (m != NULL) {
        ep->msg_head = m->next;
        if (ep->msg_head == NULL)
            ep->msg_tail = NULL;
        ep->n_msgs--;
    }
    pthread_mutex_unlock(&ep->msg_lock);
    if (m == NULL)
        return GRAFT_ETIMEOUT;
    memcpy(buf, m->data, m->len);
    *len_p = m->len;
    graft_free(m);
    return GRAFT_OK;
}

void graft_transfer_msg_reset(graft_transfer_endpoint_t *ep)
{
    if (ep == NULL)
        return;
    if (ep->ops->msg_forget != NULL)
        ep->ops->msg_forget(ep);
    msgbox_clear(ep);
}
