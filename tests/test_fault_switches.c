/*
 * The fault switches that break recovery on purpose (GRAFT_TEST_SKIP_REGION)
 * and the persistent tier's test hooks (a crash countdown that SIGKILLs
 * the process, delays that slow every chunk) exist only in the test build
 * of the library ($(BUILD)/testlib/, built
 * with -DGRAFT_TEST_FAULTS): no trace of them in the library that is
 * shipped, static or shared, nor in the tools and the example trainer that
 * `make demo` runs. The test build is searched the same way and must have
 * them, so the search itself is shown to find what it looks for.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char build_dir[PATH_MAX];

/* Names a build with the switches compiled in always contains: the
 * variable it reads and the functions that implement it; the persist
 * hooks' variables and function. */
static const char *const traces[] = {"GRAFT_TEST_SKIP_REGION",
                                     "graft__rt_skip_init",
                                     "graft__rt_skip_restore",
                                     "graft__persist_crash_countdown",
                                     "graft__persist_crash_point",
                                     "graft__persist_test_compress_delay_us",
                                     "graft__persist_test_write_delay_us",
                                     "graft__ucx_test_no_ticket"};

/* Whether the file holds needle anywhere (symbol tables, strings, debug
 * information alike). */
static bool file_contains(const char *path, const char *needle)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("%s: not built", path);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long size = ftell(f);
    assert_true(size > 0);
    rewind(f);
    char *buf = malloc((size_t)size);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    bool found = memmem(buf, (size_t)size, needle, strlen(needle)) != NULL;
    free(buf);
    return found;
}

static void check_clean(const char *rel)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/%s", build_dir, rel);
    for (size_t i = 0; i < sizeof(traces) / sizeof(traces[0]); i++)
        if (file_contains(path, traces[i]))
            fail_msg("%s contains \"%s\": a fault switch is in a build that is shipped", path,
                     traces[i]);
}

static void test_shipped_library_has_no_switch(void **state)
{
    (void)state;
    check_clean("lib/libgraft.a");
    check_clean("lib/libgraft.so");
}

static void test_demo_programs_have_no_switch(void **state)
{
    (void)state;
    check_clean("bin/train_mlp");
    check_clean("bin/graft-sim");
}

static void test_test_build_has_the_switch(void **state)
{
    (void)state;
    char path[PATH_MAX + 64];
    const char *rels[] = {"testlib/lib/libgraft-test.a", "testlib/bin/train_mlp"};
    for (size_t r = 0; r < 2; r++) {
        snprintf(path, sizeof(path), "%s/%s", build_dir, rels[r]);
        for (size_t i = 0; i < sizeof(traces) / sizeof(traces[0]); i++)
            if (!file_contains(path, traces[i]))
                fail_msg("%s lacks \"%s\": the test build has no fault switch", path,
                         traces[i]);
    }
}

int main(void)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return 1;
    self[n] = '\0';
    /* BUILD/tests/test_fault_switches -> BUILD */
    *strrchr(self, '/') = '\0';
    *strrchr(self, '/') = '\0';
    snprintf(build_dir, sizeof(build_dir), "%s", self);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped_library_has_no_switch),
        cmocka_unit_test(test_demo_programs_have_no_switch),
        cmocka_unit_test(test_test_build_has_the_switch),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
