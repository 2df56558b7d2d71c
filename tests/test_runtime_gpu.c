/*
 * The runtime with CUDA regions and transfer_backend = nccl, against a real
 * etcd: two groups start together, and the step-0 sync gives group 1 group
 * 0's state, its CUDA region over an NCCL pair whose unique id goes through
 * etcd, its host region over UCX. Runs where a GPU exists; elsewhere it
 * reports "skipped: no GPU" (a cmocka skip, counted apart from passes).
 *
 * Each group is a forked child (CUDA must not be initialised before a
 * fork); the parent runs etcd and checks exit codes.
 *
 * test_follow_cuda: a follow spare (docs/RUNTIME.md, "Follow spares")
 * with a CUDA region, over UCX (staged through pinned host memory): it
 * follows group 0 while two groups step; group 1 is killed; the spare
 * takes its slot, joins at the step it holds without a pull, and ends
 * with group 0's device bytes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <graft/graft.h>
#include <xxhash.h>

#include "etcd_fixture.h"
#include "gpu_support.h"

#ifdef GRAFT_HAVE_CUDA
#include <cuda_runtime.h>

#define DEV_BYTES ((9u << 20) + 13)
#define HOST_BYTES ((1u << 20) + 5)

static int set(graft_config_t *c, const char *name, const char *value)
{
    char *err = NULL;
    graft_status_t st = graft_config_set(c, name, value, &err);
    if (st != GRAFT_OK)
        fprintf(stderr, "%s\n", err != NULL ? err : name);
    graft_free(err);
    return st == GRAFT_OK ? 0 : 1;
}

/* One group: its own patterns in, group 0's out. Exit code = failed stage. */
static int group_child(const char *endpoint, const char *job, int g)
{
    char host_id[32], gs[16];
    uint8_t *dev = NULL;
    uint8_t *host = malloc(HOST_BYTES), *want = malloc(DEV_BYTES), *back = malloc(DEV_BYTES);
    graft_config_t *c = NULL;
    graft_runtime_t *rt = NULL;
    graft_step_info_t info;
    graft_metrics_t m;
    bool apply = false;

    snprintf(host_id, sizeof(host_id), "graft-test-group%d", g);
    snprintf(gs, sizeof(gs), "%d", g);
    graft_test_nccl_env(host_id);
    if (host == NULL || want == NULL || back == NULL)
        return 2;
    graft_test_fill_pattern(want, DEV_BYTES, 10 + (uint64_t)g);
    graft_test_fill_pattern(host, HOST_BYTES, 20 + (uint64_t)g);
    if (cudaMalloc((void **)&dev, DEV_BYTES) != cudaSuccess ||
        cudaMemcpy(dev, want, DEV_BYTES, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) /* as graft.h asks of a trainer */
        return 3;
    if (graft_config_create(&c) != GRAFT_OK || set(c, "job", job) || set(c, "groups", "2") ||
        set(c, "group", gs) || set(c, "etcd_endpoints", endpoint) ||
        set(c, "transfer_backend", "nccl") || set(c, "transfer_chunk_bytes", "1048576") ||
        set(c, "lease_ttl_ms", "3000") || set(c, "join_timeout_ms", "5000") ||
        set(c, "fence_timeout_ms", "60000") || set(c, "quorum_timeout_ms", "60000"))
        return 4;
    if (graft_init(c, &rt) != GRAFT_OK)
        return 5;
    graft_config_destroy(c);
    graft_region_t rd = {"weights", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_CUDA, dev, DEV_BYTES,
                         0, 0};
    graft_region_t rh = {"moments", GRAFT_REGION_OPTIM, 0, GRAFT_DEVICE_HOST, host, HOST_BYTES,
                         0, 0};
    if (graft_region_register(rt, &rd) != GRAFT_OK || graft_region_register(rt, &rh) != GRAFT_OK)
        return 6;
    if (graft_quorum(rt, &info) != GRAFT_OK)
        return 7;
    if (graft_heal_wait(rt) != GRAFT_OK)
        return 8;
    if (graft_commit(rt, &apply) != GRAFT_OK || !apply)
        return 9;
    /* Both groups now hold group 0's bytes, on the device and on the host. */
    graft_test_fill_pattern(want, DEV_BYTES, 10);
    if (cudaMemcpy(back, dev, DEV_BYTES, cudaMemcpyDeviceToHost) != cudaSuccess ||
        memcmp(back, want, DEV_BYTES) != 0)
        return 10;
    graft_test_fill_pattern(want, HOST_BYTES, 20);
    if (memcmp(host, want, HOST_BYTES) != 0)
        return 11;
    graft_metrics_get(rt, &m);
    if (m.recoveries != (g == 1 ? 1u : 0u) || m.recovery_bytes != (g == 1 ? DEV_BYTES + HOST_BYTES
                                                                            : 0u))
        return 12;
    graft_destroy(rt);
    cudaFree(dev);
    free(host);
    free(want);
    free(back);
    return 0;
}

#define FOLLOW_STEPS 120 /* 50 ms each: still stepping at the kill */

/* A group (g >= 0) or the follow spare (g < 0) of test_follow_cuda: steps
 * to FOLLOW_STEPS (a byte of the device region changed per applied step)
 * and writes its device bytes' hash and its recoveries to fd. */
static int follow_child(const char *endpoint, const char *job, int g, int fd)
{
    uint8_t *dev = NULL;
    uint8_t *host = malloc(DEV_BYTES);
    graft_config_t *c = NULL;
    graft_runtime_t *rt = NULL;
    char gs[16];
    snprintf(gs, sizeof(gs), "%d", g);
    if (host == NULL)
        return 2;
    graft_test_fill_pattern(host, DEV_BYTES, g < 0 ? 99 : 10);
    if (cudaMalloc((void **)&dev, DEV_BYTES) != cudaSuccess ||
        cudaMemcpy(dev, host, DEV_BYTES, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess)
        return 3;
    if (graft_config_create(&c) != GRAFT_OK || set(c, "job", job) || set(c, "groups", "2") ||
        set(c, "etcd_endpoints", endpoint) || set(c, "lease_ttl_ms", "2000") ||
        set(c, "join_timeout_ms", "1000") || set(c, "stall_timeout_ms", "2000") ||
        set(c, "quorum_timeout_ms", "60000") ||
        (g >= 0 ? set(c, "group", gs) : set(c, "spare", "1") || set(c, "spare_follow", "1")))
        return 4;
    if (graft_init(c, &rt) != GRAFT_OK)
        return 5;
    graft_config_destroy(c);
    graft_region_t rd = {"weights", GRAFT_REGION_PARAM, 0, GRAFT_DEVICE_CUDA, dev, DEV_BYTES,
                         0, 0};
    if (graft_region_register(rt, &rd) != GRAFT_OK)
        return 6;
    for (;;) {
        graft_step_info_t info;
        bool apply = false;
        if (graft_quorum(rt, &info) != GRAFT_OK || graft_heal_wait(rt) != GRAFT_OK)
            return 7;
        if (info.step >= FOLLOW_STEPS) {
            if (graft_finish(rt) != GRAFT_OK || graft_commit(rt, &apply) != GRAFT_OK)
                return 8;
            break;
        }
        usleep(50000); /* the step's compute */
        if (graft_commit(rt, &apply) != GRAFT_OK)
            return 9;
        uint8_t b = (uint8_t)(info.step + 1);
        if (apply && (cudaMemcpy(dev + info.step * 4099u % DEV_BYTES, &b, 1,
                                 cudaMemcpyHostToDevice) != cudaSuccess ||
                      cudaDeviceSynchronize() != cudaSuccess))
            return 10;
    }
    graft_metrics_t m;
    graft_metrics_get(rt, &m);
    if (cudaMemcpy(host, dev, DEV_BYTES, cudaMemcpyDeviceToHost) != cudaSuccess)
        return 11;
    uint64_t out[4] = {(uint64_t)(g < 0 ? 2 : g), XXH3_64bits(host, DEV_BYTES),
                       m.recoveries, m.follow_pulls};
    if (write(fd, out, sizeof(out)) != sizeof(out))
        return 12;
    graft_destroy(rt);
    cudaFree(dev);
    free(host);
    return 0;
}
#endif

static void test_follow_cuda(void **state)
{
    (void)state;
    GRAFT_TEST_REQUIRE_GPU();
#ifdef GRAFT_HAVE_CUDA
    graft_test_etcd_t etcd;
    char job[64];
    int fds[2];
    pid_t kids[3];
    assert_int_equal(graft_test_etcd_start(&etcd, NULL), 0);
    assert_int_equal(pipe(fds), 0);
    snprintf(job, sizeof(job), "gpu-follow-%d", (int)getpid());
    for (int k = 0; k < 3; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            _exit(follow_child(graft_etcd_server_endpoint(etcd.server), job, k == 2 ? -1 : k,
                               fds[1]));
        }
        assert_true(kids[k] > 0);
    }
    sleep(4); /* the groups step, the spare follows */
    kill(kids[1], SIGKILL);
    assert_int_equal(waitpid(kids[1], NULL, 0), kids[1]);
    uint64_t res[3][4] = {{0}};
    for (int k = 0; k < 2; k++) {
        uint64_t r[4];
        assert_int_equal(read(fds[0], r, sizeof(r)), (ssize_t)sizeof(r));
        assert_true(r[0] == 0 || r[0] == 2);
        memcpy(res[r[0]], r, sizeof(r));
    }
    for (int k = 0; k < 3; k += 2) {
        int ws = 0;
        assert_int_equal(waitpid(kids[k], &ws, 0), kids[k]);
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
            print_message("process %d: %s %d\n", k, WIFEXITED(ws) ? "exit" : "signal",
                          WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
        assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    }
    print_message("follower: %llu pulls, %llu recoveries\n", (unsigned long long)res[2][3],
                  (unsigned long long)res[2][2]);
    assert_true(res[2][3] > 0);                 /* it followed */
    assert_int_equal(res[2][2], 0);             /* and joined without a pull */
    assert_int_equal(res[2][1], res[0][1]);     /* with group 0's device bytes */
    close(fds[0]);
    close(fds[1]);
    graft_test_etcd_stop(&etcd);
#endif
}

static void test_nccl_heal(void **state)
{
    (void)state;
    GRAFT_TEST_REQUIRE_GPU();
#ifdef GRAFT_HAVE_CUDA
    graft_test_etcd_t etcd;
    char job[64];
    pid_t kids[2];
    assert_int_equal(graft_test_etcd_start(&etcd, NULL), 0);
    snprintf(job, sizeof(job), "gpu-%d", (int)getpid());
    for (int g = 0; g < 2; g++) {
        kids[g] = fork();
        if (kids[g] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            _exit(group_child(graft_etcd_server_endpoint(etcd.server), job, g));
        }
        assert_true(kids[g] > 0);
    }
    for (int g = 0; g < 2; g++) {
        int ws = 0;
        assert_int_equal(waitpid(kids[g], &ws, 0), kids[g]);
        if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
            print_message("group %d: %s %d\n", g, WIFEXITED(ws) ? "exit" : "signal",
                          WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
        assert_true(WIFEXITED(ws));
        assert_int_equal(WEXITSTATUS(ws), 0);
    }
    graft_test_etcd_stop(&etcd);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nccl_heal),
        cmocka_unit_test(test_follow_cuda),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests_name("runtime_gpu", tests, NULL, NULL);
}
