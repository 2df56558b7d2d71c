/*
 * Attacks on a live donor endpoint and its real UCX listener, by a peer
 * that never holds the job secret: a UCX client of our own that reads and
 * writes donor memory one-sidedly (its own context with RMA, a key of its
 * own memory), a flood of idle connections, a captured request replayed on
 * a new connection, and a veth that comes and goes beside the endpoint.
 * Each ends with the donor alive, its state unchanged (hashed by the donor
 * itself), nothing served to the attacker, and the donor still serving an
 * honest recipient. The donor is a child process with its log in a file.
 */
#include "transfer_fixture.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <ucp/api/ucp.h>

#include "proto/graft.pb-c.h"
#include "transfer/ucx_int.h"

/* ---- the donor: serves a pattern, answers questions about itself ---------- */

typedef struct atk_donor_opts {
    bool host_mem;
    char log_path[128];
} atk_donor_opts_t;

/* FNV-1a over the regions and the job secret: what an attacker must not
 * change. */
static uint64_t state_hash(graft_transfer_endpoint_t *ep, uint8_t **mem, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        for (uint64_t k = 0; k < tf_small_layout[i].bytes; k++)
            h = (h ^ mem[i][k]) * 0x100000001b3ull;
    }
    for (size_t k = 0; k < ep->job_secret_len; k++)
        h = (h ^ ep->job_secret[k]) * 0x100000001b3ull;
    return h;
}

