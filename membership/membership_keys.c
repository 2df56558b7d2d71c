/*
 * The one owner of etcd key spellings (docs/KEYS.md): the job prefix, every
 * key and folder membership and the runtime write or read under it, and
 * the classification of the keys the membership view follows. A change of
 * layout is a change of this file (and of docs/KEYS.md and DESIGN's table);
 * tests/test_membership_keys.c holds every builder to its spelling.
 */
#include "membership_keys.h"

#include "graft_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- job --- */

char *graft__key_job_prefix(const char *job)
{
    return graft__asprintf("/graft/%s/", job);
}

/* --------------------------------------------------- membership's keys --- */

char *graft__key_member(const char *prefix, uint32_t group, uint32_t rank)
{
    return graft__asprintf("%smembers/%" PRIu32 "/%" PRIu32, prefix, group, rank);
}

char *graft__key_members_folder(const char *prefix)
{
    return graft__asprintf("%smembers/", prefix);
}

char *graft__key_spare(const char *prefix, uint32_t rank, uint64_t incarnation)
{
    return graft__asprintf("%sspares/%" PRIu32 "/%020" PRIu64, prefix, rank, incarnation);
}

char *graft__key_spares_folder(const char *prefix)
{
    return graft__asprintf("%sspares/", prefix);
}

char *graft__key_ready(const char *prefix, uint64_t round, uint32_t group, uint32_t rank)
{
    return graft__asprintf("%sready/%" PRIu64 "/%" PRIu32 "/%" PRIu32, prefix, round, group,
                           rank);
}

char *graft__key_ready_folder(const char *prefix, uint64_t round)
{
    return graft__asprintf("%sready/%" PRIu64 "/", prefix, round);
}

char *graft__key_quorum(const char *prefix)
{
    return graft__asprintf("%squorum", prefix);
}

char *graft__key_vote(const char *prefix, uint32_t group, uint64_t round, uint32_t rank)
{
    return graft__asprintf("%svotes/%" PRIu32 "/%" PRIu64 "/%" PRIu32, prefix, group, round,
                           rank);
}

char *graft__key_votes_round_folder(const char *prefix, uint32_t group, uint64_t round)
{
    return graft__asprintf("%svotes/%" PRIu32 "/%" PRIu64 "/", prefix, group, round);
}

char *graft__key_votes_folder(const char *prefix, uint32_t group)
{
    return graft__asprintf("%svotes/%" PRIu32 "/", prefix, group);
}

char *graft__key_blob(const char *prefix, uint64_t quorum_id)
{
    return graft__asprintf("%sblob/%020" PRIu64, prefix, quorum_id);
}

char *graft__key_pair(const char *prefix, uint64_t round, uint32_t donor, uint32_t recipient,
                      uint32_t rank)
{
    return graft__asprintf("%spairs/%020" PRIu64 "/%" PRIu32 "/%" PRIu32 "/%" PRIu32, prefix,
                           round, donor, recipient, rank);
}

char *graft__key_event(const char *prefix, uint64_t number)
{
    return graft__asprintf("%sevents/%020" PRIu64, prefix, number);
}

char *graft__key_events_folder(const char *prefix)
{
    return graft__asprintf("%sevents/", prefix);
}

/* ------------------------------------------------------ runtime's keys --- */

char *graft__key_progress(const char *prefix)
{
    return graft__asprintf("%sprogress", prefix);
}

char *graft__key_group_progress(const char *prefix, uint32_t group)
{
    return graft__asprintf("%sgroup_progress/%" PRIu32, prefix, group);
}

char *graft__key_group_progress_folder(const char *prefix)
{
    return graft__asprintf("%sgroup_progress/", prefix);
}

char *graft__key_finished(const char *prefix, uint32_t group)
{
    return graft__asprintf("%sfinished/%" PRIu32, prefix, group);
}

char *graft__key_finished_folder(const char *prefix)
{
    return graft__asprintf("%sfinished/", prefix);
}

/* Who may read this key is who may read the job (docs/SECURITY.md). */
char *graft__key_secret(const char *prefix)
{
    return graft__asprintf("%ssecret", prefix);
}

char *graft__key_checkpoint(const char *prefix, uint64_t step)
{
    return graft__asprintf("%scheckpoints/%020" PRIu64, prefix, step);
}

char *graft__key_checkpoints_folder(const char *prefix)
{
    return graft__asprintf("%scheckpoints/", prefix);
}

char *graft__key_ckpt_shard(const char *prefix, uint64_t step, uint32_t rank)
{
    return graft__asprintf("%sckpt/%020" PRIu64 "/shard/%" PRIu32, prefix, step, rank);
}

