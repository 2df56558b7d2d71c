/*
 * graftctl ckpt, shared by graftctl_ckpt.c (a root on disk) and
 * graftctl_ckpt_remote.c (an s3:// URL).
 */
#ifndef GRAFTCTL_CKPT_H
#define GRAFTCTL_CKPT_H

#include "graftctl.h"

#include <graft/persist.h>

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

typedef struct ckpt_args {
    const char *root; /* a directory, or s3://bucket/prefix */
    bool has_step;
    uint64_t step;
    bool quick;
    bool dry_run;
    graft_persist_retention_t policy;
    /* --secret-file: the job secret the manifests' MACs are checked with */
    uint8_t secret[GRAFT_PERSIST_SECRET_MAX_BYTES];
    size_t secret_len;
    /* s3:// only: --endpoint, --region */
    const char *endpoint;
    const char *region;
} ckpt_args_t;

static inline bool graftctl_ckpt_is_remote(const char *root)
{
    return root != NULL && strncmp(root, "s3://", 5) == 0;
}

/* How one checkpoint is shown (graftctl_ckpt_view.c): its state's name,
 * its entry as JSON, the sidecar check and the manifest for a person. */
const char *graftctl_ckpt_state_name(graft_persist_state_t s);
json_t *graftctl_ckpt_entry_json(const graft_persist_entry_t *e);
/* The manifest.json sidecar of root's step against its manifest.pb: "ok",
 * "damaged" or "unchecked", why says what differs. */
const char *graftctl_ckpt_sidecar(const char *root, uint64_t step, char *why, size_t why_len);
void graftctl_ckpt_inspect_print(json_t *m, const graft_persist_entry_t *v, graft_status_t vst,
                                 const char *sidecar, const char *why);
/* ls, verify, inspect, prune, restore --dry-run on a.root = s3://...
 * (graftctl_ckpt_remote.c). */
int graftctl_ckpt_remote(const graftctl_opts_t *o, const char *sub, const ckpt_args_t *a);

#endif
