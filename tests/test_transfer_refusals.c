/*
 * What a donor refuses, precisely, while it keeps serving correct requests:
 * recipients of another job, step, layout or chunk size, addresses where
 * nobody listens or that are no address; and strangers that send it junk,
 * over raw TCP and as a raw UCX client (malformed, truncated and foreign
 * requests, on the request and on the push-read path): one that knows the
 * job's step but not its secret, one that signs with a wrong secret, and
 * one that replays a request signed for another connection get nothing. Every test runs in
 * every group of tf_run_wire(); the fixture is in transfer_fixture.h.
 */
#include "transfer_fixture.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <ucp/api/ucp.h>

#include "proto/graft.pb-c.h"
#include "transfer/transfer_int.h"

/* A refusal is precise and the donor keeps serving correct requests. */
static void test_refusals(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(tf_small_layout, TF_N_SMALL, 256u << 10);
    graft_transfer_pull_options_t *po = &f->po;
    const graft_transfer_report_t *rep = &f->rep;
    static const tf_region_t other_layout[] = {{"weights", 1000}};

    tf_donors_start(f, &o, 1);

    tf_recipient_create(f, tf_small_layout, TF_N_SMALL, 256u << 10, "a-wrong-job-secret", false);
    assert_int_equal(tf_pull(f), GRAFT_ENODONOR);
    assert_int_equal(rep->donors[0].status, GRAFT_ETOKEN);
    assert_false(rep->installed);
    tf_recipient_destroy(f);

    /* A donor that serves only group 7 refuses the right secret from group
     * 2 (the fixture's recipients), and serves it once 2 is named. */
    int32_t out[2];
    tf_donor_ask(&f->d[0], 'G', 7, 1, 5000, out);
    assert_int_equal(out[0], GRAFT_OK);
    tf_recipient_of(f, &o);
    assert_int_equal(tf_pull(f), GRAFT_ENODONOR);
    assert_int_equal(rep->donors[0].status, GRAFT_ENOTRECIPIENT);
    assert_false(rep->installed);
    tf_donor_ask(&f->d[0], 'G', 2, 1, 5000, out);
    tf_pull_verified(f);
    tf_donor_ask(&f->d[0], 'G', 0, 0, 5000, out);
    /* Both refusals for who asked were counted (the runtime records an
     * event for them). */
    tf_donor_ask(&f->d[0], 'X', 0, 0, 5000, out);
    assert_int_equal(out[0], 2);
    tf_recipient_destroy(f);

    tf_recipient_of(f, &o);
    /* A donor at an older step may be about to move on: asked again until
     * the connect deadline, then its refusal is the answer. */
    po->step = STEP + 1;
    po->connect_timeout_ms = 400;
    double t0 = graft_test_now_s();
    assert_int_equal(tf_pull(f), GRAFT_ENODONOR);
    assert_int_equal(rep->donors[0].status, GRAFT_ESTEP);
    assert_true(graft_test_now_s() - t0 >= 0.2);
    po->step = STEP;
    po->connect_timeout_ms = 0;
    tf_recipient_destroy(f);

    tf_recipient_create(f, other_layout, 1, 256u << 10, SECRET, false);
    assert_int_equal(tf_pull(f), GRAFT_ENODONOR);
    assert_int_equal(rep->donors[0].status, GRAFT_ELAYOUT);
    tf_recipient_destroy(f);

    /* A different chunk size is caught by the recipient. */
    tf_recipient_create(f, tf_small_layout, TF_N_SMALL, 128u << 10, SECRET, false);
    assert_int_equal(tf_pull(f), GRAFT_ENODONOR);
    assert_int_equal(rep->donors[0].status, GRAFT_EPROTO);
    tf_recipient_destroy(f);

    /* Nobody listening. */
    tf_recipient_of(f, &o);
    const char *nobody[1] = {"127.0.0.1:1"};
    po->donors = nobody;
    po->connect_timeout_ms = 2000;
    assert_int_equal(tf_pull(f), GRAFT_ENODONOR);
    assert_int_equal(graft_status_class(rep->donors[0].status), GRAFT_CLASS_PEER);
    const char *bad[1] = {"not-an-address"};
    po->donors = bad;
    assert_int_equal(tf_pull(f), GRAFT_ENODONOR);
    assert_int_equal(rep->donors[0].status, GRAFT_EINVAL);

    po->donors = f->addrs;
    tf_pull_verified(f);
    tf_recipient_destroy(f);
    tf_donors_stop(f, 1);
}

/* ---- a raw UCX client of a donor ------------------------------------------ */

