/*
 * The recipient of fuzz_transfer_accept: its job secret, the nonces of its
 * connection, the step it pulls and its region table. make_seeds.c writes
 * that harness's seeds for this table.
 */
#ifndef GRAFT_FUZZ_TRANSFER_TABLE_H
#define GRAFT_FUZZ_TRANSFER_TABLE_H

#include <stdint.h>

#define FTT_STEP 57u
#define FTT_LAYOUT_HASH 0x1234abcdull
#define FTT_CHUNK 1024u

static const struct {
    const char *name;
    uint64_t bytes;
} ftt_regions[] = {{"param", 5000}, {"optim", 4096}, {"empty", 0}};
#define FTT_N_REGIONS (sizeof(ftt_regions) / sizeof(ftt_regions[0]))

static const uint8_t ftt_secret[] = "fuzz-job-secret-of-the-transfers";
static const uint8_t ftt_nr[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static const uint8_t ftt_nd[16] = {21, 22, 23, 24, 25, 26, 27, 28,
                                   29, 30, 31, 32, 33, 34, 35, 36};

#endif
