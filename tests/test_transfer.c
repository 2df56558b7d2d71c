/*
 * The transfer engine's own API, with no pull or one plain pull at most:
 * misuse refused, allocation failures, host blocks from
 * graft_transfer_host_alloc(), listen and advertised addresses, and no
 * shared memory to the listener. Pulls over the wire are in
 * test_transfer_pull.c and the programs beside it; their fixture is in
 * transfer_fixture.h.
 */
#include "transfer_fixture.h"

#include "alloc_fail.h"
#include "transfer/ucx_int.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

/* ---- local API checks ---------------------------------------------------- */

/* An endpoint made by hand: the defaults and the tests' secret. */
static const graft_transfer_config_t tf_config = {TF_SECRET};

static void test_api_misuse(void **state)
{
    (void)state;
    graft_transfer_endpoint_t *ep = NULL;
    uint8_t buf[64];
    graft_transfer_region_t r = {.name = "a", .kind = GRAFT_TRANSFER_REGION_PARAM, .ptr = buf,
                                 .bytes = sizeof(buf)};
    graft_transfer_config_t bad = {.listen_address = "not-an-ip", TF_SECRET};
    uint64_t h0, h1;

    assert_int_equal(graft_transfer_endpoint_create(NULL, NULL), GRAFT_EINVAL);
    assert_int_equal(graft_transfer_endpoint_create(&bad, &ep), GRAFT_EINVAL);
    assert_null(ep);
    /* No secret, or one too short to be one: refused. */
    assert_int_equal(graft_transfer_endpoint_create(NULL, &ep), GRAFT_EINVAL);
    graft_transfer_config_t weak = {.job_secret = "job-name", .job_secret_len = 8};
    assert_int_equal(graft_transfer_endpoint_create(&weak, &ep), GRAFT_EINVAL);
    assert_null(ep);
    graft_transfer_endpoint_destroy(NULL);
    assert_int_equal(graft_transfer_endpoint_create(&tf_config, &ep), GRAFT_OK);
    assert_non_null(strchr(graft_transfer_endpoint_address(ep), ':'));
    assert_int_equal(graft_transfer_layout_hash(ep, &h0), GRAFT_OK);
    assert_int_equal(graft_transfer_region_register(ep, &r), GRAFT_OK);
    assert_int_equal(graft_transfer_layout_hash(ep, &h1), GRAFT_OK);
    assert_true(h0 != h1);
    assert_int_equal(graft_transfer_region_register(ep, &r), GRAFT_EEXIST);
    r.name = "b";
    r.kind = (graft_transfer_region_kind_t)99;
    assert_int_equal(graft_transfer_region_register(ep, &r), GRAFT_EINVAL);
    r.kind = GRAFT_TRANSFER_REGION_OPTIM;
    r.ptr = NULL;
    assert_int_equal(graft_transfer_region_register(ep, &r), GRAFT_EINVAL);
    r.ptr = buf;
    r.device = GRAFT_TRANSFER_CUDA;
    assert_int_equal(graft_transfer_region_register(ep, &r), GRAFT_ENOTSUP);
    r.device = GRAFT_TRANSFER_HOST;

    assert_int_equal(graft_transfer_serve_end(ep), GRAFT_ESTATE);
    assert_int_equal(graft_transfer_serve_begin(ep, 5), GRAFT_OK);
    assert_int_equal(graft_transfer_serve_begin(ep, 5), GRAFT_OK);
    assert_int_equal(graft_transfer_serve_begin(ep, 6), GRAFT_ESTATE);
    assert_int_equal(graft_transfer_region_register(ep, &r), GRAFT_ESTATE);
    const char *donors[1] = {"127.0.0.1:9"};
    graft_transfer_pull_options_t po = {.donors = donors, .n_donors = 1, .step = 5};
    graft_transfer_report_t rep;
    assert_int_equal(graft_transfer_pull(ep, &po, &rep), GRAFT_ESTATE);
    assert_int_equal(graft_transfer_serve_end(ep), GRAFT_OK);
    po.n_donors = 0;
    assert_int_equal(graft_transfer_pull(ep, &po, &rep), GRAFT_EINVAL);
    po.n_donors = GRAFT_TRANSFER_MAX_DONORS + 1;
    assert_int_equal(graft_transfer_pull(ep, &po, &rep), GRAFT_EINVAL);
    assert_int_equal(graft_transfer_fence_wait(ep, 5, 0, 0), GRAFT_OK);
    assert_int_equal(graft_transfer_fence_wait(ep, 5, 1, 10), GRAFT_ETIMEOUT);
    graft_transfer_endpoint_destroy(ep);
}