char *graft__key_ckpt_shards_folder(const char *prefix, uint64_t step)
{
    return graft__asprintf("%sckpt/%020" PRIu64 "/shard/", prefix, step);
}

char *graft__key_drift(const char *prefix, uint64_t step, uint32_t rank, uint32_t group)
{
    return graft__asprintf("%sdrift/%020" PRIu64 "/%" PRIu32 "/%" PRIu32, prefix, step, rank,
                           group);
}

char *graft__key_drift_rank_folder(const char *prefix, uint64_t step, uint32_t rank)
{
    return graft__asprintf("%sdrift/%020" PRIu64 "/%" PRIu32 "/", prefix, step, rank);
}

char *graft__key_drift_folder(const char *prefix)
{
    return graft__asprintf("%sdrift/", prefix);
}

/* -------------------------------------------------- classification --- */

/* Parse a decimal number that fills [s, end) completely. */
static bool parse_u64(const char *s, const char **end_p, uint64_t *v_p)
{
    if (*s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0)
        return false;
    *end_p = end;
    *v_p = v;
    return true;
}

static bool parse_group_rank(const char *s, graft__mkey_t *k)
{
    const char *end;
    uint64_t g, r;
    if (!parse_u64(s, &end, &g) || *end != '/' || g > UINT32_MAX)
        return false;
    if (!parse_u64(end + 1, &end, &r) || *end != '\0' || r > UINT32_MAX)
        return false;
    k->group = (uint32_t)g;
    k->rank = (uint32_t)r;
    return true;
}

static bool parse_round_group_rank(const char *s, graft__mkey_t *k)
{
    const char *end;
    uint64_t round;
    if (!parse_u64(s, &end, &round) || *end != '/' || round == 0)
        return false;
    k->number = round;
    return parse_group_rank(end + 1, k);
}

/* votes/<group>/<round>/<rank>: the group first, so that a rank watches
 * its own group's folder; the round next, so that one range reads a round. */
static bool parse_group_round_rank(const char *s, graft__mkey_t *k)
{
    const char *end;
    uint64_t g, round, r;
    if (!parse_u64(s, &end, &g) || *end != '/' || g > UINT32_MAX)
        return false;
    if (!parse_u64(end + 1, &end, &round) || *end != '/' || round == 0)
        return false;
    if (!parse_u64(end + 1, &end, &r) || *end != '\0' || r > UINT32_MAX)
        return false;
    k->group = (uint32_t)g;
    k->rank = (uint32_t)r;
    k->number = round;
    return true;
}

static bool parse_number(const char *s, graft__mkey_t *k)
{
    const char *end;
    uint64_t v;
    if (!parse_u64(s, &end, &v) || *end != '\0')
        return false;
    k->number = v;
    return true;
}

graft__mkey_t graft__mship_key_parse(const char *prefix, const char *key)
{
    graft__mkey_t k = {GRAFT__MKEY_OTHER, 0, 0, 0};
    size_t plen = strlen(prefix);
    if (key == NULL || strncmp(key, prefix, plen) != 0)
        return k;
    const char *rest = key + plen;
    static const struct {
        const char *name;
        graft__mkey_kind_t kind;
        int shape; /* 0: exact, 1: group/rank, 2: number, 3: round/group/rank,
                      4: group/round/rank */
    } table[] = {
        {"members/", GRAFT__MKEY_MEMBER, 1}, {"ready/", GRAFT__MKEY_READY, 3},
        {"votes/", GRAFT__MKEY_VOTE, 4},     {"blob/", GRAFT__MKEY_BLOB, 2},
        {"events/", GRAFT__MKEY_EVENT, 2},   {"quorum", GRAFT__MKEY_QUORUM, 0},
        {"eventseq", GRAFT__MKEY_EVENTSEQ, 0},
        {"group_progress/", GRAFT__MKEY_GROUP_PROGRESS, 2},
        {"finished/", GRAFT__MKEY_FINISHED, 2},
    };
    for (size_t i = 0; i < GRAFT_ARRAY_SIZE(table); i++) {
        size_t n = strlen(table[i].name);
        if (table[i].shape == 0) {
            if (strcmp(rest, table[i].name) == 0)
                k.kind = table[i].kind;
            continue;
        }
        if (strncmp(rest, table[i].name, n) != 0)
            continue;
        bool ok = table[i].shape == 1   ? parse_group_rank(rest + n, &k)
                  : table[i].shape == 3 ? parse_round_group_rank(rest + n, &k)
                  : table[i].shape == 4 ? parse_group_round_rank(rest + n, &k)
                                        : parse_number(rest + n, &k);
        k.kind = ok ? table[i].kind : GRAFT__MKEY_BAD;
        return k;
    }
    return k;
}
