/*
 * `graft-sim run`: the command line of live mode. Scripts depend on these
 * flag names, so they are parsed and validated here, completely, whether or
 * not the live engine (graft_sim_live_run) is part of this build.
 */
#include "../sim_cli.h"
#include "sim_live.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void sim_run_usage(FILE *out)
{
    fprintf(out,
            "usage: graft-sim run [options]\n"
            "Live failure injection: G groups x R ranks of the example trainer, a seeded\n"
            "failure schedule, and a verdict against a fault-free reference.\n\n"
            "  --groups G            replica groups [4]\n"
            "  --ranks R             ranks per group [2]\n"
            "  --steps N             optimizer steps [100]\n"
            "  --seed S              seed of the trainer and of the failure schedule [1]\n"
            "  --mode strict|elastic strict: bit-exact final state; elastic: consistent [strict]\n"
            "  --random-failures N   N failures of mixed kinds at seeded random points [0]\n"
            "  --schedule FILE       failure schedule (JSON), docs/SIM.md:\n"
            "                        {\"events\":[{\"kind\":K, \"at_step\":N or \"at_ms\":T,\n"
            "                        \"group\", \"rank\", \"duration_ms\", \"corrupt\"}]}; K is\n"
            "                        kill_rank, kill_group, kill_donor, hang, disaster,\n"
            "                        etcd_restart (embedded etcd of one member),\n"
            "                        lose_disks (--persist-remote),\n"
            "                        partition, isolate, netem, throttle, cut_donor\n"
            "                        (--netns) or etcd_leader_kill (SIGKILL etcd's leader,\n"
            "                        restart it after duration_ms; --etcd-members >= 3)\n"
            "  --etcd URL[,URL...]   use this etcd (its members' endpoints) instead of an\n"
            "                        embedded one\n"
            "  --etcd-members N      members of the embedded etcd, on loopback [1]; with 3\n"
            "                        or more, --random-failures draws etcd_leader_kill\n"
            "                        instead of etcd_restart\n"
            "  --persist-root DIR    keep persistent checkpoints here\n"
            "  --persist-every K     persistent checkpoint every K steps (with --persist-root)\n"
            "  --persist-remote s3://BUCKET[/PREFIX]\n"
            "                        the trainers' object-store tier (under PREFIX/<job>;\n"
            "                        credentials from AWS_*); --random-failures then draws\n"
            "                        lose_disks: a disaster that also wipes the local root\n"
            "  --persist-remote-endpoint URL\n"
            "                        a non-AWS store's http(s) URL (path-style requests)\n"
            "  --netns               groups in network namespaces with shaped links\n"
            "  --json FILE           write the report as JSON\n"
            "  --trainer CMD         the trainer: a /bin/sh command the contract's flags are\n"
            "                        appended to (docs/SIM.md) [train_mlp next to graft-sim]\n"
            "  --torch-world         the ranks of a group are one torch world: each is started\n"
            "                        as torchrun starts a worker (RANK, WORLD_SIZE, LOCAL_RANK,\n"
            "                        MASTER_ADDR, MASTER_PORT: a port per group), and when one\n"
            "                        dies the others of its group are stopped and all start\n"
            "                        again, as torchrun restarts a world\n"
            "  --spares N            N spare groups: N x R trainers started with GRAFT_SPARE=1\n"
            "                        (rank r each) that promote themselves into a dead rank's\n"
            "                        slot; every replacement is then started as a spare [0]\n"
            "  --follow              the spares follow the job's state (GRAFT_SPARE_FOLLOW=1):\n"
            "                        each pulls every step from a donor while it waits, so\n"
            "                        one promoted at the step it holds pulls nothing\n"
            "  --spawn-delay-ms D    a dead trainer to its replacement's start, as an\n"
            "                        orchestrator takes to schedule one [100]\n"
            "  --plot FILE.svg       timeline plot [the --json path with .svg]\n"
            "Exit status: 0 only when the verdict holds; 2 bad usage; %d live mode not in "
            "this build.\n",
            GRAFT_SIM_EXIT_UNAVAILABLE);
}