static uint64_t fd_count(void)
{
    uint64_t n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return 0;
    for (struct dirent *e = readdir(d); e != NULL; e = readdir(d))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static uint64_t rss_bytes(void)
{
    unsigned long size = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL)
        return 0;
    if (fscanf(f, "%lu %lu", &size, &rss) != 2)
        rss = 0;
    fclose(f);
    return (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Commands: 'A' i -> the address of region i (i = 99: of the job secret),
 * 'H' -> the state hash, 'S' -> open fds and RSS bytes, 'C' -> the
 * endpoint's consecutive serve failures, 'Q' -> quit. Answers 2 words. */
static int atk_donor_main(const void *arg, int cmd_fd, int resp_fd)
{
    const atk_donor_opts_t *o = arg;
    graft_transfer_config_t cfg = {TF_SECRET, .chunk_bytes = 64u << 10, .group = 1};
    graft_transfer_endpoint_t *ep = NULL;
    uint8_t *mem[TF_N_SMALL] = {0}, *block = NULL;
    char addr[64] = {0};
    int rc = 1;

    int lfd = open(o->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600);
    if (lfd < 0 || dup2(lfd, STDERR_FILENO) < 0)
        return 1;
    close(lfd);
    graft_log_level_set(GRAFT_LOG_INFO);
    if (graft_transfer_endpoint_create(&cfg, &ep) != GRAFT_OK)
        goto out;
    if (o->host_mem &&
        graft_transfer_host_alloc(ep, tf_host_block_bytes(tf_small_layout, TF_N_SMALL),
                                  (void **)&block) != GRAFT_OK)
        goto out;
    for (size_t i = 0; i < TF_N_SMALL; i++) {
        mem[i] = block != NULL ? block + tf_host_block_offset(tf_small_layout, i)
                               : malloc(tf_small_layout[i].bytes + 1);
        tf_fill_pattern(mem[i], tf_small_layout[i].bytes, i + 1);
        graft_transfer_region_t r = {.name = tf_small_layout[i].name,
                                     .kind = GRAFT_TRANSFER_REGION_PARAM,
                                     .ptr = mem[i],
                                     .bytes = tf_small_layout[i].bytes};
        if (graft_transfer_region_register(ep, &r) != GRAFT_OK)
            goto out;
    }
    if (graft_transfer_serve_begin(ep, STEP) != GRAFT_OK)
        goto out;
    snprintf(addr, sizeof(addr), "%s", graft_transfer_endpoint_address(ep));
    if (!tf_write_full(resp_fd, addr, sizeof(addr)))
        goto out;
    for (;;) {
        uint32_t cmd[3];
        uint64_t out[2] = {0, 0};
        if (!tf_read_full(cmd_fd, cmd, sizeof(cmd), -1) || cmd[0] == 'Q')
            break;
        if (cmd[0] == 'A')
            out[0] = cmd[1] == 99 ? (uint64_t)(uintptr_t)ep->job_secret
                                  : (uint64_t)(uintptr_t)mem[cmd[1] % TF_N_SMALL];
        else if (cmd[0] == 'H')
            out[0] = state_hash(ep, mem, TF_N_SMALL);
        else if (cmd[0] == 'S')
            out[0] = fd_count(), out[1] = rss_bytes();
        else if (cmd[0] == 'C')
            out[0] = graft_transfer_serve_failures(ep);
        else if (cmd[0] == 'X')
            out[0] = graft_transfer_refused_count(ep);
        if (!tf_write_full(resp_fd, out, sizeof(out)))
            break;
    }
    rc = graft_transfer_serve_end(ep) == GRAFT_OK ? 0 : 1;
out:
    graft_transfer_endpoint_destroy(ep);
    for (size_t i = 0; i < TF_N_SMALL && block == NULL; i++)
        free(mem[i]);
    return rc;
}

static void donor_query(tf_donor_t *d, uint32_t op, uint32_t a, uint64_t out[2])
{
    uint32_t cmd[3] = {op, a, 0};
    assert_true(tf_write_full(d->cmd_fd, cmd, sizeof(cmd)));
    assert_true(tf_read_full(d->resp_fd, out, 2 * sizeof(uint64_t), 30000));
}

static uint64_t donor_hash(tf_donor_t *d)
{
    uint64_t out[2];
    donor_query(d, 'H', 0, out);
    return out[0];
}

/* Whether the donor's log has a line containing @needle, waiting up to
 * @timeout_ms for it. */
static bool log_has(const char *path, const char *needle, int timeout_ms)
{
    for (int waited = 0;; waited += 50) {
        FILE *f = fopen(path, "r");
        char line[1024];
        bool found = false;
        while (f != NULL && !found && fgets(line, sizeof(line), f) != NULL)
            found = strstr(line, needle) != NULL;
        if (f != NULL)
            fclose(f);
        if (found)
            return true;
        if (waited >= timeout_ms)
            return false;
        usleep(50000);
    }
}

static tf_donor_t *atk_donor_start(tf_t *f, int i, atk_donor_opts_t *o, bool host_mem)
{
    o->host_mem = host_mem;
    static int started;
    snprintf(o->log_path, sizeof(o->log_path), "/tmp/graft-attack-%d-%d-%d.log", (int)getpid(), i,
             ++started);
    return tf_child_start(f, i, atk_donor_main, o);
}

/* ---- the attacker: a UCX client of our own -------------------------------- */

typedef struct attacker {
    ucp_context_h ctx;
    ucp_worker_h w;
    ucp_ep_h ep;
    bool challenged;
    bool failed;
    uint8_t donor_nonce[GRAFT_NONCE_BYTES];
    uint8_t *mem;
    ucp_mem_h memh;
    void *rkey_buf;
    size_t rkey_len;
    ucp_rkey_h rkey;
} attacker_t;

static void atk_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    (void)status;
    ((attacker_t *)arg)->failed = true;
}

static ucs_status_t atk_challenge_cb(void *arg, const void *header, size_t header_length,
                                     void *data, size_t length, const ucp_am_recv_param_t *param)
{
    attacker_t *a = arg;
    (void)header, (void)header_length, (void)param;
    a->challenged = true;
    Graft__TransferChallenge *ch = graft__transfer_challenge__unpack(NULL, length, data);
    if (ch != NULL && ch->nonce.len == GRAFT_NONCE_BYTES)
        memcpy(a->donor_nonce, ch->nonce.data, GRAFT_NONCE_BYTES);
    graft__transfer_challenge__free_unpacked(ch, NULL);
    return UCS_OK;
}

static void atk_progress_ms(attacker_t *a, int ms)
{
    uint64_t end = graft__now_ns() + (uint64_t)ms * 1000000ull;
    while (graft__now_ns() < end) {
        ucp_worker_progress(a->w);
        usleep(200);
    }
}

static void atk_sockaddr(const char *addr, struct sockaddr_in *sa)
{
    char host[64];
    const char *colon = strrchr(addr, ':');
    assert_non_null(colon);
    snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)atoi(colon + 1));
    assert_int_equal(inet_pton(AF_INET, host, &sa->sin_addr), 1);
}

