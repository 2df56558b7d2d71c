/* Donor processes for the transfer benchmarks: see bench_donors.h. */
#include "bench_donors.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef GRAFT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* The job secret of the benchmarks' donors and recipients. */
#define BENCH_SECRET "job-secret-of-the-benchmarks"

static void fill(uint64_t *p, uint64_t words, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (uint64_t i = 0; i < words; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = x;
    }
}

static uint64_t region_bytes(const graft_bench_state_t *s, int i)
{
    uint64_t a = (s->bytes / 4 * 3) & ~7ull;
    return i == 0 ? a : s->bytes - a;
}

/* n bytes of CUDA device memory holding what fill() or zeros give; NULL
 * on any failure (or in a build without CUDA). */
static void *cuda_region(uint64_t n, bool donor, uint64_t seed)
{
#ifdef GRAFT_HAVE_CUDA
    void *d = NULL, *h = NULL;
    if (cudaMalloc(&d, n) != cudaSuccess)
        return NULL;
    if (!donor)
        return cudaMemset(d, 0, n) == cudaSuccess ? d : (cudaFree(d), NULL);
    h = malloc(n + 8);
    bool ok = h != NULL;
    if (ok) {
        fill(h, n / 8, seed);
        ok = cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) == cudaSuccess;
    }
    free(h);
    if (!ok) {
        cudaFree(d);
        d = NULL;
    }
    return d;
#else
    (void)n;
    (void)donor;
    (void)seed;
    fprintf(stderr, "bench: CUDA regions need a build with CUDA\n");
    return NULL;
#endif
}

void graft_bench_mem_free(const graft_bench_state_t *s, void *mem[2])
{
    for (int i = 0; i < 2; i++) {
#ifdef GRAFT_HAVE_CUDA
        if (s->cuda && mem[i] != NULL)
            cudaFree(mem[i]);
        else
#endif
            free(mem[i]);
        mem[i] = NULL;
    }
}

graft_transfer_endpoint_t *graft_bench_endpoint(const graft_bench_state_t *s, const char *listen,
                                                bool donor, void *mem[2])
{
    static const char *names[2] = {"params", "optim"};
    graft_transfer_config_t ec = {.listen_address = listen,
                                  .chunk_bytes = s->chunk,
                                  .job_secret = BENCH_SECRET,
                                  .job_secret_len = strlen(BENCH_SECRET),
                                  .hash_threads = 2};
    graft_transfer_endpoint_t *ep = NULL;
    uint8_t *block = NULL;
    mem[0] = mem[1] = NULL;
    if (graft_transfer_endpoint_create(&ec, &ep) != GRAFT_OK)
        return NULL;
    /* One block holds both regions, the second at a 64-byte boundary. */
    if (s->host_alloc &&
        graft_transfer_host_alloc(ep, region_bytes(s, 0) + 64 + region_bytes(s, 1),
                                  (void **)&block) != GRAFT_OK)
        goto fail;
    for (int i = 0; i < 2; i++) {
        uint64_t n = region_bytes(s, i);
        uint8_t *p;
        if (s->cuda) {
            p = mem[i] = cuda_region(n, donor, (uint64_t)i + 1);
        } else if (!s->host_alloc) {
            mem[i] = malloc(n + 8);
            p = mem[i];
        } else {
            p = block + (i == 0 ? 0 : (region_bytes(s, 0) + 63) / 64 * 64);
        }
        if (p == NULL)
            goto fail;
        if (!s->cuda && donor) /* CUDA memory was filled or zeroed above */
            fill((uint64_t *)p, n / 8, (uint64_t)i + 1);
        else if (!s->cuda)
            memset(p, 0, n); /* touched, as a trainer's memory is */
        graft_transfer_region_t r = {.name = names[i],
                                     .kind = i == 0 ? GRAFT_TRANSFER_REGION_PARAM
                                                    : GRAFT_TRANSFER_REGION_OPTIM,
                                     .device = s->cuda ? GRAFT_TRANSFER_CUDA
                                                       : GRAFT_TRANSFER_HOST,
                                     .ptr = p,
                                     .bytes = n};
        if (graft_transfer_region_register(ep, &r) != GRAFT_OK)
            goto fail;
    }
    return ep;
fail:
    graft_transfer_endpoint_destroy(ep);
    graft_bench_mem_free(s, mem);
    return NULL;
}

static int donor_main(const graft_bench_state_t *s, int index, graft_bench_donor_setup_fn setup,
                      void *arg, int cmd_fd, int addr_fd)
{
    void *mem[2];
    char addr[64] = {0}, q;
    bool failed = false;
    const char *listen = setup != NULL ? setup(index, arg, &failed) : NULL;
    if (failed)
        return 1;
    graft_transfer_endpoint_t *ep = graft_bench_endpoint(s, listen, true, mem);
    if (ep == NULL || graft_transfer_serve_begin(ep, s->step) != GRAFT_OK)
        return 1;
    snprintf(addr, sizeof(addr), "%s", graft_transfer_endpoint_address(ep));
    if (write(addr_fd, addr, sizeof(addr)) != (ssize_t)sizeof(addr))
        return 1;
    (void)!read(cmd_fd, &q, 1);
    int rc = graft_transfer_serve_end(ep) == GRAFT_OK ? 0 : 1;
    graft_transfer_endpoint_destroy(ep);
    graft_bench_mem_free(s, mem);
    return rc;
}

int graft_bench_donors_start(const graft_bench_state_t *s, graft_bench_donor_t *d, int n,
                             graft_bench_donor_setup_fn setup, void *arg)
{
    for (int i = 0; i < n; i++) {
        int cmd[2], ad[2];
        if (pipe(cmd) != 0)
            return -1;
        if (pipe(ad) != 0) {
            close(cmd[0]);
            close(cmd[1]);
            return -1;
        }
        d[i].pid = fork();
        if (d[i].pid < 0)
            return -1;
        if (d[i].pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            for (int k = 0; k < i; k++)
                close(d[k].cmd_fd); /* only the caller may stop the others */
            close(cmd[1]);
            close(ad[0]);
            _exit(donor_main(s, i, setup, arg, cmd[0], ad[1]));
        }
        close(cmd[0]);
        close(ad[1]);
        d[i].cmd_fd = cmd[1];
        size_t got = 0;
        while (got < sizeof(d[i].addr)) {
            ssize_t r = read(ad[0], d[i].addr + got, sizeof(d[i].addr) - got);
            if (r <= 0) {
                close(ad[0]);
                return -1;
            }
            got += (size_t)r;
        }
        close(ad[0]);
    }
    return 0;
}

void graft_bench_donors_stop(graft_bench_donor_t *d, int n)
{
    for (int i = 0; i < n; i++) {
        if (d[i].pid <= 0)
            continue;
        (void)!write(d[i].cmd_fd, "q", 1);
        close(d[i].cmd_fd);
        waitpid(d[i].pid, NULL, 0);
        d[i].pid = 0;
    }
}
