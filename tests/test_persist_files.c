/*
 * Checkpoint files against someone who can plant files (docs/SECURITY.md,
 * "Checkpoint files"), on real files in a temporary directory:
 *  - a symbolic link planted at a temporary shard name, at the temporary
 *    manifest names, at a final shard name (local and second tier): the file
 *    it names is untouched, the checkpoint is written safely beside it;
 *  - a link where a step directory should be: the write fails, naming the
 *    link, and writes nothing where it points; retention removes the link,
 *    never what it names; readers refuse a link at a shard or manifest;
 *  - file modes: 0600 files and 0700 directories by default, whatever the
 *    umask lets through; file_mode (and the persist_file_mode setting)
 *    widens them; modes that would let others write or execute are refused;
 *  - the manifest MAC: a forged manifest (its region table re-written, its
 *    checksums valid) verifies without the secret, fails with it, and a
 *    restore that knows the secret skips it for the genuine older one;
 *    `graftctl ckpt verify --secret-file` tells good from forged.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sys/wait.h>

#include <graft/graft.h>

#include "persist/persist_internal.h"
#include "persist_fixture.h"

static const uint8_t secret[] = "0123456789abcdef-the-job-secret";
#define SECRET_LEN (sizeof(secret) - 1)
static const uint8_t other_secret[] = "someone-else's-secret-0123456789";
#define VICTIM_TEXT "precious: not a checkpoint\n"

/* ---------------------------------------------------------- log capture --- */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[8192];

static void log_sink(graft_log_level_t level, const char *module, const char *message, void *arg)
{
    (void)level;
    (void)module;
    (void)arg;
    pthread_mutex_lock(&log_mu);
    size_t n = strlen(log_text);
    snprintf(log_text + n, sizeof(log_text) - n, "%s\n", message);
    pthread_mutex_unlock(&log_mu);
}

static bool log_has(const char *needle)
{
    pthread_mutex_lock(&log_mu);
    bool found = strstr(log_text, needle) != NULL;
    pthread_mutex_unlock(&log_mu);
    return found;
}

static int setup(void **state)
{
    (void)state;
    log_text[0] = '\0';
    graft_log_sink_set(log_sink, NULL);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    graft_log_sink_set(NULL, NULL);
    return 0;
}

/* --------------------------------------------------------------- helpers --- */

static char *join(const char *a, const char *b)
{
    char *p = malloc(strlen(a) + strlen(b) + 2);
    sprintf(p, "%s/%s", a, b);
    return p;
}

static char *victim_make(const char *tmp)
{
    char *v = join(tmp, "victim");
    FILE *f = fopen(v, "w");
    assert_non_null(f);
    fputs(VICTIM_TEXT, f);
    fclose(f);
    return v;
}

static void victim_check(const char *v)
{
    FILE *f = fopen(v, "r");
    assert_non_null(f);
    char buf[256] = "";
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    assert_string_equal(buf, VICTIM_TEXT);
}

/* Plants a link named @p name in step @p step's directory (created) that
 * points at @p target. */
static void plant(const char *root, uint64_t step, const char *name, const char *target)
{
    pt_mkdir_step(root, step);
    char *p = pt_path(root, step, name);
    assert_int_equal(symlink(target, p), 0);
    free(p);
}

static bool is_regular(const char *root, uint64_t step, const char *name)
{
    char *p = pt_path(root, step, name);
    struct stat sb;
    bool r = lstat(p, &sb) == 0 && S_ISREG(sb.st_mode);
    free(p);
    return r;
}

static unsigned mode_of(const char *path)
{
    struct stat sb;
    assert_int_equal(lstat(path, &sb), 0);
    return (unsigned)(sb.st_mode & 07777);
}

typedef struct save_opts {
    const char *second_root;
    uint32_t file_mode;
    const uint8_t *secret;
    size_t secret_len;
} save_opts_t;

