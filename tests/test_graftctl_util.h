/*
 * Helpers of the graftctl tests (header-only, static; each test program is
 * one file): the binaries next to the test program, a temporary directory,
 * the test's etcd, and running graftctl with its output captured.
 */
#ifndef GRAFT_TEST_GRAFTCTL_UTIL_H
#define GRAFT_TEST_GRAFTCTL_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <graft/membership.h>

#include "etcd_fixture.h"


static char ctl_bin[PATH_MAX + 32];
static char sim_bin[PATH_MAX + 32];
static char tmpdir[PATH_MAX];
static graft_test_etcd_t etcd;
static const char *endpoint;

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return strdup("");
    char *buf = calloc(1, 8 << 20);
    assert_non_null(buf);
    size_t n = fread(buf, 1, (8 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void sh(const char *fmt, ...);

/* A copy of graftctl that nobody can run, in a fresh 0755 directory under
 * /tmp: the checkout's build dir may sit under a directory nobody cannot
 * enter (root's 0700 home, a `mktemp -d` folder), and then execv of the
 * original fails. graftctl links libgraft statically, so the binary alone
 * is enough. Writes the directory into dir (removed by the caller). */
static void nobody_ctl_copy(char *dir, size_t dir_size, char *bin, size_t bin_size)
{
    snprintf(dir, dir_size, "/tmp/graft-test-nobody-XXXXXX");
    assert_non_null(mkdtemp(dir));
    assert_int_equal(chmod(dir, 0755), 0);
    snprintf(bin, bin_size, "%s/graftctl", dir);
    sh("cp '%s' '%s' && chmod 0755 '%s'", ctl_bin, bin, bin);
}

/* Runs graftctl with args (NULL-terminated, without the program); stdout
 * and stderr into *out_p and *err_p (either may be NULL); stdin is
 * /dev/null. With as_nobody, the child drops root first and runs a copy of
 * graftctl that nobody can reach (nobody_ctl_copy); the exit status is 127
 * when even that copy cannot be run. */
static int run_ctl_as(bool as_nobody, const char *const *args, char **out_p, char **err_p)
{
    char outpath[PATH_MAX + 32], errpath[PATH_MAX + 32];
    char copy_dir[64] = "", copy_bin[96];
    const char *bin = ctl_bin;
    if (as_nobody) {
        nobody_ctl_copy(copy_dir, sizeof(copy_dir), copy_bin, sizeof(copy_bin));
        bin = copy_bin;
    }
    snprintf(outpath, sizeof(outpath), "%s/ctl.out", tmpdir);
    snprintf(errpath, sizeof(errpath), "%s/ctl.err", tmpdir);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int o = open(outpath, O_WRONLY | O_CREAT | O_TRUNC, 0666);
        int e = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0666);
        int in = open("/dev/null", O_RDONLY);
        if (o < 0 || e < 0 || in < 0)
            _exit(126);
        dup2(in, 0);
        dup2(o, 1);
        dup2(e, 2);
        if (as_nobody && (setgid(65534) != 0 || setuid(65534) != 0))
            _exit(125);
        const char *argv[64];
        size_t n = 0;
        argv[n++] = bin;
        for (size_t i = 0; args[i] != NULL && n < 63; i++)
            argv[n++] = args[i];
        argv[n] = NULL;
        execv(bin, (char **)argv);
        _exit(127);
    }
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    if (copy_dir[0] != '\0')
        sh("rm -rf '%s'", copy_dir);
    char *out = slurp(outpath), *err = slurp(errpath);
    if (out_p != NULL)
        *out_p = out;
    else
        free(out);
    if (err_p != NULL)
        *err_p = err;
    else
        free(err);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

static int run_ctl(const char *const *args, char **out_p, char **err_p)
{
    return run_ctl_as(false, args, out_p, err_p);
}

/* Runs graftctl, expects exit 0 and JSON on stdout. */
static json_t *ctl_json(const char *const *args)
{
    char *out = NULL, *err = NULL;
    int rc = run_ctl(args, &out, &err);
    if (rc != 0)
        print_error("graftctl %s %s exited %d: %s\n", args[0], args[1] ? args[1] : "", rc, err);
    assert_int_equal(rc, 0);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    if (j == NULL)
        print_error("not JSON (%s): %s\n", je.text, out);
    assert_non_null(j);
    free(out);
    free(err);
    return j;
}

static void sh(const char *fmt, ...)
{
    char cmd[4 * PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    assert_int_equal(system(cmd), 0);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A string field of a group in graftctl status (NULL: no such group or
 * field). */
static inline const char *group_field(json_t *status, int group, const char *field)
{
    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(status, "groups"), i, g)
        if (json_integer_value(json_object_get(g, "group")) == group)
            return json_string_value(json_object_get(g, field));
    return NULL;
}

/* The health graftctl status gives a group ("absent" if it has none). */
static const char *group_health(json_t *status, int group)
{
    const char *h = group_field(status, group, "health");
    return h != NULL ? h : "absent";
}

/* Starts argv[0] with argv, stdout and stderr into log (tmpdir/<name>);
 * the child's pid. */
static inline pid_t spawn_logged(const char *const *argv, const char *name)
{
    char log[PATH_MAX + 128];
    snprintf(log, sizeof(log), "%s/%s", tmpdir, name);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], (char **)argv);
        _exit(127);
    }
    return pid;
}

/* Writes text into tmpdir/name; its path into path (len bytes). */
static inline void tmp_file_write(char *path, size_t len, const char *name, const char *text)
{
    snprintf(path, len, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_true(fputs(text, f) >= 0);
    assert_int_equal(fclose(f), 0);
}

/* The job of a `graft-sim run --persist-root root`: the folder the run
 * makes under its persist root (waits up to 60 s). */
static inline void sim_job_wait(const char *root, char *job, size_t len)
{
    for (int i = 0; i < 600 && job[0] == '\0'; i++) {
        DIR *d = opendir(root);
        for (struct dirent *e = d ? readdir(d) : NULL; e != NULL; e = readdir(d))
            if (strncmp(e->d_name, "sim-", 4) == 0)
                snprintf(job, len, "%.120s", e->d_name);
        if (d != NULL)
            closedir(d);
        if (job[0] == '\0')
            sleep_ms(100);
    }
    assert_true(job[0] != '\0');
}

/* Group set-up: the binaries next to this program (BUILD/tests/x ->
 * BUILD/bin/graftctl, BUILD/bin/graft-sim), a temporary directory and an
 * etcd. */
static int graftctl_test_setup(void **state)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return -1;
    self[n] = '\0';
    *strrchr(self, '/') = '\0';
    snprintf(ctl_bin, sizeof(ctl_bin), "%s/../bin/graftctl", self);
    snprintf(sim_bin, sizeof(sim_bin), "%s/../bin/graft-sim", self);
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/graft-test-graftctl-XXXXXX");
    if (mkdtemp(tmpdir) == NULL)
        return -1;
    if (graft_test_etcd_start(&etcd, NULL) != 0)
        return -1;
    endpoint = graft_etcd_server_endpoint(etcd.server);
    return 0;
}

static int graftctl_test_teardown(void **state)
{
    char cmd[PATH_MAX + 32];
    graft_test_etcd_stop(&etcd);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

#endif