/* Fail each allocation in turn: every path returns ENOMEM cleanly. */
static void test_alloc_failures(void **state)
{
    (void)state;
    static uint8_t a[100000], b[5000];
    bool completed = false;

    for (int n = 0; n < 64 && !completed; n++) {
        graft_transfer_endpoint_t *ep = NULL;
        graft_transfer_config_t cfg = {.chunk_bytes = 4096, TF_SECRET};
        graft_transfer_region_t ra = {.name = "a", .kind = 1, .ptr = a, .bytes = sizeof(a)};
        graft_transfer_region_t rb = {.name = "b", .kind = 2, .ptr = b, .bytes = sizeof(b)};
        graft_status_t st;

        graft_test_alloc_fail_after(n);
        st = graft_transfer_endpoint_create(&cfg, &ep);
        if (st == GRAFT_OK)
            st = graft_transfer_region_register(ep, &ra);
        if (st == GRAFT_OK)
            st = graft_transfer_region_register(ep, &rb);
        if (st == GRAFT_OK)
            st = graft_transfer_serve_begin(ep, 1);
        if (st == GRAFT_OK) {
            st = graft_transfer_serve_end(ep);
            completed = st == GRAFT_OK;
        }
        if (!completed)
            assert_int_equal(st, GRAFT_ENOMEM);
        graft_transfer_endpoint_destroy(ep);
        graft_test_alloc_restore();
    }
    assert_true(completed);
}

/* ---- host memory from graft_transfer_host_alloc() ----------------------- */

