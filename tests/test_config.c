/* The runtime's configuration: setters, environment, validation messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "alloc_fail.h"

#include <stdlib.h>
#include <string.h>

#include <graft/graft.h>

static graft_config_t *valid_config(void)
{
    graft_config_t *c = NULL;
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "job", "llm", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "groups", "4", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "group", "2", NULL), GRAFT_OK);
    return c;
}

static void expect_invalid(graft_config_t *c, const char *field)
{
    char *err = NULL;
    assert_int_equal(graft_config_validate(c, &err), GRAFT_EINVAL);
    assert_non_null(err);
    if (strstr(err, field) == NULL)
        fail_msg("error '%s' does not name '%s'", err, field);
    graft_free(err);
}

static void test_defaults_and_roundtrip(void **state)
{
    (void)state;
    graft_config_t *c = valid_config();
    char *err = NULL;
    assert_int_equal(graft_config_validate(c, &err), GRAFT_OK);
    assert_null(err);

    char *v = NULL;
    assert_int_equal(graft_config_get(c, "lease_ttl_ms", &v), GRAFT_OK);
    assert_string_equal(v, "3000");
    graft_free(v);
    assert_int_equal(graft_config_get(c, "mode", &v), GRAFT_OK);
    assert_string_equal(v, "strict");
    graft_free(v);
    assert_int_equal(graft_config_get(c, "persist_root", &v), GRAFT_OK);
    assert_string_equal(v, "");
    graft_free(v);
    assert_int_equal(graft_config_set(c, "etcd_endpoints", "http://a:1,http://b:2", NULL),
                     GRAFT_OK);
    assert_int_equal(graft_config_get(c, "etcd_endpoints", &v), GRAFT_OK);
    assert_string_equal(v, "http://a:1,http://b:2");
    graft_free(v);
    assert_int_equal(graft_config_get(c, "no_such", &v), GRAFT_ENOTFOUND);
    graft_config_destroy(c);
    graft_config_destroy(NULL);
}

/* etcdctl's form of an endpoint (no scheme) is refused at validation, the
 * reason in the message that reaches the caller; the connect bound is a
 * setting with a default of 10 s. */
static void test_endpoint_without_scheme(void **state)
{
    (void)state;
    graft_config_t *c = valid_config();
    char *err = NULL;
    char *v = NULL;
    assert_int_equal(graft_config_get(c, "etcd_connect_timeout_ms", &v), GRAFT_OK);
    assert_string_equal(v, "10000");
    graft_free(v);
    assert_int_equal(graft_config_set(c, "etcd_endpoints", "http://a:1,127.0.0.1:23791", NULL),
                     GRAFT_OK);
    assert_int_equal(graft_config_validate(c, &err), GRAFT_EINVAL);
    assert_non_null(strstr(err, "'127.0.0.1:23791' is not an http(s) URL"));
    graft_free(err);
    assert_int_equal(graft_config_set(c, "etcd_endpoints", "https://a:1,http://b:2", NULL),
                     GRAFT_OK);
    assert_int_equal(graft_config_validate(c, NULL), GRAFT_OK);
    graft_config_destroy(c);
}

