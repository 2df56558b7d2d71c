/*
 * The fixture of the tests of `graft-sim run` (header-only, static inline;
 * each test program is one file: test_sim_plan.c, test_sim_live.c,
 * test_sim_netns.c): where the built binaries are, a temporary directory
 * per program, graft-sim run in the foreground with its output captured
 * (run_sim(), run_sim_ok()) or in the background (sim_start()), and its
 * --json report read back (load_json()).
 *
 * A program, start to end:
 *
 *     int main(void)
 *     {
 *         const struct CMUnitTest tests[] = {cmocka_unit_test(test_x)};
 *         return sim_run_tests("plan", tests, ARRAY_SIZE(tests), sim_teardown);
 *     }
 *
 * Its tests write under tmpdir ($TMPDIR/graft-test-sim-plan-XXXXXX here),
 * which the teardown removes; TEST_FILTER=<glob> runs some tests only.
 */
#ifndef GRAFT_TEST_SIM_UTIL_H
#define GRAFT_TEST_SIM_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

static char sim_bin[PATH_MAX + 32];
static char trainer_bin[PATH_MAX + 32];
/* The same trainer linked to the test build of the library (fault switches). */
static char fault_trainer_bin[PATH_MAX + 32];
static char tmpdir[PATH_MAX];
/* "plan", "live", "netns": names the program's temporary directory. */
static const char *sim_prog;

/* ---- graft-sim run -------------------------------------------------------- */

/* Runs graft-sim with argv (NULL-terminated, without the program) and the
 * extra environment (NULL-terminated "K=V"), output into *out_p. */
static inline int run_sim(const char *const *args, const char *const *env, char **out_p)
{
    char outpath[PATH_MAX + 32];
    snprintf(outpath, sizeof(outpath), "%s/out.txt", tmpdir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(outpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) {
            _exit(126);
        }
        dup2(fd, 1);
        dup2(fd, 2);
        for (size_t i = 0; env != NULL && env[i] != NULL; i++) {
            putenv((char *)env[i]);
        }
        const char *argv[64];
        size_t n = 0;
        argv[n++] = sim_bin;
        argv[n++] = "run";
        for (size_t i = 0; args[i] != NULL && n < 63; i++) {
            argv[n++] = args[i];
        }
        argv[n] = NULL;
        execv(sim_bin, (char **)argv);
        _exit(127);
    }
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    if (out_p != NULL) {
        FILE *f = fopen(outpath, "r");
        char *buf = calloc(1, 1 << 20);
        assert_non_null(buf);
        if (f != NULL) {
            /* Keep the end of a long output: that is where the verdict and
             * the reason for a failure are. */
            if (fseek(f, 0, SEEK_END) == 0 && ftell(f) > (1 << 20) - 1) {
                fseek(f, -((1 << 20) - 1), SEEK_END);
            } else {
                rewind(f);
            }
            size_t n = fread(buf, 1, (1 << 20) - 1, f);
            buf[n] = '\0';
            fclose(f);
        }
        *out_p = buf;
    }
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

/* run_sim() that must exit 0: otherwise the test fails with the end of the
 * run's output. Returns the output (free it). Never inlined: inlined into
 * test_live_relays_bit_exact, GCC 12 takes a pointer into the output for
 * one to this function's local `out` (-Wdangling-pointer, an error here);
 * `unused` stands for the `inline` of the others (test_sim_plan has no
 * use for it). */
static __attribute__((noinline, unused)) char *run_sim_ok(const char *const *args,
                                                          const char *const *env)
{
    char *out = NULL;
    int rc = run_sim(args, env, &out);
    if (rc != 0) {
        size_t n = strlen(out);
        print_error("graft-sim run exited %d; its output ends:\n%s\n", rc,
                    out + (n > 6000 ? n - 6000 : 0));
        free(out);
        fail();
    }
    return out;
}

/* Starts `graft-sim run` with @args (NULL-terminated, after "run") in the
 * background, output discarded, with this test's cache and trainer and,
 * when @tmp is not NULL, TMPDIR=@tmp; returns its pid. */
static inline pid_t sim_start(const char *tmp, const char *const *args)
{
    char cache[PATH_MAX + 32], trainer_env[PATH_MAX + 96], tmp_env[PATH_MAX + 32];
    snprintf(cache, sizeof(cache), "GRAFT_SIM_CACHE_DIR=%s/cache", tmpdir);
    snprintf(trainer_env, sizeof(trainer_env), "GRAFT_SIM_TRAINER=%s", trainer_bin);
    snprintf(tmp_env, sizeof(tmp_env), "TMPDIR=%s", tmp != NULL ? tmp : "");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        const char *argv[32];
        size_t n = 0;
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1);
        dup2(fd, 2);
        putenv(cache);
        putenv(trainer_env);
        if (tmp != NULL)
            putenv(tmp_env);
        argv[n++] = sim_bin;
        argv[n++] = "run";
        for (size_t i = 0; args[i] != NULL && n < 31; i++)
            argv[n++] = args[i];
        argv[n] = NULL;
        execv(sim_bin, (char **)argv);
        _exit(127);
    }
    return pid;
}

/* A run's --json report; the test fails if it cannot be read. */
static inline json_t *load_json(const char *path)
{
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (j == NULL) {
        fail_msg("%s: %s", path, jerr.text);
    }
    return j;
}

/* ---- setup, teardown, main -------------------------------------------------- */

/* Before the program's tests: its temporary directory. */
static inline int sim_setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "%s/graft-test-sim-%s-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", sim_prog);
    return mkdtemp(tmpdir) != NULL ? 0 : -1;
}

/* After them: the directory removed, with whatever the tests left there. */
static inline int sim_teardown(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Runs @n @tests as group "sim_@prog", between sim_setup() and @teardown
 * (sim_teardown() or one that ends with it), with the binaries found next
 * to this program: BUILD/tests/test_sim_* -> BUILD/bin/graft-sim,
 * BUILD/bin/train_mlp, BUILD/testlib/bin/train_mlp. Returns the number of
 * failures, 1 when this program's own path cannot be read. */
static inline int sim_run_tests(const char *prog, const struct CMUnitTest *tests, size_t n,
                                CMFixtureFunction teardown)
{
    char self_path[PATH_MAX], dir[PATH_MAX], name[64];
    ssize_t len = readlink("/proc/self/exe", self_path, sizeof(self_path) - 1);
    if (len <= 0) {
        return 1;
    }
    self_path[len] = '\0';
    snprintf(dir, sizeof(dir), "%s", self_path);
    *strrchr(dir, '/') = '\0';
    snprintf(sim_bin, sizeof(sim_bin), "%s/../bin/graft-sim", dir);
    snprintf(trainer_bin, sizeof(trainer_bin), "%s/../bin/train_mlp", dir);
    snprintf(fault_trainer_bin, sizeof(fault_trainer_bin), "%s/../testlib/bin/train_mlp", dir);
    sim_prog = prog;
    if (getenv("TEST_FILTER") != NULL) {
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    }
    snprintf(name, sizeof(name), "sim_%s", prog);
    return _cmocka_run_group_tests(name, tests, n, sim_setup, teardown);
}

#endif
