/*
 * train_mlp: a small deterministic trainer on graft's public API.
 *
 * Each rank trains a 2-layer MLP (float32, about 2,700 parameters) with Adam
 * on a synthetic, deterministic dataset. Its whole training state lives in
 * graft regions: parameters, Adam moments, the dropout RNG, the data-loader
 * position, the LR scheduler and the step counter (plus an optional blob to
 * make the state larger). There is no collective library here, so the
 * data-parallel all-reduce across groups is simulated: every group computes
 * the same gradient over the same global batch, and all groups hold
 * bit-identical state after every commit. Rank r of a group trains its own
 * shard (a model seeded with seed + r), like a sharded model would.
 *
 * Configuration comes from GRAFT_* environment variables (docs/RUNTIME.md);
 * flags:
 *   --steps N             train until N steps are committed (default 20)
 *   --seed S              initial-state seed (default 1)
 *   --state-hash-out FILE write the final state hash (hex) to FILE
 *   --hash-log FILE       append "step hash" after every applied commit
 *   --role-log FILE       append "step serve N" when a quorum makes this rank a
 *                         donor to N recipients, "step serving G R" when its
 *                         transfer endpoint starts serving rank R of group G
 *                         (sent it the manifest: the pull reads from here
 *                         on), "step pulled G R ok|failed" when that
 *                         recipient reported its pull done, "step served"
 *                         once that step's commit returned (the serve is
 *                         over), and "step heal STATUS MS DETAIL" when a
 *                         heal of this rank ended
 *                         (In these three FILEs, each "{group}" stands for
 *                         this process's group, known once graft_group()
 *                         says it: a spare, GRAFT_SPARE=1, writes nothing
 *                         there before its first graft_quorum() returned.)
 *   --step-delay-ms MS    sleep MS per step (simulated compute)
 *   --blob-mib N          add an N MiB blob region to the state
 *   --die-when-serving MS SIGKILL this process MS ms after it starts serving
 *   --serve-before-end    do not commit the last step before this rank has
 *                         served once: until a quorum makes it a donor, vote
 *                         no at the last step (graft_commit_veto) and retry,
 *                         so a group late to join still finds this one
 *                         serving (with --die-when-serving: a donor that is
 *                         sure to die serving, however slowly the other
 *                         group starts)
 *   --serve-at STEP       the same hold at step STEP: a group started first
 *                         waits there for a late group to join it
 *   --die-at-step N       SIGKILL this process when step N starts, once the
 *                         persistent checkpoint it last started is durable
 *   --die-before-vote N   SIGKILL this process once step N's quorum returned,
 *                         before its graft_commit() (between ready and vote)
 *   --restart-at N        once step N's quorum returned, restart in place
 *                         (graft_restart(): endpoint and membership made anew,
 *                         the process stays) instead of voting, as after a
 *                         collective that failed
 *   --vote-delay-at N     sleep --vote-delay-ms MS before step N's
 *   --vote-delay-ms MS    graft_commit() (a rank that votes late)
 *   --checkpoint-at N     call graft_checkpoint_now() after step N commits
 *   --corrupt-at-step N   flip a parameter bit after step N (drift injection)
 *   --no-graft            train alone without the runtime (the reference)
 * It prints "final step N hash H start K recoveries R" on standard output,
 * then "metrics commits C commits_failed F drift_checks D drift_mismatches M
 * restores S recovery_failures X serves V checkpoints_written W
 * checkpoints_committed K".
 * Exit status: 0 done, 1 a graft call failed, 2 bad configuration or flags.
 */
#include <graft/graft.h>

#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define IN 16
#define HID 128
#define OUT 4
#define BATCH 32
#define NPARAM (IN * HID + HID + HID * OUT + OUT)
#define DROPOUT 0.1f

typedef struct sched {
    uint64_t step; /* scheduler's own step */
    float base_lr;
    float pad;
} sched_t;

typedef struct state {
    float param[NPARAM];
    float adam_m[NPARAM];
    float adam_v[NPARAM];
    uint64_t rng;      /* xorshift64* state for dropout */
    uint64_t data_pos; /* next sample */
    sched_t sched;
    uint64_t step;
    uint8_t *blob;
    size_t blob_bytes;
} state_t;

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static float unit(uint64_t r)
{
    return (float)(r >> 40) / (float)(1u << 24);
}