/* Allocate, use, register parts of, and free blocks; misuse is refused. */
static void test_host_alloc(void **state)
{
    (void)state;
    graft_transfer_endpoint_t *ep = NULL;
    uint8_t *a = NULL, *b = NULL, *c = NULL;
    uint8_t foreign[64];
    void *untouched = (void *)0x1;

    assert_int_equal(graft_transfer_endpoint_create(&tf_config, &ep), GRAFT_OK);
    assert_int_equal(graft_transfer_host_alloc(NULL, 64, (void **)&a), GRAFT_EINVAL);
    assert_int_equal(graft_transfer_host_alloc(ep, 64, NULL), GRAFT_EINVAL);
    assert_int_equal(graft_transfer_host_alloc(ep, 0, &untouched), GRAFT_EINVAL);
    assert_ptr_equal(untouched, (void *)0x1);
#ifndef __SANITIZE_ADDRESS__
    /* More than any machine has: a clean error, no block. (UCX's last
     * resort is posix_memalign, which AddressSanitizer aborts on for such
     * a size instead of failing; the hook torture covers that build.) */
    assert_int_equal(graft_transfer_host_alloc(ep, 1ull << 62, &untouched), GRAFT_ENOMEM);
    assert_ptr_equal(untouched, (void *)0x1);
#endif

    /* Round trip: aligned, writable, readable, freed. */
    assert_int_equal(graft_transfer_host_alloc(ep, 1u << 20, (void **)&a), GRAFT_OK);
    assert_non_null(a);
    assert_int_equal((uintptr_t)a % 64, 0);
    tf_fill_pattern(a, 1u << 20, 7);
    uint8_t *want = malloc(1u << 20);
    tf_fill_pattern(want, 1u << 20, 7);
    assert_memory_equal(a, want, 1u << 20);
    free(want);
    assert_int_equal(graft_transfer_host_free(ep, a), GRAFT_OK);
    assert_int_equal(graft_transfer_host_free(ep, a), GRAFT_EINVAL); /* twice */
    assert_int_equal(graft_transfer_host_free(ep, NULL), GRAFT_OK);
    assert_int_equal(graft_transfer_host_free(NULL, a), GRAFT_EINVAL);
    assert_int_equal(graft_transfer_host_free(ep, foreign), GRAFT_EINVAL);

    /* Regions over parts of one block; a region that runs past its end is
     * refused and leaves the table as it was. */
    assert_int_equal(graft_transfer_host_alloc(ep, 100000, (void **)&b), GRAFT_OK);
    assert_int_equal(graft_transfer_host_free(ep, b + 1), GRAFT_EINVAL); /* inside, not it */
    graft_transfer_region_t r1 = {.name = "r1", .kind = GRAFT_TRANSFER_REGION_PARAM,
                                  .ptr = b + 13, .bytes = 50000};
    graft_transfer_region_t r2 = {.name = "r2", .kind = GRAFT_TRANSFER_REGION_OPTIM,
                                  .ptr = b + 50048, .bytes = 49952};
    graft_transfer_region_t over = {.name = "over", .kind = GRAFT_TRANSFER_REGION_OPTIM,
                                    .ptr = b + 99000, .bytes = 1u << 20};
    uint64_t h0, h1;
    assert_int_equal(graft_transfer_region_register(ep, &r1), GRAFT_OK);
    assert_int_equal(graft_transfer_layout_hash(ep, &h0), GRAFT_OK);
    assert_int_equal(graft_transfer_region_register(ep, &over), GRAFT_EINVAL);
    assert_int_equal(graft_transfer_layout_hash(ep, &h1), GRAFT_OK);
    assert_true(h0 == h1);
    assert_int_equal(graft_transfer_region_register(ep, &r2), GRAFT_OK);
    /* Its regions keep it: freeing it now is refused. */
    assert_int_equal(graft_transfer_host_free(ep, b), GRAFT_ESTATE);
    /* A block without regions, left for the endpoint to free. */
    assert_int_equal(graft_transfer_host_alloc(ep, 4096, (void **)&c), GRAFT_OK);
    assert_true(c != b);
    c[4095] = 1;
    assert_int_equal(graft_transfer_serve_begin(ep, 3), GRAFT_OK);
    assert_int_equal(graft_transfer_serve_end(ep), GRAFT_OK);
    graft_transfer_endpoint_destroy(ep);
}

/* Fail each allocation of graft_transfer_host_alloc() in turn: GRAFT_ENOMEM,
 * nothing left behind (the sanitizer build checks), and the endpoint still
 * allocates afterwards. */
static void test_host_alloc_failures(void **state)
{
    (void)state;
    graft_transfer_endpoint_t *ep = NULL;
    bool completed = false;

    assert_int_equal(graft_transfer_endpoint_create(&tf_config, &ep), GRAFT_OK);
    for (int n = 0; n < 16 && !completed; n++) {
        void *p = (void *)0x1;
        graft_test_alloc_fail_after(n);
        graft_status_t st = graft_transfer_host_alloc(ep, 8192, &p);
        graft_test_alloc_restore();
        if (st == GRAFT_OK) {
            completed = true;
            assert_int_equal(graft_transfer_host_free(ep, p), GRAFT_OK);
        } else {
            assert_int_equal(st, GRAFT_ENOMEM);
            assert_ptr_equal(p, (void *)0x1);
        }
    }
    assert_true(completed);
    graft_transfer_endpoint_destroy(ep);
}

