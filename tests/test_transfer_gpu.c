/*
 * Transfer engine with CUDA memory: UCX with pinned-host staging, and the
 * NCCL pair backend. Runs where a GPU exists; elsewhere each test reports
 * "skipped: no GPU" (a cmocka skip, counted apart from passes).
 *
 * Both roles run in forked children (CUDA must not be initialised before a
 * fork); the parent only wires pipes and checks exit codes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <graft/transfer.h>

#include "gpu_support.h"

#ifdef GRAFT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define STEP 7
#define CHUNK (1u << 20)

#ifdef GRAFT_HAVE_CUDA
static const uint64_t sizes[2] = {(8u << 20) + 13, 3u << 20};
static const char *const names[2] = {"weights", "optim"};

static bool io_full(int fd, void *buf, size_t n, bool wr)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = wr ? write(fd, (char *)buf + done, n - done)
                       : read(fd, (char *)buf + done, n - done);
        if (r <= 0)
            return false;
        done += (size_t)r;
    }
    return true;
}

/* CUDA regions with the pattern (donor) or zeroes (recipient). */
static graft_transfer_endpoint_t *gpu_endpoint(bool donor, void *dev[2])
{
    graft_transfer_config_t cfg = {.chunk_bytes = CHUNK,
                                   .job_secret = "job-secret-of-the-gpu-tests",
                                   .job_secret_len = strlen("job-secret-of-the-gpu-tests")};
    graft_transfer_endpoint_t *ep = NULL;
    if (graft_transfer_endpoint_create(&cfg, &ep) != GRAFT_OK)
        return NULL;
    for (int i = 0; i < 2; i++) {
        uint8_t *h = calloc(1, sizes[i]);
        if (donor)
            graft_test_fill_pattern(h, sizes[i], (uint64_t)i + 1);
        if (cudaMalloc(&dev[i], sizes[i]) != cudaSuccess ||
            cudaMemcpy(dev[i], h, sizes[i], cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaDeviceSynchronize() != cudaSuccess) /* as graft.h asks of a trainer */
            return NULL;
        free(h);
        graft_transfer_region_t r = {.name = names[i],
                                     .kind = GRAFT_TRANSFER_REGION_PARAM,
                                     .device = GRAFT_TRANSFER_CUDA,
                                     .ptr = dev[i],
                                     .bytes = sizes[i]};
        if (graft_transfer_region_register(ep, &r) != GRAFT_OK)
            return NULL;
    }
    return ep;
}

static bool gpu_matches(void *dev[2])
{
    bool ok = true;
    for (int i = 0; i < 2 && ok; i++) {
        uint8_t *want = malloc(sizes[i]), *got = malloc(sizes[i]);
        graft_test_fill_pattern(want, sizes[i], (uint64_t)i + 1);
        ok = cudaMemcpy(got, dev[i], sizes[i], cudaMemcpyDeviceToHost) == cudaSuccess &&
             memcmp(want, got, sizes[i]) == 0;
        free(want);
        free(got);
    }
    return ok;
}

static int uid_fd[2];

static graft_status_t uid_exchange(bool publish, uint8_t *uid, size_t n, uint64_t step, void *arg)
{
    (void)step;
    (void)arg;
    return io_full(publish ? uid_fd[1] : uid_fd[0], uid, n, publish) ? GRAFT_OK : GRAFT_EIO;
}

/* mode 0: UCX staged; mode 1: NCCL. Exit 0 on success. */
static int donor_child(int mode, int addr_fd, int quit_fd)
{
    void *dev[2];
    char addr[64] = {0};
    graft_transfer_endpoint_t *ep;
    if (mode == 1)
        graft_test_nccl_env("graft-test-donor");
    ep = gpu_endpoint(true, dev);
    if (ep == NULL || graft_transfer_serve_begin(ep, STEP) != GRAFT_OK)
        return 2;
    snprintf(addr, sizeof(addr), "%s", graft_transfer_endpoint_address(ep));
    if (!io_full(addr_fd, addr, sizeof(addr), true))
        return 3;
    if (mode == 1) {
        graft_transfer_nccl_options_t no = {.exchange = uid_exchange, .timeout_ms = 60000};
        if (graft_transfer_serve_nccl(ep, STEP, &no) != GRAFT_OK)
            return 4;
    }
    char q;
    (void)!read(quit_fd, &q, 1);
    graft_transfer_endpoint_destroy(ep);
    return 0;
}

static int recipient_child(int mode, const char *addr)
{
    void *dev[2];
    graft_transfer_endpoint_t *ep;
    graft_transfer_report_t rep;
    graft_transfer_nccl_options_t no = {.exchange = uid_exchange, .timeout_ms = 60000};
    const char *donors[1] = {addr};
    graft_transfer_pull_options_t po = {.donors = donors, .n_donors = 1, .step = STEP};
    if (mode == 1)
        graft_test_nccl_env("graft-test-recipient");
    ep = gpu_endpoint(false, dev);
    if (ep == NULL)
        return 2;
    if (mode == 1) {
        po.backend = GRAFT_TRANSFER_BACKEND_NCCL;
        po.nccl = &no;
    }
    if (graft_transfer_pull(ep, &po, &rep) != GRAFT_OK || !rep.installed)
        return 5;
    if (!gpu_matches(dev))
        return 6;
    graft_transfer_endpoint_destroy(ep);
    return 0;
}

static void run_pair(int mode)
{
    int addr_pipe[2], quit_pipe[2], ws;
    char addr[64];
    assert_int_equal(pipe(addr_pipe), 0);
    assert_int_equal(pipe(quit_pipe), 0);
    assert_int_equal(pipe(uid_fd), 0);
    pid_t donor = fork();
    if (donor == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        _exit(donor_child(mode, addr_pipe[1], quit_pipe[0]));
    }
    struct pollfd pfd = {.fd = addr_pipe[0], .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 60000), 1);
    assert_true(io_full(addr_pipe[0], addr, sizeof(addr), false));
    pid_t recip = fork();
    if (recip == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        _exit(recipient_child(mode, addr));
    }
    assert_int_equal(waitpid(recip, &ws, 0), recip);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
    assert_int_equal(write(quit_pipe[1], "q", 1), 1);
    assert_int_equal(waitpid(donor, &ws, 0), donor);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
    for (int i = 0; i < 2; i++) {
        close(addr_pipe[i]);
        close(quit_pipe[i]);
        close(uid_fd[i]);
    }
}
#endif

