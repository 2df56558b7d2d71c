/*
 * graftctl: each command's own help (`graftctl COMMAND --help`, `graftctl
 * ckpt SUB --help`); the global one is in graftctl_main.c.
 */
#include "graftctl.h"

#include <stdio.h>
#include <string.h>

#define JOB_FOOT                                                                                 \
    "\nNeeds etcd (--etcd, GRAFT_ETCD_ENDPOINTS) and the job (--job, GRAFT_JOB); --json\n"      \
    "gives JSON. The options every command takes: graftctl --help.\n"
#define CKPT_FOOT                                                                                \
    "\nWorks on the files alone (no etcd). ROOT is a job's checkpoint directory, the\n"         \
    "one that holds step-* folders, or its remote tier, s3://BUCKET/PREFIX: the\n"            \
    "store is --endpoint URL (else GRAFT_PERSIST_REMOTE_ENDPOINT, AWS_ENDPOINT_URL_S3\n"       \
    "or AWS_ENDPOINT_URL, else AWS S3), --region R (else GRAFT_PERSIST_REMOTE_REGION,\n"          \
    "AWS_REGION); credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,\n"               \
    "AWS_SESSION_TOKEN or the AWS credentials file. --json gives JSON. graftctl\n"            \
    "--help: the rest.\n"

typedef struct help {
    const char *name; /* "status", "ckpt ls", ... */
    const char *text;
} help_t;

static const help_t helps[] = {
    {"status",
     "usage: graftctl [options] status\n"
     "\n"
     "Every group the job has had (a dead one too) with its health: healthy,\n"
     "recovering, hung, cannot-serve, dead; per rank its state, committed step,\n"
     "incarnation, pid, lease time left and transfer address; the latest quorum\n"
     "(id, round, step, members, recoveries) and the job's progress.\n" JOB_FOOT},
    {"watch",
     "usage: graftctl [options] watch [--interval-ms N] [--count N]\n"
     "\n"
     "The status, redrawn at every change of the job's members and at least every\n"
     "interval.\n"
     "\n"
     "  --interval-ms N        redraw at least this often (default 1000)\n"
     "  --count N              stop after N redraws (default: until interrupted)\n" JOB_FOOT},
    {"events",
     "usage: graftctl [options] events [--kind K[,K]] [--group G] [--since T]\n"
     "                                 [--until T] [--recoveries]\n"
     "\n"
     "The job's retained event history, oldest first; times in local time (--json:\n"
     "unix_ms).\n"
     "\n"
     "  --kind K[,K]           only these kinds (join, leave, quorum, recovery_done, ...)\n"
     "  --group G              only events of group G\n"
     "  --since T, --until T   T is unix milliseconds, an age (90s, 10m, 2h, 1d), a day\n"
     "                         (today, yesterday, 2026-11-27), a date and time\n"
     "                         ('2026-11-27 14:00[:SS]') or a time of day (14:00[:SS]:\n"
     "                         today's, or yesterday's if still to come), local time\n"
     "  --recoveries           each recovery with its phases, donors and bytes\n" JOB_FOOT},
    {"drift",
     "usage: graftctl [options] drift\n"
     "\n"
     "The newest replica hash comparison and drift event; exit 1 when the history\n"
     "holds a drift.\n" JOB_FOOT},
    {"evict",
     "usage: graftctl [options] evict GROUP\n"
     "\n"
     "Revokes the lease of every live rank of GROUP (they join again as new\n"
     "incarnations) and records the eviction. Asks for confirmation unless --yes;\n"
     "with no terminal to ask on it refuses (exit 2).\n" JOB_FOOT},
    {"dashboard",
     "usage: graftctl [options] dashboard [--listen ADDR:PORT] [--token T]\n"
     "                 [--ckpt-root DIR] [--ckpt-remote URL] [--allow-host NAME]...\n"
     "                 [--interval-ms N]\n"
     "\n"
     "The job over HTTP: a page, a JSON API and /metrics (Prometheus).\n"
     "\n"
     "  --listen ADDR:PORT     IPv4 address and port (default 127.0.0.1:8470)\n"
     "  --token T              operator token, 8 characters or more\n"
     "                         (GRAFT_DASHBOARD_TOKEN)\n"
     "  --ckpt-root DIR        list and verify checkpoints only under DIR\n"
     "  --ckpt-remote URL      the job's remote tier, s3://BUCKET/PREFIX (default\n"
     "                         GRAFT_PERSIST_REMOTE), with the upload lag\n"
     "  --allow-host NAME      a Host name to answer besides addresses and localhost\n"
     "                         (others get 403); may be repeated\n"
     "  --interval-ms N        how often the job is read, 50..60000 (default 500)\n" JOB_FOOT},
    {"ckpt ls",
     "usage: graftctl ckpt ls ROOT [--keep-last N] [--milestone-every M] [--geometric]\n"
     "                       [--endpoint URL] [--region R]\n"
     "\n"
     "Every step-* checkpoint under ROOT, newest first, quickly verified, with its\n"
     "retention class under the policy given (newest, config_change, milestone,\n"
     "kept, prunable, invalid). Nothing is deleted: this is what `ckpt prune` with\n"
     "the same policy would keep. On s3://, every step-* prefix with its objects:\n"
     "complete (it has manifest.pb) or incomplete (a leftover that prune removes\n"
     "when older than the newest complete checkpoint; in_progress otherwise).\n"
     "\n"
     "  --keep-last N          the policy keeps the newest N checkpoints (without\n"
     "                         it, or with 0, every one is kept)\n"
     "  --milestone-every M    ... and every one whose step is a multiple of M\n"
     "  --geometric            ... and of the rest the newest in each band of\n"
     "                         [2^k, 2^(k+1)) steps behind the newest step\n" CKPT_FOOT},
    {"ckpt verify",
     "usage: graftctl ckpt verify ROOT [STEP] [--quick] [--secret-file F]\n"
     "                           [--endpoint URL] [--region R]\n"
     "\n"
     "Every chunk of one (default: every) checkpoint, naming the file and chunk at\n"
     "fault, and the manifest.json sidecar against manifest.pb. Exit 1 on a fault.\n"
     "On s3://, each checkpoint is downloaded into a scratch directory under\n"
     "$TMPDIR (removed after) and verified as a restore does: a missing or corrupt\n"
     "object is named (s3://B/P/step-.../shard-1-of-2: chunk 1: ...).\n"
     "\n"
     "  --quick                manifest, shard headers, indexes and footers only,\n"
     "                         not every chunk's hashes\n"
     "  --secret-file F        also check the manifest's MAC under the job secret\n" CKPT_FOOT},
    {"ckpt inspect",
     "usage: graftctl ckpt inspect ROOT STEP [--endpoint URL] [--region R]\n"
     "\n"
     "The manifest of step STEP: regions, shards, hashes, and the sidecar's state.\n"
     "On s3://, the checkpoint is downloaded and verified first.\n" CKPT_FOOT},
    {"ckpt prune",
     "usage: graftctl ckpt prune ROOT --keep-last N [--milestone-every M] [--geometric]\n"
     "                          [--dry-run] [--endpoint URL] [--region R]\n"
     "\n"
     "Deletes the checkpoints the policy does not keep (asks unless --yes). On\n"
     "s3://, the remote retention: --yes or --dry-run is required; a checkpoint\n"
     "goes manifest.pb first, then its other objects, and every incomplete prefix\n"
     "older than the newest complete checkpoint (an upload given up) goes too.\n"
     "--geometric is not applied there.\n"
     "\n"
     "  --keep-last N          keep the newest N (required, N >= 1)\n"
     "  --milestone-every M    also keep every one whose step is a multiple of M\n"
     "  --geometric            also keep, of the rest, the newest in each band of\n"
     "                         [2^k, 2^(k+1)) steps behind the newest step\n"
     "  --dry-run              say what would go, delete nothing\n"
     "  --endpoint URL         an s3:// ROOT's store (http://host:port)\n" CKPT_FOOT},
    {"ckpt restore",
     "usage: graftctl ckpt restore ROOT --dry-run [--step S] [--secret-file F]\n"
     "                            [--endpoint URL] [--region R]\n"
     "\n"
     "Which checkpoint a trainer's start-up would restore: the newest one (or step S)\n"
     "that verifies in full, and the ones skipped with why. On s3://, what\n"
     "graft_persist_remote_restore() would take (each one downloaded and verified).\n"
     "\n"
     "  --dry-run              required: the restore itself is the trainer's\n"
     "  --step S               that step instead of the newest\n"
     "  --secret-file F        also check the manifest's MAC under the job secret\n" CKPT_FOOT},
};