/* An endpoint's published address for @cfg, or its status. */
static graft_status_t address_for(const graft_transfer_config_t *cfg, char *addr, size_t size)
{
    graft_transfer_endpoint_t *ep = NULL;
    graft_transfer_config_t with_secret = *cfg;
    with_secret.job_secret = SECRET;
    with_secret.job_secret_len = sizeof(SECRET) - 1;
    graft_status_t st = graft_transfer_endpoint_create(&with_secret, &ep);
    if (st == GRAFT_OK)
        snprintf(addr, size, "%s", graft_transfer_endpoint_address(ep));
    else
        assert_null(ep);
    graft_transfer_endpoint_destroy(ep);
    return st;
}

static unsigned port_of(const char *addr)
{
    const char *colon = strrchr(addr, ':');
    return colon != NULL ? (unsigned)atoi(colon + 1) : 0;
}

/* Listening on an interface by name, with a port in the address, and on the
 * wildcard (only with an advertised address, which is what is published and
 * what a recipient reaches the donor at). */
static void test_listen_address(void **state)
{
    tf_t *f = *state;
    char addr[64], want[64], spec[64];
    graft_transfer_config_t cfg = {.listen_address = "lo"};

    assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_OK);
    assert_int_equal(strncmp(addr, "127.0.0.1:", 10), 0);
    unsigned port = port_of(addr);
    assert_true(port > 0);
    /* "name:port", and the same port in both places. */
    snprintf(spec, sizeof(spec), "lo:%u", port);
    cfg.listen_address = spec;
    assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_OK);
    snprintf(want, sizeof(want), "127.0.0.1:%u", port);
    assert_string_equal(addr, want);
    cfg.port = (uint16_t)port;
    assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_OK);
    assert_string_equal(addr, want);
    cfg.port = (uint16_t)(port == 65535 ? 1 : port + 1); /* disagrees */
    assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_EINVAL);
    cfg.port = 0;

    /* Refused: no such interface, junk ports, the wildcard without an
     * advertised address, a wildcard advertised. */
    static const char *const bad[] = {"no-such-if0", "lo:", "lo:65536", "lo:x", ":80", ""};
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        cfg.listen_address = bad[i];
        assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_EINVAL);
    }
    cfg.listen_address = "0.0.0.0";
    assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_EINVAL);
    cfg.listen_address = "lo";
    cfg.advertise_address = "0.0.0.0";
    assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_EINVAL);
    cfg.advertise_address = "no-such-if0";
    assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_EINVAL);
    cfg.advertise_address = NULL;

    /* Another interface with an IPv4 address, if the machine has one. */
    struct ifaddrs *ifs = NULL;
    assert_int_equal(getifaddrs(&ifs), 0);
    for (const struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET ||
            strcmp(i->ifa_name, "lo") == 0)
            continue;
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr, ip,
                  sizeof(ip));
        cfg.listen_address = i->ifa_name;
        assert_int_equal(address_for(&cfg, addr, sizeof(addr)), GRAFT_OK);
        snprintf(want, sizeof(want), "%s:", ip);
        print_message("# interface %s: %s\n", i->ifa_name, addr);
        assert_int_equal(strncmp(addr, want, strlen(want)), 0);
        break;
    }
    freeifaddrs(ifs);

    /* A donor on the wildcard that advertises "lo" is pulled from at the
     * address it published. */
    tf_donor_opts_t o = tf_opts(tf_small_layout, TF_N_SMALL, 256u << 10);
    o.listen = "0.0.0.0";
    o.advertise = "lo";
    tf_donors_start(f, &o, 1);
    assert_int_equal(strncmp(f->d[0].addr, "127.0.0.1:", 10), 0);
    tf_recipient_of(f, &o);
    tf_pull_verified(f);
    tf_recipient_destroy(f);
    tf_donors_stop(f, 1);
}

/* ---- no shared memory to the listener -------------------------------------- */

/* What a recipient in a child process saw. */
typedef struct env_probe {
    int32_t status;    /* the pull's */
    int32_t matches;   /* every byte as the donor wrote it */
    char transports[sizeof(((graft_transfer_donor_report_t *)0)->transports)];
    char shm_transports[sizeof(((graft_transfer_donor_report_t *)0)->transports)];
} env_probe_t;