/* One checkpoint of pt_global_small(step) over @p ranks ranks. */
static graft_status_t save(const char *root, uint64_t step, uint32_t ranks, const save_opts_t *o,
                           graft_persist_write_result_t *res)
{
    pt_global_t *g = pt_global_small(step);
    pt_layout_t *lay = pt_global_split(g, ranks);
    graft_persist_config_t cfg = {.root = root, .chunk_bytes = 4096};
    if (o != NULL) {
        cfg.second_root = o->second_root;
        cfg.file_mode = o->file_mode;
        cfg.secret = o->secret;
        cfg.secret_len = o->secret_len;
    }
    graft_persist_writer_t *w;
    graft_status_t st = graft_persist_writer_create(&cfg, &w);
    if (st == GRAFT_OK) {
        st = graft_persist_save(w, step, ranks,
                                (const graft_persist_region_t *const *)lay->regions,
                                lay->nregions, NULL);
        if (st == GRAFT_OK)
            st = graft_persist_wait(w, step, res);
        graft_persist_writer_destroy(w);
    }
    pt_layout_free(lay);
    pt_global_free(g);
    return st;
}

/* Restores step (0: newest usable) onto one rank and checks the bytes are
 * those of @p expect_step. */
static graft_status_t restore(const char *root, uint64_t step, const uint8_t *key, size_t key_len,
                              uint64_t expect_step, graft_persist_restore_result_t *rr)
{
    pt_global_t *want = pt_global_small(expect_step);
    pt_global_t *got = pt_global_clone_empty(want);
    pt_layout_t *lay = pt_global_split(got, 1);
    graft_persist_restore_params_t p = {.rank = 0, .ranks = 1, .regions = lay->regions[0],
                                        .nregions = lay->nregions[0], .step = step,
                                        .verify_full = true, .secret = key,
                                        .secret_len = key_len};
    graft_status_t st = graft_persist_restore(root, &p, rr);
    if (st == GRAFT_OK && !pt_global_equal(want, got))
        st = GRAFT_EHASH; /* the caller got other bytes than expected */
    pt_layout_free(lay);
    pt_global_free(got);
    pt_global_free(want);
    return st;
}

/* -------------------------------------------------------------- symlinks --- */

static void test_link_at_temp_shard(void **state)
{
    (void)state;
    char *tmp = pt_tmpdir();
    char *root = join(tmp, "root");
    char *victim = victim_make(tmp);
    assert_int_equal(mkdir(root, 0700), 0);
    plant(root, 20, "shard-0-of-1.tmp", victim);
    graft_persist_write_result_t res;
    assert_int_equal(save(root, 20, 1, NULL, &res), GRAFT_OK);
    victim_check(victim);
    assert_true(is_regular(root, 20, "shard-0-of-1"));
    char *t = pt_path(root, 20, "shard-0-of-1.tmp");
    assert_int_equal(access(t, F_OK), -1); /* the link went, not followed */
    free(t);
    assert_int_equal(graft_persist_verify(root, 20, GRAFT_PERSIST_VERIFY_FULL, NULL), GRAFT_OK);
    graft_persist_restore_result_t rr;
    assert_int_equal(restore(root, 20, NULL, 0, 20, &rr), GRAFT_OK);
    free(victim);
    free(root);
    pt_rmtree(tmp);
}

static void test_link_at_temp_manifest(void **state)
{
    (void)state;
    char *tmp = pt_tmpdir();
    char *root = join(tmp, "root");
    char *victim = victim_make(tmp);
    assert_int_equal(mkdir(root, 0700), 0);
    plant(root, 30, "manifest.pb.tmp", victim);
    plant(root, 30, "manifest.json.tmp", victim);
    /* a link at a final shard name is replaced by the rename */
    plant(root, 30, "shard-1-of-2", victim);
    graft_persist_write_result_t res;
    assert_int_equal(save(root, 30, 2, NULL, &res), GRAFT_OK);
    victim_check(victim);
    assert_true(is_regular(root, 30, "manifest.pb"));
    assert_true(is_regular(root, 30, "manifest.json"));
    assert_true(is_regular(root, 30, "shard-1-of-2"));
    assert_int_equal(graft_persist_verify(root, 30, GRAFT_PERSIST_VERIFY_FULL, NULL), GRAFT_OK);
    free(victim);
    free(root);
    pt_rmtree(tmp);
}

