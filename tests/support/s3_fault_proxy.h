/*
 * An HTTP proxy on loopback in front of the S3 fixture's server that
 * injects faults at the HTTP level: the next N requests whose request line
 * contains a pattern are answered with a given status (e.g. 503 with
 * Retry-After) and never reach the store. Every request is forwarded on a
 * connection of its own ("Connection: close"), so each one is seen.
 */
#ifndef GRAFT_TEST_S3_FAULT_PROXY_H
#define GRAFT_TEST_S3_FAULT_PROXY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "s3_fixture.h"

typedef struct graft_test_s3_proxy {
    int listen_fd;
    int upstream_port;
    int port;
    char endpoint[64]; /* http://127.0.0.1:<port> */
    pthread_t thread;
    atomic_bool stop;
    pthread_mutex_t mu;
    char pattern[128];  /* in the request line, e.g. "partNumber=" */
    int inject_left;    /* requests still to answer with status */
    int status;         /* e.g. 503 */
    int retry_after_s;  /* > 0: a Retry-After header */
    int pass_left;      /* matching requests still let through before injecting */
    int delay_ms;       /* status 0: forward each hit this late instead */
    atomic_int delayed;
    atomic_int injected;
    atomic_int forwarded;
    atomic_int live;    /* connection threads running */
} graft_test_s3_proxy_t;

/* Start the proxy in front of 127.0.0.1:upstream_port. Returns 0 or -1. */
int graft_test_s3_proxy_start(graft_test_s3_proxy_t *p, int upstream_port);

/* Answer the next count requests whose request line contains pattern with
 * status (and Retry-After when retry_after_s > 0). */
void graft_test_s3_proxy_inject(graft_test_s3_proxy_t *p, const char *pattern, int count,
                                int status, int retry_after_s);

/* The same, after letting the next pass requests matching pattern
 * through. */
void graft_test_s3_proxy_inject_after(graft_test_s3_proxy_t *p, const char *pattern, int pass,
                                      int count, int status, int retry_after_s);

/* A slow store: the next count requests matching pattern reach it (and
 * their answers come back) delay_ms late. */
void graft_test_s3_proxy_delay(graft_test_s3_proxy_t *p, const char *pattern, int count,
                               int delay_ms);

void graft_test_s3_proxy_stop(graft_test_s3_proxy_t *p);

/* A store behind the proxy: graft_test_s3_setup(s3, bucket), then the proxy
 * in front of it. Returns 0 when both run, 1 when the test is to skip (no
 * moto_server; nothing started), -1 on failure (nothing left running). */
int graft_test_s3_proxied_setup(graft_test_s3_t *s3, graft_test_s3_proxy_t *proxy,
                                const char *bucket);

#endif