/* The child: no cmocka here (a failed assertion would unwind into the
 * parent's copy of the test runner), only a result on @fd. */
static void env_child(const char *addr, bool no_ticket, int fd)
{
    env_probe_t res = {.status = GRAFT_EINTERNAL};
    graft_transfer_config_t cfg = {.job_secret = SECRET, .job_secret_len = strlen(SECRET),
                                   .chunk_bytes = 256u << 10, .group = 2};
    graft_transfer_endpoint_t *ep = NULL;
    uint8_t *mem[TF_N_SMALL] = {0};
    graft_transfer_report_t rep;
    const char *addrs[1] = {addr};

    graft__ucx_test_no_ticket = no_ticket;
    if (graft_transfer_endpoint_create(&cfg, &ep) == GRAFT_OK) {
        res.status = GRAFT_OK;
        for (size_t i = 0; i < TF_N_SMALL && res.status == GRAFT_OK; i++) {
            mem[i] = calloc(1, tf_small_layout[i].bytes + 1);
            graft_transfer_region_t r = {.name = tf_small_layout[i].name,
                                         .kind = GRAFT_TRANSFER_REGION_PARAM,
                                         .ptr = mem[i],
                                         .bytes = tf_small_layout[i].bytes};
            res.status = mem[i] != NULL ? graft_transfer_region_register(ep, &r) : GRAFT_ENOMEM;
        }
        graft_transfer_pull_options_t po = {.donors = addrs, .n_donors = 1, .step = STEP};
        if (res.status == GRAFT_OK)
            res.status = graft_transfer_pull(ep, &po, &rep);
        if (res.status == GRAFT_OK) {
            res.matches = 1;
            for (size_t i = 0; i < TF_N_SMALL; i++)
                res.matches =
                    res.matches && tf_pattern_matches(mem[i], tf_small_layout[i].bytes, i + 1);
            snprintf(res.transports, sizeof(res.transports), "%s", rep.donors[0].transports);
            snprintf(res.shm_transports, sizeof(res.shm_transports), "%s",
                     rep.donors[0].shm_transports);
        }
    }
    graft_transfer_endpoint_destroy(ep);
    for (size_t i = 0; i < TF_N_SMALL; i++)
        free(mem[i]);
    _exit(tf_write_full(fd, &res, sizeof(res)) ? 0 : 1);
}

/* A donor process started with UCX_TLS=sm,self,tcp and a recipient
 * process with @p recipient_tls; the test's own environment is put back
 * before it returns. */
static void env_case(tf_t *f, const char *recipient_tls, bool no_ticket, env_probe_t *res)
{
    const char *old_tls = getenv("UCX_TLS");
    char saved_tls[64] = "";
    bool had_tls = old_tls != NULL;
    tf_donor_opts_t o = tf_opts(tf_small_layout, TF_N_SMALL, 256u << 10);
    tf_donor_t *d;
    int fds[2], ws = 0;

    if (had_tls)
        snprintf(saved_tls, sizeof(saved_tls), "%s", old_tls);
    setenv("UCX_TLS", "sm,self,tcp", 1);
    d = tf_donor_start(f, 0, &o);
    assert_int_equal(pipe(fds), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(fds[0]);
        setenv("UCX_TLS", recipient_tls, 1);
        env_child(d->addr, no_ticket, fds[1]);
    }
    close(fds[1]);
    if (had_tls)
        setenv("UCX_TLS", saved_tls, 1);
    else
        unsetenv("UCX_TLS");
    memset(res, 0, sizeof(*res));
    bool got = tf_read_full(fds[0], res, sizeof(*res), 30000);
    close(fds[0]);
    if (!got)
        kill(child, SIGKILL);
    assert_int_equal(waitpid(child, &ws, 0), child);
    assert_true(got);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    res->transports[sizeof(res->transports) - 1] = '\0';
    res->shm_transports[sizeof(res->shm_transports) - 1] = '\0';
    print_message("# %s, lanes '%s', second connection '%s'\n", graft_status_name(res->status),
                  res->transports, res->shm_transports);
    assert_int_equal(tf_donor_stop(d), 0);
}

