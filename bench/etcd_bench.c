/*
 * etcd_bench: what graft's etcd client achieves against an embedded etcd on
 * loopback (sequential put, range and txn rates; put -> watch event
 * latency), printed beside `etcdctl check perf` run against the same server
 * in the same run.
 *
 *   etcd_bench [--json] [--ops N] [--rounds R] [--no-etcdctl]
 *
 * Rates are the median over R rounds of N sequential operations; latencies
 * are the median and 99th percentile over all samples.
 */
#include "bench_args.h"
#include "bench_stats.h"

#include <graft/etcd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "etcd_fixture.h"




typedef enum { OP_PUT, OP_RANGE, OP_TXN } op_t;

static int run_op(graft_etcd_t *c, op_t op, int i)
{
    char key[64], val[64];
    snprintf(key, sizeof(key), "/bench/k%04d", i % 1000);
    snprintf(val, sizeof(val), "value-%d", i);
    graft_status_t st = GRAFT_OK;
    if (op == OP_PUT) {
        st = graft_etcd_put(c, key, val, strlen(val), 0, NULL, NULL);
    } else if (op == OP_RANGE) {
        graft_etcd_range_result_t r;
        st = graft_etcd_range(c, key, NULL, &r);
        if (st == GRAFT_OK)
            graft_etcd_range_result_clear(&r);
    } else {
        /* The shape of a quorum update: compare a version, write on success. */
        graft_etcd_compare_t cmp = {.key = key, .target = GRAFT_ETCD_CMP_VERSION,
                                    .op = GRAFT_ETCD_CMP_GREATER, .number = -1};
        graft_etcd_op_t put = {.type = GRAFT_ETCD_OP_PUT, .key = key, .value = val,
                               .value_len = strlen(val)};
        graft_etcd_txn_result_t r;
        st = graft_etcd_txn(c, &cmp, 1, &put, 1, NULL, 0, &r);
        if (st == GRAFT_OK)
            graft_etcd_txn_result_clear(&r);
    }
    if (st != GRAFT_OK) {
        fprintf(stderr, "etcd_bench: %s\n", graft_status_string(st));
        return -1;
    }
    return 0;
}

/* Median rate over rounds of ops operations; also per-op latencies. */
static int measure_rate(graft_etcd_t *c, op_t op, int ops, int rounds, double *rate_p,
                        double *lat_med_p, double *lat_p99_p)
{
    double *rates = calloc((size_t)rounds, sizeof(double));
    double *lat = calloc((size_t)ops * (size_t)rounds, sizeof(double));
    int rc = -1;
    if (rates == NULL || lat == NULL)
        goto out;
    size_t nl = 0;
    for (int r = 0; r < rounds; r++) {
        double t0 = graft_test_now_s();
        for (int i = 0; i < ops; i++) {
            double a = graft_test_now_s();
            if (run_op(c, op, r * ops + i) != 0)
                goto out;
            lat[nl++] = graft_test_now_s() - a;
        }
        rates[r] = ops / (graft_test_now_s() - t0);
    }
    *rate_p = graft_test_percentile(rates, (size_t)rounds, 0.5);
    *lat_med_p = graft_test_percentile(lat, nl, 0.5);
    *lat_p99_p = graft_test_percentile(lat, nl, 0.99);
    rc = 0;
out:
    free(rates);
    free(lat);
    return rc;
}

static int measure_watch(graft_etcd_t *c, int samples, double *med_p, double *p99_p)
{
    graft_etcd_watch_t *w = NULL;
    double *lat = calloc((size_t)samples, sizeof(double));
    int rc = -1;
    if (lat == NULL || graft_etcd_watch_create(c, "/bench/watch/", 0, &w) != GRAFT_OK)
        goto out;
    for (int i = 0; i < samples; i++) {
        double t0 = graft_test_now_s();
        if (graft_etcd_put(c, "/bench/watch/k", "v", 1, 0, NULL, NULL) != GRAFT_OK)
            goto out;
        size_t got = 0;
        while (got == 0) {
            graft_etcd_event_t *ev = NULL;
            if (graft_etcd_watch_next(w, 2000, &ev, &got) != GRAFT_OK || got == 0) {
                fprintf(stderr, "etcd_bench: watch event missing\n");
                goto out;
            }
            graft_etcd_events_free(ev, got);
        }
        lat[i] = graft_test_now_s() - t0;
    }
    *med_p = graft_test_percentile(lat, (size_t)samples, 0.5);
    *p99_p = graft_test_percentile(lat, (size_t)samples, 0.99);
    rc = 0;
out:
    graft_etcd_watch_destroy(w);
    free(lat);
    return rc;
}

typedef struct perf {
    int ran;
    int passed;
    double writes_per_s;
    double slowest_s;
    double stddev_s;
} perf_t;

/* The first number after a keyword on its line. etcdctl words its lines
 * differently on pass and fail ("PASS: Slowest request took 0.01s",
 * "Slowest request took too long: 0.80s"), so only the keyword is fixed. */
static double number_after(const char *out, const char *keyword)
{
    const char *s = strstr(out, keyword);
    if (s == NULL)
        return 0;
    for (s += strlen(keyword); *s != '\0' && *s != '\n'; s++)
        if (*s >= '0' && *s <= '9')
            return strtod(s, NULL);
    return 0;
}

