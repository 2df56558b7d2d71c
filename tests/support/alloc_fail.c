/* Allocation-failure hooks for tests: see alloc_fail.h. */
#include "alloc_fail.h"

#include <graft/common.h>

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

static atomic_int budget_left;
static atomic_bool counting_only;
static atomic_int calls;
static atomic_int refused;
/* Blocks handed out through the hooks and not freed yet. */
static atomic_int live;

static bool allow(void)
{
    atomic_fetch_add(&calls, 1);
    if (atomic_load(&counting_only) || atomic_fetch_sub(&budget_left, 1) > 0)
        return true;
    atomic_fetch_add(&refused, 1);
    return false;
}

static void *hook_malloc(size_t n, void *arg)
{
    (void)arg;
    void *p = allow() ? malloc(n) : NULL;
    if (p != NULL)
        atomic_fetch_add(&live, 1);
    return p;
}

static void *hook_realloc(void *p, size_t n, void *arg)
{
    (void)arg;
    void *q = allow() ? realloc(p, n) : NULL;
    if (q != NULL && p == NULL)
        atomic_fetch_add(&live, 1);
    return q;
}

static void hook_free(void *p, void *arg)
{
    (void)arg;
    if (p != NULL)
        atomic_fetch_sub(&live, 1);
    free(p);
}

/* The hooks are installed before main() and stay: graft_alloc_hooks_set()
 * may only be called with no graft object alive (graft/common.h), and tests
 * switch budgets while endpoints' threads allocate. Only the atomics change;
 * until a budget is set they only count. */
__attribute__((constructor)) static void hooks_install(void)
{
    static const graft_alloc_hooks_t hooks = {hook_malloc, hook_realloc, hook_free, NULL};
    atomic_store(&counting_only, true);
    graft_alloc_hooks_set(&hooks);
}

void graft_test_alloc_fail_after(int budget)
{
    atomic_store(&counting_only, true); /* no refusal while resetting */
    atomic_store(&budget_left, budget);
    atomic_store(&calls, 0);
    atomic_store(&refused, 0);
    atomic_store(&counting_only, budget < 0);
}

void graft_test_alloc_restore(void)
{
    atomic_store(&counting_only, true);
}

int graft_test_alloc_calls(void)
{
    return atomic_load(&calls);
}

int graft_test_alloc_refused(void)
{
    return atomic_load(&refused);
}

int graft_test_alloc_live(void)
{
    return atomic_load(&live);
}
