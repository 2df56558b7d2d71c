/* Helpers of the GPU tests: whether a GPU is there, a test pattern, and
 * the environment an NCCL pair needs on one machine. */
#ifndef GRAFT_TEST_GPU_SUPPORT_H
#define GRAFT_TEST_GPU_SUPPORT_H

#include <stdint.h>

/* Number of CUDA devices, asked in a forked child so that the caller never
 * initialises CUDA (forked children could not use it afterwards). */
int graft_test_gpu_count(void);

/* Skip the calling cmocka test with "skipped: no GPU" where none is. */
#define GRAFT_TEST_REQUIRE_GPU()                                                          \
    do {                                                                                  \
        if (graft_test_gpu_count() == 0) {                                                \
            print_message("skipped: no GPU\n");                                           \
            skip();                                                                       \
        }                                                                                 \
    } while (0)

/* Deterministic bytes from a seed (xorshift). */
void graft_test_fill_pattern(uint8_t *p, uint64_t n, uint64_t seed);

/* Call in each process of an NCCL pair before NCCL starts. NCCL refuses
 * two ranks of a communicator on one GPU of one host ("Duplicate GPU
 * detected"); a host id per process makes the pair two hosts, as graft's
 * pairs are in a job, and its traffic then goes over loopback sockets. */
void graft_test_nccl_env(const char *host_id);

#endif