/* Parses a decimal integer in [lo, hi]; prints the error itself. */
static int sim_run_int(const char *flag, const char *v, long long lo, long long hi,
                       long long *out_p)
{
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end != '\0' || errno == ERANGE || x < lo || x > hi) {
        fprintf(stderr, "graft-sim run: error: %s: '%s' is not an integer in [%lld, %lld]\n",
                flag, v, lo, hi);
        return -1;
    }
    *out_p = x;
    return 0;
}

/* A comma-separated list of http:// or https:// URLs, as the library's
 * endpoint list takes; prints the error itself. */
static int sim_run_url_list(const char *list)
{
    int n = 0;
    for (const char *p = list; *p != '\0';) {
        size_t len = strcspn(p, ",");
        if (len > 0) {
            if (!((len > 7 && strncmp(p, "http://", 7) == 0) ||
                  (len > 8 && strncmp(p, "https://", 8) == 0))) {
                fprintf(stderr, "graft-sim run: error: --etcd: '%.*s' is not an http:// or "
                                "https:// URL\n",
                        (int)len, p);
                return 0;
            }
            n++;
        }
        p += len + (p[len] == ',');
    }
    if (n == 0) {
        fprintf(stderr, "graft-sim run: error: --etcd: no URL in '%s'\n", list);
    }
    return n > 0;
}

/* Whether flag takes a value and argv has one after *i (moved onto it);
 * prints the error itself. */
static int sim_run_has_value(int argc, char **argv, int *i, const char *flag)
{
    static const char *const with_value[] = {
        "--groups", "--ranks",        "--steps",        "--seed",          "--mode",
        "--random-failures", "--schedule", "--etcd", "--etcd-members", "--persist-root",
        "--persist-every", "--persist-remote", "--persist-remote-endpoint",
        "--json", "--plot", "--trainer", "--spares", "--spawn-delay-ms"};
    int known = 0;
    for (size_t k = 0; k < sizeof(with_value) / sizeof(with_value[0]); k++) {
        known |= strcmp(flag, with_value[k]) == 0;
    }
    if (!known) {
        fprintf(stderr, "graft-sim run: error: unknown option '%s' (see graft-sim run "
                        "--help)\n",
                flag);
        return 0;
    }
    if (*i + 1 >= argc) {
        fprintf(stderr, "graft-sim run: error: %s needs a value\n", flag);
        return 0;
    }
    ++*i;
    return 1;
}

/* The run's shape: --groups, --ranks, --steps, --seed, --mode,
 * --random-failures, --etcd-members, --spares, --spawn-delay-ms. 0, 2 on
 * an error, -1 when flag is none of them. */
static int sim_run_shape_flag(graft_sim_live_opts_t *o, const char *flag, const char *val)
{
    long long v;
    if (strcmp(flag, "--groups") == 0 || strcmp(flag, "--ranks") == 0) {
        if (sim_run_int(flag, val, 1, 4096, &v) != 0) {
            return 2;
        }
        if (strcmp(flag, "--groups") == 0) {
            o->groups = (int)v;
        } else {
            o->ranks = (int)v;
        }
    } else if (strcmp(flag, "--steps") == 0) {
        return sim_run_int(flag, val, 1, LLONG_MAX, &o->steps) != 0 ? 2 : 0;
    } else if (strcmp(flag, "--seed") == 0) {
        char *end = NULL;
        errno = 0;
        unsigned long long s = strtoull(val, &end, 10);
        if (end == val || *end != '\0' || errno == ERANGE || val[0] == '-') {
            fprintf(stderr, "graft-sim run: error: --seed: '%s' is not an unsigned 64-bit "
                            "integer\n",
                    val);
            return 2;
        }
        o->seed = s;
    } else if (strcmp(flag, "--mode") == 0) {
        if (strcmp(val, "strict") == 0) {
            o->mode = GRAFT_SIM_LIVE_STRICT;
        } else if (strcmp(val, "elastic") == 0) {
            o->mode = GRAFT_SIM_LIVE_ELASTIC;
        } else {
            fprintf(stderr, "graft-sim run: error: --mode: '%s' is neither 'strict' nor "
                            "'elastic'\n",
                    val);
            return 2;
        }
    } else if (strcmp(flag, "--random-failures") == 0) {
        if (sim_run_int(flag, val, 0, 1000000, &v) != 0) {
            return 2;
        }
        o->random_failures = (int)v;
    } else if (strcmp(flag, "--etcd-members") == 0) {
        if (sim_run_int(flag, val, 1, 9, &v) != 0) {
            return 2;
        }
        o->etcd_members = (int)v;
    } else if (strcmp(flag, "--spares") == 0) {
        if (sim_run_int(flag, val, 0, 4096, &v) != 0) {
            return 2;
        }
        o->spares = (int)v;
    } else if (strcmp(flag, "--spawn-delay-ms") == 0) {
        if (sim_run_int(flag, val, 0, 3600000, &v) != 0) {
            return 2;
        }
        o->spawn_delay_ms = (uint32_t)v;
    } else {
        return -1;
    }
    return 0;
}

