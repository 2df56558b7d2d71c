/* The etcd client against a real etcd with authentication enabled (users and
 * roles set up with etcdctl, as an operator would). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <graft/etcd.h>

#include "etcd_fixture.h"

static graft_test_etcd_t T;
static const char *EP;

static void ctl(const char *a0, const char *a1, const char *a2, const char *a3, const char *a4,
                int expect_ok)
{
    const char *args[] = {a0, a1, a2, a3, a4, NULL};
    char out[1024];
    int rc = graft_test_etcdctl(EP, out, sizeof(out), args);
    if (expect_ok && rc != 0)
        fprintf(stderr, "etcdctl %s %s: rc %d: %s\n", a0, a1 ? a1 : "", rc, out);
    if (expect_ok)
        assert_int_equal(rc, 0);
}

static int group_setup(void **state)
{
    (void)state;
    /* Tokens live one second, so the test can see one expire. */
    static const char *const args[] = {"--auth-token=simple", "--auth-token-ttl=1",
                                       "--bcrypt-cost=4", NULL};
    if (graft_test_etcd_start(&T, args) != 0)
        return -1;
    EP = graft_etcd_server_endpoint(T.server);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    graft_test_etcd_stop(&T);
    return 0;
}

static void test_setup_users_and_enable(void **state)
{
    (void)state;
    ctl("user", "add", "root:rootpw", NULL, NULL, 1);
    ctl("role", "add", "root", NULL, NULL, 0); /* may exist already */
    ctl("user", "grant-role", "root", "root", NULL, 1);
    ctl("user", "add", "alice:alicepw", NULL, NULL, 1);
    ctl("role", "add", "jobrw", NULL, NULL, 1);
    const char *perm[] = {"role", "grant-permission", "jobrw", "--prefix=true", "readwrite",
                          "/graft/", NULL};
    assert_int_equal(graft_test_etcdctl(EP, NULL, 0, perm), 0);
    ctl("user", "grant-role", "alice", "jobrw", NULL, 1);
    ctl("auth", "enable", NULL, NULL, NULL, 1);
}

static void test_authenticated_client_works(void **state)
{
    (void)state;
    graft_etcd_t *c = graft_test_etcd_client(&EP, 1, "alice", "alicepw");
    assert_non_null(c);
    int64_t rev = 0;
    assert_int_equal(graft_etcd_put(c, "/graft/a", "1", 1, 0, NULL, &rev), GRAFT_OK);
    graft_etcd_kv_t kv;
    assert_int_equal(graft_etcd_get(c, "/graft/a", &kv, NULL), GRAFT_OK);
    assert_string_equal((char *)kv.value, "1");
    graft_etcd_kv_clear(&kv);
    /* The watch carries the token too. */
    graft_etcd_watch_t *w = NULL;
    assert_int_equal(graft_etcd_watch_create(c, "/graft/", rev, &w), GRAFT_OK);
    graft_etcd_event_t *ev = NULL;
    size_t n = 0;
    for (int i = 0; i < 20 && n == 0; i++)
        assert_int_equal(graft_etcd_watch_next(w, 100, &ev, &n), GRAFT_OK);
    assert_int_equal(n, 1);
    assert_string_equal(ev[0].kv.key, "/graft/a");
    graft_etcd_events_free(ev, n);
    graft_etcd_watch_destroy(w);
    /* Outside her role's prefix: refused as an auth error. */
    assert_int_equal(graft_etcd_put(c, "/other", "1", 1, 0, NULL, NULL), GRAFT_EAUTH);
    graft_etcd_destroy(c);
}

static void test_wrong_password_and_no_credentials(void **state)
{
    (void)state;
    graft_etcd_t *c = graft_test_etcd_client(&EP, 1, "alice", "wrong");
    graft_etcd_kv_t kv;
    assert_int_equal(graft_etcd_get(c, "/graft/a", &kv, NULL), GRAFT_EAUTH);
    graft_etcd_watch_t *w = NULL;
    assert_int_equal(graft_etcd_watch_create(c, "/graft/", 0, &w), GRAFT_EAUTH);
    graft_etcd_destroy(c);
    c = graft_test_etcd_client(&EP, 1, "nobody", "x");
    assert_int_equal(graft_etcd_put(c, "/graft/a", "1", 1, 0, NULL, NULL), GRAFT_EAUTH);
    graft_etcd_destroy(c);
    c = graft_test_etcd_client(&EP, 1, NULL, NULL);
    assert_int_equal(graft_etcd_get(c, "/graft/a", &kv, NULL), GRAFT_EAUTH);
    graft_etcd_destroy(c);
}

static int reauths;
static void count_reauth(graft_log_level_t level, const char *module, const char *message,
                         void *arg)
{
    (void)level;
    (void)module;
    (void)arg;
    if (strstr(message, "authenticating again") != NULL)
        reauths++;
}

static void test_expired_token_reauthenticates(void **state)
{
    (void)state;
    graft_etcd_t *c = graft_test_etcd_client(&EP, 1, "root", "rootpw");
    assert_int_equal(graft_etcd_put(c, "/graft/t", "1", 1, 0, NULL, NULL), GRAFT_OK);
    graft_log_level_t saved = graft_log_level_get();
    reauths = 0;
    graft_log_sink_set(count_reauth, NULL);
    graft_log_level_set(GRAFT_LOG_INFO);
    /* The simple token expires --auth-token-ttl after its last use; etcd's
     * TTL check runs on a one-second timer, so stay idle a little longer. */
    graft_status_t st = GRAFT_OK;
    for (int i = 0; i < 3 && reauths == 0; i++) {
        sleep(3);
        st = graft_etcd_put(c, "/graft/t", "2", 1, 0, NULL, NULL);
        assert_int_equal(st, GRAFT_OK);
    }
    graft_log_sink_set(NULL, NULL);
    graft_log_level_set(saved);
    assert_true(reauths >= 1);
    graft_etcd_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_setup_users_and_enable),
        cmocka_unit_test(test_authenticated_client_works),
        cmocka_unit_test(test_wrong_password_and_no_credentials),
        cmocka_unit_test(test_expired_token_reauthenticates),
    };
    return cmocka_run_group_tests_name("etcd_auth", tests, group_setup, group_teardown);
}