static void state_init(state_t *s, uint64_t seed)
{
    uint64_t x = seed * 7919u + 17u;
    for (size_t i = 0; i < NPARAM; i++)
        s->param[i] = (unit(splitmix(&x)) - 0.5f) * 0.2f;
    memset(s->adam_m, 0, sizeof(s->adam_m));
    memset(s->adam_v, 0, sizeof(s->adam_v));
    s->rng = seed * 2654435761u + 1u;
    s->data_pos = 0;
    s->sched.step = 0;
    s->sched.base_lr = 0.01f;
    s->sched.pad = 0;
    s->step = 0;
    for (size_t i = 0; i < s->blob_bytes; i++)
        s->blob[i] = (uint8_t)(splitmix(&x) >> 56);
}

/* Sample i of the synthetic dataset: features from a hash of i, the label
 * from a fixed teacher. */
static void sample(uint64_t i, float *x, int *label)
{
    uint64_t h = i * 0x9E3779B97F4A7C15ull + 3u;
    float best = -1e30f;
    for (int j = 0; j < IN; j++)
        x[j] = unit(splitmix(&h)) * 2.0f - 1.0f;
    for (int c = 0; c < OUT; c++) {
        float z = 0;
        for (int j = 0; j < IN; j++)
            z += x[j] * (float)(((j * 7 + c * 13) % 5) - 2);
        if (z > best) {
            best = z;
            *label = c;
        }
    }
}

static float lr_at(const sched_t *sc)
{
    float warm = sc->step < 10 ? (float)(sc->step + 1) / 10.0f : 1.0f;
    return sc->base_lr * warm / (1.0f + 0.01f * (float)sc->step);
}

/* Forward and backward over one batch; the RNG used for dropout is
 * advanced in *rng (a copy: the caller keeps it only if the step commits). */
static float gradient(const state_t *s, uint64_t *rng, float *grad)
{
    const float *w1 = s->param, *b1 = w1 + IN * HID, *w2 = b1 + HID, *b2 = w2 + HID * OUT;
    float *gw1 = grad, *gb1 = gw1 + IN * HID, *gw2 = gb1 + HID, *gb2 = gw2 + HID * OUT;
    float loss = 0;
    memset(grad, 0, NPARAM * sizeof(float));
    for (int b = 0; b < BATCH; b++) {
        float x[IN], h[HID], mask[HID], z[OUT], p[OUT], dz[OUT], dh[HID];
        int y = 0;
        sample(s->data_pos + (uint64_t)b, x, &y);
        for (int k = 0; k < HID; k++) {
            float a = b1[k];
            for (int j = 0; j < IN; j++)
                a += x[j] * w1[j * HID + k];
            mask[k] = unit(xorshift(rng)) < DROPOUT ? 0.0f : 1.0f / (1.0f - DROPOUT);
            h[k] = (a > 0 ? a : 0) * mask[k];
        }
        float mx = -1e30f, sum = 0;
        for (int c = 0; c < OUT; c++) {
            z[c] = b2[c];
            for (int k = 0; k < HID; k++)
                z[c] += h[k] * w2[k * OUT + c];
            mx = z[c] > mx ? z[c] : mx;
        }
        for (int c = 0; c < OUT; c++)
            sum += p[c] = expf(z[c] - mx);
        for (int c = 0; c < OUT; c++) {
            p[c] /= sum;
            dz[c] = (p[c] - (c == y ? 1.0f : 0.0f)) / BATCH;
        }
        loss -= logf(p[y] + 1e-12f) / BATCH;
        for (int k = 0; k < HID; k++) {
            dh[k] = 0;
            for (int c = 0; c < OUT; c++) {
                gw2[k * OUT + c] += h[k] * dz[c];
                dh[k] += w2[k * OUT + c] * dz[c];
            }
            dh[k] = h[k] > 0 ? dh[k] * mask[k] : 0;
        }
        for (int c = 0; c < OUT; c++)
            gb2[c] += dz[c];
        for (int k = 0; k < HID; k++) {
            gb1[k] += dh[k];
            for (int j = 0; j < IN; j++)
                gw1[j * HID + k] += x[j] * dh[k];
        }
    }
    return loss;
}