static void test_bad_values_name_the_field(void **state)
{
    (void)state;
    graft_config_t *c = valid_config();
    char *err = NULL;
    assert_int_equal(graft_config_set(c, "lease_ttl_ms", "-5", &err), GRAFT_EINVAL);
    assert_non_null(strstr(err, "lease_ttl_ms"));
    graft_free(err);
    assert_int_equal(graft_config_set(c, "lease_ttl_ms", "12x", &err), GRAFT_EINVAL);
    graft_free(err);
    assert_int_equal(graft_config_set(c, "lease_ttl_ms", "10", &err), GRAFT_EINVAL);
    assert_non_null(strstr(err, "out of range"));
    graft_free(err);
    assert_int_equal(graft_config_set(c, "mode", "sloppy", &err), GRAFT_EINVAL);
    assert_non_null(strstr(err, "mode"));
    graft_free(err);
    /* The runtime's timeouts and the persist compression level. */
    assert_int_equal(graft_config_set(c, "persist_compression", "20", &err), GRAFT_EINVAL);
    assert_non_null(strstr(err, "persist_compression"));
    graft_free(err);
    assert_int_equal(graft_config_set(c, "fence_timeout_ms", "0", &err), GRAFT_EINVAL);
    assert_non_null(strstr(err, "fence_timeout_ms"));
    graft_free(err);
    assert_int_equal(graft_config_set(c, "persist_compression", "fast", &err), GRAFT_EINVAL);
    assert_non_null(strstr(err, "or auto"));
    graft_free(err);
    char *v = NULL;
    /* The compression level defaults to persist's adaptive level, and takes
     * a zstd level or "auto" back. */
    assert_int_equal(graft_config_get(c, "persist_compression", &v), GRAFT_OK);
    assert_string_equal(v, "auto");
    graft_free(v);
    assert_int_equal(graft_config_set(c, "persist_compression", "3", NULL), GRAFT_OK);
    assert_int_equal(graft_config_get(c, "persist_compression", &v), GRAFT_OK);
    assert_string_equal(v, "3");
    graft_free(v);
    assert_int_equal(graft_config_set(c, "persist_compression", "auto", NULL), GRAFT_OK);
    assert_int_equal(graft_config_get(c, "persist_compression", &v), GRAFT_OK);
    assert_string_equal(v, "auto");
    graft_free(v);
    assert_int_equal(graft_config_get(c, "quorum_timeout_ms", &v), GRAFT_OK);
    assert_string_equal(v, "300000");
    graft_free(v);
    assert_int_equal(graft_config_set(c, "stall_timeout_ms", "250", NULL), GRAFT_OK);
    assert_int_equal(graft_config_get(c, "stall_timeout_ms", &v), GRAFT_OK);
    assert_string_equal(v, "250");
    graft_free(v);
    /* The transfer backend: a word from a list, named in the error. */
    assert_int_equal(graft_config_get(c, "transfer_backend", &v), GRAFT_OK);
    assert_string_equal(v, "ucx");
    graft_free(v);
    assert_int_equal(graft_config_set(c, "transfer_backend", "rdma", &err), GRAFT_EINVAL);
    assert_string_equal(err, "config: transfer_backend: 'rdma' is not ucx or nccl");
    graft_free(err);
    assert_int_equal(graft_config_set(c, "mode", "loose", &err), GRAFT_EINVAL);
    assert_string_equal(err, "config: mode: 'loose' is not strict or elastic");
    graft_free(err);
    assert_int_equal(graft_config_set(c, "cuda_device", "1024", &err), GRAFT_EINVAL);
    assert_non_null(strstr(err, "cuda_device"));
    graft_free(err);
    assert_int_equal(graft_config_set(c, "transfer_backend", "nccl", NULL), GRAFT_OK);
    assert_int_equal(graft_config_get(c, "transfer_backend", &v), GRAFT_OK);
    assert_string_equal(v, "nccl");
    graft_free(v);
#ifdef GRAFT_HAVE_CUDA
    assert_int_equal(graft_config_validate(c, NULL), GRAFT_OK);
#else
    /* A build without CUDA says so at validation, naming the field. */
    assert_int_equal(graft_config_validate(c, &err), GRAFT_EINVAL);
    assert_non_null(strstr(err, "transfer_backend: nccl needs a build with CUDA"));
    graft_free(err);
#endif
    assert_int_equal(graft_config_set(c, "transfer_backend", "ucx", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "colour", "blue", &err), GRAFT_ENOTFOUND);
    assert_non_null(strstr(err, "colour"));
    graft_free(err);
    graft_config_destroy(c);
}

