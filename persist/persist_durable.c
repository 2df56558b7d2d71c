/*
 * Durable files: directories created with their parents fsynced, and files
 * written under a temporary name, fsynced, renamed into place and their
 * directory fsynced (the only way persist/ writes a file). A failed system
 * call maps to a status in one place: a full disk or quota is
 * GRAFT_ENOSPC, anything else GRAFT_EIO.
 */
#include "persist_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Log a failed system call on path (errno still set) and map it. */
static graft_status_t io_failed(const char *what, const char *path)
{
    int e = errno;
    GRAFT_ERROR(GRAFT_MOD_PERSIST, "%s %s: %s", what, path, strerror(e));
    return e == ENOSPC || e == EDQUOT || e == EFBIG ? GRAFT_ENOSPC : GRAFT_EIO;
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

graft_status_t graft__persist_mkdirs(const char *path)
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
        if (mkdir(copy, 0755) == 0) {
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

graft_status_t graft__tmpfile_open(graft__tmpfile_t *f, const char *dir, const char *name)
{
    f->fd = -1;
    f->installed = false;
    f->dir = graft__strdup(dir);
    f->tmp = graft__asprintf("%s/%s.tmp", dir, name);
    f->final = graft__asprintf("%s/%s", dir, name);
    if (f->dir == NULL || f->tmp == NULL || f->final == NULL)
        return GRAFT_ENOMEM;
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    return f->fd >= 0 ? GRAFT_OK : io_failed("create", f->tmp);
}

graft_status_t graft__tmpfile_sync(graft__tmpfile_t *f)
{
    graft__persist_crash_point();
    if (fsync(f->fd) != 0)
        return io_failed("fsync", f->tmp);
    close(f->fd);
    f->fd = -1;
    graft__persist_crash_point();
    return GRAFT_OK;
}

graft_status_t graft__tmpfile_install(graft__tmpfile_t *f)
{
    if (rename(f->tmp, f->final) != 0)
        return io_failed("rename", f->tmp);
    f->installed = true;
    graft__persist_crash_point();
    return graft__persist_fsync_dir(f->dir);
}

void graft__tmpfile_close(graft__tmpfile_t *f)
{
    if (f->fd >= 0)
        close(f->fd);
    if (!f->installed && f->tmp != NULL)
        unlink(f->tmp);
    graft_free(f->dir);
    graft_free(f->tmp);
    graft_free(f->final);
    f->fd = -1;
    f->dir = f->tmp = f->final = NULL;
}

graft_status_t graft__persist_file_atomic(const char *dir, const char *name, const void *data,
                                          size_t len)
{
    graft__tmpfile_t f;
    graft_status_t st = graft__tmpfile_open(&f, dir, name);
    if (st == GRAFT_OK)
        st = graft__persist_write_all(f.fd, data, len, f.tmp);
    if (st == GRAFT_OK)
        st = graft__tmpfile_sync(&f);
    if (st == GRAFT_OK)
        st = graft__tmpfile_install(&f);
    graft__tmpfile_close(&f);
    return st;
}
