/*
 * The shared part of the tests of `graft-sim model` (sim_model_fixture.h).
 */
#include "sim_model_fixture.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char sim_dir[PATH_MAX];

int graft_test_sim_setup(void **state)
{
    (void)state;
    snprintf(sim_dir, sizeof(sim_dir), "%s/graft-sim-test.XXXXXX",
             getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(sim_dir) == NULL ? -1 : 0;
}

int graft_test_sim_teardown(void **state)
{
    (void)state;
    DIR *d = opendir(sim_dir);
    if (d == NULL) {
        return -1;
    }
    struct dirent *e;
    char path[2 * PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(path, sizeof(path), "%s/%s", sim_dir, e->d_name);
            unlink(path);
        }
    }
    closedir(d);
    return rmdir(sim_dir);
}

const char *graft_test_sim_dir(void)
{
    return sim_dir;
}

int graft_test_sim_write(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        return -1;
    }
    int ok = fputs(text, f) >= 0;
    if (fclose(f) != 0) {
        ok = 0;
    }
    return ok ? 0 : -1;
}

char *graft_test_sim_slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0) {
        rewind(f);
        buf = malloc((size_t)n + 1);
    }
    if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf != NULL) {
        buf[n] = '\0';
    }
    fclose(f);
    return buf;
}

/* bin/graft-sim next to the tests/ folder that holds this program. */
static int sim_binary_path(char *bin, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", bin, len - 1);
    if (n <= 0) {
        return -1;
    }
    bin[n] = '\0';
    char *slash = strrchr(bin, '/');
    if (slash == NULL) {
        return -1;
    }
    *slash = '\0';
    slash = strrchr(bin, '/');
    if (slash == NULL) {
        return -1;
    }
    *slash = '\0';
    strncat(bin, "/bin/graft-sim", len - strlen(bin) - 1);
    return 0;
}

int graft_test_sim_run_binary(char *const args[], char *err, size_t errlen)
{
    char bin[PATH_MAX + 32], errpath[PATH_MAX + 16];
    if (sim_binary_path(bin, sizeof(bin)) != 0 || access(bin, X_OK) != 0) {
        snprintf(err, errlen, "%s not built (make tests builds it): %s", bin, strerror(errno));
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    snprintf(errpath, sizeof(errpath), "%s/stderr.txt", sim_dir);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    if (pid == 0) {
        int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int devnull = open("/dev/null", O_WRONLY);
        if (fd < 0 || devnull < 0 || dup2(fd, 2) < 0 || dup2(devnull, 1) < 0) {
            _exit(127);
        }
        char *argv[32];
        int n = 0;
        argv[n++] = bin;
        for (int i = 0; args[i] != NULL && n < 31; i++) {
            argv[n++] = args[i];
        }
        argv[n] = NULL;
        execv(bin, argv);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) {
        snprintf(err, errlen, "%s did not exit", bin);
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    char *text = graft_test_sim_slurp(errpath);
    snprintf(err, errlen, "%s", text != NULL ? text : "");
    free(text);
    return WEXITSTATUS(status);
}
