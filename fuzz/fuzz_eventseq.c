/*
 * The job history's old counter (etcd: /graft/<job>/eventseq, written by
 * histories before events were keyed at random), read by every handle's
 * view: any bytes decode to a status,
 * and the decoder reads nothing past the value (the input is not
 * terminated); what decodes is the number its decimal text gives back.
 */
#include "fuzz_common.h"
#include "membership_internal.h"

#include <assert.h>
#include <inttypes.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t seq = 0, again = 0;
    /* A copy of exactly size bytes, so ASan sees a read past the end. */
    uint8_t *copy = malloc(size + 1);
    assert(copy != NULL);
    if (size > 0)
        memcpy(copy, data, size);
    graft_status_t st = graft__mship_eventseq_decode(size > 0 ? copy : NULL, size, &seq);
    assert(st == GRAFT_OK || st == GRAFT_EMALFORMED);
    if (st == GRAFT_OK) {
        char text[24];
        int n = snprintf(text, sizeof(text), "%" PRIu64, seq);
        assert(n > 0 && graft__mship_eventseq_decode((const uint8_t *)text, (size_t)n,
                                                     &again) == GRAFT_OK);
        assert(again == seq);
        /* Only digits decode, so the text is the input less its leading
         * zeros. */
        size_t z = 0;
        while (z + 1 < size && copy[z] == '0')
            z++;
        assert(size - z == (size_t)n && memcmp(copy + z, text, (size_t)n) == 0);
    }
    free(copy);
    return 0;
}