static void test_link_in_second_tier(void **state)
{
    (void)state;
    char *tmp = pt_tmpdir();
    char *root = join(tmp, "root");
    char *second = join(tmp, "second");
    char *victim = victim_make(tmp);
    assert_int_equal(mkdir(second, 0700), 0);
    plant(second, 40, "shard-0-of-1.tmp", victim);
    plant(second, 40, "manifest.pb.tmp", victim);
    save_opts_t o = {.second_root = second, .secret = secret, .secret_len = SECRET_LEN};
    graft_persist_write_result_t res;
    assert_int_equal(save(root, 40, 1, &o, &res), GRAFT_OK);
    assert_int_equal(res.second_tier_status, GRAFT_OK);
    victim_check(victim);
    assert_true(is_regular(second, 40, "shard-0-of-1"));
    assert_int_equal(graft_persist_verify_mac(second, 40, GRAFT_PERSIST_VERIFY_FULL, secret,
                                              SECRET_LEN, NULL),
                     GRAFT_OK);
    free(victim);
    free(second);
    free(root);
    pt_rmtree(tmp);
}

static void test_link_as_step_dir(void **state)
{
    (void)state;
    char *tmp = pt_tmpdir();
    char *root = join(tmp, "root");
    char *elsewhere = join(tmp, "elsewhere");
    assert_int_equal(mkdir(root, 0700), 0);
    assert_int_equal(mkdir(elsewhere, 0700), 0);
    char *step_dir = pt_path(root, 50, "");
    step_dir[strlen(step_dir) - 1] = '\0';
    assert_int_equal(symlink(elsewhere, step_dir), 0);
    graft_persist_write_result_t res;
    graft_status_t st = save(root, 50, 1, NULL, &res);
    assert_int_not_equal(st, GRAFT_OK);
    assert_true(log_has("is a symbolic link, not a directory: not writing through it"));
    assert_int_equal(pt_count_entries(elsewhere), 0);
    /* The failed checkpoint's cleanup removed at most the link itself.
     * Planted again, a genuine later checkpoint makes it a leftover:
     * retention removes the link and leaves what it names. */
    struct stat sb;
    assert_true(lstat(step_dir, &sb) != 0 || S_ISLNK(sb.st_mode));
    unlink(step_dir);
    assert_int_equal(symlink(elsewhere, step_dir), 0);
    char *kept = join(elsewhere, "kept");
    FILE *f = fopen(kept, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(save(root, 60, 1, NULL, &res), GRAFT_OK);
    graft_persist_retention_t pol = {.keep_last = 1};
    size_t deleted = 0;
    assert_int_equal(graft_persist_retention_apply(root, &pol, &deleted), GRAFT_OK);
    assert_int_equal(deleted, 1);
    assert_int_equal(lstat(step_dir, &sb), -1);
    assert_int_equal(access(kept, F_OK), 0);
    free(kept);
    free(step_dir);
    free(elsewhere);
    free(root);
    pt_rmtree(tmp);
}

/* Readers do not follow a link at a shard or manifest name either: a shard
 * replaced by a link to an identical copy is corrupt, not read. */
static void test_readers_refuse_links(void **state)
{
    (void)state;
    char *tmp = pt_tmpdir();
    char *root = join(tmp, "root");
    graft_persist_write_result_t res;
    assert_int_equal(save(root, 70, 1, NULL, &res), GRAFT_OK);
    const char *names[] = {"shard-0-of-1", "manifest.pb"};
    for (size_t i = 0; i < 2; i++) {
        char *p = pt_path(root, 70, names[i]);
        char *copy = join(tmp, names[i]);
        assert_int_equal(rename(p, copy), 0);
        assert_int_equal(symlink(copy, p), 0);
        graft_persist_entry_t e;
        assert_int_not_equal(graft_persist_verify(root, 70, GRAFT_PERSIST_VERIFY_FULL, &e),
                             GRAFT_OK);
        assert_non_null(strstr(e.reason, "symbolic link"));
        assert_int_equal(unlink(p), 0);
        assert_int_equal(rename(copy, p), 0);
        assert_int_equal(graft_persist_verify(root, 70, GRAFT_PERSIST_VERIFY_FULL, NULL),
                         GRAFT_OK);
        free(copy);
        free(p);
    }
    free(root);
    pt_rmtree(tmp);
}

/* ----------------------------------------------------------------- modes --- */

static void expect_modes(const char *root, uint64_t step, unsigned file, unsigned dir)
{
    char *d = pt_path(root, step, "");
    d[strlen(d) - 1] = '\0';
    assert_int_equal(mode_of(root), dir);
    assert_int_equal(mode_of(d), dir);
    const char *names[] = {"shard-0-of-2", "shard-1-of-2", "manifest.pb", "manifest.json"};
    for (size_t i = 0; i < 4; i++) {
        char *p = pt_path(root, step, names[i]);
        if (mode_of(p) != file)
            fail_msg("%s: mode %04o, expected %04o", p, mode_of(p), file);
        free(p);
    }
    free(d);
}

static void test_default_modes(void **state)
{
    (void)state;
    mode_t old = umask(0);
    char *tmp = pt_tmpdir();
    char *root = join(tmp, "a/root");
    char *second = join(tmp, "second");
    save_opts_t o = {.second_root = second};
    graft_persist_write_result_t res;
    /* umask 0 lets everything through: the modes are the writer's own */
    assert_int_equal(save(root, 7, 2, &o, &res), GRAFT_OK);
    assert_int_equal(res.second_tier_status, GRAFT_OK);
    expect_modes(root, 7, 0600, 0700);
    expect_modes(second, 7, 0600, 0700);
    char *a = join(tmp, "a");
    assert_int_equal(mode_of(a), 0700); /* a parent the writer created */
    free(a);
    umask(old);
    free(second);
    free(root);
    pt_rmtree(tmp);
}

static void test_widened_modes(void **state)
{
    (void)state;
    mode_t old = umask(022);
    char *tmp = pt_tmpdir();
    char *root = join(tmp, "root");
    char *second = join(tmp, "second");
    save_opts_t o = {.second_root = second, .file_mode = 0640};
    graft_persist_write_result_t res;
    assert_int_equal(save(root, 8, 2, &o, &res), GRAFT_OK);
    expect_modes(root, 8, 0640, 0750);
    expect_modes(second, 8, 0640, 0750);
    /* the umask still applies on top */
    umask(027);
    char *root2 = join(tmp, "root2");
    o = (save_opts_t){.file_mode = 0666};
    assert_int_equal(save(root2, 9, 2, &o, &res), GRAFT_OK);
    expect_modes(root2, 9, 0640, 0750);
    umask(old);
    /* modes that give away writing, executing or the owner's access */
    const uint32_t bad[] = {0700, 0644 | 01000, 0400, 0200, 0755};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        graft_persist_config_t cfg = {.root = root, .file_mode = bad[i]};
        graft_persist_writer_t *w = NULL;
        assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_EINVAL);
    }
    free(root2);
    free(second);
    free(root);
    pt_rmtree(tmp);
}

