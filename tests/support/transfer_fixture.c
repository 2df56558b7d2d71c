/* The fixture of the transfer tests (transfer_fixture.h says how a test
 * uses it). */
#include "transfer_fixture.h"

const tf_region_t tf_small_layout[TF_N_SMALL] = {
    {"weights", (3u << 20) + 12345}, {"optim", 4u << 20}, {"rng", 13}, {"empty", 0},
    {"step", 8},
};

const tf_region_t tf_big_layout[TF_N_BIG] = {{"weights", 24u << 20}, {"optim", 24u << 20}};

graft_transfer_read_t tf_read = GRAFT_TRANSFER_READ_GET;

/* Word k of the pattern of @seed (splitmix64 of a counter): any piece of a
 * region can be regenerated on its own, 8 bytes per step. */
static uint64_t tf_pattern_word(uint64_t seed, uint64_t k)
{
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + (k + 1) * 0xD1B54A32D192ED03ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Bytes [off, off + n) of the pattern of @seed, to @p. */
static void tf_pattern_at(uint8_t *p, uint64_t off, uint64_t n, uint64_t seed)
{
    uint64_t i = 0;
    while (i < n) {
        uint64_t k = (off + i) / 8, skip = (off + i) % 8;
        uint64_t w = tf_pattern_word(seed, k);
        uint64_t take = 8 - skip < n - i ? 8 - skip : n - i;
        memcpy(p + i, (const uint8_t *)&w + skip, (size_t)take);
        i += take;
    }
}

void tf_fill_pattern(uint8_t *p, uint64_t n, uint64_t seed)
{
    tf_pattern_at(p, 0, n, seed);
}

bool tf_pattern_matches(const uint8_t *p, uint64_t n, uint64_t seed)
{
    enum { PIECE = 1u << 20 };
    uint8_t *want = malloc(PIECE);
    bool ok = want != NULL;
    for (uint64_t off = 0; off < n && ok; off += PIECE) {
        uint64_t len = n - off < PIECE ? n - off : PIECE;
        tf_pattern_at(want, off, len, seed);
        ok = memcmp(want, p + off, (size_t)len) == 0;
    }
    free(want);
    return ok;
}

bool tf_read_full(int fd, void *buf, size_t n, int timeout_ms)
{
    size_t got = 0;
    while (got < n) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int rc = poll(&pfd, 1, timeout_ms);
        if (rc <= 0)
            return false;
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return true;
}

bool tf_write_full(int fd, const void *buf, size_t n)
{
    size_t put = 0;
    while (put < n) {
        ssize_t w = write(fd, (const char *)buf + put, n - put);
        if (w <= 0)
            return false;
        put += (size_t)w;
    }
    return true;
}

uint64_t tf_host_block_offset(const tf_region_t *layout, size_t i)
{
    uint64_t off = 13;
    for (size_t k = 0; k < i; k++)
        off = (off + layout[k].bytes + 63) / 64 * 64;
    return off;
}

uint64_t tf_host_block_bytes(const tf_region_t *layout, size_t n)
{
    return tf_host_block_offset(layout, n) + 4096;
}

tf_donor_opts_t tf_opts(const tf_region_t *layout, size_t n, uint64_t chunk)
{
    tf_donor_opts_t o = {.layout = layout,
                         .n_regions = n,
                         .chunk = chunk,
                         .secret = SECRET,
                         .step = STEP,
                         .flip_region = -1};
    return o;
}

/* The donor does command @cmd (3 words: an op and its two arguments) and
 * writes its 2-word answer to @resp_fd (see tf_donor_ask()); an unknown op
 * is ignored. Returns false when the test is gone. */
static bool tf_donor_answer(graft_transfer_endpoint_t *ep, const tf_donor_opts_t *o,
                            uint8_t **mem, const uint32_t cmd[3], int resp_fd)
{
    int32_t out[2] = {0, 0};
    switch (cmd[0]) {
    case 'M': /* change a byte behind the engine's back (after hashing) */
        mem[cmd[1]][cmd[2]] ^= 0x01;
        break;
    case 'R': /* serve the same step again, as after a rollback */
        out[0] = graft_transfer_serve_end(ep);
        if (out[0] == GRAFT_OK)
            out[0] = graft_transfer_serve_begin(ep, o->step);
        break;
    case 'P': /* the most recipients served at once */
        out[0] = (int32_t)graft_transfer_serve_peak(ep);
        break;
    case 'X': /* requests refused for who sent them */
        out[0] = (int32_t)graft_transfer_refused_count(ep);
        break;
    case 'G': /* serve only group @cmd[1] (@cmd[2] == 1), or any group (0) */
        out[0] = graft_transfer_serve_recipients(ep, &cmd[1], cmd[2] == 1 ? 1 : 0);
        break;
    case 'F': /* wait for @cmd[1] recipients, at most @cmd[2] ms */
        out[0] = graft_transfer_fence_wait(ep, o->step, cmd[1], cmd[2]);
        out[1] = (int32_t)graft_transfer_fence_count(ep, o->step);
        break;
    case 'L': /* followers: would serving step @cmd[1] give one a step; wait @cmd[2] ms */
        out[0] = graft_transfer_followers_wanted(ep, cmd[1]);
        out[1] = graft_transfer_followers_wait(ep, cmd[2]);
        break;
    case 'S': /* serve only groups @cmd[1] and @cmd[2] */
        out[0] = graft_transfer_serve_recipients(ep, &cmd[1], 2);
        break;
    default:
        return true;
    }
    return tf_write_full(resp_fd, out, sizeof(out));
}

/* After its address, the donor's timed steps: a late serve, a late begin
 * of an announced step, a withdrawn announcement. */
static bool tf_donor_schedule(graft_transfer_endpoint_t *ep, const tf_donor_opts_t *o)
{
    if (o->serve_delay_ms > 0) {
        usleep(o->serve_delay_ms * 1000u);
        if (graft_transfer_serve_begin(ep, o->step) != GRAFT_OK)
            return false;
    }
    if (o->begin_after_ms > 0) {
        usleep(o->begin_after_ms * 1000u);
        if (graft_transfer_serve_begin(ep, o->step) != GRAFT_OK)
            return false;
    }
    if (o->withdraw_after_ms > 0) {
        usleep(o->withdraw_after_ms * 1000u);
        if (graft_transfer_serve_end(ep) != GRAFT_OK)
            return false;
    }
    return true;
}

/* The donor process: serve until told to quit; answer commands. */
static int tf_donor_main(const tf_donor_opts_t *o, int cmd_fd, int resp_fd)
{
    graft_transfer_config_t cfg = {.job_secret = o->secret, .job_secret_len = strlen(o->secret),
                                   .chunk_bytes = o->chunk, .group = 1,
                                   .listen_address = o->listen,
                                   .advertise_address = o->advertise,
                                   .max_recipients = o->max_recipients};
    graft_transfer_endpoint_t *ep = NULL;
    uint8_t **mem = calloc(o->n_regions + 1, sizeof(*mem));
    char addr[64] = {0};
    int rc = 1;

    uint8_t *block = NULL;

    if (graft_transfer_endpoint_create(&cfg, &ep) != GRAFT_OK)
        goto out;
    if (o->host_mem && graft_transfer_host_alloc(ep, tf_host_block_bytes(o->layout, o->n_regions),
                                                 (void **)&block) != GRAFT_OK)
        goto out;
    for (size_t i = 0; i < o->n_regions; i++) {
        mem[i] = block != NULL ? block + tf_host_block_offset(o->layout, i)
                               : malloc(o->layout[i].bytes + 1);
        tf_fill_pattern(mem[i], o->layout[i].bytes, i + 1);
        if ((int)i == o->flip_region)
            mem[i][o->flip_offset] ^= 0x40;
        graft_transfer_region_t r = {.name = o->layout[i].name,
                                     .kind = GRAFT_TRANSFER_REGION_PARAM,
                                     .ptr = mem[i],
                                     .bytes = o->layout[i].bytes};
        if (graft_transfer_region_register(ep, &r) != GRAFT_OK)
            goto out;
    }
    if (o->expect && graft_transfer_serve_expect(ep, o->step) != GRAFT_OK)
        goto out;
    if (!o->expect && o->serve_delay_ms == 0 && graft_transfer_serve_begin(ep, o->step) != GRAFT_OK)
        goto out;
    snprintf(addr, sizeof(addr), "%s", graft_transfer_endpoint_address(ep));
    if (!tf_write_full(resp_fd, addr, sizeof(addr)) || !tf_donor_schedule(ep, o))
        goto out;
    for (;;) {
        uint32_t cmd[3];
        if (!tf_read_full(cmd_fd, cmd, sizeof(cmd), -1) || cmd[0] == 'Q')
            break;
        if (!tf_donor_answer(ep, o, mem, cmd, resp_fd))
            break;
    }
    /* A withdrawn announcement leaves nothing to end. */
    rc = graft_transfer_serve_end(ep) == GRAFT_OK || o->withdraw_after_ms > 0 ? 0 : 1;
out:
    /* The endpoint frees the block (its regions keep it until then). */
    graft_transfer_endpoint_destroy(ep);
    for (size_t i = 0; i < o->n_regions && block == NULL; i++)
        free(mem[i]);
    free(mem);
    return rc;
}

tf_donor_t *tf_child_start(tf_t *f, int i,
                           int (*child_main)(const void *, int, int),
                           const void *arg)
{
    tf_donor_t *d = &f->d[i];
    int cmd[2], resp[2];
    assert_true(i >= 0 && i < TF_MAX_DONORS);
    assert_int_equal(d->pid, 0);
    assert_int_equal(pipe(cmd), 0);
    assert_int_equal(pipe(resp), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (int k = 0; k < TF_MAX_DONORS; k++) {
            if (f->d[k].pid > 0 && f->d[k].cmd_fd >= 0)
                close(f->d[k].cmd_fd);
            if (f->d[k].pid > 0 && f->d[k].resp_fd >= 0)
                close(f->d[k].resp_fd);
        }
        close(cmd[1]);
        close(resp[0]);
        _exit(child_main(arg, cmd[0], resp[1]));
    }
    close(cmd[0]);
    close(resp[1]);
    d->pid = pid;
    d->cmd_fd = cmd[1];
    d->resp_fd = resp[0];
    f->addrs[i] = d->addr;
    /* 60 s: a donor of 10,000 regions maps each one, which took over 20 s
     * in a sanitizer build on 2 loaded cores. */
    assert_true(tf_read_full(d->resp_fd, d->addr, sizeof(d->addr), 60000));
    return d;
}

tf_donor_t *tf_child_adopt(tf_t *f, int i, pid_t pid, const char *addr)
{
    tf_donor_t *d = &f->d[i];
    assert_true(i >= 0 && i < TF_MAX_DONORS);
    assert_int_equal(d->pid, 0);
    d->pid = pid;
    d->cmd_fd = d->resp_fd = -1;
    snprintf(d->addr, sizeof(d->addr), "%s", addr);
    f->addrs[i] = d->addr;
    return d;
}

static int tf_donor_child(const void *arg, int cmd_fd, int resp_fd)
{
    return tf_donor_main(arg, cmd_fd, resp_fd);
}

tf_donor_t *tf_donor_start(tf_t *f, int i, const tf_donor_opts_t *o)
{
    return tf_child_start(f, i, tf_donor_child, o);
}

void tf_donors_start(tf_t *f, const tf_donor_opts_t *o, int n)
{
    for (int i = 0; i < n; i++)
        tf_donor_start(f, i, o);
    f->po.donors = f->addrs;
    f->po.n_donors = (size_t)n;
    f->po.step = STEP;
}

static void tf_child_forget(tf_donor_t *d)
{
    if (d->cmd_fd >= 0)
        close(d->cmd_fd);
    if (d->resp_fd >= 0)
        close(d->resp_fd);
    d->pid = 0;
    d->cmd_fd = d->resp_fd = -1;
}

void tf_child_kill(tf_donor_t *d)
{
    if (d->pid <= 0)
        return;
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
    tf_child_forget(d);
}

int tf_donor_stop(tf_donor_t *d)
{
    int ws = 0;
    uint32_t cmd[3] = {'Q', 0, 0};
    if (!tf_write_full(d->cmd_fd, cmd, sizeof(cmd)))
        kill(d->pid, SIGKILL);
    kill(d->pid, SIGCONT);
    for (int i = 0; i < 200; i++) {
        if (waitpid(d->pid, &ws, WNOHANG) == d->pid)
            goto reaped;
        usleep(50000);
    }
    kill(d->pid, SIGKILL);
    waitpid(d->pid, &ws, 0);
reaped:
    if (WIFSIGNALED(ws))
        print_message("# donor %d ended by signal %d\n", (int)d->pid, WTERMSIG(ws));
    tf_child_forget(d);
    return ws;
}

void tf_donors_stop(tf_t *f, int n)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(tf_donor_stop(&f->d[i]), 0);
}

