/*
 * Transfer wire messages as a donor or recipient receives them from a peer
 * (transfer/ucx.c): TransferRequest, TransferDone, ChunkRequest,
 * TransferManifest and the steady path's StepMessage, each unpacked through the transfer module's allocator
 * exactly as the handlers do. The first input byte picks the message. What
 * decodes is walked field by field, so a count that disagrees with its
 * array would be read out of bounds under the sanitizers.
 */
#include "fuzz_common.h"
#include "transfer_int.h"
#include "proto/graft.pb-c.h"

#include <assert.h>
#include <stdbool.h>

static volatile uint64_t sink;

static void walk_manifest(const Graft__TransferManifest *m)
{
    sink += m->seal.len > 0 ? m->seal.data[m->seal.len - 1] : 0;
    for (size_t i = 0; i < m->n_regions; i++) {
        const Graft__RegionManifest *r = m->regions[i];
        assert(r != NULL);
        sink += r->rkey.len > 0 ? r->rkey.data[r->rkey.len - 1] : 0;
        if (r->region != NULL && r->region->name != NULL)
            sink += strlen(r->region->name);
        for (size_t j = 0; j < r->n_chunk_hashes; j++)
            sink += r->chunk_hashes[j];
    }
    for (size_t i = 0; i < m->n_hash_parts; i++) {
        const Graft__ChunkHashes *h = m->hash_parts[i];
        assert(h != NULL);
        for (size_t j = 0; j < h->n_hashes; j++)
            sink += h->hashes[j];
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *msg = data + 1;
    size_t len = size - 1;
    bool oom = false;
    ProtobufCAllocator pa = graft__pb_allocator_tracked(&oom);
    switch (data[0] % 6) {
    case 0: {
        Graft__TransferRequest *r = graft__transfer_request__unpack(&pa, len, msg);
        if (r != NULL) {
            sink += r->nonce.len + r->mac.len + r->step;
            graft__transfer_request__free_unpacked(r, &graft__pb_allocator);
        }
        break;
    }
    case 1: {
        Graft__TransferDone *d = graft__transfer_done__unpack(&graft__pb_allocator, len, msg);
        graft__transfer_done__free_unpacked(d, &graft__pb_allocator);
        break;
    }
    case 2: {
        Graft__ChunkRequest *c = graft__chunk_request__unpack(&graft__pb_allocator, len, msg);
        graft__chunk_request__free_unpacked(c, &graft__pb_allocator);
        break;
    }
    case 4: {
        /* The steady path's messages (runtime/runtime_steady.c). */
        Graft__StepMessage *m = graft__step_message__unpack(&pa, len, msg);
        if (m != NULL) {
            sink += m->step + m->group + m->rank + m->barrier_round + (uint64_t)m->kind;
            graft__step_message__free_unpacked(m, &graft__pb_allocator);
        }
        break;
    }
    case 5: {
        /* The donor's challenge, the first message a recipient reads. */
        Graft__TransferChallenge *c = graft__transfer_challenge__unpack(&pa, len, msg);
        if (c != NULL) {
            sink += c->nonce.len + c->version;
            graft__transfer_challenge__free_unpacked(c, &graft__pb_allocator);
        }
        break;
    }
    default: {
        Graft__TransferManifest *m = graft__transfer_manifest__unpack(&pa, len, msg);
        if (m != NULL) {
            walk_manifest(m);
            graft__transfer_manifest__free_unpacked(m, &graft__pb_allocator);
        }
        break;
    }
    }
    assert(!oom);
    return 0;
}