/* Where things are: --schedule, --etcd, the persistent tiers, --plot,
 * --trainer and --json. 0, or 2 on an error. */
static int sim_run_place_flag(graft_sim_live_opts_t *o, const char *flag, const char *val,
                              const char **trainer_p)
{
    if (strcmp(flag, "--schedule") == 0) {
        if (access(val, R_OK) != 0) {
            fprintf(stderr, "graft-sim run: error: --schedule: cannot read '%s': %s\n", val,
                    strerror(errno));
            return 2;
        }
        o->schedule_path = val;
    } else if (strcmp(flag, "--etcd") == 0) {
        if (!sim_run_url_list(val)) {
            return 2;
        }
        o->etcd_url = val;
    } else if (strcmp(flag, "--persist-root") == 0) {
        if (val[0] == '\0') {
            fprintf(stderr, "graft-sim run: error: --persist-root: empty path\n");
            return 2;
        }
        o->persist_root = val;
    } else if (strcmp(flag, "--persist-every") == 0) {
        return sim_run_int(flag, val, 1, LLONG_MAX, &o->persist_every) != 0 ? 2 : 0;
    } else if (strcmp(flag, "--persist-remote") == 0) {
        if (strncmp(val, "s3://", 5) != 0 || val[5] == '\0' || val[5] == '/') {
            fprintf(stderr, "graft-sim run: error: --persist-remote: '%s' is not "
                            "s3://bucket[/prefix]\n", val);
            return 2;
        }
        o->persist_remote = val;
    } else if (strcmp(flag, "--persist-remote-endpoint") == 0) {
        if (!((strncmp(val, "http://", 7) == 0 && val[7] != '\0') ||
              (strncmp(val, "https://", 8) == 0 && val[8] != '\0')) ||
            strchr(val, ',') != NULL) {
            fprintf(stderr, "graft-sim run: error: --persist-remote-endpoint: '%s' is not "
                            "one http:// or https:// URL\n", val);
            return 2;
        }
        o->persist_remote_endpoint = val;
    } else if (strcmp(flag, "--plot") == 0) {
        o->plot_path = val;
    } else if (strcmp(flag, "--trainer") == 0) {
        if (strspn(val, " \t") == strlen(val)) {
            fprintf(stderr, "graft-sim run: error: --trainer: empty command\n");
            return 2;
        }
        *trainer_p = val;
    } else {
        o->json_path = val;
    }
    return 0;
}

/* The flags that do not go together, and --persist-every's default. 0, or
 * 2. */
