/*
 * Clocks and order statistics shared by the benchmarks (and tests that
 * time something): a monotonic clock in seconds, the median and a
 * percentile of a sample. Each sorts the sample in place.
 */
#ifndef GRAFT_TEST_BENCH_STATS_H
#define GRAFT_TEST_BENCH_STATS_H

#include <stddef.h>

/* Seconds on CLOCK_MONOTONIC. */
double graft_test_now_s(void);

/* The median of v[0..n) (mean of the two middle values when n is even);
 * 0 when n is 0. */
double graft_test_median(double *v, size_t n);

/* The p-th quantile (0 <= p <= 1) of v[0..n), nearest rank; 0 when n is 0. */
double graft_test_percentile(double *v, size_t n, double p);

#endif