static void test_ucx_staged_cuda(void **state)
{
    (void)state;
    GRAFT_TEST_REQUIRE_GPU();
#ifdef GRAFT_HAVE_CUDA
    run_pair(0);
#endif
}

static void test_nccl_pair(void **state)
{
    (void)state;
    GRAFT_TEST_REQUIRE_GPU();
#ifdef GRAFT_HAVE_CUDA
    run_pair(1);
#endif
}

/* Whatever the machine: the NCCL entry points refuse bad input precisely. */
static void test_nccl_misuse(void **state)
{
    (void)state;
    graft_transfer_endpoint_t *ep = NULL;
    graft_transfer_report_t rep;
    const char *donors[2] = {"127.0.0.1:1", "127.0.0.1:2"};
    graft_transfer_pull_options_t po = {.donors = donors, .n_donors = 1, .step = 1,
                                        .backend = GRAFT_TRANSFER_BACKEND_NCCL};
    graft_transfer_nccl_options_t no = {0};

    graft_transfer_config_t cfg = {.job_secret = "job-secret-of-the-gpu-tests",
                                   .job_secret_len = strlen("job-secret-of-the-gpu-tests")};
    assert_int_equal(graft_transfer_endpoint_create(&cfg, &ep), GRAFT_OK);
    assert_int_equal(graft_transfer_serve_nccl(ep, 1, NULL), GRAFT_EINVAL);
    assert_int_equal(graft_transfer_serve_nccl(ep, 1, &no), GRAFT_EINVAL);
#ifdef GRAFT_HAVE_CUDA
    /* No options, or two donors: invalid. */
    assert_int_equal(graft_transfer_pull(ep, &po, &rep), GRAFT_EINVAL);
    po.nccl = &no;
    po.n_donors = 2;
    assert_int_equal(graft_transfer_pull(ep, &po, &rep), GRAFT_EINVAL);
    /* Well-formed, but this machine may have no GPU. */
    po.n_donors = 1;
    no.exchange = NULL;
    assert_int_equal(graft_transfer_pull(ep, &po, &rep),
                     graft_test_gpu_count() == 0 ? GRAFT_ENOTSUP : GRAFT_EINVAL);
#else
    assert_int_equal(graft_transfer_pull(ep, &po, &rep), GRAFT_ENOTSUP);
#endif
    po.backend = (graft_transfer_backend_t)7;
    assert_int_equal(graft_transfer_pull(ep, &po, &rep), GRAFT_EINVAL);
    graft_transfer_endpoint_destroy(ep);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ucx_staged_cuda),
        cmocka_unit_test(test_nccl_pair),
        /* Last: it may initialise CUDA in this process, after which forked
         * children could not use it. */
        cmocka_unit_test(test_nccl_misuse),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests_name("transfer_gpu", tests, NULL, NULL);
}
