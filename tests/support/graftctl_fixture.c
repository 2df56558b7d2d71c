/* Helpers of the graftctl tests (graftctl_fixture.h). */
#include "graftctl_fixture.h"

char gc_ctl_bin[PATH_MAX + 32];

char gc_sim_bin[PATH_MAX + 32];

char gc_tmpdir[PATH_MAX];

graft_test_etcd_t gc_etcd;

const char *gc_endpoint;

char *gc_slurp(const char *path)
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

/* A copy of graftctl that nobody can run, in a fresh 0755 directory under
 * /tmp: the checkout's build dir may sit under a directory nobody cannot
 * enter (root's 0700 home, a `mktemp -d` folder), and then execv of the
 * original fails. graftctl links libgraft statically, so the binary alone
 * is enough. Writes the directory into dir (removed by the caller). */
static void gc_nobody_ctl_copy(char *dir, size_t dir_size, char *bin, size_t bin_size)
{
    snprintf(dir, dir_size, "/tmp/graft-test-nobody-XXXXXX");
    assert_non_null(mkdtemp(dir));
    assert_int_equal(chmod(dir, 0755), 0);
    snprintf(bin, bin_size, "%s/graftctl", dir);
    gc_sh("cp '%s' '%s' && chmod 0755 '%s'", gc_ctl_bin, bin, bin);
}

int gc_run_ctl_as(bool as_nobody, const char *const *args, char **out_p, char **err_p)
{
    char outpath[PATH_MAX + 32], errpath[PATH_MAX + 32];
    char copy_dir[64] = "", copy_bin[96];
    const char *bin = gc_ctl_bin;
    if (as_nobody) {
        gc_nobody_ctl_copy(copy_dir, sizeof(copy_dir), copy_bin, sizeof(copy_bin));
        bin = copy_bin;
    }
    snprintf(outpath, sizeof(outpath), "%s/ctl.out", gc_tmpdir);
    snprintf(errpath, sizeof(errpath), "%s/ctl.err", gc_tmpdir);
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
        gc_sh("rm -rf '%s'", copy_dir);
    char *out = gc_slurp(outpath), *err = gc_slurp(errpath);
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

int gc_run_ctl(const char *const *args, char **out_p, char **err_p)
{
    return gc_run_ctl_as(false, args, out_p, err_p);
}

json_t *gc_ctl_json(const char *const *args)
{
    char *out = NULL, *err = NULL;
    int rc = gc_run_ctl(args, &out, &err);
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

void gc_sh(const char *fmt, ...)
{
    char cmd[4 * PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    assert_int_equal(system(cmd), 0);
}

void gc_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

const char *gc_group_field(json_t *status, int group, const char *field)
{
    size_t i;
    json_t *g;
    json_array_foreach(json_object_get(status, "groups"), i, g)
        if (json_integer_value(json_object_get(g, "group")) == group)
            return json_string_value(json_object_get(g, field));
    return NULL;
}

const char *gc_group_health(json_t *status, int group)
{
    const char *h = gc_group_field(status, group, "health");
    return h != NULL ? h : "absent";
}

pid_t gc_spawn_logged(const char *const *argv, const char *name)
{
    char log[PATH_MAX + 128];
    snprintf(log, sizeof(log), "%s/%s", gc_tmpdir, name);
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

void gc_tmp_file_write(char *path, size_t len, const char *name, const char *text)
{
    snprintf(path, len, "%s/%s", gc_tmpdir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_true(fputs(text, f) >= 0);
    assert_int_equal(fclose(f), 0);
}

void gc_sim_job_wait(const char *root, char *job, size_t len)
{
    for (int i = 0; i < 600 && job[0] == '\0'; i++) {
        DIR *d = opendir(root);
        for (struct dirent *e = d ? readdir(d) : NULL; e != NULL; e = readdir(d))
            if (strncmp(e->d_name, "sim-", 4) == 0)
                snprintf(job, len, "%.120s", e->d_name);
        if (d != NULL)
            closedir(d);
        if (job[0] == '\0')
            gc_sleep_ms(100);
    }
    assert_true(job[0] != '\0');
}

int gc_setup(void **state)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return -1;
    self[n] = '\0';
    *strrchr(self, '/') = '\0';
    snprintf(gc_ctl_bin, sizeof(gc_ctl_bin), "%s/../bin/graftctl", self);
    snprintf(gc_sim_bin, sizeof(gc_sim_bin), "%s/../bin/graft-sim", self);
    snprintf(gc_tmpdir, sizeof(gc_tmpdir), "/tmp/graft-test-graftctl-XXXXXX");
    if (mkdtemp(gc_tmpdir) == NULL)
        return -1;
    if (graft_test_etcd_start(&gc_etcd, NULL) != 0)
        return -1;
    gc_endpoint = graft_etcd_server_endpoint(gc_etcd.server);
    return 0;
}

int gc_teardown(void **state)
{
    char cmd[PATH_MAX + 32];
    graft_test_etcd_stop(&gc_etcd);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", gc_tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}
