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

graft_status_t graft__rt_skip_init(graft_runtime_t *rt)
{
    const char *name = getenv(SKIP_ENV);
    if (name == NULL)
        return GRAFT_OK;
    if (name[0] == '\0') {
        GRAFT_ERROR(GRAFT_MOD_RUNTIME, "%s is set but empty: name a region", SKIP_ENV);
        return GRAFT_EINVAL;
    }
    rt->skip_name = graft__strdup(name);
    return rt->skip_name != NULL ? GRAFT_OK : GRAFT_ENOMEM;
}

graft_status_t graft__rt_skip_resolve(graft_runtime_t *rt)
{
    if (rt->skip_name == NULL || rt->skip_save != NULL)
        return GRAFT_OK;
    for (size_t i = 0; i < rt->n_regions; i++) {
        const graft_region_t *r = &rt->regions[i].r;
        if (strcmp(r->name, rt->skip_name) != 0)
            continue;
        if (r->device != GRAFT_DEVICE_HOST) {
            GRAFT_ERROR(GRAFT_MOD_RUNTIME, "%s=%s: only host regions can be skipped", SKIP_ENV,
                        rt->skip_name);
            return GRAFT_ENOTSUP;
        }
        rt->skip_save = graft__malloc(r->bytes);
        if (rt->skip_save == NULL)
            return GRAFT_ENOMEM;
        rt->skip_idx = i;
        GRAFT_WARN(GRAFT_MOD_RUNTIME,
                   "group %" PRIu32 " rank %" PRIu32 ": %s=%s: every heal of this"
                   " process leaves region %s as it was (a deliberately broken recovery)",
                   rt->group, rt->rank, SKIP_ENV, rt->skip_name, rt->skip_name);
        return GRAFT_OK;
    }
    /* A misspelt name would make a "broken heal" test pass for the wrong
     * reason, so it is an error rather than a no-op. */
    GRAFT_ERROR(GRAFT_MOD_RUNTIME, "%s=%s: no region of that name is registered", SKIP_ENV,
                rt->skip_name);
    return GRAFT_EINVAL;
}

void graft__rt_skip_save(graft_runtime_t *rt)
{
    if (rt->skip_save == NULL)
        return;
    const graft_region_t *r = &rt->regions[rt->skip_idx].r;
    memcpy(rt->skip_save, r->ptr, r->bytes);
}

void graft__rt_skip_restore(graft_runtime_t *rt)
{
    if (rt->skip_save == NULL)
        return;
    const graft_region_t *r = &rt->regions[rt->skip_idx].r;
    memcpy(r->ptr, rt->skip_save, r->bytes);
    GRAFT_WARN(GRAFT_MOD_RUNTIME, "group %" PRIu32 " rank %" PRIu32 ": heal left region %s as it"
               " was (%s)", rt->group, rt->rank, r->name, SKIP_ENV);
}

void graft__rt_skip_free(graft_runtime_t *rt)
{
    graft_free(rt->skip_save);
    rt->skip_save = NULL;
    graft_free(rt->skip_name);
    rt->skip_name = NULL;
}

#endif /* GRAFT_TEST_FAULTS */
