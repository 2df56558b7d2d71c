/*
 * Durable files: directories created with their parents fsynced, and files
 * written under a temporary name, fsynced, renamed into place and their
 * directory fsynced (the only way persist/ writes a file). A failed system
 * call maps to a status in one place: a full disk or quota is
 * GRAFT_ENOSPC, anything else GRAFT_EIO.
 *
 * Nothing below the configured root is reached by a path that could follow
 * a symbolic link (docs/SECURITY.md, "Checkpoint files"): the root is opened
 * as a directory (a link the operator made there is followed: the operator
 * named it), the step directory under it with O_NOFOLLOW, and every file is
 * created, renamed and removed relative to that directory's descriptor
 * (openat, renameat, unlinkat). A temporary file is created with O_EXCL
 * after a stale one is unlinked (a link left there is removed, never
 * followed). Files are created with the configured mode (0600 unless
 * widened) and directories with the matching search bits; the umask
 * applies on top.
 */
#include "persist_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#ifdef GRAFT_TEST_FAULTS
volatile int graft__persist_crash_countdown = 0;
volatile int graft__persist_test_compress_delay_us = 0;
volatile int graft__persist_test_write_delay_us = 0;

void graft__persist_crash_point(void)
{
    if (graft__persist_crash_countdown > 0 && --graft__persist_crash_countdown == 0)
        raise(SIGKILL);
}
#endif

/* A stale temporary file re-planted between its unlink and the exclusive
 * create is unlinked again this many times before the write gives up. */
#define GP_CREATE_TRIES 3

/* Log a failed system call on path (errno still set) and map it. */
static graft_status_t io_failed(const char *what, const char *path)
{
    int e = errno;
    GRAFT_ERROR(GRAFT_MOD_PERSIST, "%s %s: %s", what, path, strerror(e));
    return e == ENOSPC || e == EDQUOT || e == EFBIG ? GRAFT_ENOSPC : GRAFT_EIO;
}

uint32_t graft__persist_file_mode(uint32_t mode)
{
    return mode == 0 ? GRAFT_PERSIST_FILE_MODE_DEFAULT : mode;
}

uint32_t graft__persist_dir_mode(uint32_t mode)
{
    mode = graft__persist_file_mode(mode);
    return mode | ((mode & 0444u) >> 2);
}

bool graft__persist_mode_valid(uint32_t mode)
{
    return mode == 0 || ((mode & ~0666u) == 0 && (mode & 0600u) == 0600u);
}

/* fsync the directory holding the entry of @p path (which ends in a name,
 * not a slash). */
static graft_status_t fsync_parent(char *path)
{
    char *slash = strrchr(path, '/');
    if (slash == NULL)
        return graft__persist_fsync_dir(".");
    if (slash == path)
        return graft__persist_fsync_dir("/");
    *slash = '\0';
    graft_status_t st = graft__persist_fsync_dir(path);
    *slash = '/';
    return st;
}

graft_status_t graft__persist_mkdirs(const char *path, uint32_t mode)
{
    graft_status_t st = GRAFT_OK;
    char *copy = graft__strdup(path);
    if (copy == NULL)
        return GRAFT_ENOMEM;
    for (char *p = copy + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(copy, (mode_t)graft__persist_dir_mode(mode)) == 0) {
            /* A new directory's name lives in its parent, and the renames
             * that commit files inside it only fsync the new directory
             * itself: without this a power loss could drop step-<n>/ with
             * a committed checkpoint in it. Only a directory really
             * created costs an fsync. */
            st = fsync_parent(copy);
            if (st != GRAFT_OK)
                break;
        } else if (errno != EEXIST) {
            GRAFT_ERROR(GRAFT_MOD_PERSIST, "mkdir %s: %s", copy, strerror(errno));
            st = errno == ENOSPC ? GRAFT_ENOSPC : GRAFT_ESYS;
            break;
        }
        *p = c;
        if (c == '\0')
            break;
    }
    graft_free(copy);
    return st;
}

graft_status_t graft__persist_write_all(int fd, const void *buf, size_t len, const char *path)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, (const char *)buf + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return io_failed("write", path);
        done += (size_t)n;
    }
    return GRAFT_OK;
}

graft_status_t graft__persist_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return io_failed("open", dir);
    graft_status_t st = fsync(fd) == 0 ? GRAFT_OK : io_failed("fsync", dir);
    close(fd);
    return st;
}

/* ------------------------------------------------------- directories --- */

static graft_status_t root_open(const char *root, int *fd_p)
{
    *fd_p = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (*fd_p < 0)
        return io_failed("open", root);
    return GRAFT_OK;
}