static void parse_perf(const char *out, perf_t *p)
{
    p->writes_per_s = number_after(out, "Throughput");
    p->slowest_s = number_after(out, "Slowest request");
    p->stddev_s = number_after(out, "Stddev");
    /* The verdict is etcdctl's last line: PASS or FAIL. */
    p->passed = strstr(out, "FAIL") == NULL && strstr(out, "PASS") != NULL;
    p->ran = p->writes_per_s > 0;
}

int main(int argc, char **argv)
{
    int ops = 200, rounds = 5;
    bool json = false, no_etcdctl = false;
    const graft_bench_arg_t cli[] = {
        GRAFT_BENCH_ARG("json", GRAFT_BENCH_FLAG, &json),
        GRAFT_BENCH_ARG("ops", GRAFT_BENCH_INT, &ops),
        GRAFT_BENCH_ARG("rounds", GRAFT_BENCH_INT, &rounds),
        GRAFT_BENCH_ARG("no-etcdctl", GRAFT_BENCH_FLAG, &no_etcdctl),
    };
    if (graft_bench_args(argc, argv, cli, GRAFT_BENCH_NARGS(cli),
                         "[--json] [--ops N] [--rounds R] [--no-etcdctl]") != 0)
        return 2;
    int with_etcdctl = !no_etcdctl;
    if (ops < 1 || rounds < 1)
        return 2;

    graft_test_etcd_t t;
    if (graft_test_etcd_start(&t, NULL) != 0)
        return 1;
    int rc = 1;
    double put_rate, put_med, put_p99, range_rate, range_med, range_p99, txn_rate, txn_med,
        txn_p99, w_med, w_p99;
    if (measure_rate(t.client, OP_PUT, ops, rounds, &put_rate, &put_med, &put_p99) != 0 ||
        measure_rate(t.client, OP_RANGE, ops, rounds, &range_rate, &range_med, &range_p99) != 0 ||
        measure_rate(t.client, OP_TXN, ops, rounds, &txn_rate, &txn_med, &txn_p99) != 0 ||
        measure_watch(t.client, ops, &w_med, &w_p99) != 0)
        goto out;

    perf_t perf = {0};
    if (with_etcdctl) {
        /* About a minute: etcdctl's small load runs for 60 s. */
        static char out[1 << 16];
        const char *args[] = {"check", "perf", "--load=s", NULL};
        fprintf(stderr, "etcd_bench: running etcdctl check perf (about 60 s)...\n");
        graft_test_etcdctl(graft_etcd_server_endpoint(t.server), out, sizeof(out), args);
        parse_perf(out, &perf);
        if (!perf.ran)
            fprintf(stderr, "etcd_bench: could not read etcdctl's output:\n%s\n", out);
    }

    printf("etcd client on loopback (embedded etcd %s), %d rounds x %d sequential ops\n",
           graft_etcd_server_endpoint(t.server), rounds, ops);
    printf("%-22s %12s %14s %14s\n", "operation", "ops/s (med)", "latency med", "latency p99");
    printf("%-22s %12.0f %12.3f ms %12.3f ms\n", "put", put_rate, put_med * 1e3, put_p99 * 1e3);
    printf("%-22s %12.0f %12.3f ms %12.3f ms\n", "range (one key)", range_rate,
           range_med * 1e3, range_p99 * 1e3);
    printf("%-22s %12.0f %12.3f ms %12.3f ms\n", "txn (cmp + put)", txn_rate, txn_med * 1e3,
           txn_p99 * 1e3);
    printf("%-22s %12s %12.3f ms %12.3f ms\n", "put -> watch event", "-", w_med * 1e3,
           w_p99 * 1e3);
    if (perf.ran)
        printf("etcdctl check perf --load=s (same server, 60 s, gRPC clients, rate-limited):\n"
               "  %s: throughput %.0f writes/s, slowest %.3f ms, stddev %.3f ms\n",
               perf.passed ? "PASS" : "FAIL", perf.writes_per_s, perf.slowest_s * 1e3,
               perf.stddev_s * 1e3);
    else
        printf("etcdctl check perf: not run\n");
    if (json)
        printf("{\"bench\":\"etcd\",\"ops\":%d,\"rounds\":%d,\"put_per_s\":%.1f,"
               "\"put_ms_median\":%.4f,\"put_ms_p99\":%.4f,\"range_per_s\":%.1f,"
               "\"range_ms_median\":%.4f,\"range_ms_p99\":%.4f,\"txn_per_s\":%.1f,"
               "\"txn_ms_median\":%.4f,\"txn_ms_p99\":%.4f,\"watch_ms_median\":%.4f,"
               "\"watch_ms_p99\":%.4f,\"etcdctl_ran\":%s,\"etcdctl_pass\":%s,"
               "\"etcdctl_writes_per_s\":%.1f,\"etcdctl_slowest_ms\":%.4f,"
               "\"etcdctl_stddev_ms\":%.4f}\n",
               ops, rounds, put_rate, put_med * 1e3, put_p99 * 1e3, range_rate, range_med * 1e3,
               range_p99 * 1e3, txn_rate, txn_med * 1e3, txn_p99 * 1e3, w_med * 1e3,
               w_p99 * 1e3, perf.ran ? "true" : "false", perf.passed ? "true" : "false",
               perf.writes_per_s, perf.slowest_s * 1e3, perf.stddev_s * 1e3);
    rc = 0;
out:
    graft_test_etcd_stop(&t);
    return rc;
}
