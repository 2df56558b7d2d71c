/*
 * The group channel (runtime_channel.h): the inbox and outbox of step
 * messages, authenticated here once for every reader.
 */
#include "runtime_channel.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <string.h>

#define GRAFT_MOD_CHANNEL "runtime"

/* Early messages kept for a later phase or the other reader. */
#define CHANNEL_STASH 256u
/* Dropped messages (no valid MAC) are logged at most this often. */
#define CHANNEL_REJECT_LOG_NS 1000000000ull
/* Room for the longest message: a delegated record with its reason. */
#define CHANNEL_SEND_MAX 512u

struct graft__channel {
    graft_transfer_endpoint_t *ep; /* not owned */
    const uint8_t *secret;         /* not owned */
    size_t secret_len;
    uint32_t group, rank;
    graft__step_msg_t stash[CHANNEL_STASH];
    size_t n_stash;
    _Atomic uint64_t rejected;
    uint64_t rejected_log_ns;   /* when dropped messages were last logged */
    uint64_t rejected_unlogged; /* dropped since */
};

graft_status_t graft__channel_create(graft_transfer_endpoint_t *ep, const uint8_t *secret,
                                     size_t secret_len, uint32_t group, uint32_t rank,
                                     graft__channel_t **ch_p)
{
    graft__channel_t *ch = graft__calloc(1, sizeof(*ch));
    if (ch == NULL)
        return GRAFT_ENOMEM;
    ch->ep = ep;
    ch->secret = secret;
    ch->secret_len = secret_len;
    ch->group = group;
    ch->rank = rank;
    atomic_init(&ch->rejected, 0);
    *ch_p = ch;
    return GRAFT_OK;
}

void graft__channel_destroy(graft__channel_t *ch)
{
    if (ch == NULL)
        return;
    explicit_bzero(ch->stash, sizeof(ch->stash)); /* reasons may name peers */
    graft_free(ch);
}

graft_status_t graft__channel_send(graft__channel_t *ch, const char *to, graft__step_msg_t *m,
                                   uint32_t timeout_ms)
{
    uint8_t buf[CHANNEL_SEND_MAX];
    size_t len = 0;
    m->group = ch->group;
    m->rank = ch->rank;
    graft_status_t st = graft__rt_step_encode(ch->secret, ch->secret_len, m, buf, sizeof(buf),
                                              &len);
    if (st == GRAFT_OK)
        st = graft_transfer_msg_send(ch->ep, to, buf, len, GRAFT_MAX(timeout_ms, 1u));
    return st;
}

/* A message without a valid MAC: counted, and logged at most once a
 * second (a flood of them must not flood the log too). */
static void rejected(graft__channel_t *ch)
{
    uint64_t now = graft__now_ns();
    atomic_fetch_add(&ch->rejected, 1);
    ch->rejected_unlogged++;
    if (ch->rejected_log_ns != 0 && now - ch->rejected_log_ns < CHANNEL_REJECT_LOG_NS)
        return;
    GRAFT_WARN(GRAFT_MOD_CHANNEL, "group %" PRIu32 " rank %" PRIu32 ": %" PRIu64
               " step message(s) without a valid MAC dropped (forged, or sent with another "
               "job secret)", ch->group, ch->rank, ch->rejected_unlogged);
    ch->rejected_unlogged = 0;
    ch->rejected_log_ns = now;
}

graft_status_t graft__channel_recv(graft__channel_t *ch, uint32_t timeout_ms,
                                   graft__step_msg_t *m_p)
{
    uint8_t buf[GRAFT_TRANSFER_MSG_MAX];
    size_t len = 0;
    graft_status_t st = graft_transfer_msg_recv(ch->ep, buf, &len, GRAFT_MAX(timeout_ms, 1u));
    if (st != GRAFT_OK)
        return st;
    st = graft__rt_step_decode(ch->secret, ch->secret_len, buf, len, m_p);
    if (st == GRAFT_ETOKEN)
        rejected(ch);
    else if (st != GRAFT_OK)
        GRAFT_DEBUG(GRAFT_MOD_CHANNEL, "group %" PRIu32 " rank %" PRIu32 ": a message "
                    "dropped: %s", ch->group, ch->rank, graft_status_string(st));
    return st;
}

void graft__channel_stash(graft__channel_t *ch, const graft__step_msg_t *m)
{
    if (ch->n_stash == CHANNEL_STASH)
        memmove(ch->stash, ch->stash + 1, --ch->n_stash * sizeof(ch->stash[0]));
    ch->stash[ch->n_stash++] = *m;
}

bool graft__channel_take(graft__channel_t *ch, graft__stash_fn sort, void *ctx,
                         graft__step_msg_t *m_p)
{
    for (size_t i = 0; i < ch->n_stash;) {
        graft__stash_verdict_t v = sort(&ch->stash[i], ctx);
        if (v == GRAFT__STASH_KEEP) {
            i++;
            continue;
        }
        if (v == GRAFT__STASH_TAKE)
            *m_p = ch->stash[i];
        /* Keep arrival order: a later message of the same kind may wait. */
        memmove(ch->stash + i, ch->stash + i + 1, (ch->n_stash - i - 1) * sizeof(ch->stash[0]));
        ch->n_stash--;
        if (v == GRAFT__STASH_TAKE)
            return true;
    }
    return false;
}

uint64_t graft__channel_rejected(const graft__channel_t *ch)
{
    return ch != NULL ? atomic_load(&((graft__channel_t *)ch)->rejected) : 0;
}
