/*
 * Commit votes (etcd: /graft/<job>/votes/...): any bytes decode to a
 * status, the reason is always a terminated string, and whatever decodes
 * survives an encode/decode round trip.
 */
#include "fuzz_common.h"
#include "membership_internal.h"

#include <assert.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    graft__vote_t v, again;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (graft__mship_vote_decode(data, size, &v) != GRAFT_OK)
        return 0;
    assert(memchr(v.reason, '\0', sizeof(v.reason)) != NULL);
    if (graft__mship_vote_encode(&v, &buf, &len) == GRAFT_OK) {
        assert(graft__mship_vote_decode(buf, len, &again) == GRAFT_OK);
        assert(again.group == v.group && again.rank == v.rank &&
               again.incarnation == v.incarnation && again.quorum_id == v.quorum_id &&
               again.round == v.round && again.step == v.step && again.ok == v.ok &&
               strcmp(again.reason, v.reason) == 0);
        graft_free(buf);
    }
    return 0;
}
