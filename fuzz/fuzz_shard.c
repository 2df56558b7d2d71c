/*
 * The shard file reader (graft__shard_open, then every chunk and a ranged
 * read). The first input byte picks how the rest becomes the file: odd,
 * the rest as is; even, the harness first repairs the header, footer and
 * index checksums and every in-range chunk's hashes, so that the
 * range checks, the zstd decoding and the raw hash check behind them are
 * reached too.
 */
#include "fuzz_common.h"
#include "persist_internal.h"

#include <assert.h>
#include <xxhash.h>

static void repair(uint8_t *f, size_t n)
{
    if (n < GP_HEADER_BYTES + GP_FOOTER_BYTES)
        return;
    fuzz_put64(f + 56, XXH3_64bits(f, 56));
    uint8_t *foot = f + n - GP_FOOTER_BYTES;
    uint64_t index_off = fuzz_get64(foot);
    size_t index_end = n - GP_FOOTER_BYTES;
    if (index_off >= GP_HEADER_BYTES && index_off <= index_end &&
        (index_end - index_off) % GP_INDEX_ENTRY_BYTES == 0) {
        for (size_t e = (size_t)index_off; e < index_end; e += GP_INDEX_ENTRY_BYTES) {
            uint64_t off = fuzz_get64(f + e), len = fuzz_get64(f + e + 8);
            if (off > index_off || len > index_off - off)
                continue;
            uint64_t h = XXH3_64bits(f + off, (size_t)len);
            fuzz_put64(f + e + 24, h);
            if (f[e + 40] == GP_CODEC_STORED) /* stored: the raw bytes are the same */
                fuzz_put64(f + e + 32, h);
        }
        fuzz_put64(foot + 16, XXH3_64bits(f + index_off, index_end - (size_t)index_off));
    }
    fuzz_put64(foot + 32, XXH3_64bits(foot, 32));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[600];
    char why[256];
    graft__shard_t *s = NULL;
    if (size < 1)
        return 0;
    snprintf(path, sizeof(path), "%s/shard", fuzz_scratch_dir());
    uint8_t *file = malloc(size);
    assert(file != NULL);
    memcpy(file, data + 1, size - 1);
    if (!(data[0] & 1))
        repair(file, size - 1);
    fuzz_write_file(path, file, size - 1);
    free(file);
    if (graft__shard_open(path, &s, why, sizeof(why)) != GRAFT_OK)
        return 0;
    assert(s->footer.chunk_count == 0 || s->chunks != NULL);
    for (uint64_t i = 0; i < s->footer.chunk_count; i++) {
        const uint8_t *raw = NULL;
        if (graft__shard_chunk(s, i, &raw, why, sizeof(why)) == GRAFT_OK)
            assert(raw != NULL || s->chunks[i].raw_bytes == 0);
    }
    /* A ranged read across the whole stream, and one past its end. */
    uint64_t total = s->header.raw_bytes;
    if (total <= (1u << 20)) {
        uint8_t *dst = malloc(total + 1);
        assert(dst != NULL);
        (void)graft__shard_read(s, 0, dst, total, why, sizeof(why));
        assert(graft__shard_read(s, total, dst, 1, why, sizeof(why)) != GRAFT_OK);
        free(dst);
    }
    graft__shard_close(s);
    return 0;
}