void tf_donor_ask(tf_donor_t *d, uint32_t op, uint32_t a, uint32_t b, int timeout_ms,
                  int32_t out[2])
{
    uint32_t cmd[3] = {op, a, b};
    assert_true(tf_write_full(d->cmd_fd, cmd, sizeof(cmd)));
    assert_true(tf_read_full(d->resp_fd, out, 2 * sizeof(out[0]), timeout_ms));
}

void tf_fence(tf_donor_t *d, uint32_t expected, uint32_t timeout_ms,
              int32_t *st_p, int32_t *count_p)
{
    int32_t out[2];
    tf_donor_ask(d, 'F', expected, timeout_ms, (int)timeout_ms + 10000, out);
    *st_p = out[0];
    *count_p = out[1];
}

void tf_fence_is(tf_donor_t *d, uint32_t expected, uint32_t timeout_ms,
                 int32_t want_st, int32_t want_count)
{
    int32_t st, count;
    tf_fence(d, expected, timeout_ms, &st, &count);
    assert_int_equal(st, want_st);
    assert_int_equal(count, want_count);
}

void tf_recipient_create(tf_t *f, const tf_region_t *layout, size_t n,
                         uint64_t chunk, const char *secret, bool host_mem)
{
    graft_transfer_config_t cfg = {.job_secret = secret, .job_secret_len = strlen(secret),
                                   .chunk_bytes = chunk, .group = 2};
    tf_recipient_t *r = &f->r;
    uint8_t *block = NULL;
    assert_null(r->mem); /* one recipient at a time */
    r->layout = layout;
    r->n_regions = n;
    r->host_mem = host_mem;
    r->mem = calloc(n + 1, sizeof(*r->mem));
    assert_int_equal(graft_transfer_endpoint_create(&cfg, &r->ep), GRAFT_OK);
    if (host_mem) {
        uint64_t bytes = tf_host_block_bytes(layout, n);
        assert_int_equal(graft_transfer_host_alloc(r->ep, bytes, (void **)&block), GRAFT_OK);
        memset(block, 0, bytes);
    }
    for (size_t i = 0; i < n; i++) {
        r->mem[i] = host_mem ? block + tf_host_block_offset(layout, i)
                             : calloc(1, layout[i].bytes + 1);
        graft_transfer_region_t reg = {.name = layout[i].name,
                                       .kind = GRAFT_TRANSFER_REGION_PARAM,
                                       .ptr = r->mem[i],
                                       .bytes = layout[i].bytes};
        assert_int_equal(graft_transfer_region_register(r->ep, &reg), GRAFT_OK);
    }
}