#define N_HELPS (sizeof(helps) / sizeof(helps[0]))

bool graftctl_help_print(const char *cmd, const char *sub)
{
    char name[64];
    if (cmd == NULL)
        return false;
    if (strcmp(cmd, "ckpt") == 0 && sub != NULL && sub[0] != '-') {
        snprintf(name, sizeof(name), "ckpt %s", sub);
        for (size_t i = 0; i < N_HELPS; i++)
            if (strcmp(helps[i].name, name) == 0) {
                fputs(helps[i].text, stdout);
                return true;
            }
    }
    if (strcmp(cmd, "ckpt") == 0) {
        fputs("usage: graftctl ckpt ls|verify|inspect|prune|restore ROOT ...\n"
              "\n"
              "Commands on a checkpoint root; graftctl ckpt SUB --help for one of them.\n\n",
              stdout);
        for (size_t i = 0; i < N_HELPS; i++)
            if (strncmp(helps[i].name, "ckpt ", 5) == 0) {
                const char *t = helps[i].text;
                const char *end = strstr(t, CKPT_FOOT);
                fprintf(stdout, "%.*s\n", (int)(end != NULL ? end - t : (long)strlen(t)), t);
            }
        fputs(CKPT_FOOT + 1, stdout);
        return true;
    }
    for (size_t i = 0; i < N_HELPS; i++)
        if (strcmp(helps[i].name, cmd) == 0) {
            fputs(helps[i].text, stdout);
            return true;
        }
    return false;
}
