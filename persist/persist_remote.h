/*
 * Private to persist/: the remote tier (persist_remote.c: the uploader;
 * persist_remote_restore.c: listing, retention and restore).
 */
#ifndef GRAFT_PERSIST_REMOTE_H
#define GRAFT_PERSIST_REMOTE_H

#include "graft_internal.h"
#include <graft/persist.h>

typedef struct graft__remote graft__remote_t;

/* How long destroying a writer waits for the uploads still to do before
 * canceling them. */
#define GP_REMOTE_DRAIN_MS 30000
struct graft__s3;

/* The uploader of a writer. A bad URL is GRAFT_EINVAL; credentials that
 * cannot be resolved leave the uploader running with every upload failing
 * with that reason, so that the local tier is unaffected. */
GRAFT_WUR graft_status_t graft__persist_remote_create(const graft_persist_remote_config_t *cfg,
                                                      const char *root, const uint8_t *secret,
                                                      size_t secret_len, graft__remote_t **r_p);
/* Waits up to GP_REMOTE_DRAIN_MS for the uploads still to do, then cancels
 * them (at the next retry or part) and joins the thread. */
void graft__persist_remote_destroy(graft__remote_t *r);
/* Hand a checkpoint committed locally to the uploader (never blocks on
 * the network). */
void graft__persist_remote_enqueue(graft__remote_t *r, uint64_t step);
/* Keep the newest keep_last (0: all) complete checkpoints in the bucket
 * and those whose step is a multiple of milestone_every (0: none); delete
 * the others whole, manifest.pb first. Then delete the objects of every
 * step-* prefix without a manifest.pb older than the newest complete
 * checkpoint (an upload given up). *deleted_p, *leftovers_p (may be NULL):
 * how many of each. */
GRAFT_WUR graft_status_t graft__persist_remote_retention(struct graft__s3 *s3, uint32_t keep_last,
                                                         uint64_t milestone_every,
                                                         size_t *deleted_p, size_t *leftovers_p,
                                                         char *why, size_t why_len);

#endif
