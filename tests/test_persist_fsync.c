/*
 * Directory durability. A file's name lives in its directory, so a new
 * directory is only durable once its parent has been fsynced. This program
 * interposes fsync() (every call of the program, the library's included,
 * lands here and goes on to the real system call) and records which
 * directories were fsynced, in order, to check that creating a checkpoint
 * directory (local root and second tier) fsyncs the directory that holds it
 * before the checkpoint is reported durable, and that directories that
 * already exist cost no fsync. It also plays a full disk: an fsync of a
 * file under `enospc_under` fails with ENOSPC, as it does when the disk
 * fills up while the page cache is written back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "persist/persist_internal.h"
#include "persist_fixture.h"

#define LOG_MAX 256

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char dir_log[LOG_MAX][PATH_MAX];
static int dir_n;
static int file_n;
/* Real path of a directory whose files' fsyncs fail with ENOSPC; "": none. */
static char enospc_under[PATH_MAX];

int fsync(int fd)
{
    struct stat sb;
    bool full = false;
    if (fstat(fd, &sb) == 0) {
        char link[64], path[PATH_MAX];
        snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, path, sizeof(path) - 1);
        path[n > 0 ? n : 0] = '\0';
        pthread_mutex_lock(&log_mu);
        if (S_ISDIR(sb.st_mode) && n > 0 && dir_n < LOG_MAX) {
            strcpy(dir_log[dir_n++], path);
        } else if (S_ISREG(sb.st_mode)) {
            file_n++;
            full = enospc_under[0] != '\0' &&
                   strncmp(path, enospc_under, strlen(enospc_under)) == 0;
        }
        pthread_mutex_unlock(&log_mu);
    }
    if (full) {
        errno = ENOSPC;
        return -1;
    }
    return (int)syscall(SYS_fsync, fd);
}

static void disk_full_under(const char *dir)
{
    pthread_mutex_lock(&log_mu);
    if (dir == NULL)
        enospc_under[0] = '\0';
    else
        assert_non_null(realpath(dir, enospc_under));
    pthread_mutex_unlock(&log_mu);
}

static void log_clear(void)
{
    pthread_mutex_lock(&log_mu);
    dir_n = 0;
    file_n = 0;
    pthread_mutex_unlock(&log_mu);
}

/* Index of the first (last) fsync of @p dir, -1 if none. */
static int log_find(const char *dir, bool last)
{
    char real[PATH_MAX];
    if (realpath(dir, real) == NULL)
        return -1;
    int at = -1;
    pthread_mutex_lock(&log_mu);
    for (int i = 0; i < dir_n && (last || at < 0); i++)
        if (strcmp(dir_log[i], real) == 0)
            at = i;
    pthread_mutex_unlock(&log_mu);
    return at;
}

static char *join(const char *a, const char *b)
{
    char *p = malloc(strlen(a) + strlen(b) + 2);
    sprintf(p, "%s/%s", a, b);
    return p;
}

static void save_one(const char *root, const char *second_root, uint64_t step)
{
    pt_global_t *g = pt_global_small(step);
    pt_layout_t *lay = pt_global_split(g, 2);
    graft_persist_config_t cfg = {.root = root, .second_root = second_root, .chunk_bytes = 4096};
    graft_persist_writer_t *w;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    graft_persist_write_result_t res;
    assert_int_equal(graft_persist_save(w, step, 2,
                                        (const graft_persist_region_t *const *)lay->regions,
                                        lay->nregions, NULL),
                     GRAFT_OK);
    assert_int_equal(graft_persist_wait(w, step, &res), GRAFT_OK);
    assert_int_equal(res.second_tier_status, GRAFT_OK);
    graft_persist_writer_destroy(w);
    pt_layout_free(lay);
    pt_global_free(g);
}

static void test_new_dirs_reach_their_parent(void **state)
{
    (void)state;
    char *tmp = pt_tmpdir();
    char *a = join(tmp, "a");
    char *root = join(a, "root");
    char *second = join(tmp, "second");
    char *step_dir = pt_path(root, 5, "");
    char *second_step = pt_path(second, 5, "");
    log_clear();
    save_one(root, second, 5);
    /* The interposer sees the library's fsyncs: the renames inside the
     * step directory have always fsynced it. */
    int step_last = log_find(step_dir, true);
    assert_true(step_last >= 0);
    assert_true(file_n > 0);
    /* The chain of new directories: tmp holds a/ and second/, a/ holds
     * root/, root/ holds step-5/, second/ holds its step-5/. */
    assert_true(log_find(tmp, false) >= 0);
    assert_true(log_find(a, false) >= 0);
    int root_at = log_find(root, false);
    assert_true(root_at >= 0);
    /* before the manifest's commit (the last fsync of the step directory) */
    assert_true(root_at < step_last);
    int second_at = log_find(second, false);
    int second_step_last = log_find(second_step, true);
    assert_true(second_at >= 0);
    assert_true(second_step_last >= 0);
    assert_true(second_at < second_step_last);
    free(second_step);
    free(step_dir);
    free(second);
    free(root);
    free(a);
    pt_rmtree(tmp);
}