/* Open the entry @p name of @p parent as a directory, never through a
 * symbolic link; a link is named as such. */
static graft_status_t subdir_open(int parent, const char *name, const char *path, int *fd_p)
{
    *fd_p = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (*fd_p >= 0)
        return GRAFT_OK;
    struct stat sb;
    if ((errno == ELOOP || errno == ENOTDIR) &&
        fstatat(parent, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(sb.st_mode)) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST,
                    "%s is a symbolic link, not a directory: not writing through it", path);
        return GRAFT_EIO;
    }
    return io_failed("open", path);
}

graft_status_t graft__persist_dir_open(const char *root, uint64_t step, bool create,
                                       uint32_t mode, graft__pdir_t *d)
{
    int root_fd = -1;
    char name[32];
    snprintf(name, sizeof(name), "step-%020llu", (unsigned long long)step);
    d->fd = -1;
    d->path = graft__persist_step_dir(root, step);
    if (d->path == NULL)
        return GRAFT_ENOMEM;
    graft_status_t st = root_open(root, &root_fd);
    if (st != GRAFT_OK)
        return st;
    if (create && mkdirat(root_fd, name, (mode_t)graft__persist_dir_mode(mode)) == 0) {
        /* Its name is durable only once the root is fsynced (see mkdirs). */
        if (fsync(root_fd) != 0)
            st = io_failed("fsync", root);
    } else if (create && errno != EEXIST) {
        st = io_failed("mkdir", d->path);
        st = st == GRAFT_ENOSPC ? st : GRAFT_ESYS;
    }
    if (st == GRAFT_OK)
        st = subdir_open(root_fd, name, d->path, &d->fd);
    close(root_fd);
    return st;
}

void graft__persist_dir_close(graft__pdir_t *d)
{
    if (d->fd >= 0)
        close(d->fd);
    graft_free(d->path);
    d->fd = -1;
    d->path = NULL;
}

/* Unlink every entry of the step directory but the manifest (already
 * gone): links are removed as links, a planted subdirectory is an error. */
static graft_status_t dir_empty(int fd, const char *path)
{
    int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (d == NULL) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "opendir %s: %s", path, strerror(errno));
        if (dup_fd >= 0)
            close(dup_fd);
        return GRAFT_ESYS;
    }
    graft_status_t st = GRAFT_OK;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (unlinkat(fd, de->d_name, 0) != 0 && errno != ENOENT) {
            GRAFT_ERROR(GRAFT_MOD_PERSIST, "unlink %s/%s: %s", path, de->d_name, strerror(errno));
            st = GRAFT_ESYS;
        }
    }
    closedir(d);
    return st;
}

graft_status_t graft__persist_remove_dir(const char *root, uint64_t step)
{
    graft__pdir_t d = {.fd = -1};
    int root_fd = -1;
    char name[32];
    snprintf(name, sizeof(name), "step-%020llu", (unsigned long long)step);
    graft_status_t st = root_open(root, &root_fd);
    if (st != GRAFT_OK)
        return GRAFT_ESYS;
    struct stat sb;
    if (fstatat(root_fd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(sb.st_mode)) {
        /* Not a checkpoint of ours: the link goes, what it names stays. */
        if (unlinkat(root_fd, name, 0) != 0) {
            GRAFT_ERROR(GRAFT_MOD_PERSIST, "unlink %s/%s: %s", root, name, strerror(errno));
            st = GRAFT_ESYS;
        }
        goto out;
    }
    st = graft__persist_dir_open(root, step, false, 0, &d);
    if (st != GRAFT_OK) {
        st = GRAFT_ESYS;
        goto out;
    }
    if (unlinkat(d.fd, GP_MANIFEST_PB, 0) == 0) {
        /* From here on the checkpoint is merely incomplete. */
        if (fsync(d.fd) != 0)
            st = io_failed("fsync", d.path);
    } else if (errno != ENOENT) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "unlink %s/" GP_MANIFEST_PB ": %s", d.path,
                    strerror(errno));
        st = GRAFT_ESYS;
    }
    if (st == GRAFT_OK)
        st = dir_empty(d.fd, d.path);
    if (st == GRAFT_OK && unlinkat(root_fd, name, AT_REMOVEDIR) != 0) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "rmdir %s: %s", d.path, strerror(errno));
        st = GRAFT_ESYS;
    }
out:
    graft__persist_dir_close(&d);
    close(root_fd);
    return st;
}

/* ---------------------------------------------------- temporary files --- */

