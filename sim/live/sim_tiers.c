/*
 * The live engine's view of the job's persistent tiers: the complete
 * checkpoints of the local root (a step directory with its manifest.pb),
 * the newest one corrupted on purpose by a corrupting disaster, the
 * object store's newest complete checkpoint, and the local root emptied
 * by lose_disks.
 */
#include "sim_live_int.h"

#include <graft/persist.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* How many complete checkpoints (a step directory with its manifest.pb,
 * written once every shard is durable) the run's persistent tier holds
 * that a disaster has not corrupted; the newest one's directory name goes
 * to newest (may be NULL). A soak run counted corrupted ones: after
 * several corrupting disasters every retained checkpoint was bad and the
 * next disaster lost the job by design. */
int graft_sim_complete_checkpoints(const graft_sim_run_t *r, char *newest, size_t cap)
{
    DIR *d = opendir(r->persist_root);
    struct dirent *e;
    int n = 0;
    if (newest != NULL) {
        newest[0] = '\0';
    }
    while (d != NULL && (e = readdir(d)) != NULL) {
        char mf[PATH_MAX + 600];
        snprintf(mf, sizeof(mf), "%s/%s/manifest.pb", r->persist_root, e->d_name);
        if (strncmp(e->d_name, "step-", 5) != 0 || access(mf, F_OK) != 0) {
            continue;
        }
        long long step = strtoll(e->d_name + 5, NULL, 10);
        int bad = 0;
        for (int i = 0; i < r->n_corrupted; i++) {
            bad |= r->corrupted[i] == step;
        }
        if (bad) {
            continue;
        }
        n++;
        if (newest != NULL && strlen(e->d_name) < cap && strcmp(e->d_name, newest) > 0) {
            snprintf(newest, cap, "%s", e->d_name);
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    return n;
}

/*
 * Flip one byte in the middle of ONE shard of the newest complete
 * checkpoint (one with its manifest.pb) so that its restore must fail
 * verification and fall back. One shard, as a real bad disk block or
 * torn copy would: the runtime verifies every shard of a checkpoint before
 * any rank restores it (docs/RUNTIME.md), so every rank of a group skips
 * the whole checkpoint, not only the rank whose shard is bad. Which shard
 * comes from the seed and the event's place in the plan. Returns the
 * checkpoint's step, -1 when none was corrupted.
 */
long long graft_sim_corrupt_newest(graft_sim_run_t *r, size_t plan_index)
{
    char best[256] = "";
    if (graft_sim_complete_checkpoints(r, best, sizeof(best)) == 0) {
        return -1;
    }
    int rank = (int)((r->o->seed + plan_index) % (uint64_t)r->o->ranks);
    char f[PATH_MAX + 600];
    snprintf(f, sizeof(f), "%s/%s/shard-%d-of-%d", r->persist_root, best, rank, r->o->ranks);
    int fd = open(f, O_RDWR);
    struct stat sb;
    int corrupted = 0;
    if (fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0) {
        off_t at = sb.st_size / 2;
        unsigned char b = 0;
        if (pread(fd, &b, 1, at) == 1) {
            b ^= 0xff;
            corrupted = pwrite(fd, &b, 1, at) == 1;
        }
    }
    if (fd >= 0) {
        close(fd);
    }
    if (!corrupted) {
        fprintf(stderr, "graft-sim: warning: could not corrupt %s: %s\n", f, strerror(errno));
        return -1;
    }
    if (!r->tty) {
        printf("graft-sim: corrupted shard %d of %d of the newest checkpoint %s\n", rank,
               r->o->ranks, best);
    }
    long long step = strtoll(best + 5, NULL, 10);
    if (r->n_corrupted < (int)(sizeof(r->corrupted) / sizeof(r->corrupted[0]))) {
        r->corrupted[r->n_corrupted++] = step;
    }
    return step;
}

/* The newest complete checkpoint in the object store (-1: none, or no
 * store), asked at most every 500 ms (the injector looks far more often). */
long long graft_sim_remote_newest(graft_sim_run_t *r)
{
    uint64_t now = graft_sim_now_ns();
    if (r->remote_url[0] == '\0')
        return -1;
    if (r->remote_checked_ns != 0 && now - r->remote_checked_ns < 500000000ull)
        return r->remote_newest;
    r->remote_checked_ns = now;
    graft_persist_remote_config_t rc;
    memset(&rc, 0, sizeof(rc));
    rc.url = r->remote_url;
    rc.endpoint = r->o->persist_remote_endpoint;
    rc.max_retries = 1;
    rc.timeout_ms = 5000;
    uint64_t *steps = NULL;
    size_t n = 0;
    char why[256] = "";
    graft_status_t st = graft_persist_remote_list(&rc, &steps, &n, why, sizeof(why));
    if (st != GRAFT_OK) {
        fprintf(stderr, "graft-sim run: cannot list %s: %s%s%s\n", r->remote_url,
                graft_status_string(st), why[0] ? ": " : "", why);
        r->remote_newest = -1;
    } else {
        r->remote_newest = n > 0 ? (long long)steps[0] : -1;
    }
    graft_free(steps);
    return r->remote_newest;
}

/* lose_disks: everything under the job's local checkpoint root goes, as
 * when the hosts are replaced by new ones with empty disks. */
void graft_sim_wipe_local_root(graft_sim_run_t *r)
{
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'/* '%s'/.[!.]*", r->persist_root, r->persist_root);
    if (strchr(r->persist_root, '\'') != NULL || system(cmd) != 0) {
        graft_sim_run_fail(r, "lose_disks: could not empty %s", r->persist_root);
    }
}
