/*
 * graftctl ckpt: how one checkpoint is shown, for a root on disk
 * (graftctl_ckpt.c) and an s3:// URL (graftctl_ckpt_remote.c) alike: its
 * entry as JSON, its manifest for a person, and the manifest.json sidecar
 * checked against manifest.pb. Below both; calls neither.
 */
#include "graftctl.h"
#include "graftctl_ckpt.h"

#include <graft/persist.h>

#include <inttypes.h>
#include <stdio.h>
#include <unistd.h>

#include <jansson.h>

const char *graftctl_ckpt_state_name(graft_persist_state_t s)
{
    return s == GRAFT_PERSIST_COMPLETE     ? "complete"
           : s == GRAFT_PERSIST_INCOMPLETE ? "incomplete"
                                           : "corrupt";
}

json_t *graftctl_ckpt_entry_json(const graft_persist_entry_t *e)
{
    return json_pack("{s:I,s:s,s:s,s:o,s:I,s:I,s:I,s:b}", "step", (json_int_t)e->step, "state",
                     graftctl_ckpt_state_name(e->state), "status", graft_status_name(e->status),
                     "reason", graftctl_json_text(e->reason), "ranks", (json_int_t)e->ranks,
                     "raw_bytes", (json_int_t)e->raw_bytes, "unix_ms", (json_int_t)e->unix_ms,
                     "before_config_change", e->before_config_change);
}

/* The sidecar is for people; it is compared with manifest.pb, the
 * manifest of record, and a disagreement is reported, never trusted. */
const char *graftctl_ckpt_sidecar(const char *root, uint64_t step, char *why, size_t why_len)
{
    char path[4096];
    char *pb = NULL;
    json_t *want = NULL, *have = NULL;
    json_error_t err;
    const char *verdict = "ok";
    snprintf(path, sizeof(path), "%s/step-%020" PRIu64 "/manifest.json", root, step);
    graft_status_t st = graft_persist_manifest_json(root, step, &pb);
    if (st != GRAFT_OK) {
        snprintf(why, why_len, "manifest.pb: %s", graft_status_string(st));
        verdict = "unchecked";
        goto out;
    }
    want = json_loads(pb, 0, &err);
    have = json_load_file(path, 0, &err);
    if (have == NULL) {
        snprintf(why, why_len, "%.300s: %s (line %d)", path,
                 access(path, F_OK) != 0 ? "missing" : err.text, err.line);
        verdict = "damaged";
        goto out;
    }
    if (want == NULL || !json_equal(want, have)) {
        const char *key = "?";
        json_t *v;
        json_object_foreach(want, key, v) {
            if (!json_equal(v, json_object_get(have, key)))
                break;
        }
        snprintf(why, why_len, "%.300s disagrees with manifest.pb (first at \"%s\")", path,
                 key != NULL ? key : "an extra key");
        verdict = "damaged";
        goto out;
    }
    why[0] = '\0';
out:
    json_decref(want);
    json_decref(have);
    graft_free(pb);
    return verdict;
}

/* The manifest for a person: every name in it comes from the file, so
 * each is escaped (graftctl_text). */
void graftctl_ckpt_inspect_print(json_t *m, const graft_persist_entry_t *v, graft_status_t vst,
                                 const char *sidecar, const char *why)
{
    char t[5][GRAFTCTL_TEXT_LEN];
#define TEXT(i, s) graftctl_text((s), t[i], sizeof(t[i]))
#define FIELD(obj, key) json_string_value(json_object_get((obj), (key)))
    /* The code revision only when the trainer gave one. */
    const char *rev = FIELD(m, "code_revision");
    bool has_rev = rev != NULL && rev[0] != '\0';
    printf("step %" JSON_INTEGER_FORMAT " (%s%s%s), written %" JSON_INTEGER_FORMAT
           " unix ms by graft %s%s%s\n",
           json_integer_value(json_object_get(m, "step")), graftctl_ckpt_state_name(v->state),
           vst != GRAFT_OK ? ": " : "", vst != GRAFT_OK ? TEXT(0, v->reason) : "",
           json_integer_value(json_object_get(m, "unix_ms")), TEXT(1, FIELD(m, "library_version")),
           has_rev ? ", code revision " : "", has_rev ? TEXT(2, rev) : "");
    printf("ranks %" JSON_INTEGER_FORMAT ", %" JSON_INTEGER_FORMAT " bytes (%" JSON_INTEGER_FORMAT
           " stored), layout %s, sidecar %s%s%s\n",
           json_integer_value(json_object_get(m, "ranks")),
           json_integer_value(json_object_get(m, "raw_bytes")),
           json_integer_value(json_object_get(m, "stored_bytes")), TEXT(3, FIELD(m, "layout_hash")),
           sidecar, why[0] ? ": " : "", TEXT(4, why));
    printf("\n%-32s %-8s %-6s %s\n", "REGION", "KIND", "DEVICE", "BYTES");
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(m, "regions"), i, r)
        printf("%-32s %-8s %-6s %" JSON_INTEGER_FORMAT "\n", TEXT(0, FIELD(r, "name")),
               TEXT(1, FIELD(r, "kind")), TEXT(2, FIELD(r, "device")),
               json_integer_value(json_object_get(r, "bytes")));
    printf("\n%-6s %-6s %-24s %-8s %s\n", "RANK", "GROUP", "FILE", "CHUNKS", "BYTES");
    json_array_foreach(json_object_get(m, "shards"), i, r)
        printf("%-6" JSON_INTEGER_FORMAT " %-6" JSON_INTEGER_FORMAT " %-24s %-8" JSON_INTEGER_FORMAT
               " %" JSON_INTEGER_FORMAT "\n",
               json_integer_value(json_object_get(r, "rank")),
               json_integer_value(json_object_get(r, "written_by_group")),
               TEXT(0, FIELD(r, "file")), json_integer_value(json_object_get(r, "chunks")),
               json_integer_value(json_object_get(r, "file_bytes")));
#undef TEXT
#undef FIELD
}