static void adam_step(state_t *s, const float *grad, uint64_t rng_after)
{
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    float lr = lr_at(&s->sched);
    float t = (float)(s->step + 1);
    float c1 = 1.0f - powf(b1, t), c2 = 1.0f - powf(b2, t);
    for (size_t i = 0; i < NPARAM; i++) {
        s->adam_m[i] = b1 * s->adam_m[i] + (1 - b1) * grad[i];
        s->adam_v[i] = b2 * s->adam_v[i] + (1 - b2) * grad[i] * grad[i];
        s->param[i] -= lr * (s->adam_m[i] / c1) / (sqrtf(s->adam_v[i] / c2) + eps);
    }
    s->rng = rng_after;
    s->data_pos += BATCH;
    s->sched.step++;
    s->step++;
    if (s->blob_bytes > 0) /* the blob changes every step too */
        s->blob[(s->step * 4099u) % s->blob_bytes] ^= (uint8_t)s->step;
}

static uint64_t state_hash(const state_t *s)
{
    XXH3_state_t *h = XXH3_createState();
    uint64_t v;
    XXH3_64bits_reset(h);
    XXH3_64bits_update(h, s->param, sizeof(s->param));
    XXH3_64bits_update(h, s->adam_m, sizeof(s->adam_m));
    XXH3_64bits_update(h, s->adam_v, sizeof(s->adam_v));
    XXH3_64bits_update(h, &s->rng, sizeof(s->rng));
    XXH3_64bits_update(h, &s->data_pos, sizeof(s->data_pos));
    XXH3_64bits_update(h, &s->sched, sizeof(s->sched));
    XXH3_64bits_update(h, &s->step, sizeof(s->step));
    if (s->blob_bytes > 0)
        XXH3_64bits_update(h, s->blob, s->blob_bytes);
    v = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return v;
}

/* Fingerprint: the model's loss on a fixed batch, hashed (a change in any
 * parameter changes it). */
static graft_status_t fingerprint(void *arg, uint64_t *fp_p)
{
    const state_t *s = arg;
    float grad[NPARAM];
    state_t probe = *s;
    uint64_t rng = 42;
    probe.data_pos = 1u << 30;
    float loss = gradient(&probe, &rng, grad);
    *fp_p = XXH3_64bits(&loss, sizeof(loss)) ^ XXH3_64bits(grad, sizeof(grad));
    return GRAFT_OK;
}

typedef struct opts {
    uint64_t steps, seed, step_delay_ms, blob_mib, die_when_serving_ms, die_at_step, ckpt_at;
    uint64_t corrupt_at, die_before_vote, vote_delay_at, vote_delay_ms, restart_at;
    /* Hold at this step (vetoing its commit) until this group has served
     * once; UINT64_MAX: never. --serve-before-end: the last step. */
    uint64_t serve_at;
    const char *hash_out, *hash_log, *role_log;
    bool no_graft, die_when_serving, serve_before_end;
    graft_runtime_t *rt; /* for "{group}" in the file names above */
} opts_t;

#define GROUP_PLACEHOLDER "{group}"

/* A per-slot file's name with each "{group}" replaced by this process's
 * group: graft-sim hands a spare such names, as it cannot know the slot
 * the spare will take (docs/SIM.md, trainer contract). NULL while the
 * group is unknown (a spare not promoted yet) or the name does not fit. */
static const char *slot_path(const opts_t *o, const char *name, char *buf, size_t cap)
{
    if (name == NULL || strstr(name, GROUP_PLACEHOLDER) == NULL)
        return name;
    uint32_t g = o->rt != NULL ? graft_group(o->rt) : UINT32_MAX;
    if (g == UINT32_MAX)
        return NULL;
    size_t n = 0;
    for (const char *p = name; *p != '\0' && n < cap;) {
        const char *ph = strstr(p, GROUP_PLACEHOLDER);
        size_t lit = ph != NULL ? (size_t)(ph - p) : strlen(p);
        int w = snprintf(buf + n, cap - n, "%.*s", (int)lit, p);
        n += w > 0 ? (size_t)w : 0;
        p += lit;
        if (ph != NULL && n < cap) {
            w = snprintf(buf + n, cap - n, "%" PRIu32, g);
            n += w > 0 ? (size_t)w : 0;
            p += strlen(GROUP_PLACEHOLDER);
        }
    }
    return n < cap ? buf : NULL;
}

static int parse_u64(const char *flag, const char *v, uint64_t *out)
{
    char *end = NULL;
    if (v == NULL || *v == '\0' || *v == '-') {
        fprintf(stderr, "train_mlp: %s needs a non-negative integer\n", flag);
        return -1;
    }
    *out = strtoull(v, &end, 10);
    if (*end != '\0') {
        fprintf(stderr, "train_mlp: %s: '%s' is not a non-negative integer\n", flag, v);
        return -1;
    }
    return 0;
}

