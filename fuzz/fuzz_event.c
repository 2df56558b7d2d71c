/*
 * Job history events (etcd: /graft/<job>/events/...): any bytes decode to a
 * status; what decodes has a known kind, a detail string, and survives an
 * encode/decode round trip.
 */
#include "fuzz_common.h"
#include "membership_internal.h"

#include <assert.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    graft_event_t ev, again;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (graft__mship_event_decode(data, size, &ev) != GRAFT_OK)
        return 0;
    assert(ev.seq != 0 && ev.detail != NULL);
    assert(strcmp(graft_event_kind_string(ev.kind), "unknown") != 0);
    if (graft__mship_event_encode(&ev, &buf, &len) == GRAFT_OK) {
        assert(graft__mship_event_decode(buf, len, &again) == GRAFT_OK);
        assert(again.seq == ev.seq && again.kind == ev.kind && again.unix_ms == ev.unix_ms &&
               again.group == ev.group && again.rank == ev.rank &&
               again.incarnation == ev.incarnation && again.quorum_id == ev.quorum_id &&
               again.round == ev.round && again.step == ev.step &&
               again.duration_us == ev.duration_us && again.ok == ev.ok &&
               again.n_members == ev.n_members && strcmp(again.detail, ev.detail) == 0);
        assert(ev.n_members == 0 ||
               memcmp(again.members, ev.members, ev.n_members * sizeof(uint32_t)) == 0);
        graft__mship_event_clear(&again);
        graft_free(buf);
    }
    graft__mship_event_clear(&ev);
    return 0;
}