static void test_existing_dirs_cost_nothing(void **state)
{
    (void)state;
    char *root = pt_tmpdir();
    char *step_dir = pt_path(root, 9, "");
    assert_int_equal(mkdir(step_dir, 0755), 0);
    log_clear();
    assert_int_equal(graft__persist_mkdirs(root, 0), GRAFT_OK);
    assert_int_equal(graft__persist_mkdirs(step_dir, 0), GRAFT_OK);
    assert_int_equal(dir_n, 0);
    /* Two new levels: exactly their two parents, outermost first. */
    char *x = join(root, "x");
    char *xy = join(x, "y/");
    assert_int_equal(graft__persist_mkdirs(xy, 0), GRAFT_OK);
    assert_int_equal(dir_n, 2);
    assert_int_equal(log_find(root, false), 0);
    assert_int_equal(log_find(x, false), 1);
    free(xy);
    free(x);
    free(step_dir);
    pt_rmtree(root);
}

static graft_status_t save_full(const char *root, const char *second_root, uint64_t step,
                                graft_persist_write_result_t *res)
{
    pt_global_t *g = pt_global_small(step);
    pt_layout_t *lay = pt_global_split(g, 2);
    graft_persist_config_t cfg = {.root = root, .second_root = second_root, .chunk_bytes = 4096};
    graft_persist_writer_t *w;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    assert_int_equal(graft_persist_save(w, step, 2,
                                        (const graft_persist_region_t *const *)lay->regions,
                                        lay->nregions, NULL),
                     GRAFT_OK);
    graft_status_t st = graft_persist_wait(w, step, res);
    graft_persist_writer_destroy(w);
    pt_layout_free(lay);
    pt_global_free(g);
    return st;
}

/* A disk that fills up during the fsync of a file is GRAFT_ENOSPC wherever
 * persist/ writes a file (a shard, the manifest, the second tier's copy),
 * and leaves neither the temporary file nor the checkpoint behind. */
static void test_full_disk_at_fsync_is_enospc(void **state)
{
    (void)state;
    char *tmp = pt_tmpdir();
    char *root = join(tmp, "root");
    char *second = join(tmp, "second");
    assert_int_equal(graft__persist_mkdirs(root, 0), GRAFT_OK);
    assert_int_equal(graft__persist_mkdirs(second, 0), GRAFT_OK);

    /* one file */
    disk_full_under(tmp);
    graft__pdir_t d = {.fd = open(tmp, O_RDONLY | O_DIRECTORY), .path = tmp};
    assert_true(d.fd >= 0);
    assert_int_equal(graft__persist_file_atomic(&d, "x", "abc", 3, 0), GRAFT_ENOSPC);
    close(d.fd);
    char *x = join(tmp, "x");
    char *x_tmp = join(tmp, "x.tmp");
    assert_int_equal(access(x, F_OK), -1);
    assert_int_equal(access(x_tmp, F_OK), -1);

    /* the local tier: the shards' fsyncs fail, the checkpoint is gone */
    graft_persist_write_result_t res;
    disk_full_under(root);
    assert_int_equal(save_full(root, NULL, 3, &res), GRAFT_ENOSPC);
    char *step3 = pt_path(root, 3, "");
    assert_int_equal(access(step3, F_OK), -1);

    /* the second tier: its copies' fsyncs fail; the local checkpoint
     * stands and the second tier keeps nothing */
    disk_full_under(second);
    assert_int_equal(save_full(root, second, 4, &res), GRAFT_OK);
    assert_int_equal(res.second_tier_status, GRAFT_ENOSPC);
    char *local4 = pt_path(root, 4, "manifest.pb");
    char *second4 = pt_path(second, 4, "");
    assert_int_equal(access(local4, F_OK), 0);
    assert_int_equal(access(second4, F_OK), -1);
    disk_full_under(NULL);

    free(second4);
    free(local4);
    free(step3);
    free(x_tmp);
    free(x);
    free(second);
    free(root);
    pt_rmtree(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_dirs_reach_their_parent),
        cmocka_unit_test(test_existing_dirs_cost_nothing),
        cmocka_unit_test(test_full_disk_at_fsync_is_enospc),
    };
    return cmocka_run_group_tests_name("persist_fsync", tests, NULL, NULL);
}