/* A connection to the listener at @sa, as graft's own (peer errors). */
static ucs_status_t atk_ep_create(ucp_worker_h w, const struct sockaddr_in *sa, attacker_t *errs,
                                  ucp_ep_h *ep_p)
{
    ucp_ep_params_t prm = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                         UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                         UCP_EP_PARAM_FIELD_ERR_HANDLER,
                           .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                           .sockaddr = {.addr = (const struct sockaddr *)sa,
                                        .addrlen = sizeof(*sa)},
                           .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                           .err_handler = {.cb = atk_err_cb, .arg = errs}};
    return ucp_ep_create(w, &prm, ep_p);
}

/* The attacker's own context (with RMA), its worker and a connection to
 * the donor at @addr, up once the donor's challenge came; a key of its own
 * memory, unpacked on that connection. */
static void atk_connect(attacker_t *a, const char *addr)
{
    ucp_config_t *cfg = NULL;
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features = UCP_FEATURE_RMA | UCP_FEATURE_AM};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    struct sockaddr_in sa;
    memset(a, 0, sizeof(*a));
    assert_int_equal(ucp_config_read(NULL, NULL, &cfg), UCS_OK);
    /* A stranger from another host: tcp only. */
    assert_int_equal(ucp_config_modify(cfg, "TLS", "tcp"), UCS_OK);
    assert_int_equal(ucp_init(&p, cfg, &a->ctx), UCS_OK);
    ucp_config_release(cfg);
    assert_int_equal(ucp_worker_create(a->ctx, &wp, &a->w), UCS_OK);
    /* The donor's refusals and the like: dropped (UCX 1.13 crashes on a
     * message with no handler). */
    assert_int_equal(graft__ucx_drop_all(a->w), GRAFT_OK);
    ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                                               UCP_AM_HANDLER_PARAM_FIELD_CB |
                                               UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                 .id = GRAFT__XFER_AM_CHALLENGE,
                                 .cb = atk_challenge_cb,
                                 .arg = a};
    assert_int_equal(ucp_worker_set_am_recv_handler(a->w, &hp), UCS_OK);
    atk_sockaddr(addr, &sa);
    assert_int_equal(atk_ep_create(a->w, &sa, a, &a->ep), UCS_OK);
    for (int i = 0; i < 3000 && !a->challenged && !a->failed; i++)
        atk_progress_ms(a, 1);
    assert_true(a->challenged);

    a->mem = calloc(1, 1u << 16);
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                             UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = a->mem,
                               .length = 1u << 16};
    assert_int_equal(ucp_mem_map(a->ctx, &mp, &a->memh), UCS_OK);
    assert_int_equal(ucp_rkey_pack(a->ctx, a->memh, &a->rkey_buf, &a->rkey_len), UCS_OK);
    ucs_status_t st = ucp_ep_rkey_unpack(a->ep, a->rkey_buf, &a->rkey);
    print_message("# attacker's key unpacked on the connection: %s\n", ucs_status_string(st));
    if (st != UCS_OK)
        a->rkey = NULL;
}

static void atk_op_cb(void *request, ucs_status_t status, void *user_data)
{
    (void)request;
    *(ucs_status_t *)user_data = status;
}

/* Wait for @req (an RMA op or a flush) at most @ms; UCS_ERR_TIMED_OUT when
 * nothing came back. */
