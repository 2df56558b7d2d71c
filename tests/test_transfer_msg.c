/*
 * Short messages between transfer endpoints (graft_transfer_msg_send /
 * _recv), over real UCX on loopback: order from one sender, the bounds, a
 * peer that is gone, and a stranger's bytes on the port.
 */
#include <graft/transfer.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

static graft_transfer_endpoint_t *endpoint(uint32_t group)
{
    graft_transfer_config_t cfg = {.listen_address = "127.0.0.1", .group = group,
                                   .job_secret = "job-secret-of-the-message-tests",
                                   .job_secret_len = strlen("job-secret-of-the-message-tests")};
    graft_transfer_endpoint_t *ep = NULL;
    assert_int_equal(graft_transfer_endpoint_create(&cfg, &ep), GRAFT_OK);
    return ep;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Messages from one sender arrive whole and in order; an empty inbox
 * times out after about the time asked. */
static void test_msg_in_order(void **state)
{
    (void)state;
    graft_transfer_endpoint_t *a = endpoint(0), *b = endpoint(1);
    const char *to = graft_transfer_endpoint_address(b);
    char buf[GRAFT_TRANSFER_MSG_MAX];
    size_t len = 0;
    for (int i = 0; i < 50; i++) {
        snprintf(buf, sizeof(buf), "message %d", i);
        assert_int_equal(graft_transfer_msg_send(a, to, buf, strlen(buf) + 1, 5000), GRAFT_OK);
    }
    for (int i = 0; i < 50; i++) {
        char want[32];
        snprintf(want, sizeof(want), "message %d", i);
        assert_int_equal(graft_transfer_msg_recv(b, buf, &len, 5000), GRAFT_OK);
        assert_int_equal(len, strlen(want) + 1);
        assert_string_equal(buf, want);
    }
    double t = now_s();
    assert_int_equal(graft_transfer_msg_recv(b, buf, &len, 100), GRAFT_ETIMEOUT);
    double waited = now_s() - t;
    assert_true(waited >= 0.09 && waited < 2.0);
    /* The largest message goes; a longer or empty one is refused here. */
    memset(buf, 'x', sizeof(buf));
    assert_int_equal(graft_transfer_msg_send(a, to, buf, GRAFT_TRANSFER_MSG_MAX, 5000), GRAFT_OK);
    assert_int_equal(graft_transfer_msg_recv(b, buf, &len, 5000), GRAFT_OK);
    assert_int_equal(len, GRAFT_TRANSFER_MSG_MAX);
    assert_int_equal(graft_transfer_msg_send(a, to, buf, GRAFT_TRANSFER_MSG_MAX + 1, 100),
                     GRAFT_EINVAL);
    assert_int_equal(graft_transfer_msg_send(a, to, buf, 0, 100), GRAFT_EINVAL);
    assert_int_equal(graft_transfer_msg_send(a, "not an address", buf, 4, 100), GRAFT_EINVAL);
    graft_transfer_endpoint_destroy(a);
    graft_transfer_endpoint_destroy(b);
}

/* A peer that is gone: the send fails within its timeout instead of
 * hanging, and works again once a peer listens at an address. */
static void test_msg_peer_gone(void **state)
{
    (void)state;
    graft_transfer_endpoint_t *a = endpoint(0), *b = endpoint(1);
    char to[64];
    snprintf(to, sizeof(to), "%s", graft_transfer_endpoint_address(b));
    assert_int_equal(graft_transfer_msg_send(a, to, "hello", 5, 5000), GRAFT_OK);
    graft_transfer_endpoint_destroy(b);
    double t = now_s();
    graft_status_t st = GRAFT_OK;
    /* The first sends after the peer went may still leave this process. */
    for (int i = 0; i < 20 && st == GRAFT_OK; i++)
        st = graft_transfer_msg_send(a, to, "hello", 5, 500);
    assert_int_not_equal(st, GRAFT_OK);
    assert_true(now_s() - t < 15.0);
    graft_transfer_endpoint_t *c = endpoint(2);
    const char *to_c = graft_transfer_endpoint_address(c);
    char buf[GRAFT_TRANSFER_MSG_MAX];
    size_t len = 0;
    assert_int_equal(graft_transfer_msg_send(a, to_c, "again", 5, 5000), GRAFT_OK);
    assert_int_equal(graft_transfer_msg_recv(c, buf, &len, 5000), GRAFT_OK);
    assert_int_equal(len, 5);
    graft_transfer_endpoint_destroy(a);
    graft_transfer_endpoint_destroy(c);
}

/* Many senders at once: none is lost below the inbox's bound. */
static void test_msg_many_senders(void **state)
{
    (void)state;
    enum { SENDERS = 8, EACH = 20 };
    graft_transfer_endpoint_t *rx = endpoint(0), *tx[SENDERS];
    const char *to = graft_transfer_endpoint_address(rx);
    for (int s = 0; s < SENDERS; s++)
        tx[s] = endpoint((uint32_t)s + 1);
    for (int i = 0; i < EACH; i++)
        for (int s = 0; s < SENDERS; s++) {
            uint32_t v = (uint32_t)(s * 1000 + i);
            assert_int_equal(graft_transfer_msg_send(tx[s], to, &v, sizeof(v), 5000), GRAFT_OK);
        }
    int next[SENDERS] = {0};
    for (int k = 0; k < SENDERS * EACH; k++) {
        uint32_t v = 0;
        size_t len = 0;
        assert_int_equal(graft_transfer_msg_recv(rx, &v, &len, 5000), GRAFT_OK);
        assert_int_equal(len, sizeof(v));
        int s = (int)(v / 1000);
        assert_true(s >= 0 && s < SENDERS);
        assert_int_equal((int)(v % 1000), next[s]); /* in order per sender */
        next[s]++;
    }
    for (int s = 0; s < SENDERS; s++)
        graft_transfer_endpoint_destroy(tx[s]);
    graft_transfer_endpoint_destroy(rx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_msg_in_order),
        cmocka_unit_test(test_msg_peer_gone),
        cmocka_unit_test(test_msg_many_senders),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
