/*
 * Quorum records (etcd: /graft/<job>/quorum): any bytes decode to a status;
 * what decodes is consistent (members strictly ascending, every recipient
 * and donor a member, no recipient also a donor) and survives an
 * encode/decode round trip.
 */
#include "fuzz_common.h"
#include "membership_internal.h"

#include <assert.h>
#include <stdbool.h>

static bool is_member(const graft_quorum_t *q, uint32_t g)
{
    for (size_t i = 0; i < q->n_members; i++)
        if (q->members[i] == g)
            return true;
    return false;
}

static void check_consistent(const graft_quorum_t *q)
{
    assert(q->id != 0 && q->round != 0 && q->n_members > 0);
    for (size_t i = 1; i < q->n_members; i++)
        assert(q->members[i] > q->members[i - 1]);
    for (size_t i = 0; i < q->n_recoveries; i++) {
        const graft_recovery_t *r = &q->recoveries[i];
        assert(is_member(q, r->recipient) && r->n_donors > 0);
        for (size_t j = 0; j < r->n_donors; j++) {
            assert(is_member(q, r->donors[j]));
            for (size_t k = 0; k < q->n_recoveries; k++)
                assert(q->recoveries[k].recipient != r->donors[j]);
        }
    }
}

static void check_same(const graft_quorum_t *a, const graft_quorum_t *b)
{
    assert(a->id == b->id && a->round == b->round && a->step == b->step &&
           a->max_committed_step == b->max_committed_step && a->min_groups == b->min_groups &&
           a->formed_unix_ms == b->formed_unix_ms && a->duration_us == b->duration_us &&
           a->members_hash == b->members_hash && a->n_members == b->n_members &&
           a->n_recoveries == b->n_recoveries);
    assert(memcmp(a->members, b->members, a->n_members * sizeof(*a->members)) == 0);
    for (size_t i = 0; i < a->n_recoveries; i++) {
        assert(a->recoveries[i].recipient == b->recoveries[i].recipient);
        assert(a->recoveries[i].n_donors == b->recoveries[i].n_donors);
        assert(memcmp(a->recoveries[i].donors, b->recoveries[i].donors,
                      a->recoveries[i].n_donors * sizeof(uint32_t)) == 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    graft_quorum_t *q = NULL, *again = NULL;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (graft__mship_quorum_decode(data, size, &q) != GRAFT_OK)
        return 0;
    check_consistent(q);
    if (graft__mship_quorum_encode(q, &buf, &len) == GRAFT_OK) {
        assert(graft__mship_quorum_decode(buf, len, &again) == GRAFT_OK);
        check_same(q, again);
        graft_membership_quorum_free(again);
        graft_free(buf);
    }
    graft_membership_quorum_free(q);
    return 0;
}
