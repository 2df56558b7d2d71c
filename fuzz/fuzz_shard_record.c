/*
 * Shard records (serialized ShardInfo) as the committing rank receives
 * them from the other ranks, through graft_persist_commit(). The first
 * input byte picks one or two ranks, the next two (little-endian) where
 * the rest is cut into the two records. The shard files are absent, so a commit that gets past
 * the records and the layout checks still stops at the files; it must
 * never succeed, and any manifest it writes is removed for the next input.
 */
#include "fuzz_common.h"
#include "persist_internal.h"

#include <assert.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    uint32_t ranks = 1 + (data[0] & 1);
    const uint8_t *rest = data + 3;
    size_t len = size - 3;
    size_t cut = ranks == 2 ? (size_t)(data[1] | data[2] << 8) : len;
    if (cut > len)
        cut = len;
    const uint8_t *infos[2] = {rest, rest + cut};
    size_t lens[2] = {cut, len - cut};
    const char *root = fuzz_scratch_dir();
    graft_status_t st = graft_persist_commit(root, 1, ranks, infos, lens, NULL, NULL);
    assert(st != GRAFT_OK);
    return 0;
}
