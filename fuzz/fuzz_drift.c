/*
 * Another group's DriftRecord (etcd: /graft/<job>/drift/<step>/<group>),
 * decoded against this rank's region table (runtime_drift.c): any bytes
 * decode to a status; a region is marked only when the record names it
 * (by name, in this rank's table); what this rank encodes decodes to the
 * same group and hashes.
 */
#include "fuzz_common.h"
#include "runtime_internal.h"

#include <assert.h>

#define N_REGIONS 3

static char *names[N_REGIONS] = {"params", "optim", "rng"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    graft__rt_region_t regions[N_REGIONS];
    graft_runtime_t *rt = calloc(1, sizeof(*rt));
    uint64_t hashes[N_REGIONS] = {0}, back[N_REGIONS] = {0};
    bool have[N_REGIONS] = {false}, have_back[N_REGIONS] = {false};
    uint32_t group = UINT32_MAX;
    uint8_t *buf = NULL;
    size_t len = 0;
    assert(rt != NULL);
    memset(regions, 0, sizeof(regions));
    for (size_t i = 0; i < N_REGIONS; i++)
        regions[i].name = names[i];
    rt->regions = regions;
    rt->n_regions = N_REGIONS;
    rt->group = 7;
    graft_status_t st = graft__rt_drift_decode(rt, data, size, &group, hashes, have);
    assert(st == GRAFT_OK || st == GRAFT_EMALFORMED || st == GRAFT_EFORMAT);
    if (st != GRAFT_OK) {
        for (size_t i = 0; i < N_REGIONS; i++)
            assert(!have[i]); /* a record refused marks nothing */
        goto out;
    }
    /* This rank's record of what decoded (absent regions hash to 0). */
    if (graft__rt_drift_encode(rt, hashes, &buf, &len) != GRAFT_OK)
        goto out;
    assert(graft__rt_drift_decode(rt, buf, len, &group, back, have_back) == GRAFT_OK);
    assert(group == rt->group);
    for (size_t i = 0; i < N_REGIONS; i++)
        assert(have_back[i] && back[i] == hashes[i]);
out:
    graft_free(buf);
    free(rt);
    return 0;
}