static ucs_status_t atk_wait(attacker_t *a, ucs_status_ptr_t req, ucs_status_t *done, int ms)
{
    if (req == NULL)
        return UCS_OK;
    if (UCS_PTR_IS_ERR(req))
        return UCS_PTR_STATUS(req);
    for (int i = 0; i < ms && *done == UCS_INPROGRESS; i++)
        atk_progress_ms(a, 1);
    return *done == UCS_INPROGRESS ? UCS_ERR_TIMED_OUT : *done;
}

/* A one-sided get (or put of @len bytes of 0xde) at @raddr of the donor.
 * Returns how it ended at the attacker; *@got holds what a get brought. */
static ucs_status_t atk_rma(attacker_t *a, bool put, uint64_t raddr, size_t len)
{
    ucs_status_t done = UCS_INPROGRESS, fdone = UCS_INPROGRESS;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                               UCP_OP_ATTR_FIELD_USER_DATA,
                               .cb.send = atk_op_cb,
                               .user_data = &done};
    if (a->rkey == NULL)
        return UCS_ERR_UNSUPPORTED;
    memset(a->mem, put ? 0xde : 0, len);
    ucs_status_ptr_t req = put ? ucp_put_nbx(a->ep, a->mem, len, raddr, a->rkey, &prm)
                               : ucp_get_nbx(a->ep, a->mem, len, raddr, a->rkey, &prm);
    ucs_status_t st = atk_wait(a, req, &done, 3000);
    if (st == UCS_OK && put) {
        prm.user_data = &fdone;
        st = atk_wait(a, ucp_ep_flush_nbx(a->ep, &prm), &fdone, 3000);
    }
    return st;
}

static void atk_close(attacker_t *a)
{
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_EP_CLOSE_FLAG_FORCE};
    if (a->rkey != NULL)
        ucp_rkey_destroy(a->rkey);
    if (a->ep != NULL) {
        ucs_status_ptr_t req = ucp_ep_close_nbx(a->ep, &prm);
        for (int i = 0; UCS_PTR_IS_PTR(req) && i < 3000 &&
                        ucp_request_check_status(req) == UCS_INPROGRESS;
             i++)
            atk_progress_ms(a, 1);
        if (UCS_PTR_IS_PTR(req))
            ucp_request_free(req);
    }
    if (a->rkey_buf != NULL)
        ucp_rkey_buffer_release(a->rkey_buf);
    if (a->memh != NULL)
        (void)ucp_mem_unmap(a->ctx, a->memh);
    if (a->w != NULL)
        ucp_worker_destroy(a->w);
    if (a->ctx != NULL)
        ucp_cleanup(a->ctx);
    free(a->mem);
    memset(a, 0, sizeof(*a));
}

/* The donor is alive, unchanged, and serves an honest recipient. */
static void assert_donor_intact(tf_t *f, tf_donor_t *d, uint64_t hash0)
{
    int ws;
    assert_int_equal(waitpid(d->pid, &ws, WNOHANG), 0);
    assert_true(donor_hash(d) == hash0);
    f->po.donors = f->addrs;
    f->po.n_donors = 1;
    f->po.step = STEP;
    tf_recipient_zero(f);
    tf_pull_verified(f);
}