static void test_validation(void **state)
{
    (void)state;
    graft_config_t *c = NULL;
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    expect_invalid(c, "job");
    assert_int_equal(graft_config_set(c, "job", "a/b", NULL), GRAFT_OK);
    expect_invalid(c, "job");
    assert_int_equal(graft_config_set(c, "job", "ok", NULL), GRAFT_OK);
    expect_invalid(c, "groups");
    assert_int_equal(graft_config_set(c, "groups", "4", NULL), GRAFT_OK);
    expect_invalid(c, "group");
    /* A spare has no group until it is promoted; 2 is no yes or no. */
    assert_int_equal(graft_config_set(c, "spare", "2", NULL), GRAFT_EINVAL);
    assert_int_equal(graft_config_set(c, "spare", "1", NULL), GRAFT_OK);
    assert_int_equal(graft_config_validate(c, NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "spare_group", "world/1", NULL), GRAFT_OK);
    expect_invalid(c, "spare_group");
    assert_int_equal(graft_config_set(c, "spare_group", "world-1.a_b", NULL), GRAFT_OK);
    assert_int_equal(graft_config_validate(c, NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "spare_follow", "2", NULL), GRAFT_EINVAL);
    assert_int_equal(graft_config_set(c, "spare_follow", "1", NULL), GRAFT_OK);
    assert_int_equal(graft_config_validate(c, NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "spare", "0", NULL), GRAFT_OK);
    expect_invalid(c, "group");
    assert_int_equal(graft_config_set(c, "group", "4", NULL), GRAFT_OK);
    expect_invalid(c, "spare_follow"); /* only a spare follows */
    assert_int_equal(graft_config_set(c, "spare_follow", "0", NULL), GRAFT_OK);
    expect_invalid(c, "group");
    assert_int_equal(graft_config_set(c, "group", "3", NULL), GRAFT_OK);
    assert_int_equal(graft_config_validate(c, NULL), GRAFT_OK);

    assert_int_equal(graft_config_set(c, "rank", "2", NULL), GRAFT_OK);
    expect_invalid(c, "rank");
    assert_int_equal(graft_config_set(c, "ranks_per_group", "4", NULL), GRAFT_OK);
    assert_int_equal(graft_config_validate(c, NULL), GRAFT_OK);

    assert_int_equal(graft_config_set(c, "min_groups", "2", NULL), GRAFT_OK);
    expect_invalid(c, "min_groups"); /* strict needs all groups */
    assert_int_equal(graft_config_set(c, "mode", "elastic", NULL), GRAFT_OK);
    assert_int_equal(graft_config_validate(c, NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "min_groups", "5", NULL), GRAFT_OK);
    expect_invalid(c, "min_groups");
    assert_int_equal(graft_config_set(c, "min_groups", "1", NULL), GRAFT_OK);

    assert_int_equal(graft_config_set(c, "etcd_user", "root", NULL), GRAFT_OK);
    expect_invalid(c, "etcd_password");
    assert_int_equal(graft_config_set(c, "etcd_password", "pw", NULL), GRAFT_OK);
    assert_int_equal(graft_config_set(c, "persist_second_root", "/mnt/x", NULL), GRAFT_OK);
    expect_invalid(c, "persist_second_root");
    assert_int_equal(graft_config_set(c, "persist_root", "/tmp/ck", NULL), GRAFT_OK);
    assert_int_equal(graft_config_validate(c, NULL), GRAFT_OK);
    graft_config_destroy(c);
}

static void test_from_env(void **state)
{
    (void)state;
    graft_config_t *c = NULL;
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    setenv("GRAFT_JOB", "envjob", 1);
    setenv("GRAFT_GROUPS", "8", 1);
    setenv("GRAFT_GROUP", "7", 1);
    setenv("GRAFT_MODE", "elastic", 1);
    setenv("GRAFT_MIN_GROUPS", "6", 1);
    setenv("GRAFT_CUDA_DEVICE", "3", 1);
    assert_int_equal(graft_config_from_env(c, NULL), GRAFT_OK);
    assert_int_equal(graft_config_validate(c, NULL), GRAFT_OK);
    char *v = NULL;
    assert_int_equal(graft_config_get(c, "job", &v), GRAFT_OK);
    assert_string_equal(v, "envjob");
    graft_free(v);
    assert_int_equal(graft_config_get(c, "cuda_device", &v), GRAFT_OK);
    assert_string_equal(v, "3");
    graft_free(v);

    char *err = NULL;
    setenv("GRAFT_JOIN_TIMEOUT_MS", "soon", 1);
    assert_int_equal(graft_config_from_env(c, &err), GRAFT_EINVAL);
    assert_non_null(strstr(err, "GRAFT_JOIN_TIMEOUT_MS"));
    graft_free(err);
    unsetenv("GRAFT_JOIN_TIMEOUT_MS");
    unsetenv("GRAFT_JOB");
    unsetenv("GRAFT_GROUPS");
    unsetenv("GRAFT_GROUP");
    unsetenv("GRAFT_MODE");
    unsetenv("GRAFT_MIN_GROUPS");
    unsetenv("GRAFT_CUDA_DEVICE");
    graft_config_destroy(c);
}

/* Fail every allocation in turn: each call either succeeds or reports
 * GRAFT_ENOMEM, and nothing leaks (checked under SAN=1). */

static void test_allocation_failures(void **state)
{
    (void)state;
    bool completed = false;
    for (int n = 0; n < 64 && !completed; n++) {
        graft_test_alloc_fail_after(n);
        graft_config_t *c = NULL;
        graft_status_t st = graft_config_create(&c);
        if (st == GRAFT_OK) {
            st = graft_config_set(c, "job", "x", NULL);
            if (st == GRAFT_OK)
                completed = true;
            else
                assert_int_equal(st, GRAFT_ENOMEM);
        } else {
            assert_int_equal(st, GRAFT_ENOMEM);
        }
        graft_config_destroy(c);
        graft_test_alloc_restore();
    }
    assert_true(completed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_roundtrip),
        cmocka_unit_test(test_bad_values_name_the_field),
        cmocka_unit_test(test_endpoint_without_scheme),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_from_env),
        cmocka_unit_test(test_allocation_failures),
    };
    return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