typedef struct raw_client {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h ep;
    int replies;
    int32_t last_status;
    bool challenged; /* the donor's challenge came: its nonce */
    uint8_t donor_nonce[GRAFT_NONCE_BYTES];
} raw_client_t;

static ucs_status_t raw_challenge_cb(void *arg, const void *header, size_t header_length,
                                     void *data, size_t length, const ucp_am_recv_param_t *param)
{
    raw_client_t *c = arg;
    (void)header;
    (void)header_length;
    (void)param;
    Graft__TransferChallenge *ch = graft__transfer_challenge__unpack(NULL, length, data);
    if (ch != NULL && ch->nonce.len == GRAFT_NONCE_BYTES) {
        memcpy(c->donor_nonce, ch->nonce.data, GRAFT_NONCE_BYTES);
        c->challenged = true;
    }
    graft__transfer_challenge__free_unpacked(ch, NULL);
    return UCS_OK;
}

static ucs_status_t raw_reply_cb(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param)
{
    raw_client_t *c = arg;
    (void)header;
    (void)header_length;
    (void)param;
    Graft__TransferManifest *m = graft__transfer_manifest__unpack(NULL, length, data);
    c->last_status = m != NULL ? m->status : 1;
    graft__transfer_manifest__free_unpacked(m, NULL);
    c->replies++;
    return UCS_OK;
}

/* Push-read answers: a 16-byte header (echo, tag, status) and no bytes
 * when refused. */
static ucs_status_t raw_chunk_cb(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param)
{
    raw_client_t *c = arg;
    (void)data;
    (void)param;
    int32_t st = 1;
    if (header_length == 16 && length == 0)
        memcpy(&st, (const char *)header + 12, sizeof(st));
    c->last_status = st;
    c->replies++;
    return UCS_OK;
}

static void raw_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)arg;
    (void)ep;
    (void)status;
}

static void raw_connect(raw_client_t *c, const char *addr)
{
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_AM};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    struct sockaddr_in sa = {.sin_family = AF_INET};
    char host[32];
    const char *colon = strrchr(addr, ':');
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    assert_int_equal(inet_pton(AF_INET, host, &sa.sin_addr), 1);
    memset(c, 0, sizeof(*c));
    assert_int_equal(ucp_init(&p, NULL, &c->ctx), UCS_OK);
    assert_int_equal(ucp_worker_create(c->ctx, &wp, &c->worker), UCS_OK);
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                               UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                 .id = 12,
                                 .cb = raw_reply_cb,
                                 .arg = c};
    assert_int_equal(ucp_worker_set_am_recv_handler(c->worker, &hp), UCS_OK);
    hp.id = 15;
    hp.cb = raw_chunk_cb;
    assert_int_equal(ucp_worker_set_am_recv_handler(c->worker, &hp), UCS_OK);
    hp.id = GRAFT__XFER_AM_CHALLENGE;
    hp.cb = raw_challenge_cb;
    assert_int_equal(ucp_worker_set_am_recv_handler(c->worker, &hp), UCS_OK);
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                          .sockaddr = {.addr = (struct sockaddr *)&sa, .addrlen = sizeof(sa)},
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {.cb = raw_err_cb}};
    assert_int_equal(ucp_ep_create(c->worker, &ep, &c->ep), UCS_OK);
    /* A donor challenges every connection it accepts. */
    for (int i = 0; i < 2000000 && !c->challenged; i++) {
        ucp_worker_progress(c->worker);
        if (i % 1000 == 999)
            usleep(1000);
    }
    assert_true(c->challenged);
}

/* Sign @p req for client @p c's connection with @p secret, as a recipient
 * does (transfer_auth.c); @p nonce_mac holds the recipient's nonce and
 * receives the MAC. */
static void raw_sign(const raw_client_t *c, const char *secret, Graft__TransferRequest *req,
                     uint8_t nonce[GRAFT_NONCE_BYTES], uint8_t mac[GRAFT_MAC_BYTES])
{
    graft__xfer_request_fields_t fields = {.step = req->step,
                                           .layout_hash = req->layout_hash,
                                           .request_id = req->request_id,
                                           .group = req->recipient_group,
                                           .rank = req->rank};
    memset(nonce, 0x5a, GRAFT_NONCE_BYTES);
    assert_int_equal(graft__xfer_request_mac((const uint8_t *)secret, strlen(secret),
                                             c->donor_nonce, nonce, &fields, mac),
                     GRAFT_OK);
    req->nonce.data = nonce;
    req->nonce.len = GRAFT_NONCE_BYTES;
    req->mac.data = mac;
    req->mac.len = GRAFT_MAC_BYTES;
}

