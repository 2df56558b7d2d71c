/*
 * The manifest reader (manifest.pb of a checkpoint directory). The first
 * input byte picks how the rest becomes the file, the second is the step
 * the directory is named for (the reader must refuse a manifest of any
 * other step). Then, with the first byte odd, the rest is the
 * whole file as is (the wrapper's magic, lengths and checksums under
 * attack); even, the rest is the protobuf payload and the harness writes a
 * valid wrapper around it, so that the decoder and the invariant checks
 * behind the checksums are reached too. A manifest that is accepted must
 * pass graft__manifest_check() on its own.
 */
#include "fuzz_common.h"
#include "persist_internal.h"

#include <assert.h>
#include <xxhash.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[600];
    char why[256];
    Graft__CheckpointManifest *m = NULL;
    if (size < 2)
        return 0;
    uint64_t step = data[1];
    const char *dir = fuzz_scratch_dir();
    snprintf(path, sizeof(path), "%s/" GP_MANIFEST_PB, dir);
    const uint8_t *rest = data + 2;
    size_t rest_len = size - 2;
    if (data[0] & 1) {
        fuzz_write_file(path, rest, rest_len);
    } else {
        size_t plen = rest_len;
        uint8_t *file = malloc(GP_MANIFEST_HEADER_BYTES + plen + 1);
        assert(file != NULL);
        memcpy(file, GP_MANIFEST_MAGIC, 8);
        fuzz_put64(file + 8, GRAFT_PERSIST_FORMAT_VERSION);
        fuzz_put64(file + 16, plen);
        fuzz_put64(file + 24, XXH3_64bits(rest, plen));
        fuzz_put64(file + 32, XXH3_64bits(file, 32));
        memcpy(file + GP_MANIFEST_HEADER_BYTES, rest, plen);
        fuzz_write_file(path, file, GP_MANIFEST_HEADER_BYTES + plen);
        free(file);
    }
    if (graft__manifest_read(dir, step, &m, why, sizeof(why)) == GRAFT_OK) {
        assert(m != NULL && m->step == step);
        assert(graft__manifest_check(m, why, sizeof(why)) == GRAFT_OK);
        graft__manifest_free(m);
    }
    return 0;
}