void tf_recipient_of(tf_t *f, const tf_donor_opts_t *o)
{
    tf_recipient_create(f, o->layout, o->n_regions, o->chunk, o->secret, false);
}

bool tf_recipient_matches(const tf_t *f)
{
    bool ok = true;
    for (size_t i = 0; i < f->r.n_regions && ok; i++)
        ok = tf_pattern_matches(f->r.mem[i], f->r.layout[i].bytes, i + 1);
    return ok;
}

bool tf_recipient_untouched(const tf_t *f)
{
    for (size_t i = 0; i < f->r.n_regions; i++) {
        for (uint64_t k = 0; k < f->r.layout[i].bytes; k++) {
            if (f->r.mem[i][k] != 0)
                return false;
        }
    }
    return true;
}

void tf_recipient_zero(tf_t *f)
{
    for (size_t i = 0; i < f->r.n_regions; i++)
        memset(f->r.mem[i], 0, f->r.layout[i].bytes);
}

void tf_recipient_destroy(tf_t *f)
{
    tf_recipient_t *r = &f->r;
    graft_transfer_endpoint_destroy(r->ep);
    for (size_t i = 0; i < r->n_regions && !r->host_mem && r->mem != NULL; i++)
        free(r->mem[i]);
    free(r->mem);
    memset(r, 0, sizeof(*r));
}

