/*
 * The fault-free reference of a strict run: the state hash every rank must
 * end with, from a cache keyed by what decides it, or from the trainers run
 * without the runtime (and then stored in the cache).
 */
#include "sim_live_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

static void sim_ref_key(const graft_sim_live_opts_t *o, char *key, size_t len)
{
    char trainer_buf[PATH_MAX];
    const char *trainer = graft_sim_trainer_path(trainer_buf, sizeof(trainer_buf));
    struct stat sb;
    memset(&sb, 0, sizeof(sb));
    if (stat(trainer, &sb) != 0) {
        memset(&sb, 0, sizeof(sb));
    }
    char desc[PATH_MAX + 256];
    /* Everything that decides the final state: the shape, the steps, the
     * seed, the mode, which trainer binary (path, size, mtime) and its
     * ballast (the blob is part of the state). */
    int n = snprintf(desc, sizeof(desc), "v1 g=%d r=%d steps=%lld seed=%" PRIu64
                     " mode=%d trainer=%s size=%lld mtime=%lld.%09ld blob=%d",
                     o->groups, o->ranks, o->steps, o->seed, (int)o->mode, trainer,
                     (long long)sb.st_size, (long long)sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec,
                     graft_sim_ballast_mib);
    snprintf(key, len, "%016" PRIx64, (uint64_t)XXH3_64bits(desc, (size_t)n));
}

static char *sim_cache_path(const graft_sim_live_opts_t *o)
{
    char key[32];
    sim_ref_key(o, key, sizeof(key));
    const char *dir = getenv("GRAFT_SIM_CACHE_DIR");
    char *p = NULL;
    if (dir != NULL && dir[0] != '\0') {
        if (asprintf(&p, "%s/ref-%s.txt", dir, key) < 0) {
            p = NULL;
        }
        return p;
    }
    const char *home = getenv("XDG_CACHE_HOME");
    if (home != NULL && home[0] != '\0') {
        if (asprintf(&p, "%s/graft-sim/ref-%s.txt", home, key) < 0) {
            p = NULL;
        }
    } else if (asprintf(&p, "%s/.cache/graft-sim/ref-%s.txt",
                        getenv("HOME") ? getenv("HOME") : "/tmp", key) < 0) {
        p = NULL;
    }
    return p;
}

/*
 * The fault-free reference: every rank r of the trainer run alone with the
 * same seed (--no-graft, GRAFT_RANK=r). The trainer's data parallelism has
 * every group compute the same global batch, so one group alone ends where
 * G fault-free groups end; the runtime is not involved at all, which is
 * what makes it a reference.
 */
static graft_status_t sim_reference_run(const graft_sim_live_opts_t *o, const char *dir,
                                        char **hash_p)
{
    graft_status_t st = GRAFT_OK;
    char trainer_buf[PATH_MAX];
    const char *trainer = graft_sim_trainer_path(trainer_buf, sizeof(trainer_buf));
    graft_sim_result_t ref;
    memset(&ref, 0, sizeof(ref));
    ref.groups = 1;
    ref.ranks = o->ranks;
    ref.completed = 1;
    ref.rank_hashes = calloc((size_t)o->ranks, sizeof(char *));
    if (ref.rank_hashes == NULL) {
        return GRAFT_ENOMEM;
    }
    for (int k = 0; k < o->ranks && st == GRAFT_OK; k++) {
        char hp[PATH_MAX + 64], steps[32], seed[32], rank[32], blob[32];
        snprintf(hp, sizeof(hp), "%s/ref-hash-r%d.txt", dir, k);
        snprintf(steps, sizeof(steps), "%lld", o->steps);
        snprintf(seed, sizeof(seed), "%" PRIu64, o->seed);
        snprintf(rank, sizeof(rank), "%d", k);
        snprintf(blob, sizeof(blob), "%d", graft_sim_ballast_mib);
        pid_t pid = fork();
        if (pid < 0) {
            st = GRAFT_ESYS;
            break;
        }
        if (pid == 0) {
            /* Dies with graft-sim, like the supervised trainers. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            setenv("GRAFT_RANK", rank, 1);
            int devnull = open("/dev/null", O_WRONLY);
            if (devnull >= 0) {
                dup2(devnull, 1);
            }
            execl(trainer, trainer, "--no-graft", "--steps", steps, "--seed", seed,
                  "--state-hash-out", hp, "--blob-mib", blob, (char *)NULL);
            _exit(127);
        }
        int ws = 0;
        if (graft_sim_stop_signal != 0) {
            kill(pid, SIGKILL); /* the signal came before the wait */
        }
        while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
            if (graft_sim_stop_signal != 0) {
                kill(pid, SIGKILL);
            }
        }
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            if (graft_sim_stop_signal == 0) {
                fprintf(stderr, "graft-sim run: error: the reference trainer (rank %d) failed\n",
                        k);
            }
            st = GRAFT_EIO;
            break;
        }
        FILE *f = fopen(hp, "r");
        char buf[256] = "";
        if (f != NULL) {
            if (fgets(buf, sizeof(buf), f) == NULL) {
                buf[0] = '\0';
            }
            fclose(f);
        }
        buf[strcspn(buf, " \t\r\n")] = '\0';
        ref.rank_hashes[k] = strdup(buf);
    }
    const char *why = NULL;
    if (st == GRAFT_OK) {
        (void)graft_sim_verdict_judge(o, &ref, NULL, &why);
        if (ref.final_hash == NULL) {
            st = GRAFT_EIO;
        } else {
            *hash_p = ref.final_hash;
            ref.final_hash = NULL;
        }
    }
    graft_sim_result_clear(&ref);
    return st;
}

/* The reference hash: from the cache, or from a fault-free run stored there. */
char *graft_sim_reference_hash(const graft_sim_live_opts_t *o, const char *tmp_dir, int *cached_p)
{
    char *path = sim_cache_path(o);
    char *hash = NULL;
    *cached_p = 0;
    FILE *f = path != NULL ? fopen(path, "r") : NULL;
    if (f != NULL) {
        char buf[256];
        if (fgets(buf, sizeof(buf), f) != NULL) {
            buf[strcspn(buf, " \t\r\n")] = '\0';
            if (buf[0] != '\0') {
                hash = strdup(buf);
                *cached_p = 1;
            }
        }
        fclose(f);
    }
    if (hash != NULL) {
        goto out;
    }
    if (sim_reference_run(o, tmp_dir, &hash) != GRAFT_OK || hash == NULL) {
        if (graft_sim_stop_signal == 0) {
            fprintf(stderr, "graft-sim run: error: the fault-free reference did not complete\n");
        }
        goto out;
    }
    if (path != NULL) {
        graft_sim_mkdirs(path);
        char tmp[PATH_MAX + 32];
        snprintf(tmp, sizeof(tmp), "%s.%d", path, (int)getpid());
        FILE *w = fopen(tmp, "w");
        if (w != NULL) {
            fprintf(w, "%s\n", hash);
            if (fclose(w) != 0 || rename(tmp, path) != 0) {
                unlink(tmp);
            }
        }
    }
out:
    free(path);
    return hash;
}
