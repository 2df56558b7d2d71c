/* Status table, logging and allocation hooks of common/. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "alloc_fail.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graft_internal.h"

static void test_status_table(void **state)
{
    (void)state;
    assert_int_equal(GRAFT_OK, 0);
    assert_string_equal(graft_status_string(GRAFT_OK), "success");
    assert_string_equal(graft_status_name(GRAFT_EHASH), "GRAFT_EHASH");
    assert_int_equal(graft_status_class(GRAFT_EHASH), GRAFT_CLASS_CHUNK);
    assert_int_equal(graft_status_class(GRAFT_EPEER_TIMEOUT), GRAFT_CLASS_PEER);
    assert_int_equal(graft_status_class(GRAFT_EDRIFT), GRAFT_CLASS_GROUP);
    assert_int_equal(graft_status_class(GRAFT_EUNREACHABLE), GRAFT_CLASS_JOB);
    assert_int_equal(graft_status_class(GRAFT_EINVAL), GRAFT_CLASS_USAGE);
    assert_int_equal(graft_status_class(GRAFT_ENOSPC), GRAFT_CLASS_SYSTEM);
    assert_string_equal(graft_status_string((graft_status_t)-9999), "unknown status");
    assert_string_equal(graft_status_class_string(GRAFT_CLASS_PEER), "peer");

    /* Every code is negative, unique, and sits in its class's range. */
#define CHECK(name, value, cls, msg)                                                     \
    if (value != 0) {                                                                    \
        assert_true(value < 0);                                                          \
        assert_int_equal(graft_status_class(GRAFT_##name), GRAFT_CLASS_##cls);           \
        int lo = -100 * ((int)GRAFT_CLASS_##cls - 1);                                    \
        assert_true(value <= (lo == 0 ? -1 : lo) && value > lo - 100);                   \
        assert_true(strlen(graft_status_string(GRAFT_##name)) > 0);                      \
    }
    GRAFT_STATUS_MAP(CHECK)
#undef CHECK
}

static void test_log_levels(void **state)
{
    (void)state;
    graft_log_level_t l;
    assert_int_equal(graft_log_level_parse("debug", &l), GRAFT_OK);
    assert_int_equal(l, GRAFT_LOG_DEBUG);
    assert_int_equal(graft_log_level_parse("WARN", &l), GRAFT_OK);
    assert_int_equal(l, GRAFT_LOG_WARN);
    assert_int_equal(graft_log_level_parse("loud", &l), GRAFT_EINVAL);
    assert_int_equal(graft_log_level_parse(NULL, &l), GRAFT_EINVAL);
}

struct captured {
    int calls;
    char last[256];
};

static void capture(graft_log_level_t level, const char *module, const char *message, void *arg)
{
    struct captured *c = arg;
    c->calls++;
    snprintf(c->last, sizeof(c->last), "%d %s %s", (int)level, module, message);
}

static void test_log_sink_and_threshold(void **state)
{
    (void)state;
    struct captured c = {0};
    graft_log_level_t saved = graft_log_level_get();
    graft_log_sink_set(capture, &c);
    graft_log_level_set(GRAFT_LOG_WARN);
    GRAFT_INFO("test", "hidden %d", 1);
    assert_int_equal(c.calls, 0);
    GRAFT_ERROR("test", "shown %d", 2);
    assert_int_equal(c.calls, 1);
    assert_string_equal(c.last, "1 test shown 2");
    graft_log_level_set(GRAFT_LOG_OFF);
    GRAFT_ERROR("test", "dropped");
    assert_int_equal(c.calls, 1);
    graft_log_sink_set(NULL, NULL);
    graft_log_level_set(saved);
}


static void test_buf_and_alloc_failure(void **state)
{
    (void)state;
    graft_buf_t b;
    graft__buf_init(&b);
    assert_int_equal(graft__buf_append(&b, "hello ", 6), GRAFT_OK);
    assert_int_equal(graft__buf_printf(&b, "%s %d", "world", 42), GRAFT_OK);
    assert_string_equal(b.data, "hello world 42");
    graft__buf_consume(&b, 6);
    assert_string_equal(b.data, "world 42");
    assert_int_equal(b.len, 8);
    graft__buf_free(&b);

    graft_test_alloc_fail_after(0);
    assert_null(graft__strdup("x"));
    graft__buf_init(&b);
    assert_int_equal(graft__buf_append(&b, "abc", 3), GRAFT_ENOMEM);
    assert_null(b.data);
    graft_test_alloc_fail_after(1);
    char *s = graft__asprintf("%d-%s", 7, "x");
    assert_non_null(s);
    assert_string_equal(s, "7-x");
    graft_free(s);
    graft_test_alloc_restore();
    assert_null(graft__calloc(SIZE_MAX / 2, 4));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_table),
        cmocka_unit_test(test_log_levels),
        cmocka_unit_test(test_log_sink_and_threshold),
        cmocka_unit_test(test_buf_and_alloc_failure),
    };
    return cmocka_run_group_tests_name("common", tests, NULL, NULL);
}