graft_status_t tf_pull(tf_t *f)
{
    graft_transfer_pull_options_t o = f->po;
    graft_transfer_report_t *rep = &f->rep;
    o.read = tf_read;
    graft_status_t st = graft_transfer_pull(f->r.ep, &o, rep);
    /* What each donor did, so that a failure in CI explains itself. */
    if (st != GRAFT_OK) {
        print_message("# pull: %s\n", graft_status_name(st));
        for (size_t i = 0; i < rep->n_donors; i++)
            print_message("#   donor %zu: %s, %llu bytes, %llu chunks, %llu reassigned, "
                          "lanes '%s'\n", i, graft_status_name(rep->donors[i].status),
                          (unsigned long long)rep->donors[i].bytes,
                          (unsigned long long)rep->donors[i].chunks,
                          (unsigned long long)rep->donors[i].reassigned,
                          rep->donors[i].transports);
    }
    return st;
}

void tf_pull_verified(tf_t *f)
{
    assert_int_equal(tf_pull(f), GRAFT_OK);
    assert_true(tf_recipient_matches(f));
}

void tf_lanes_parse(const char *transports, char *am_tl, size_t am_size,
                    bool *all_tcp_p)
{
    char copy[sizeof(((graft_transfer_donor_report_t *)0)->transports)];
    char *save = NULL;
    bool all_tcp = true;
    am_tl[0] = '\0';
    snprintf(copy, sizeof(copy), "%s", transports);
    for (char *lane = strtok_r(copy, " ", &save); lane != NULL;
         lane = strtok_r(NULL, " ", &save)) {
        char *uses = strchr(lane, ':');
        char *slash = strchr(lane, '/');
        if (uses != NULL)
            *uses++ = '\0';
        if (slash != NULL)
            *slash = '\0';
        all_tcp = all_tcp && strcmp(lane, "tcp") == 0;
        char *usave = NULL;
        for (char *u = uses != NULL ? strtok_r(uses, ",", &usave) : NULL; u != NULL;
             u = strtok_r(NULL, ",", &usave)) {
            if (strcmp(u, "am") == 0)
                snprintf(am_tl, am_size, "%s", lane);
        }
    }
    *all_tcp_p = all_tcp;
}