static int parse_args(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->steps = 20;
    o->seed = 1;
    o->serve_at = UINT64_MAX;
    o->die_before_vote = UINT64_MAX; /* step 0 is a step too */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t *num = NULL;
        if (strcmp(a, "--no-graft") == 0) {
            o->no_graft = true;
            continue;
        } else if (strcmp(a, "--serve-before-end") == 0) {
            o->serve_before_end = true;
            continue;
        } else if (strcmp(a, "--state-hash-out") == 0 || strcmp(a, "--hash-log") == 0 ||
                   strcmp(a, "--role-log") == 0) {
            if (v == NULL) {
                fprintf(stderr, "train_mlp: %s needs a file name\n", a);
                return -1;
            }
            *(strcmp(a, "--hash-log") == 0   ? &o->hash_log
              : strcmp(a, "--role-log") == 0 ? &o->role_log
                                             : &o->hash_out) = v;
            i++;
            continue;
        } else if (strcmp(a, "--steps") == 0) {
            num = &o->steps;
        } else if (strcmp(a, "--seed") == 0) {
            num = &o->seed;
        } else if (strcmp(a, "--step-delay-ms") == 0) {
            num = &o->step_delay_ms;
        } else if (strcmp(a, "--blob-mib") == 0) {
            num = &o->blob_mib;
        } else if (strcmp(a, "--die-when-serving") == 0) {
            num = &o->die_when_serving_ms;
            o->die_when_serving = true;
        } else if (strcmp(a, "--die-at-step") == 0) {
            num = &o->die_at_step;
        } else if (strcmp(a, "--die-before-vote") == 0) {
            num = &o->die_before_vote;
        } else if (strcmp(a, "--restart-at") == 0) {
            num = &o->restart_at;
        } else if (strcmp(a, "--vote-delay-at") == 0) {
            num = &o->vote_delay_at;
        } else if (strcmp(a, "--vote-delay-ms") == 0) {
            num = &o->vote_delay_ms;
        } else if (strcmp(a, "--corrupt-at-step") == 0) {
            num = &o->corrupt_at;
        } else if (strcmp(a, "--checkpoint-at") == 0) {
            num = &o->ckpt_at;
        } else if (strcmp(a, "--serve-at") == 0) {
            num = &o->serve_at;
        } else {
            fprintf(stderr, "train_mlp: unknown flag '%s' (see docs/RUNTIME.md)\n", a);
            return -1;
        }
        if (parse_u64(a, v, num) != 0)
            return -1;
        i++;
    }
    if (o->blob_mib > 4096) {
        fprintf(stderr, "train_mlp: --blob-mib: at most 4096\n");
        return -1;
    }
    return 0;
}