/* Send @p len bytes as active message @p id and wait for the refusal. */
static int32_t raw_send_id(raw_client_t *c, unsigned id, const void *data, size_t len)
{
    static uint64_t header = 0;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_AM_SEND_FLAG_REPLY};
    int before = c->replies;
    ucs_status_ptr_t req = ucp_am_send_nbx(c->ep, id, &header, sizeof(header), data, len, &prm);
    assert_false(UCS_PTR_IS_ERR(req));
    for (int i = 0; i < 2000000 && c->replies == before; i++) {
        ucp_worker_progress(c->worker);
        if (i % 1000 == 999)
            usleep(1000);
    }
    if (UCS_PTR_IS_PTR(req))
        ucp_request_free(req);
    assert_int_equal(c->replies, before + 1);
    return c->last_status;
}

static int32_t raw_send(raw_client_t *c, const void *data, size_t len)
{
    return raw_send_id(c, 11, data, len);
}

static void raw_close(raw_client_t *c)
{
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t req = ucp_ep_close_nbx(c->ep, &prm);
    if (UCS_PTR_IS_PTR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS)
            ucp_worker_progress(c->worker);
        ucp_request_free(req);
    }
    ucp_worker_destroy(c->worker);
    ucp_cleanup(c->ctx);
}

static void test_garbage_clients(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(tf_small_layout, TF_N_SMALL, 256u << 10);
    tf_donor_t *d;

    tf_donors_start(f, &o, 1);
    d = &f->d[0];

    /* A raw TCP client that sends junk to the listener and hangs up. */
    {
        struct sockaddr_in sa = {.sin_family = AF_INET};
        const char *colon = strrchr(d->addr, ':');
        sa.sin_port = htons((uint16_t)atoi(colon + 1));
        inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
        for (int k = 0; k < 3; k++) {
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            assert_true(fd >= 0);
            assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
            uint8_t junk[4096];
            tf_fill_pattern(junk, sizeof(junk), 99 + (uint64_t)k);
            (void)!write(fd, junk, k == 0 ? 3 : sizeof(junk));
            usleep(50000);
            close(fd);
        }
    }

    /* A UCX client: junk, a truncated request, one that knows the job's
     * step but not its secret. */
    raw_client_t c;
    raw_connect(&c, d->addr);
    uint8_t junk[300];
    tf_fill_pattern(junk, sizeof(junk), 7);
    assert_int_equal(raw_send(&c, junk, sizeof(junk)), GRAFT_EPROTO);

    Graft__TransferRequest req = GRAFT__TRANSFER_REQUEST__INIT;
    req.version = 1;
    req.step = STEP;
    req.layout_hash = 0x1234567890abcdefull;
    uint8_t packed[256], nonce[GRAFT_NONCE_BYTES], mac[GRAFT_MAC_BYTES];
    size_t n = graft__transfer_request__pack(&req, packed);
    assert_int_equal(raw_send(&c, packed, n - 3), GRAFT_EPROTO);
    assert_int_equal(raw_send(&c, packed, n), GRAFT_ETOKEN);
    req.version = 9;
    n = graft__transfer_request__pack(&req, packed);
    assert_int_equal(raw_send(&c, packed, n), GRAFT_EFORMAT);
    assert_int_equal(raw_send(&c, "", 0), GRAFT_EFORMAT);
    req.version = 1;
    /* Signed with a wrong secret (the job's name, say): refused. */
    raw_sign(&c, "the-job-name-is-not-a-secret", &req, nonce, mac);
    n = graft__transfer_request__pack(&req, packed);
    assert_int_equal(raw_send(&c, packed, n), GRAFT_ETOKEN);
    /* A MAC of the wrong length: refused. */
    req.mac.len = GRAFT_MAC_BYTES - 1;
    n = graft__transfer_request__pack(&req, packed);
    assert_int_equal(raw_send(&c, packed, n), GRAFT_ETOKEN);
    /* Signed with the secret, the checks that follow speak. */
    raw_sign(&c, SECRET, &req, nonce, mac);
    n = graft__transfer_request__pack(&req, packed);
    assert_int_equal(raw_send(&c, packed, n), GRAFT_ELAYOUT);
    req.step = STEP + 1;
    raw_sign(&c, SECRET, &req, nonce, mac);
    n = graft__transfer_request__pack(&req, packed);
    assert_int_equal(raw_send(&c, packed, n), GRAFT_ESTEP);
    /* The same signed bytes on another connection (another challenge): a
     * replay, refused. */
    raw_client_t c2;
    raw_connect(&c2, d->addr);
    assert_int_equal(raw_send(&c2, packed, n), GRAFT_ETOKEN);
    raw_close(&c2);

    /* Push reads: junk, and a well-formed request without a manifest. */
    assert_int_equal(raw_send_id(&c, 14, junk, sizeof(junk)), GRAFT_EPROTO);
    Graft__ChunkRequest cr = GRAFT__CHUNK_REQUEST__INIT;
    cr.version = 1;
    cr.region = 0;
    cr.chunk = 0;
    n = graft__chunk_request__pack(&cr, packed);
    assert_int_equal(raw_send_id(&c, 14, packed, n), GRAFT_ESTEP);
    raw_close(&c);

    /* The donor is unaffected. */
    tf_recipient_of(f, &o);
    tf_pull_verified(f);
    tf_recipient_destroy(f);
    tf_donors_stop(f, 1);
}