static void test_mode_setting(void **state)
{
    (void)state;
    graft_config_t *c;
    char *v = NULL, *err = NULL;
    assert_int_equal(graft_config_create(&c), GRAFT_OK);
    assert_int_equal(graft_config_get(c, "persist_file_mode", &v), GRAFT_OK);
    assert_string_equal(v, "0600");
    graft_free(v);
    assert_int_equal(graft_config_set(c, "persist_file_mode", "0640", NULL), GRAFT_OK);
    assert_int_equal(graft_config_get(c, "persist_file_mode", &v), GRAFT_OK);
    assert_string_equal(v, "0640");
    graft_free(v);
    const char *bad[] = {"0755", "0400", "640x", "rw-r-----", "-0600", "", "01600"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(graft_config_set(c, "persist_file_mode", bad[i], &err), GRAFT_EINVAL);
        assert_non_null(strstr(err, "persist_file_mode"));
        graft_free(err);
        err = NULL;
    }
    setenv("GRAFT_PERSIST_FILE_MODE", "0660", 1);
    assert_int_equal(graft_config_from_env(c, NULL), GRAFT_OK);
    unsetenv("GRAFT_PERSIST_FILE_MODE");
    assert_int_equal(graft_config_get(c, "persist_file_mode", &v), GRAFT_OK);
    assert_string_equal(v, "0660");
    graft_free(v);
    graft_config_destroy(c);
}

