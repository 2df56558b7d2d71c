/*
 * Ready records (etcd: /graft/<job>/ready/...): any bytes decode to a
 * status, and whatever decodes survives an encode/decode round trip.
 */
#include "fuzz_common.h"
#include "membership_internal.h"

#include <assert.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    graft__ready_t r, again;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (graft__mship_ready_decode(data, size, &r) != GRAFT_OK)
        return 0;
    if (graft__mship_ready_encode(&r, &buf, &len) == GRAFT_OK) {
        assert(graft__mship_ready_decode(buf, len, &again) == GRAFT_OK);
        assert(again.group == r.group && again.rank == r.rank &&
               again.incarnation == r.incarnation && again.round == r.round &&
               again.committed_step == r.committed_step && again.unix_ms == r.unix_ms);
        graft_free(buf);
    }
    return 0;
}