static int sim_run_settle(graft_sim_live_opts_t *o)
{
    if (o->etcd_members > 1 && o->etcd_url != NULL) {
        fprintf(stderr, "graft-sim run: error: --etcd-members sizes the embedded etcd; it "
                        "cannot be combined with --etcd\n");
        return 2;
    }
    if (o->etcd_members > 1 && o->netns) {
        fprintf(stderr, "graft-sim run: error: --netns runs one embedded etcd member; it "
                        "cannot be combined with --etcd-members\n");
        return 2;
    }
    if (o->torch_world && o->netns) {
        fprintf(stderr, "graft-sim run: error: --torch-world's rendezvous is on loopback; it "
                        "cannot be combined with --netns\n");
        return 2;
    }
    /* A spare learns its group only when it takes a slot: a torch world's
     * rendezvous port and a group's namespace are chosen before it starts. */
    if (o->spares > 0 && o->torch_world) {
        fprintf(stderr, "graft-sim run: error: --spares cannot be combined with --torch-world: "
                        "a spare joins no world (its group is known only once it takes a "
                        "slot)\n");
        return 2;
    }
    if (o->follow && o->spares == 0) {
        fprintf(stderr, "graft-sim run: error: --follow needs --spares (it makes the spares "
                        "followers)\n");
        return 2;
    }
    if (o->spares > 0 && o->netns) {
        fprintf(stderr, "graft-sim run: error: --spares cannot be combined with --netns: a "
                        "spare would have to start in the namespace of a group it does not "
                        "know yet\n");
        return 2;
    }
    if (o->persist_remote_endpoint != NULL && o->persist_remote == NULL) {
        fprintf(stderr, "graft-sim run: error: --persist-remote-endpoint needs "
                        "--persist-remote\n");
        return 2;
    }
    if (o->persist_every > 0 && o->persist_root == NULL) {
        fprintf(stderr, "graft-sim run: error: --persist-every needs --persist-root\n");
        return 2;
    }
    if (o->persist_root != NULL && o->persist_every == 0) {
        /* Keep the persistent tier exercised: a few checkpoints per run. */
        o->persist_every = o->steps >= 10 ? o->steps / 10 : 1;
    }
    return 0;
}

static int sim_run_parse(int argc, char **argv, graft_sim_live_opts_t *o, const char **trainer_p)
{
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) {
            return 1;
        }
        if (strcmp(flag, "--netns") == 0) {
            o->netns = 1;
            continue;
        }
        if (strcmp(flag, "--torch-world") == 0) {
            o->torch_world = 1;
            continue;
        }
        if (strcmp(flag, "--follow") == 0) {
            o->follow = 1;
            continue;
        }
        if (!sim_run_has_value(argc, argv, &i, flag)) {
            return 2;
        }
        const char *val = argv[i];
        int rc = sim_run_shape_flag(o, flag, val);
        if (rc < 0) {
            rc = sim_run_place_flag(o, flag, val, trainer_p);
        }
        if (rc != 0) {
            return rc;
        }
    }
    return sim_run_settle(o);
}

int graft_sim_run_main(int argc, char **argv)
{
    graft_sim_live_opts_t o;
    memset(&o, 0, sizeof(o));
    o.groups = 4;
    o.ranks = 2;
    o.steps = 100;
    o.seed = 1;
    o.mode = GRAFT_SIM_LIVE_STRICT;
    o.etcd_members = 1;
    o.spawn_delay_ms = 100;

    const char *trainer = NULL;
    int rc = sim_run_parse(argc, argv, &o, &trainer);
    if (rc == 1) {
        sim_run_usage(stdout);
        return 0;
    }
    if (rc != 0) {
        return 2;
    }
    if (trainer == NULL) {
        return graft_sim_live_run(&o);
    }
    /* Every place that starts the trainer (the supervisor, the reference,
     * the --netns wrapper) execs one program: the command becomes a small
     * script that execs it with the contract's flags appended. */
    char dir[PATH_MAX], script[PATH_MAX + 16];
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, sizeof(dir), "%s/graft-sim-trainer-XXXXXX", tmp);
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "graft-sim run: error: mkdtemp %s: %s\n", dir, strerror(errno));
        return 1;
    }
    snprintf(script, sizeof(script), "%s/trainer", dir);
    FILE *f = fopen(script, "w");
    if (f == NULL || fprintf(f, "#!/bin/sh\nexec %s \"$@\"\n", trainer) < 0 || fclose(f) != 0 ||
        chmod(script, 0755) != 0 || setenv("GRAFT_SIM_TRAINER", script, 1) != 0) {
        fprintf(stderr, "graft-sim run: error: writing %s: %s\n", script, strerror(errno));
        rc = 1;
    } else {
        rc = graft_sim_live_run(&o);
    }
    unlink(script);
    rmdir(dir);
    return rc;
}