static void rma_attack(void **state, bool host_mem)
{
    tf_t *f = *state;
    atk_donor_opts_t o;
    tf_donor_t *d = atk_donor_start(f, 0, &o, host_mem);
    uint64_t out[2], hash0 = donor_hash(d);
    donor_query(d, 'A', 99, out);
    uint64_t secret_at = out[0];
    donor_query(d, 'A', 0, out);
    uint64_t region_at = out[0];
    tf_recipient_create(f, tf_small_layout, TF_N_SMALL, 64u << 10, SECRET, host_mem);
    const struct {
        bool put;
        uint64_t addr;
        const char *what;
    } ops[] = {{false, secret_at, "get of the job secret"},
               {false, region_at, "get of a region"},
               {true, secret_at, "put over the job secret"},
               {true, region_at, "put into a region"},
               {false, 0x1000, "get at 0x1000"},
               {true, 0x1000, "put at 0x1000"}};
    for (size_t i = 0; i < ARRAY_SIZE(ops); i++) {
        attacker_t a;
        atk_connect(&a, d->addr);
        ucs_status_t st = atk_rma(&a, ops[i].put, ops[i].addr, 32);
        print_message("# %s: %s at the attacker\n", ops[i].what, ucs_status_string(st));
        /* Nothing served: the op fails, or whatever it brought is not the
         * secret. */
        if (!ops[i].put)
            assert_true(st != UCS_OK || memcmp(a.mem, SECRET, 16) != 0);
        /* A get never completes (the donor has no handler for it); a
         * put may complete at the attacker, having written nothing. Both
         * connections are closed by the donor at its deadline. */
        if (!ops[i].put)
            assert_true(st != UCS_OK);
        for (int w = 0; w < 4000 && !a.failed; w++)
            atk_progress_ms(&a, 1);
        assert_true(a.failed);
        atk_close(&a);
        assert_donor_intact(f, d, hash0);
        assert_true(log_has(o.log_path, "sent no authenticated request in time", 3000));
    }
    tf_recipient_destroy(f);
    assert_int_equal(tf_donor_stop(d), 0);
    unlink(o.log_path);
}

/* A flood of idle connections that never authenticate: the donor's
 * descriptors and memory stay bounded, it serves an honest recipient
 * during the flood and after it, and it closes the strangers. */
#define FLOOD_CONNS 300

static attacker_t flood_errs; /* their error callback's flag: ignored */

/* The flood, from a process of its own (as an attacker would be), forked
 * before the test has UCX state of its own: answers "ready", then on 'G'
 * answers "up" as it starts opening FLOOD_CONNS connections to @addr and
 * "up" again once they are made, keeps them going until its command pipe closes, then exits
 * without closing them (the kernel does). */
static int flood_main(const void *arg, int cmd_fd, int resp_fd)
{
    const char *addr = arg;
    attacker_t a;
    struct sockaddr_in sa;
    ucp_ep_h *eps = calloc(FLOOD_CONNS, sizeof(*eps));
    char up[64] = "up";
    uint32_t cmd[3];
    if (!tf_write_full(resp_fd, up, sizeof(up)) || !tf_read_full(cmd_fd, cmd, sizeof(cmd), -1))
        _exit(1);
    atk_connect(&a, addr);
    atk_sockaddr(addr, &sa);
    if (!tf_write_full(resp_fd, up, sizeof(up)))
        _exit(1);
    for (int i = 0; i < FLOOD_CONNS; i++) {
        if (atk_ep_create(a.w, &sa, &flood_errs, &eps[i]) != UCS_OK)
            _exit(1);
        atk_progress_ms(&a, 1);
    }
    atk_progress_ms(&a, 500);
    if (!tf_write_full(resp_fd, up, sizeof(up)))
        _exit(1);
    for (;;) {
        struct pollfd pfd = {.fd = cmd_fd, .events = POLLIN};
        if (poll(&pfd, 1, 0) > 0)
            break;
        atk_progress_ms(&a, 5);
    }
    _exit(0);
}