/* Shared memory is offered to no one who reaches the listener (a peer
 * killed in the middle of a write into a worker's shared receive FIFO
 * would block every connection behind it; docs/SECURITY.md): with
 * UCX_TLS=sm,self,tcp on both sides every lane of the first connection is
 * tcp. Once authenticated, the recipient on the same host reads over the
 * second connection its manifest named, shared memory only, and the bytes
 * arrive whole. */
static void test_listener_no_shm(void **state)
{
    tf_t *f = *state;
    env_probe_t res;
    char am_tl[32];
    bool all_tcp;

    env_case(f, "sm,self,tcp", false, &res);
    assert_int_equal(res.status, GRAFT_OK);
    assert_true(res.matches);
    tf_lanes_parse(res.transports, am_tl, sizeof(am_tl), &all_tcp);
    assert_string_equal(am_tl, "tcp");
    assert_true(all_tcp);
    tf_lanes_parse(res.shm_transports, am_tl, sizeof(am_tl), &all_tcp);
    assert_true(strcmp(am_tl, "posix") == 0 || strcmp(am_tl, "sysv") == 0);
    assert_null(strstr(res.shm_transports, "tcp"));
}

/* A recipient whose UCX_TLS allows no shared memory cannot reach the
 * second connection a donor on its host offers: it reads over the first,
 * and the pull succeeds. */
static void test_shm_offer_unreachable(void **state)
{
    tf_t *f = *state;
    env_probe_t res;
    char am_tl[32];
    bool all_tcp;

    env_case(f, "tcp", false, &res);
    assert_int_equal(res.status, GRAFT_OK);
    assert_true(res.matches);
    tf_lanes_parse(res.transports, am_tl, sizeof(am_tl), &all_tcp);
    assert_true(all_tcp);
    assert_string_equal(res.shm_transports, "");
}

/* Chunk requests on the second connection without the ticket its manifest
 * gave are refused (GRAFT_ETOKEN): the recipient drops the donor and
 * installs nothing. */
static void test_shm_ticket_required(void **state)
{
    tf_t *f = *state;
    env_probe_t res;

    env_case(f, "sm,self,tcp", true, &res);
    assert_int_equal(res.status, GRAFT_ENODONOR);
    assert_false(res.matches);
}

/* An endpoint made and destroyed under each UCX_TLS puts nothing on
 * standard output, where UCX writes its warnings when UCX_LOG_FILE is unset
 * (the settings our contexts apply must be ones this UCX knows: it warned
 * at every worker about TCP_PUT_ENABLE, and about MM_ERROR_HANDLING where
 * no shared-memory transport was allowed). */
static void test_ucx_quiet(void **state)
{
    static const char *const tls[] = {"tcp", "sm,self,tcp", "self,tcp,posix"};
    (void)state;
    for (size_t i = 0; i < ARRAY_SIZE(tls); i++) {
        char out[4096] = "";
        int fds[2], ws = 0;
        assert_int_equal(pipe(fds), 0);
        pid_t child = fork();
        assert_true(child >= 0);
        if (child == 0) {
            graft_transfer_config_t cfg = {.job_secret = SECRET,
                                           .job_secret_len = strlen(SECRET)};
            graft_transfer_endpoint_t *ep = NULL;
            dup2(fds[1], STDOUT_FILENO);
            close(fds[0]);
            unsetenv("UCX_LOG_FILE");
            setenv("UCX_TLS", tls[i], 1);
            graft_status_t st = graft_transfer_endpoint_create(&cfg, &ep);
            graft_transfer_endpoint_destroy(ep);
            fflush(stdout);
            _exit(st == GRAFT_OK ? 0 : 1);
        }
        close(fds[1]);
        size_t got = 0;
        ssize_t n;
        while ((n = read(fds[0], out + got, sizeof(out) - 1 - got)) > 0)
            got += (size_t)n;
        close(fds[0]);
        assert_int_equal(waitpid(child, &ws, 0), child);
        if (got > 0)
            print_message("# UCX_TLS=%s printed: %s\n", tls[i], out);
        assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
        assert_int_equal(got, 0);
    }
}

