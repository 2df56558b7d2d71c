/*
 * The runtime with CUDA regions and transfer_backend = nccl, against a real
 * etcd: two groups start together, and the step-0 sync gives group 1 group
 * 0's state, its CUDA region over an NCCL pair whose unique id goes through
 * etcd, its host region over UCX. Runs where a GPU exists; elsewhere it
 * reports "skipped: no GPU" (a cmocka skip, counted apart from passes).
 *
 * Each group is a forked child (CUDA must not be initialised before a
 * fork); the parent runs etcd and checks exit codes.
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
#endif

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
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests_name("runtime_gpu", tests, NULL, NULL);
}