static void sleep_ms(uint64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

static int register_all(graft_runtime_t *rt, state_t *s)
{
    const graft_region_t regs[] = {
        {"param", GRAFT_REGION_PARAM, 1, GRAFT_DEVICE_HOST, s->param, sizeof(s->param), 0, 0},
        {"adam_m", GRAFT_REGION_OPTIM, 1, GRAFT_DEVICE_HOST, s->adam_m, sizeof(s->adam_m), 0, 0},
        {"adam_v", GRAFT_REGION_OPTIM, 1, GRAFT_DEVICE_HOST, s->adam_v, sizeof(s->adam_v), 0, 0},
        {"dropout_rng", GRAFT_REGION_RNG, 0, GRAFT_DEVICE_HOST, &s->rng, sizeof(s->rng), 0, 0},
        {"data_pos", GRAFT_REGION_DATA, 0, GRAFT_DEVICE_HOST, &s->data_pos, sizeof(s->data_pos),
         0, 0},
        {"lr_sched", GRAFT_REGION_SCHED, 0, GRAFT_DEVICE_HOST, &s->sched, sizeof(s->sched), 0, 0},
        {"step", GRAFT_REGION_STEP, 0, GRAFT_DEVICE_HOST, &s->step, sizeof(s->step), 0, 0},
        {"blob", GRAFT_REGION_BLOB, 0, GRAFT_DEVICE_HOST, s->blob, s->blob_bytes, 0, 0},
    };
    for (size_t i = 0; i < sizeof(regs) / sizeof(regs[0]); i++) {
        if (regs[i].bytes == 0)
            continue;
        graft_status_t st = graft_region_register(rt, &regs[i]);
        if (st != GRAFT_OK) {
            fprintf(stderr, "train_mlp: register %s: %s\n", regs[i].name,
                    graft_status_string(st));
            return -1;
        }
    }
    return 0;
}

static void log_hash(const opts_t *o, const state_t *s)
{
    char buf[4096];
    const char *path = slot_path(o, o->hash_log, buf, sizeof(buf));
    if (path == NULL)
        return;
    FILE *f = fopen(path, "a");
    if (f == NULL)
        return;
    fprintf(f, "%" PRIu64 " %016" PRIx64 "\n", s->step, state_hash(s));
    fclose(f);
}

/* One line of the --role-log, written whole (one write per line) so that a
 * reader polling the file (the simulator) never sees half of one. */
static void log_role(const opts_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_role(const opts_t *o, const char *fmt, ...)
{
    char line[640], buf[4096];
    va_list ap;
    const char *path = slot_path(o, o->role_log, buf, sizeof(buf));
    if (path == NULL)
        return;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    FILE *f = fopen(path, "a");
    if (f == NULL)
        return;
    setvbuf(f, NULL, _IONBF, 0);
    if (fwrite(line, 1, (size_t)n, f) != (size_t)n) {
        /* a reading aid; training goes on without it */
    }
    fclose(f);
}

/*
 * The library's log, with the transfer endpoint's serve messages copied to
 * the --role-log: "serving group G rank R at step S" (debug) is logged once
 * the endpoint has sent a recipient its manifest, "group G rank R done with
 * step S (ok)" when that recipient reports its pull over. They are the only
 * signal of a donor really being read from (the runtime's own "serve" is the
 * quorum's assignment, before any recipient has connected). Messages at or
 * above the threshold the user asked for (GRAFT_LOG) go to standard error
 * as the default sink prints them.
 */
static graft_log_level_t user_log_level = GRAFT_LOG_WARN;
static const char *const log_level_names[] = {"off", "error", "warn", "info", "debug", "trace"};

static void on_log(graft_log_level_t level, const char *module, const char *message, void *arg)
{
    const opts_t *o = arg;
    unsigned g = 0, r = 0;
    unsigned long long step = 0;
    char ok[16] = "";
    if (strcmp(module, "transfer") == 0 && level == GRAFT_LOG_DEBUG) {
        if (sscanf(message, "serving group %u rank %u at step %llu", &g, &r, &step) == 3)
            log_role(o, "%llu serving %u %u", step, g, r);
        else if (sscanf(message, "group %u rank %u done with step %llu (%15[a-z])", &g, &r, &step,
                        ok) == 4)
            log_role(o, "%llu pulled %u %u %s", step, g, r, ok);
    }
    if (level == GRAFT_LOG_OFF || level > user_log_level)
        return;
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "[%02d:%02d:%02d.%03ld] graft %-5s %s[%d]: %s\n", tm.tm_hour, tm.tm_min,
            tm.tm_sec, ts.tv_nsec / 1000000, log_level_names[level], module, (int)getpid(),
            message);
}

/* Heals as the runtime reports them (on the training thread). */
static void on_event(const graft_runtime_event_t *ev, void *arg)
{
    const opts_t *o = arg;
    if (ev->kind == GRAFT_RUNTIME_EVENT_RECOVERY)
        log_role(o, "%" PRIu64 " heal %s %.1f %s", ev->step, graft_status_name(ev->status),
                 (double)ev->transfer_ns / 1e6, ev->detail);
}

static int finish(const opts_t *o, const state_t *s, const char *start, uint64_t recoveries)
{
    uint64_t h = state_hash(s);
    printf("final step %" PRIu64 " hash %016" PRIx64 " start %s recoveries %" PRIu64 "\n",
           s->step, h, start, recoveries);
    char buf[4096];
    const char *path = slot_path(o, o->hash_out, buf, sizeof(buf));
    if (o->hash_out != NULL && path == NULL) {
        fprintf(stderr, "train_mlp: --state-hash-out %s: no group to put in its name\n",
                o->hash_out);
        return 1;
    }
    if (path != NULL) {
        FILE *f = fopen(path, "w");
        if (f == NULL || fprintf(f, "%016" PRIx64 "\n", h) < 0 || fclose(f) != 0) {
            perror(path);
            return 1;
        }
    }
    return 0;
}

static int run_alone(const opts_t *o, state_t *s)
{
    static float grad[NPARAM];
    while (s->step < o->steps) {
        uint64_t rng = s->rng;
        (void)gradient(s, &rng, grad);
        adam_step(s, grad, rng);
    }
    return finish(o, s, "alone", 0);
}

/* The training loop: a step per quorum until the closing step commits.
 * 0 at the end, 1 for a spare (GRAFT_SPARE=1) the job finished without,
 * -1 when graft_quorum() failed. */
static int train(graft_runtime_t *rt, const opts_t *o, state_t *s, float *grad)
{
    graft_status_t st;
    bool served = false;
    bool promoted_said = false;
    bool restarted = false; /* --restart-at happens once */
    uint32_t configured_group = graft_group(rt); /* UINT32_MAX for a spare */
    for (;;) {
        graft_step_info_t info;
        bool apply = false;
        if (o->die_at_step > 0 && graft_step(rt) == o->die_at_step) {
            /* The checkpoints a restart finds are then known, however
             * slowly the background writer ran. */
            st = graft_checkpoint_wait(rt);
            if (st != GRAFT_OK)
                fprintf(stderr, "train_mlp: graft_checkpoint_wait: %s\n", graft_status_string(st));
            raise(SIGKILL);
        }
        st = graft_quorum(rt, &info);
        if (st == GRAFT_ECANCELED && graft_finished(rt))
            return 1; /* a spare the job ended without */
        if (st != GRAFT_OK) {
            fprintf(stderr, "train_mlp: graft_quorum: %s\n", graft_status_string(st));
            return -1;
        }
        if (!promoted_said && graft_group(rt) != configured_group) {
            /* A spare's first quorum returns once it took a slot. */
            printf("spare promoted to group %" PRIu32 "\n", graft_group(rt));
            fflush(stdout);
        }
        promoted_said = true;
        if (info.donor)
            log_role(o, "%" PRIu64 " serve %" PRIu32, info.step, info.n_recipients);
        if (info.step >= o->steps) {
            /* The closing step (graft_finish()): still closed (a healing
             * group installs the final state, a donor holds until its
             * recipients are done), never applied; with a persistent tier
             * the final state's checkpoint is written here. Opened again
             * until this group commits it (docs/RUNTIME.md, "A clean end"). */
            st = graft_heal_wait(rt);
            if (graft_finish(rt) != GRAFT_OK)
                fprintf(stderr, "train_mlp: graft_finish failed\n");
            st = graft_commit(rt, &apply);
            if (st != GRAFT_OK && st != GRAFT_EDRIFT)
                fprintf(stderr, "train_mlp: graft_commit: %s\n", graft_status_string(st));
            if (info.donor)
                log_role(o, "%" PRIu64 " served", info.step);
            if (graft_finished(rt))
                break;
            continue;
        }
        if (info.donor && o->die_when_serving) {
            sleep_ms(o->die_when_serving_ms);
            raise(SIGKILL);
        }
        served = served || info.donor;
        uint64_t hold_at = o->serve_before_end ? o->steps - 1 : o->serve_at;
        if (!served && info.step == hold_at && graft_commit_veto(rt) != GRAFT_OK)
            fprintf(stderr, "train_mlp: graft_commit_veto failed\n");
        st = graft_heal_wait(rt);
        uint64_t rng = s->rng;
        if (st == GRAFT_OK)
            (void)gradient(s, &rng, grad);
        if (o->step_delay_ms > 0)
            sleep_ms(o->step_delay_ms);
        if (info.step == o->die_before_vote)
            raise(SIGKILL);
        if (o->restart_at > 0 && info.step == o->restart_at && !restarted) {
            /* The forced failure: this step is abandoned, not voted. */
            restarted = true;
            st = graft_restart(rt);
            if (st != GRAFT_OK) {
                fprintf(stderr, "train_mlp: graft_restart: %s\n", graft_status_string(st));
                return -1;
            }
            continue;
        }
        if (o->vote_delay_at > 0 && info.step == o->vote_delay_at)
            sleep_ms(o->vote_delay_ms);
        st = graft_commit(rt, &apply);
        if (info.donor)
            log_role(o, "%" PRIu64 " served", info.step);
        if (st != GRAFT_OK && st != GRAFT_EDRIFT)
            fprintf(stderr, "train_mlp: graft_commit: %s\n", graft_status_string(st));
        if (apply) {
            adam_step(s, grad, rng);
            log_hash(o, s);
            if (o->corrupt_at > 0 && s->step == o->corrupt_at) {
                uint32_t bits;
                memcpy(&bits, &s->param[0], sizeof(bits));
                bits ^= 1u << 3;
                memcpy(&s->param[0], &bits, sizeof(bits));
            }
            if (o->ckpt_at > 0 && s->step == o->ckpt_at) {
                st = graft_checkpoint_now(rt);
                if (st != GRAFT_OK)
                    fprintf(stderr, "train_mlp: graft_checkpoint_now: %s\n",
                            graft_status_string(st));
            }
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    static float grad[NPARAM];
    static state_t s;
    opts_t o;
    graft_config_t *cfg = NULL;
    graft_runtime_t *rt = NULL;
    char *err = NULL;
    int rc = 1;
    graft_status_t st;

    if (parse_args(argc, argv, &o) != 0)
        return 2;
    s.blob_bytes = (size_t)o.blob_mib << 20;
    if (s.blob_bytes > 0 && (s.blob = malloc(s.blob_bytes)) == NULL) {
        perror("malloc");
        return 1;
    }
    uint64_t rank = 0;
    const char *env_rank = getenv("GRAFT_RANK");
    if (env_rank != NULL)
        rank = strtoull(env_rank, NULL, 10);
    state_init(&s, o.seed + rank);
    if (o.no_graft) {
        rc = run_alone(&o, &s);
        goto out;
    }

    if (graft_config_create(&cfg) != GRAFT_OK || graft_config_from_env(cfg, &err) != GRAFT_OK ||
        graft_config_validate(cfg, &err) != GRAFT_OK) {
        fprintf(stderr, "train_mlp: %s\n", err != NULL ? err : "configuration failed");
        rc = 2;
        goto out;
    }
    st = graft_init(cfg, &rt);
    if (st != GRAFT_OK) {
        fprintf(stderr, "train_mlp: graft_init: %s\n", graft_status_string(st));
        goto out;
    }
    o.rt = rt;
    if (register_all(rt, &s) != 0)
        goto out;
    graft_fingerprint_set(rt, fingerprint, &s);
    if (o.role_log != NULL) {
        graft_event_callback_set(rt, on_event, &o);
        /* The serve messages are debug messages: let them through to the
         * sink, which still prints only what GRAFT_LOG asked for. */
        user_log_level = graft_log_level_get();
        graft_log_callback_set(on_log, &o);
        if (user_log_level < GRAFT_LOG_DEBUG)
            graft_log_level_set(GRAFT_LOG_DEBUG);
    }

    int trained = train(rt, &o, &s, grad);
    if (trained == 1) {
        printf("spare unused: the job finished without it\n");
        rc = 0;
        goto out;
    }
    if (trained != 0)
        goto out;
    /* The last checkpoint's background part counts in the metrics. */
    st = graft_checkpoint_wait(rt);
    if (st != GRAFT_OK)
        fprintf(stderr, "train_mlp: the last checkpoint failed: %s\n", graft_status_string(st));
    graft_metrics_t m;
    graft_metrics_get(rt, &m);
    graft_start_kind_t k = graft_start_kind(rt);
    rc = finish(&o, &s,
                k == GRAFT_START_PEER ? "peer" : k == GRAFT_START_RESTORE ? "restore" : "cold",
                m.recoveries);
    printf("metrics commits %" PRIu64 " commits_failed %" PRIu64 " drift_checks %" PRIu64
           " drift_mismatches %" PRIu64 " restores %" PRIu64 " recovery_failures %" PRIu64
           " serves %" PRIu64 " checkpoints_written %" PRIu64 " checkpoints_committed %" PRIu64
           " steady_steps %" PRIu64 " steady_fallbacks %" PRIu64 " etcd_requests %" PRIu64
           " remote_uploaded %" PRIu64 " remote_superseded %" PRIu64 "\n",
           m.commits, m.commits_failed, m.drift_checks, m.drift_mismatches, m.restores,
           m.recovery_failures, m.serves, m.checkpoints_written, m.checkpoints_committed,
           m.steady_steps, m.steady_fallbacks, m.etcd_requests, m.remote_uploaded,
           m.remote_superseded);
out:
    graft_destroy(rt);
    graft_log_callback_set(NULL, NULL);
    graft_config_destroy(cfg);
    graft_free(err);
    free(s.blob);
    return rc;
}
