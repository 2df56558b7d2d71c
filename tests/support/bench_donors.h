/*
 * Donor processes for the transfer benchmarks: a state of two regions
 * ("params", three quarters of the bytes, and "optim") that donors fill
 * with a fixed pattern and recipients zero, and forked donors that serve
 * it until stopped. Public headers only.
 */
#ifndef GRAFT_TEST_BENCH_DONORS_H
#define GRAFT_TEST_BENCH_DONORS_H

#include <graft/transfer.h>

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct graft_bench_donor {
    pid_t pid;
    int cmd_fd;     /* closing it (or a byte) stops the donor */
    char addr[64];  /* its transfer address */
} graft_bench_donor_t;

/* The state every donor serves and every recipient pulls. */
typedef struct graft_bench_state {
    uint64_t bytes;
    uint64_t chunk;
    uint64_t step;
    /* false (the default): each region is malloc'ed, as a trainer's own
     * memory is; true: both lie in one block from graft_transfer_host_alloc(),
     * which the endpoint frees. */
    bool host_alloc;
    /* Each region in CUDA device memory (cudaMalloc; builds with CUDA and a
     * GPU only): what the transfer engine stages through pinned host
     * buffers. A process that forks donors must not have used CUDA yet. */
    bool cuda;
} graft_bench_state_t;

/* Runs first in donor @index (0-based) after the fork: returns the address
 * to listen on (NULL: the default), or sets *failed_p. */
typedef const char *(*graft_bench_donor_setup_fn)(int index, void *arg, bool *failed_p);

/* An endpoint (listening on @listen, or the default when NULL) with the
 * two regions registered; their memory is returned in mem[0..1] for
 * graft_bench_mem_free() once the endpoint is destroyed (with s->host_alloc
 * mem[0..1] are NULL and the endpoint frees its block). NULL on any
 * failure. */
graft_transfer_endpoint_t *graft_bench_endpoint(const graft_bench_state_t *s, const char *listen,
                                                bool donor, void *mem[2]);

/* Free what graft_bench_endpoint() returned in mem[0..1]; sets them NULL. */
void graft_bench_mem_free(const graft_bench_state_t *s, void *mem[2]);

/* Fork @n donors serving @s; each dies with the caller. 0 or -1. */
int graft_bench_donors_start(const graft_bench_state_t *s, graft_bench_donor_t *d, int n,
                             graft_bench_donor_setup_fn setup, void *arg);

/* Stop and reap every donor still running (pid > 0). */
void graft_bench_donors_stop(graft_bench_donor_t *d, int n);

#endif
