/*
 * An NCCL pair between a recipient rank and the same rank of its first
 * donor group (runtime_nccl_pair.c): the setup both sides share.
 */
#ifndef GRAFT_RUNTIME_NCCL_PAIR_H
#define GRAFT_RUNTIME_NCCL_PAIR_H

#include "runtime_internal.h"

struct graft__rt_pair {
    graft_runtime_t *rt;
    uint64_t round, step;
    uint32_t donor, recipient;
    graft_transfer_nccl_options_t opts;
    pthread_t thread; /* donor side */
    bool started;
    graft_status_t status;
};

/* How long either side waits for the other: the donor holds its step at
 * most the fence timeout, so a pair cannot usefully wait longer. */
uint32_t graft__rt_pair_timeout_ms(const graft_runtime_t *rt);
/* The pair of donor -> recipient for step of round, its id exchanged
 * through etcd. */
void graft__rt_pair_init(graft__rt_pair_t *p, graft_runtime_t *rt, uint64_t round, uint64_t step,
                         uint32_t donor, uint32_t recipient);

#endif /* GRAFT_RUNTIME_NCCL_PAIR_H */
