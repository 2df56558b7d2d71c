/*
 * The recipient's acceptance of a donor's answer (docs/SECURITY.md, "The
 * transfer handshake"): the seal checked on the raw bytes
 * (graft__xfer_unseal), the bytes it covers decoded through the transfer
 * allocator as transfer/ucx_pull_donors.c does, then a refusal's status
 * (graft__xfer_refusal_status), a first manifest against the recipient's
 * region table (graft__xfer_manifest_check) and hash parts against its
 * chunks (graft__xfer_hash_parts_check).
 *
 * Byte 0: bit 0 clear, the rest is an answer's body and the harness seals
 * it as a donor would, as answer number byte 0 >> 1, so the checks behind
 * the seal are reached; the seal must then hold for that number only. Bit
 * 0 set: the rest is the answer as it came, seal and all. What is accepted
 * must hold up: regions as the table says, hash parts inside its chunks.
 */
#include "fuzz_common.h"
#include "fuzz_transfer_table.h"
#include "transfer_int.h"
#include "proto/graft.pb-c.h"

#include <assert.h>
#include <stdbool.h>

#define MAX_KEY 4096u

static graft_transfer_endpoint_t ep;
static graft__region_t regions[FTT_N_REGIONS];
static volatile uint64_t sink;

static void table_init(void)
{
    if (ep.regions != NULL)
        return;
    uint64_t first = 0;
    for (size_t i = 0; i < FTT_N_REGIONS; i++) {
        regions[i].name = (char *)ftt_regions[i].name;
        regions[i].bytes = ftt_regions[i].bytes;
        regions[i].n_chunks = (ftt_regions[i].bytes + FTT_CHUNK - 1) / FTT_CHUNK;
        regions[i].first_chunk = first;
        first += regions[i].n_chunks;
    }
    ep.regions = regions;
    ep.n_regions = FTT_N_REGIONS;
    ep.chunk_bytes = FTT_CHUNK;
    ep.layout_hash = FTT_LAYOUT_HASH;
    ep.total_chunks = first;
}

static void manifest_holds(const Graft__TransferManifest *m)
{
    assert(m->n_regions == ep.n_regions && m->step == FTT_STEP && m->chunk_bytes == FTT_CHUNK);
    for (size_t i = 0; i < m->n_regions; i++) {
        const Graft__RegionManifest *rm = m->regions[i];
        assert(rm->region != NULL && strcmp(rm->region->name, regions[i].name) == 0);
        assert(rm->region->bytes == regions[i].bytes);
        assert(regions[i].bytes == 0 || (rm->rkey.len > 0 && rm->rkey.len <= MAX_KEY));
        sink += rm->rkey.len > 0 ? rm->rkey.data[rm->rkey.len - 1] : 0;
    }
}

static void parts_hold(const Graft__TransferManifest *m)
{
    for (size_t i = 0; i < m->n_hash_parts; i++) {
        const Graft__ChunkHashes *h = m->hash_parts[i];
        assert(h->region < ep.n_regions);
        const graft__region_t *r = &regions[h->region];
        for (size_t k = 0; k < h->n_hashes; k++) {
            uint64_t c = r->first_chunk + h->first_chunk + k;
            assert(c < r->first_chunk + r->n_chunks && c < ep.total_chunks);
            sink += h->hashes[k] + c;
        }
    }
}

/* What the recipient does with the @p len bytes under a seal that held. */
static void accept(const uint8_t *body, size_t len)
{
    bool oom = false;
    ProtobufCAllocator pa = graft__pb_allocator_tracked(&oom);
    Graft__TransferManifest *m = graft__transfer_manifest__unpack(&pa, len, body);
    assert(!oom);
    if (m == NULL || m->version != GRAFT__XFER_WIRE_VERSION)
        goto out;
    if (m->status != 0) {
        graft_status_t st = graft__xfer_refusal_status(m->status);
        assert(st != GRAFT_OK);
        assert(graft_status_class(st) == GRAFT_CLASS_PEER || st == GRAFT_EFORMAT ||
               st == GRAFT_ENOMEM || st == GRAFT_EPROTO);
        goto out;
    }
    if (m->n_regions > 0 &&
        graft__xfer_manifest_check(&ep, FTT_STEP, m, MAX_KEY, 0) == GRAFT_OK)
        manifest_holds(m);
    if (graft__xfer_hash_parts_check(&ep, m) == GRAFT_OK)
        parts_hold(m);
out:
    graft__transfer_manifest__free_unpacked(m, &graft__pb_allocator);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    table_init();
    const size_t key_len = sizeof(ftt_secret) - 1;
    bool seal_here = (data[0] & 1) == 0;
    uint64_t seq = data[0] >> 1;
    size_t len = size - 1, n = len, body = 0;
    bool sealed = false;
    uint8_t *msg = malloc(len + GRAFT__XFER_SEAL_BYTES + 1);
    assert(msg != NULL);
    memcpy(msg, data + 1, len);
    if (seal_here) {
        assert(graft__xfer_seal(ftt_secret, key_len, ftt_nr, ftt_nd, seq, msg, len) == GRAFT_OK);
        n += GRAFT__XFER_SEAL_BYTES;
    }
    graft_status_t st =
        graft__xfer_unseal(ftt_secret, key_len, ftt_nr, ftt_nd, seq, msg, n, &body, &sealed);
    assert(st == GRAFT_OK || st == GRAFT_ETOKEN);
    if (seal_here) {
        size_t other = 0;
        assert(st == GRAFT_OK && sealed && body == len);
        /* The same answer as another number, or on the way back, does not hold. */
        assert(graft__xfer_unseal(ftt_secret, key_len, ftt_nr, ftt_nd, seq + 1, msg, n, &other,
                                  &sealed) == GRAFT_ETOKEN);
        assert(graft__xfer_unseal(ftt_secret, key_len, ftt_nd, ftt_nr, seq, msg, n, &other,
                                  &sealed) == GRAFT_ETOKEN);
    }
    if (st == GRAFT_OK) {
        assert(body + GRAFT__XFER_SEAL_BYTES == n);
        accept(msg, body);
    }
    free(msg);
    return 0;
}