void tf_assert_group_transports(const graft_transfer_donor_report_t *dr)
{
    char am_tl[32];
    bool all_tcp;
    tf_lanes_parse(dr->transports, am_tl, sizeof(am_tl), &all_tcp);
    if (!all_tcp)
        print_message("# lanes: %s\n", dr->transports);
    assert_true(all_tcp);
    assert_string_equal(am_tl, "tcp");
    if (strcmp(getenv("UCX_TLS"), "tcp") == 0 || dr->chunks == 0) {
        assert_string_equal(dr->shm_transports, "");
        return;
    }
    tf_lanes_parse(dr->shm_transports, am_tl, sizeof(am_tl), &all_tcp);
    if (strstr(dr->shm_transports, "tcp") != NULL || am_tl[0] == '\0')
        print_message("# second connection's lanes: '%s'\n", dr->shm_transports);
    assert_null(strstr(dr->shm_transports, "tcp"));
    assert_true(strcmp(am_tl, "posix") == 0 || strcmp(am_tl, "sysv") == 0);
}

int tf_setup(void **state)
{
    tf_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return -1;
    for (int i = 0; i < TF_MAX_DONORS; i++)
        f->d[i].cmd_fd = f->d[i].resp_fd = -1;
    *state = f;
    return 0;
}

