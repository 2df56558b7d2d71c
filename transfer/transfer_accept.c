/*
 * What a recipient checks of a donor's answer once its seal held, apart
 * from the connection (docs/SECURITY.md, "The transfer handshake"): a
 * refusal's status mapped to what the pull reports, a first manifest
 * against the recipient's own region table, and hash parts against the
 * chunks of that table. Pure functions of the decoded answer and the
 * table, so that fuzz/fuzz_transfer_accept.c reaches them without a
 * connection; transfer/ucx_pull_donors.c acts on what they decide.
 */
#include "transfer_int.h"

#include "proto/graft.pb-c.h"

#include <string.h>

graft_status_t graft__xfer_refusal_status(int32_t status)
{
    graft_status_t st = (graft_status_t)status;
    if (st == GRAFT_OK || (graft_status_class(st) != GRAFT_CLASS_PEER && st != GRAFT_EFORMAT &&
                           st != GRAFT_ENOMEM))
        return GRAFT_EPROTO;
    return st;
}

graft_status_t graft__xfer_manifest_check(const graft_transfer_endpoint_t *ep, uint64_t step,
                                          const Graft__TransferManifest *m, size_t max_key,
                                          uint32_t donor)
{
    if (m->status != 0 || m->step != step || m->layout_hash != ep->layout_hash ||
        m->chunk_bytes != ep->chunk_bytes || m->n_regions != ep->n_regions) {
        GRAFT_WARN(GRAFT_MOD_TRANSFER, "donor %u: manifest does not match the request "
                   "(step %llu, chunk %llu bytes, %zu regions)", donor,
                   (unsigned long long)m->step, (unsigned long long)m->chunk_bytes, m->n_regions);
        return GRAFT_EPROTO;
    }
    for (size_t i = 0; i < ep->n_regions; i++) {
        const Graft__RegionManifest *rm = m->regions[i];
        const graft__region_t *r = &ep->regions[i];
        if (rm->region == NULL || rm->region->name == NULL ||
            strcmp(rm->region->name, r->name) != 0 || rm->region->bytes != r->bytes) {
            GRAFT_WARN(GRAFT_MOD_TRANSFER, "donor %u: region %zu differs from '%s'", donor, i,
                       r->name);
            return GRAFT_EPROTO;
        }
        if (r->bytes > 0 && (rm->rkey.len == 0 || rm->rkey.len > max_key)) {
            GRAFT_WARN(GRAFT_MOD_TRANSFER, "donor %u: remote key of '%s' is malformed (%zu bytes)",
                       donor, r->name, rm->rkey.len);
            return GRAFT_EPROTO;
        }
    }
    return GRAFT_OK;
}

graft_status_t graft__xfer_hash_parts_check(const graft_transfer_endpoint_t *ep,
                                            const Graft__TransferManifest *m)
{
    for (size_t i = 0; i < m->n_hash_parts; i++) {
        const Graft__ChunkHashes *h = m->hash_parts[i];
        if (h->region >= ep->n_regions)
            return GRAFT_EPROTO;
        const graft__region_t *r = &ep->regions[h->region];
        if (h->first_chunk > r->n_chunks || h->n_hashes > r->n_chunks - h->first_chunk)
            return GRAFT_EPROTO;
    }
    return GRAFT_OK;
}