/* Followers (docs/RUNTIME.md, "Follow spares"): a donor admits one only
 * while its serve names GRAFT_TRANSFER_FOLLOWER_GROUP, a follower's done
 * never counts for the recipients' fence (else it could open the fence
 * while a recipient still reads), and one that asks for an earlier step
 * learns the step served. */
static void test_followers(void **state)
{
    tf_t *f = *state;
    tf_donor_opts_t o = tf_opts(tf_small_layout, TF_N_SMALL, 256u << 10);
    const graft_transfer_report_t *rep = &f->rep;
    int32_t out[2];
    tf_donors_start(f, &o, 1);
    tf_donor_ask(&f->d[0], 'G', 2, 1, 5000, out); /* recipient group 2 only */

    tf_recipient_of(f, &o);
    assert_int_equal(graft_transfer_endpoint_group_set(f->r.ep, GRAFT_TRANSFER_FOLLOWER_GROUP),
                     GRAFT_OK);
    f->po.follower = true;
    assert_int_equal(tf_pull(f), GRAFT_ENODONOR);
    assert_int_equal(rep->donors[0].status, GRAFT_ENOTRECIPIENT);
    tf_donor_ask(&f->d[0], 'S', 2, GRAFT_TRANSFER_FOLLOWER_GROUP, 5000, out);
    assert_int_equal(out[0], GRAFT_OK);
    tf_pull_verified(f);
    /* Its done went to the followers, not to the fence. */
    tf_fence_is(&f->d[0], 1, 0, GRAFT_ETIMEOUT, 0);
    tf_donor_ask(&f->d[0], 'L', STEP, 0, 5000, out);
    assert_int_equal(out[1], GRAFT_OK); /* none reading */

    /* An earlier step: a follower takes the step served, on the same
     * connection; any other recipient is refused with the step served. */
    f->po.step = STEP - 1;
    tf_pull_verified(f);
    assert_int_equal(rep->step, STEP);
    assert_int_equal(rep->donors[0].serving_step, STEP);
    f->po.follower = false;
    assert_int_equal(tf_pull(f), GRAFT_ENODONOR);
    assert_int_equal(rep->donors[0].status, GRAFT_ESTEP);
    assert_int_equal(rep->donors[0].serving_step, STEP);
    assert_int_equal(rep->step, STEP - 1);
    f->po.follower = true;
    /* A later step: asked again until the deadline; meanwhile the donor
     * knows a follower wants it, and stops caring once it stopped asking. */
    f->po.step = STEP + 1;
    f->po.connect_timeout_ms = 300;
    f->po.step_retry_ms = 5;
    assert_int_equal(tf_pull(f), GRAFT_ENODONOR);
    assert_int_equal(rep->donors[0].status, GRAFT_ESTEP);
    tf_donor_ask(&f->d[0], 'L', STEP + 1, 0, 5000, out);
    assert_true(out[0]);
    usleep(600000);
    tf_donor_ask(&f->d[0], 'L', STEP + 1, 0, 5000, out);
    assert_false(out[0]);
    tf_recipient_destroy(f);

    /* A recipient of the step still counts, beside the followers. */
    f->po.follower = false;
    f->po.step = STEP;
    f->po.connect_timeout_ms = 0;
    f->po.step_retry_ms = 0;
    tf_recipient_of(f, &o);
    tf_pull_verified(f);
    tf_fence_is(&f->d[0], 1, 1000, GRAFT_OK, 1);
    tf_recipient_destroy(f);
    tf_donors_stop(f, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TF_TEST(test_refusals),
        TF_TEST(test_garbage_clients),
        TF_TEST(test_followers),
    };
    return tf_run_wire("refusals", tests, ARRAY_SIZE(tests));
}
