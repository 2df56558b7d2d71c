/*
 * Allocation-failure torture for tests: graft's allocation hooks set to
 * allow a budget of allocations and refuse every one after it, so that a
 * test can fail the n-th allocation of an operation for every n. Safe to
 * use while the library allocates from several threads.
 */
#ifndef GRAFT_TEST_ALLOC_FAIL_H
#define GRAFT_TEST_ALLOC_FAIL_H

/* The next @budget allocations succeed, later ones
 * return NULL. A negative budget never refuses (it only counts). Resets
 * the counters. */
void graft_test_alloc_fail_after(int budget);

/* Stop refusing: every allocation succeeds again (plain malloc/realloc;
 * the hooks stay installed, see alloc_fail.c). */
void graft_test_alloc_restore(void);

/* Allocation calls since the last graft_test_alloc_fail_after(). */
int graft_test_alloc_calls(void);

/* Of those, how many were refused. */
int graft_test_alloc_refused(void);

/* Blocks allocated through graft's hooks and not yet freed, since the
 * program started: equal before and after an operation that keeps
 * nothing, so a test sees a leak without a sanitizer. */
int graft_test_alloc_live(void);

#endif
