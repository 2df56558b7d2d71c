/*
 * The job's ProgressRecord (etcd: /graft/<job>/progress), read by a
 * restart's cold-start check and by graftctl status: any bytes decode to
 * a status; what decodes survives an encode/decode round trip.
 */
#include "fuzz_common.h"
#include "runtime_internal.h"

#include <assert.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t step = 0, again = 0;
    uint8_t *buf = NULL;
    size_t len = 0;
    graft_status_t st = graft__rt_progress_decode(data, size, &step);
    assert(st == GRAFT_OK || st == GRAFT_EMALFORMED || st == GRAFT_EFORMAT ||
           st == GRAFT_ENOMEM);
    if (st != GRAFT_OK)
        return 0;
    if (graft__rt_progress_encode(step, &buf, &len) == GRAFT_OK) {
        assert(graft__rt_progress_decode(buf, len, &again) == GRAFT_OK);
        assert(again == step);
        graft_free(buf);
    }
    return 0;
}