int tf_teardown(void **state)
{
    tf_t *f = *state;
    if (f == NULL)
        return 0;
    if (f->r.mem != NULL)
        tf_recipient_destroy(f);
    for (int i = 0; i < TF_MAX_DONORS; i++)
        tf_child_kill(&f->d[i]);
    free(f);
    *state = NULL;
    return 0;
}

static int tf_group(graft_transfer_read_t read, const char *tls)
{
    tf_read = read;
    return setenv("UCX_TLS", tls, 1);
}

static int tf_use_tcp(void **state)
{
    return tf_group(GRAFT_TRANSFER_READ_GET, "tcp");
}

static int tf_use_shm(void **state)
{
    return tf_group(GRAFT_TRANSFER_READ_GET, "sm,self,tcp");
}

int tf_use_tcp_push(void **state)
{
    return tf_group(GRAFT_TRANSFER_READ_PUSH, "tcp");
}

int tf_use_shm_push(void **state)
{
    return tf_group(GRAFT_TRANSFER_READ_PUSH, "sm,self,tcp");
}

/* Once per program: quiet logs (GRAFT_LOG overrides), no SIGPIPE, and
 * TRANSFER_FILTER=<glob> to run some tests only (while debugging). */
static void tf_program_init(void)
{
    signal(SIGPIPE, SIG_IGN);
    if (getenv("GRAFT_LOG") == NULL)
        graft_log_level_set(GRAFT_LOG_ERROR);
    if (getenv("TRANSFER_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TRANSFER_FILTER"));
    setenv("UCX_TLS", "tcp", 1);
}

int tf_run_local(const char *prog, const struct CMUnitTest *tests, size_t n)
{
    char name[64];
    tf_program_init();
    snprintf(name, sizeof(name), "transfer_%s", prog);
    return _cmocka_run_group_tests(name, tests, n, NULL, NULL);
}

int tf_run_wire(const char *prog, const struct CMUnitTest *tests, size_t n)
{
    static const struct {
        const char *name;
        CMFixtureFunction setup;
    } groups[] = {{"tcp", tf_use_tcp},
                  {"shm", tf_use_shm},
                  {"tcp_push", tf_use_tcp_push},
                  {"shm_push", tf_use_shm_push}};
    const char *only = getenv("TRANSFER_GROUP");
    int failed = 0;
    tf_program_init();
    for (size_t g = 0; g < ARRAY_SIZE(groups); g++) {
        char name[64];
        if (only != NULL && strcmp(only, groups[g].name) != 0)
            continue;
        snprintf(name, sizeof(name), "transfer_%s_%s", prog, groups[g].name);
        failed += _cmocka_run_group_tests(name, tests, n, groups[g].setup, NULL);
    }
    return failed;
}