static void test_flood(void **state)
{
    tf_t *f = *state;
    atk_donor_opts_t o;
    tf_donor_t *d = atk_donor_start(f, 0, &o, false);
    uint64_t before[2], during[2], after[2], hash0 = donor_hash(d);
    tf_donor_t *flood = tf_child_start(f, 1, flood_main, d->addr);
    uint32_t go[3] = {'G', 0, 0};
    char up[64];

    tf_recipient_create(f, tf_small_layout, TF_N_SMALL, 64u << 10, SECRET, false);
    assert_donor_intact(f, d, hash0); /* warm: the donor's first serve */
    donor_query(d, 'S', 0, before);
    assert_true(tf_write_full(flood->cmd_fd, go, sizeof(go)));
    assert_true(tf_read_full(flood->resp_fd, up, sizeof(up), 60000)); /* connecting */
    /* An honest recipient while the flood fills every place (its
     * connections open one a millisecond, none old enough to give way):
     * turned away, it comes back and is served. */
    usleep(100 * 1000);
    assert_donor_intact(f, d, hash0);
    assert_true(tf_read_full(flood->resp_fd, up, sizeof(up), 60000));
    donor_query(d, 'S', 0, during);
    print_message("# donor with %d idle connections: fds %llu -> %llu, RSS %llu -> %llu MiB\n",
                  FLOOD_CONNS, (unsigned long long)before[0], (unsigned long long)during[0],
                  (unsigned long long)(before[1] >> 20), (unsigned long long)(during[1] >> 20));
    /* Unbounded, each connection cost 10 to 25 descriptors and ~4 MB. */
    assert_true(during[0] < before[0] + 30 * MAX_UNAUTH_CONNS);
    assert_true(during[1] < before[1] + (160ull << 20));
    /* An honest recipient during the flood. */
    assert_donor_intact(f, d, hash0);
    usleep(2500 * 1000);
    assert_true(
        log_has(o.log_path, "too many connections without an authenticated request", 1000));
    assert_true(log_has(o.log_path, "sent no authenticated request in time", 1000));
    tf_child_kill(flood);
    assert_donor_intact(f, d, hash0);
    donor_query(d, 'S', 0, after);
    print_message("# after: fds %llu, RSS %llu MiB\n", (unsigned long long)after[0],
                  (unsigned long long)(after[1] >> 20));
    assert_true(after[0] < before[0] + 40);
    tf_recipient_destroy(f);
    assert_int_equal(tf_donor_stop(d), 0);
    unlink(o.log_path);
}

/* Active message @id with @bytes on the attacker's connection. */
static void send_am(attacker_t *a, unsigned id, const uint8_t *bytes, size_t len)
{
    ucs_status_t done = UCS_INPROGRESS;
    uint64_t hdr = 7;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                               UCP_OP_ATTR_FIELD_USER_DATA |
                                               UCP_OP_ATTR_FIELD_FLAGS,
                               .cb.send = atk_op_cb,
                               .user_data = &done,
                               .flags = UCP_AM_SEND_FLAG_REPLY};
    ucs_status_ptr_t req = ucp_am_send_nbx(a->ep, id, &hdr, sizeof(hdr), bytes, len, &prm);
    assert_int_equal(atk_wait(a, req, &done, 3000), UCS_OK);
    atk_progress_ms(a, 300);
}

static uint64_t donor_refused(tf_donor_t *d)
{
    uint64_t out[2];
    donor_query(d, 'X', 0, out);
    return out[0];
}

/* A request built with the job secret for one connection's challenge,
 * captured and sent again on a new connection: refused there. Then
 * messages of ids the donor does not expect from a recipient. */
