/*
 * A test-only switch that breaks the heal on purpose: with
 * GRAFT_TEST_SKIP_REGION=<region name> in the environment, every heal
 * leaves that region's bytes as they were before the pull and still reports
 * success. It exists so that a test can show that the simulator's verdict
 * (and any other end-to-end check of recovery) is able to fail; nothing
 * else should ever set it.
 *
 * The transfer engine pulls straight into the registered memory, so the
 * region is copied aside before the pull and copied back after it.
 *
 * Only the test build of the library has it (GRAFT_TEST_FAULTS, see
 * runtime_internal.h and docs/RUNTIME.md): in the library that is shipped
 * this file is empty and the variable is never read.
 */
#include "runtime_internal.h"

#ifdef GRAFT_TEST_FAULTS

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define SKIP_ENV "GRAFT_TEST_SKIP_REGION"

/* The region a heal must leave as it was, and its bytes saved before each
 * pull. */
struct graft__rt_test_hook {
    char *skip_name;
    size_t skip_idx;
    void *skip_save;
};

graft_status_t graft__rt_skip_init(graft_runtime_t *rt)
{
    const char *name = getenv(SKIP_ENV);
    if (name == NULL)
        return GRAFT_OK;
    if (name[0] == '\0') {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "%s is set but empty: name a region", SKIP_ENV);
        return GRAFT_EINVAL;
    }
    struct graft__rt_test_hook *h = graft__calloc(1, sizeof(*h));
    if (h == NULL || (h->skip_name = graft__strdup(name)) == NULL) {
        graft_free(h);
        return GRAFT_ENOMEM;
    }
    rt->test_hook = h;
    return GRAFT_OK;
}

graft_status_t graft__rt_skip_resolve(graft_runtime_t *rt)
{
    struct graft__rt_test_hook *h = rt->test_hook;
    if (h == NULL || h->skip_save != NULL)
        return GRAFT_OK;
    for (size_t i = 0; i < rt->n_regions; i++) {
        const graft_region_t *r = &rt->regions[i].r;
        if (strcmp(r->name, h->skip_name) != 0)
            continue;
        if (r->device != GRAFT_DEVICE_HOST) {
            GRAFT_ERROR(GRAFT_MOD_RUNTIME, "%s=%s: only host regions can be skipped", SKIP_ENV,
                        h->skip_name);
            return GRAFT_ENOTSUP;
        }
        h->skip_save = graft__malloc(r->bytes);
        if (h->skip_save == NULL)
            return GRAFT_ENOMEM;
        h->skip_idx = i;
        GRAFT_WARN(GRAFT_MOD_RUNTIME,
                   "group %" PRIu32 " rank %" PRIu32 ": %s=%s: every heal of this"
                   " process leaves region %s as it was (a deliberately broken recovery)",
                   rt->group, rt->rank, SKIP_ENV, h->skip_name, h->skip_name);
        return GRAFT_OK;
    }
    /* A misspelt name would make a "broken heal" test pass for the wrong
     * reason, so it is an error rather than a no-op. */
    GRAFT_ERROR(GRAFT_MOD_RUNTIME, "%s=%s: no region of that name is registered", SKIP_ENV,
                h->skip_name);
    return GRAFT_EINVAL;
}

void graft__rt_skip_save(graft_runtime_t *rt)
{
    struct graft__rt_test_hook *h = rt->test_hook;
    if (h == NULL || h->skip_save == NULL)
        return;
    const graft_region_t *r = &rt->regions[h->skip_idx].r;
    memcpy(h->skip_save, r->ptr, r->bytes);
}

void graft__rt_skip_restore(graft_runtime_t *rt)
{
    struct graft__rt_test_hook *h = rt->test_hook;
    if (h == NULL || h->skip_save == NULL)
        return;
    const graft_region_t *r = &rt->regions[h->skip_idx].r;
    memcpy(r->ptr, h->skip_save, r->bytes);
    GRAFT_WARN(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": heal left region %s as it"
               " was (%s)", rt->group, rt->rank, r->name, SKIP_ENV);
}

void graft__rt_skip_free(graft_runtime_t *rt)
{
    struct graft__rt_test_hook *h = rt->test_hook;
    if (h == NULL)
        return;
    graft_free(h->skip_save);
    graft_free(h->skip_name);
    graft_free(h);
    rt->test_hook = NULL;
}

#endif /* GRAFT_TEST_FAULTS */