/* The shared-memory context's UCX_TLS: the shared-memory transports the
 * user's list allows, none where it names none or excludes them. */
static void test_shm_tls(void **state)
{
    static const struct {
        const char *user, *want;
    } cases[] = {{NULL, "sm"},
                 {"", "sm"},
                 {"all", "sm"},
                 {"^ib", "sm"},
                 {"sm,self,tcp", "sm"},
                 {"posix,sysv,cma,tcp", "posix,sysv,cma"},
                 {"rc,shm,tcp", "shm"},
                 {"tcp", NULL},
                 {"self,tcp", NULL},
                 {"^sm", NULL},
                 {"^ib,cma", NULL}};
    char out[64];
    (void)state;
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        bool ok = graft__ucx_shm_tls(cases[i].user, out, sizeof(out));
        assert_int_equal(ok, cases[i].want != NULL);
        if (ok)
            assert_string_equal(out, cases[i].want);
    }
}

/* The caveat of docs/SECURITY.md ("A connection flood"): said for UCX
 * before 1.22 listening where other hosts reach it, not on loopback, not
 * from 1.22 on. */
static void test_flood_caveat(void **state)
{
    (void)state;
    in_addr_t lo = htonl(INADDR_LOOPBACK), lo2 = inet_addr("127.3.2.1"), any = htonl(INADDR_ANY),
              eth = inet_addr("10.1.2.3");
    assert_true(graft__ucx_flood_caveat(1, 13, any));
    assert_true(graft__ucx_flood_caveat(1, 13, eth));
    assert_true(graft__ucx_flood_caveat(1, 21, eth));
    assert_true(graft__ucx_flood_caveat(0, 99, eth));
    assert_false(graft__ucx_flood_caveat(1, 13, lo));
    assert_false(graft__ucx_flood_caveat(1, 13, lo2));
    assert_false(graft__ucx_flood_caveat(1, 22, eth));
    assert_false(graft__ucx_flood_caveat(2, 0, any));
}

/* The listener's UCX_TLS: the user's list without shared memory, a
 * negated list extended, and tcp where nothing else is left. */
static void test_strangers_tls(void **state)
{
    static const struct {
        const char *user, *want;
    } cases[] = {{NULL, "^sm"},
                 {"", "^sm"},
                 {"all", "^sm"},
                 {"^ib", "^ib,sm"},
                 {"sm,self,tcp", "self,tcp"},
                 {"posix,sysv,cma,tcp", "tcp"},
                 {"rc,shm,tcp", "rc,tcp"},
                 {"shm", "tcp"},
                 {"self,sm", "tcp"},
                 {"tcp,,xpmem,knem,mm", "tcp"}};
    char out[64];
    (void)state;
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        graft__ucx_strangers_tls(cases[i].user, out, sizeof(out));
        assert_string_equal(out, cases[i].want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_api_misuse),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_host_alloc),
        cmocka_unit_test(test_host_alloc_failures),
        TF_TEST(test_listener_no_shm),
        TF_TEST(test_shm_offer_unreachable),
        TF_TEST(test_shm_ticket_required),
        cmocka_unit_test(test_strangers_tls),
        cmocka_unit_test(test_flood_caveat),
        cmocka_unit_test(test_shm_tls),
        cmocka_unit_test(test_ucx_quiet),
        TF_TEST(test_listen_address),
    };
    return tf_run_local("local", tests, ARRAY_SIZE(tests));
}