static void test_replay(void **state)
{
    tf_t *f = *state;
    atk_donor_opts_t o;
    tf_donor_t *d = atk_donor_start(f, 0, &o, false);
    uint64_t hash0 = donor_hash(d);
    attacker_t a, b;
    uint8_t nonce[GRAFT_NONCE_BYTES], mac[GRAFT_MAC_BYTES], buf[512];

    atk_connect(&a, d->addr);
    memset(nonce, 0x5a, sizeof(nonce));
    graft__xfer_request_fields_t fl = {.step = STEP, .layout_hash = 1, .request_id = 9,
                                       .group = 2, .rank = 0};
    assert_int_equal(graft__xfer_request_mac((const uint8_t *)SECRET, sizeof(SECRET) - 1,
                                             a.donor_nonce, nonce, &fl, mac), GRAFT_OK);
    Graft__TransferRequest req = GRAFT__TRANSFER_REQUEST__INIT;
    req.version = GRAFT__XFER_WIRE_VERSION;
    req.step = fl.step;
    req.layout_hash = fl.layout_hash;
    req.request_id = fl.request_id;
    req.recipient_group = fl.group;
    req.rank = fl.rank;
    req.nonce.data = nonce;
    req.nonce.len = sizeof(nonce);
    req.mac.data = mac;
    req.mac.len = sizeof(mac);
    size_t len = graft__transfer_request__pack(&req, buf);
    /* On its own connection the request is authentic (and refused for its
     * layout, which is not counted against who sent it). */
    uint64_t refused0 = donor_refused(d);
    send_am(&a, GRAFT__XFER_AM_REQUEST, buf, len);
    assert_true(donor_refused(d) == refused0);
    /* The same bytes on a new connection: another challenge, refused. */
    atk_connect(&b, d->addr);
    send_am(&b, GRAFT__XFER_AM_REQUEST, buf, len);
    assert_true(donor_refused(d) == refused0 + 1);
    assert_true(log_has(o.log_path, "failed authentication", 3000));
    /* Messages the donor never expects, and ids it has no use for. */
    const unsigned ids[] = {GRAFT__XFER_AM_MANIFEST, GRAFT__XFER_AM_CHALLENGE,
                            GRAFT__XFER_AM_CHUNK_DATA, 25, 31};
    for (size_t i = 0; i < ARRAY_SIZE(ids); i++)
        send_am(&b, ids[i], buf, len);
    assert_int_equal(waitpid(d->pid, &(int){0}, WNOHANG), 0);
    atk_close(&b);
    atk_close(&a);
    tf_recipient_create(f, tf_small_layout, TF_N_SMALL, 64u << 10, SECRET, false);
    assert_donor_intact(f, d, hash0);
    tf_recipient_destroy(f);
    assert_int_equal(tf_donor_stop(d), 0);
    unlink(o.log_path);
}

/* A veth that comes and goes next to a serving endpoint (as containers'
 * do): the endpoint's UCX uses only the device of its address (lo), keeps
 * serving, and counts no failure. Needs CAP_NET_ADMIN; skipped without. */
static void test_veth(void **state)
{
    tf_t *f = *state;
    atk_donor_opts_t o;
    char veth[16], cmd[256];
    snprintf(veth, sizeof(veth), "gva%d", (int)(getpid() % 100000) & 0xffff);
    snprintf(cmd, sizeof(cmd), "ip link add %s type veth peer name %sp 2>/dev/null", veth, veth);
    if (system(cmd) != 0) {
        print_message("# skipped: cannot create a veth here (needs CAP_NET_ADMIN)\n");
        skip();
    }
    /* The veth exists as the endpoint starts (UCX would list it), then
     * goes away: workers made afterwards must not need it. */
    snprintf(cmd, sizeof(cmd), "ip addr add 10.250.7.1/24 dev %s && ip link set %s up", veth,
             veth);
    assert_int_equal(system(cmd), 0);
    tf_donor_t *d = atk_donor_start(f, 0, &o, false);
    uint64_t out[2], hash0 = donor_hash(d);
    tf_recipient_create(f, tf_small_layout, TF_N_SMALL, 64u << 10, SECRET, false);
    assert_donor_intact(f, d, hash0);
    snprintf(cmd, sizeof(cmd), "ip link del %s", veth);
    assert_int_equal(system(cmd), 0);
    for (int round = 0; round < 3; round++)
        assert_donor_intact(f, d, hash0);
    /* And one that comes and goes while it serves. */
    snprintf(cmd, sizeof(cmd), "ip link add %s type veth peer name %sp && ip link set %s up && "
             "sleep 0.2 && ip link del %s", veth, veth, veth, veth);
    assert_int_equal(system(cmd), 0);
    assert_donor_intact(f, d, hash0);
    donor_query(d, 'C', 0, out);
    assert_true(out[0] == 0);
    tf_recipient_destroy(f);
    assert_int_equal(tf_donor_stop(d), 0);
    unlink(o.log_path);
}

static void test_rma_malloc(void **state)
{
    rma_attack(state, false);
}

static void test_rma_host_mem(void **state)
{
    rma_attack(state, true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        TF_TEST(test_rma_malloc),
        TF_TEST(test_rma_host_mem),
        TF_TEST(test_flood),
        TF_TEST(test_replay),
        TF_TEST(test_veth),
    };
    return tf_run_wire("attack", tests, ARRAY_SIZE(tests));
}
