/*
 * Member records (etcd: /graft/<job>/members/...): any bytes decode to a
 * status, and whatever decodes survives an encode/decode round trip
 * unchanged.
 */
#include "fuzz_common.h"
#include "membership_internal.h"

#include <assert.h>

static int str_eq(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    graft_member_t m, again;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (graft__mship_member_decode(data, size, &m) != GRAFT_OK)
        return 0;
    if (graft__mship_member_encode(&m, &buf, &len) == GRAFT_OK) {
        assert(graft__mship_member_decode(buf, len, &again) == GRAFT_OK);
        assert(again.group == m.group && again.rank == m.rank &&
               again.incarnation == m.incarnation && again.pid == m.pid &&
               again.layout_hash == m.layout_hash && again.committed_step == m.committed_step &&
               again.state == m.state && again.lease_id == m.lease_id &&
               again.joined_unix_ms == m.joined_unix_ms && str_eq(again.host, m.host) &&
               str_eq(again.transfer_address, m.transfer_address));
        graft__mship_member_clear(&again);
        graft_free(buf);
    }
    graft__mship_member_clear(&m);
    return 0;
}
