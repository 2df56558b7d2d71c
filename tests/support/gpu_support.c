#include "gpu_support.h"

#include <graft/transfer.h>

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int graft_test_gpu_count(void)
{
    int ws = 0;
    pid_t pid = fork();
    if (pid == 0)
        _exit(graft_transfer_cuda_device_count() > 0 ? 10 : 11);
    if (pid < 0 || waitpid(pid, &ws, 0) != pid || !WIFEXITED(ws))
        return 0;
    return WEXITSTATUS(ws) == 10 ? 1 : 0;
}

void graft_test_fill_pattern(uint8_t *p, uint64_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (uint64_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

void graft_test_nccl_env(const char *host_id)
{
    setenv("NCCL_HOSTID", host_id, 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 0);
    setenv("NCCL_IB_DISABLE", "1", 0);
}
