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
#include <stdbool.h>
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
                     " mode=%d trainer=%s size=%lld mtime=%lld.%09ld blob=%d world=%d",
                     o->groups, o->ranks, o->steps, o->seed, (int)o->mode, trainer,
                     (long long)sb.st_size, (long long)sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec,
                     graft_sim_ballast_mib, o->torch_world);
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

/* Start rank k of the reference: the trainer with --no-graft and the
 * environment the supervisor would give it (envp, made before fork()), in
 * a process group of its own (a launcher and its worker are one), dying
 * with graft-sim. */
static pid_t sim_reference_spawn(const char *trainer, char *const argv[], char *const envp[])
{
    pid_t pid = fork();
    if (pid != 0) {
        if (pid > 0) {
            setpgid(pid, pid);
        }
        return pid;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    setpgid(0, 0);
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) {
        dup2(devnull, 1);
    }
    execve(trainer, argv, envp);
    _exit(127);
}

static void sim_reference_kill(const pid_t *pids, int n)
{
    for (int k = 0; k < n; k++) {
        if (pids[k] > 0) {
            kill(-pids[k], SIGKILL);
        }
    }
}

/* Wait for the reference's ranks; the first that fails (or graft-sim's
 * stop) ends the others, which may be waiting for it at a rendezvous. */
static graft_status_t sim_reference_wait(pid_t *pids, int n)
{
    graft_status_t st = GRAFT_OK;
    for (int left = n; left > 0;) {
        if (graft_sim_stop_signal != 0) {
            st = GRAFT_EIO;
            sim_reference_kill(pids, n);
        }
        bool reaped = false;
        for (int k = 0; k < n; k++) {
            int ws = 0;
            if (pids[k] <= 0 || waitpid(pids[k], &ws, WNOHANG) != pids[k]) {
                continue;
            }
            kill(-pids[k], SIGKILL); /* a launcher's worker left behind */
            pids[k] = -1;
            left--;
            reaped = true;
            if ((WIFEXITED(ws) && WEXITSTATUS(ws) == 0) || st != GRAFT_OK) {
                continue;
            }
            if (graft_sim_stop_signal == 0) {
                fprintf(stderr, "graft-sim run: error: the reference trainer (rank %d) failed\n", k);
            }
            st = GRAFT_EIO;
            sim_reference_kill(pids, n);
        }
        if (!reaped) {
            usleep(10000);
        }
    }
    return st;
}

/*
 * The fault-free reference: the ranks of one group, the trainer run with
 * the same seed and without the runtime (--no-graft, GRAFT_RANK=r). The
 * trainer's data parallelism has every group compute the same global
 * batch, so one group alone ends where G fault-free groups end; the runtime
 * is not involved at all, which is what makes it a reference. The ranks
 * run together, and with --torch-world as one torch world (a launcher such
 * as torchrun starts a world only whole).
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
    char(*hp)[PATH_MAX + 64] = calloc((size_t)o->ranks, sizeof(*hp));
    pid_t *pids = calloc((size_t)o->ranks, sizeof(pid_t));
    char steps[32], seed[32], blob[32];
    int port = 0;
    if (ref.rank_hashes == NULL || hp == NULL || pids == NULL) {
        st = GRAFT_ENOMEM;
        goto out;
    }
    if (o->torch_world && (st = graft_sim_free_ports(1, &port)) != GRAFT_OK) {
        goto out;
    }
    snprintf(steps, sizeof(steps), "%lld", o->steps);
    snprintf(seed, sizeof(seed), "%" PRIu64, o->seed);
    snprintf(blob, sizeof(blob), "%d", graft_sim_ballast_mib);
    /* The environment of group 0 as the supervisor makes it. */
    graft_sim_sup_config_t sc = {.groups = 1, .ranks = o->ranks,
                                 .master_ports = o->torch_world ? &port : NULL};
    int started = 0;
    for (; started < o->ranks; started++) {
        int k = started;
        snprintf(hp[k], sizeof(hp[k]), "%s/ref-hash-r%d.txt", dir, k);
        char *argv[] = {(char *)trainer, "--no-graft", "--steps", steps, "--seed", seed,
                        "--state-hash-out", hp[k], "--blob-mib", blob, NULL};
        char **envp = graft_sim_sup_envp(&sc, 0, k);
        bool no_env = envp == NULL;
        pids[k] = no_env ? -1 : sim_reference_spawn(trainer, argv, envp);
        graft_sim_sup_strv_free(envp);
        if (pids[k] < 0) {
            fprintf(stderr, "graft-sim run: error: cannot start the reference trainer: %s\n",
                    no_env ? "out of memory" : strerror(errno));
            st = GRAFT_ESYS;
            for (int j = 0; j < k; j++) {
                kill(-pids[j], SIGKILL);
            }
            break;
        }
    }
    graft_status_t wst = sim_reference_wait(pids, started);
    st = st == GRAFT_OK ? wst : st;
    for (int k = 0; k < o->ranks && st == GRAFT_OK; k++) {
        FILE *f = fopen(hp[k], "r");
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
out:
    graft_sim_result_clear(&ref);
    free(hp);
    free(pids);
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