graft_status_t graft__tmpfile_open(graft__tmpfile_t *f, const graft__pdir_t *d, const char *name,
                                   uint32_t mode)
{
    f->fd = -1;
    f->dir_fd = d->fd;
    f->installed = false;
    f->name = graft__strdup(name);
    f->tmp_name = graft__asprintf("%s.tmp", name);
    f->tmp = graft__asprintf("%s/%s.tmp", d->path, name);
    f->final = graft__asprintf("%s/%s", d->path, name);
    if (f->name == NULL || f->tmp_name == NULL || f->tmp == NULL || f->final == NULL)
        return GRAFT_ENOMEM;
    for (int i = 0; i < GP_CREATE_TRIES && f->fd < 0; i++) {
        /* A stale temporary file (a crash's, or a link someone planted)
         * is removed, never opened. */
        if (unlinkat(f->dir_fd, f->tmp_name, 0) != 0 && errno != ENOENT)
            return io_failed("unlink", f->tmp);
        f->fd = openat(f->dir_fd, f->tmp_name,
                       O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                       (mode_t)graft__persist_file_mode(mode));
        if (f->fd < 0 && errno != EEXIST)
            return io_failed("create", f->tmp);
    }
    if (f->fd < 0) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "create %s: re-created by someone else %d times in a row",
                    f->tmp, GP_CREATE_TRIES);
        return GRAFT_EIO;
    }
    return GRAFT_OK;
}

graft_status_t graft__tmpfile_sync(graft__tmpfile_t *f)
{
    GP_CRASH_POINT();
    if (fsync(f->fd) != 0)
        return io_failed("fsync", f->tmp);
    close(f->fd);
    f->fd = -1;
    GP_CRASH_POINT();
    return GRAFT_OK;
}

graft_status_t graft__tmpfile_install(graft__tmpfile_t *f)
{
    /* rename does not follow a link at the final name: it replaces it. */
    if (renameat(f->dir_fd, f->tmp_name, f->dir_fd, f->name) != 0)
        return io_failed("rename", f->tmp);
    f->installed = true;
    GP_CRASH_POINT();
    return fsync(f->dir_fd) == 0 ? GRAFT_OK : io_failed("fsync", f->final);
}

void graft__tmpfile_close(graft__tmpfile_t *f)
{
    if (f->fd >= 0)
        close(f->fd);
    if (!f->installed && f->tmp_name != NULL && f->dir_fd >= 0)
        unlinkat(f->dir_fd, f->tmp_name, 0);
    graft_free(f->name);
    graft_free(f->tmp_name);
    graft_free(f->tmp);
    graft_free(f->final);
    f->fd = -1;
    f->name = f->tmp_name = f->tmp = f->final = NULL;
}

graft_status_t graft__persist_file_atomic(const graft__pdir_t *d, const char *name,
                                          const void *data, size_t len, uint32_t mode)
{
    graft__tmpfile_t f;
    graft_status_t st = graft__tmpfile_open(&f, d, name, mode);
    if (st == GRAFT_OK)
        st = graft__persist_write_all(f.fd, data, len, f.tmp);
    if (st == GRAFT_OK)
        st = graft__tmpfile_sync(&f);
    if (st == GRAFT_OK)
        st = graft__tmpfile_install(&f);
    graft__tmpfile_close(&f);
    return st;
}

/* Room under @p root for @p need bytes and a margin (the writer before a
 * checkpoint, the commit before its copy to the second root). */
graft_status_t graft__persist_space_check(const char *root, uint64_t need)
{
    struct statvfs sv;
    if (statvfs(root, &sv) != 0) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "statvfs %s: %s", root, strerror(errno));
        return GRAFT_ESYS;
    }
    /* Room for the manifest and the file system's own blocks. */
    uint64_t margin = (1ull << 16) + 4ull * sv.f_frsize;
    uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize;
    if (avail < need || avail - need < margin) {
        GRAFT_ERROR(GRAFT_MOD_PERSIST, "%s: %llu bytes free, a checkpoint needs %llu", root,
                    (unsigned long long)avail, (unsigned long long)(need + margin));
        return GRAFT_ENOSPC;
    }
    return GRAFT_OK;
}

/* A committed checkpoint of @p step is under @p root (its manifest). */
bool graft__persist_manifest_exists(const char *root, uint64_t step)
{
    char *dir = graft__persist_step_dir(root, step);
    char *p = dir ? graft__asprintf("%s/" GP_MANIFEST_PB, dir) : NULL;
    bool exists = p != NULL && access(p, F_OK) == 0;
    graft_free(p);
    graft_free(dir);
    return exists;
}