/* ------------------------------------------------------------ forgery --- */

/* Re-writes step's manifest as a forger would: region rng now reads the
 * shard's first bytes (those of w); the checksums are recomputed, so
 * nothing but the MAC tells. key: the forger's guess at the secret (NULL:
 * no MAC at all). */
static void forge(const char *root, uint64_t step, const uint8_t *key, size_t key_len)
{
    char *dir = pt_path(root, step, "");
    dir[strlen(dir) - 1] = '\0';
    char why[256];
    Graft__CheckpointManifest *m;
    assert_int_equal(graft__manifest_read(dir, step, &m, why, sizeof(why)), GRAFT_OK);
    bool found = false;
    for (size_t r = 0; r < m->shards[0]->n_regions; r++)
        if (strcmp(m->shards[0]->regions[r]->name, "rng") == 0) {
            m->shards[0]->regions[r]->offset_in_shard = 0;
            found = true;
        }
    assert_true(found);
    graft__pdir_t d;
    graft__persist_key_t k = {key, key_len};
    assert_int_equal(graft__persist_dir_open(root, step, false, 0, &d), GRAFT_OK);
    assert_int_equal(graft__manifest_write(&d, m, key != NULL ? &k : NULL, 0), GRAFT_OK);
    graft__persist_dir_close(&d);
    graft__manifest_free(m);
    free(dir);
}

static void test_forged_manifest(void **state)
{
    (void)state;
    char *tmp = pt_tmpdir();
    char *root = join(tmp, "root");
    save_opts_t o = {.secret = secret, .secret_len = SECRET_LEN};
    graft_persist_write_result_t res;
    assert_int_equal(save(root, 10, 1, &o, &res), GRAFT_OK);
    assert_int_equal(save(root, 20, 1, &o, &res), GRAFT_OK);
    graft_persist_entry_t e;
    assert_int_equal(graft_persist_verify_mac(root, 20, GRAFT_PERSIST_VERIFY_FULL, secret,
                                              SECRET_LEN, &e),
                     GRAFT_OK);
    /* A MAC under another secret is refused, and the manifest names it. */
    assert_int_equal(graft_persist_verify_mac(root, 20, GRAFT_PERSIST_VERIFY_QUICK, other_secret,
                                              SECRET_LEN, &e),
                     GRAFT_ECORRUPT);
    assert_non_null(strstr(e.reason, "MAC does not match"));
    char *json = NULL;
    assert_int_equal(graft_persist_manifest_json(root, 20, &json), GRAFT_OK);
    assert_non_null(strstr(json, "\"mac\""));
    graft_free(json);

    for (int variant = 0; variant < 2; variant++) {
        /* without a MAC, then with one under a guessed secret */
        forge(root, 20, variant == 0 ? NULL : other_secret, SECRET_LEN);
        /* checksums and invariants hold: only the MAC tells */
        assert_int_equal(graft_persist_verify(root, 20, GRAFT_PERSIST_VERIFY_FULL, NULL),
                         GRAFT_OK);
        assert_int_equal(graft_persist_verify_mac(root, 20, GRAFT_PERSIST_VERIFY_FULL, secret,
                                                  SECRET_LEN, &e),
                         GRAFT_ECORRUPT);
        assert_int_equal(e.state, GRAFT_PERSIST_CORRUPT);
        assert_non_null(strstr(e.reason, variant == 0 ? "no MAC" : "MAC does not match"));
        /* Without the secret a restore takes the forgery: rng gets w's
         * bytes. */
        graft_persist_restore_result_t rr;
        assert_int_equal(restore(root, 20, NULL, 0, 20, &rr), GRAFT_EHASH);
        /* With it, the forged checkpoint is skipped like a corrupt one and
         * the genuine older one restored. */
        log_text[0] = '\0';
        assert_int_equal(restore(root, 0, secret, SECRET_LEN, 10, &rr), GRAFT_OK);
        assert_int_equal(rr.step, 10);
        assert_int_equal(rr.skipped, 1);
        assert_non_null(strstr(rr.skipped_reasons, "MAC"));
        assert_true(log_has("skipping step-00000000000000000020/manifest.pb"));
        assert_int_equal(restore(root, 20, secret, SECRET_LEN, 20, &rr), GRAFT_ECORRUPT);
    }
    free(root);
    pt_rmtree(tmp);
}

/* Retention under the job secret counts only genuine checkpoints: a forged
 * newest one neither pushes a genuine one out of keep_last nor is kept as
 * the newest; once older than the newest genuine one it goes. */
static bool has_step(const char *root, uint64_t step)
{
    char *m = pt_path(root, step, "manifest.pb");
    bool ok = access(m, F_OK) == 0;
    free(m);
    return ok;
}

static void test_retention_skips_forged(void **state)
{
    (void)state;
    char *tmp = pt_tmpdir();
    char *root = join(tmp, "root");
    save_opts_t o = {.secret = secret, .secret_len = SECRET_LEN};
    graft_persist_write_result_t res;
    assert_int_equal(save(root, 10, 1, &o, &res), GRAFT_OK);
    assert_int_equal(save(root, 20, 1, &o, &res), GRAFT_OK);
    assert_int_equal(save(root, 30, 1, &o, &res), GRAFT_OK);
    forge(root, 30, NULL, 0); /* no MAC: written without the secret */
    graft_persist_retention_t pol = {.keep_last = 2, .secret = secret, .secret_len = SECRET_LEN};
    size_t deleted = 9;
    log_text[0] = '\0';
    assert_int_equal(graft_persist_retention_apply(root, &pol, &deleted), GRAFT_OK);
    /* The two newest genuine (10, 20) stay; the forged 30 is newer than
     * them, so it stays too (it could still be a commit in progress), and
     * the warning names it. */
    assert_int_equal(deleted, 0);
    assert_true(has_step(root, 10) && has_step(root, 20) && has_step(root, 30));
    assert_true(log_has("step 30 is not counted"));
    /* Without the secret the forgery counts, and pushes 10 out. */
    graft_persist_retention_t blind = {.keep_last = 2};
    char *copy = join(tmp, "copy");
    char cmd[2 * PATH_MAX];
    snprintf(cmd, sizeof(cmd), "cp -a '%s' '%s'", root, copy);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(graft_persist_retention_apply(copy, &blind, &deleted), GRAFT_OK);
    assert_int_equal(deleted, 1);
    assert_false(has_step(copy, 10));
    /* Two genuine ones after it: the forged 30 is now a leftover. */
    assert_int_equal(save(root, 40, 1, &o, &res), GRAFT_OK);
    assert_int_equal(save(root, 50, 1, &o, &res), GRAFT_OK);
    assert_int_equal(graft_persist_retention_apply(root, &pol, &deleted), GRAFT_OK);
    assert_false(has_step(root, 30));
    assert_false(has_step(root, 10) || has_step(root, 20));
    assert_true(has_step(root, 40) && has_step(root, 50));
    free(copy);
    free(root);
    pt_rmtree(tmp);
}

/* --------------------------------------------------------------- graftctl --- */

static char ctl_bin[PATH_MAX + 32];

/* Runs graftctl with args (NULL-terminated); its stdout in *out_p. */
static int run_ctl(const char *tmp, const char *const *args, char **out_p)
{
    char *outpath = join(tmp, "ctl.out");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(outpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0)
            _exit(126);
        dup2(fd, 1);
        dup2(fd, 2);
        const char *argv[16] = {ctl_bin};
        for (size_t i = 0; args[i] != NULL && i < 14; i++)
            argv[i + 1] = args[i];
        execv(ctl_bin, (char **)argv);
        _exit(127);
    }
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    FILE *f = fopen(outpath, "r");
    assert_non_null(f);
    char *buf = calloc(1, 1 << 16);
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    buf[n] = '\0';
    fclose(f);
    free(outpath);
    *out_p = buf;
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

static void test_graftctl_verify_secret(void **state)
{
    (void)state;
    char *tmp = pt_tmpdir();
    char *root = join(tmp, "root");
    char *key = join(tmp, "secret");
    char *wrong = join(tmp, "wrong");
    FILE *f = fopen(key, "w");
    assert_non_null(f);
    fprintf(f, "%s\n", (const char *)secret); /* a newline is not part of it */
    fclose(f);
    f = fopen(wrong, "w");
    assert_non_null(f);
    fprintf(f, "%s", (const char *)other_secret);
    fclose(f);
    save_opts_t o = {.secret = secret, .secret_len = SECRET_LEN};
    graft_persist_write_result_t res;
    assert_int_equal(save(root, 10, 1, &o, &res), GRAFT_OK);
    assert_int_equal(save(root, 20, 1, &o, &res), GRAFT_OK);
    char *out = NULL;
    /* genuine */
    assert_int_equal(run_ctl(tmp, (const char *[]){"ckpt", "verify", root, "--secret-file", key,
                                                  NULL},
                             &out),
                     0);
    assert_non_null(strstr(out, "step 20: ok (every chunk, 1 shards"));
    assert_non_null(strstr(out, "MAC ok"));
    free(out);
    /* the wrong secret: every checkpoint fails */
    assert_int_equal(run_ctl(tmp, (const char *[]){"ckpt", "verify", root, "20", "--secret-file",
                                                  wrong, NULL},
                             &out),
                     1);
    assert_non_null(strstr(out, "MAC does not match the job secret"));
    free(out);
    /* forged: checksums valid, so without the secret it passes */
    forge(root, 20, NULL, 0);
    assert_int_equal(run_ctl(tmp, (const char *[]){"ckpt", "verify", root, NULL}, &out), 0);
    assert_non_null(strstr(out, "manifest MACs not checked"));
    free(out);
    assert_int_equal(run_ctl(tmp, (const char *[]){"ckpt", "verify", root, "--secret-file", key,
                                                  NULL},
                             &out),
                     1);
    assert_non_null(strstr(out, "step 20: FAILED"));
    assert_non_null(strstr(out, "no MAC: written without the job secret, or forged"));
    assert_non_null(strstr(out, "step 10: ok"));
    free(out);
    assert_int_equal(run_ctl(tmp, (const char *[]){"--json", "ckpt", "verify", root, "10",
                                                  "--secret-file", key, NULL},
                             &out),
                     0);
    assert_non_null(strstr(out, "\"authenticated\": true"));
    free(out);
    /* and restore --dry-run picks the genuine one */
    assert_int_equal(run_ctl(tmp, (const char *[]){"ckpt", "restore", root, "--dry-run",
                                                  "--secret-file", key, NULL},
                             &out),
                     0);
    assert_non_null(strstr(out, "would restore step 10"));
    free(out);
    /* a secret file that is too short is a usage error */
    f = fopen(wrong, "w");
    assert_non_null(f);
    fprintf(f, "short\n");
    fclose(f);
    assert_int_equal(run_ctl(tmp, (const char *[]){"ckpt", "verify", root, "--secret-file", wrong,
                                                  NULL},
                             &out),
                     2);
    assert_non_null(strstr(out, "16 to 256 bytes"));
    free(out);
    free(wrong);
    free(key);
    free(root);
    pt_rmtree(tmp);
}

int main(void)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return 1;
    self[n] = '\0';
    /* BUILD/tests/test_persist_files -> BUILD/bin/graftctl */
    *strrchr(self, '/') = '\0';
    *strrchr(self, '/') = '\0';
    snprintf(ctl_bin, sizeof(ctl_bin), "%s/bin/graftctl", self);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_link_at_temp_shard, setup, teardown),
        cmocka_unit_test_setup_teardown(test_link_at_temp_manifest, setup, teardown),
        cmocka_unit_test_setup_teardown(test_link_in_second_tier, setup, teardown),
        cmocka_unit_test_setup_teardown(test_link_as_step_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_readers_refuse_links, setup, teardown),
        cmocka_unit_test_setup_teardown(test_default_modes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_widened_modes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mode_setting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forged_manifest, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retention_skips_forged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_graftctl_verify_secret, setup, teardown),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests_name("persist_files", tests, NULL, NULL);
}
