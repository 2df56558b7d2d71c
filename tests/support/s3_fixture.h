/*
 * Test helpers around a real S3-compatible server: the standalone server
 * of PyPI's moto (moto[server], installed into $BUILD/venv by
 * scripts/python-env.sh from tests/python-requirements.txt), started on a
 * free loopback port in a temporary directory, as etcd_fixture.c does for
 * etcd. Public headers only.
 */
#ifndef GRAFT_TEST_S3_FIXTURE_H
#define GRAFT_TEST_S3_FIXTURE_H

#include <graft/persist.h>

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct graft_test_s3 {
    pid_t pid;
    int port;
    char dir[256];       /* temporary directory: the server's cwd and log */
    char server[512];    /* the moto_server program */
    char endpoint[64];   /* http://127.0.0.1:<port> */
    char bucket[64];
    char skip_reason[512];
    int auth;            /* 0: unchecked; 1: every key refused; 2: a key of its own */
    char key_id[64];     /* the credentials the fixture uses (and sets as AWS_*) */
    char secret[96];
} graft_test_s3_t;

/* The credentials the tests use; set into the environment (AWS_*) by
 * graft_test_s3_start(). */
#define GRAFT_TEST_S3_KEY_ID "graft-test-key"
#define GRAFT_TEST_S3_SECRET "graft-test-secret"

/* Start the server and create bucket. Returns 0 on success, 1 when no
 * moto_server can be found (skip_reason says why and how to install it),
 * -1 (with a message on stderr) on failure. */
int graft_test_s3_start(graft_test_s3_t *t, const char *bucket);

/* graft_test_s3_start(), saying on stderr why it skips or fails. */
int graft_test_s3_setup(graft_test_s3_t *t, const char *bucket);

/* The same, with the server checking every request's credentials once the
 * bucket is made (moto's INITIAL_NO_AUTH_ACTION_COUNT=1). It knows no key,
 * so every later request is refused (403 InvalidAccessKeyId). */
int graft_test_s3_start_auth(graft_test_s3_t *t, const char *bucket);

/* The same, but the server also makes a user allowed everything and an
 * access key for it (its IAM API, before checking starts), set into
 * AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY: every request is then checked,
 * its SigV4 signature included. Returns as graft_test_s3_start(). */
int graft_test_s3_start_signed(graft_test_s3_t *t, const char *bucket);

/* Kill the server (SIGKILL): every request fails until a restart. */
void graft_test_s3_kill(graft_test_s3_t *t);

/* Start it again on the same port. moto keeps its state in memory, so
 * the restarted store is empty: the bucket is created again at once.
 * Returns 0 or -1. */
int graft_test_s3_restart(graft_test_s3_t *t);

/* Stop the server and remove the directory. */
void graft_test_s3_stop(graft_test_s3_t *t);

/* A remote tier configuration for s3://<bucket>/<prefix> at the server,
 * with small back-offs for tests. */
graft_persist_remote_config_t graft_test_s3_remote(const graft_test_s3_t *t, const char *prefix);

/* Signed GET/PUT/DELETE of one object (key below the bucket) with the test
 * credentials. get: *data_p (malloc'd) and *len_p. Return the HTTP status,
 * -1 when the request could not be made. */
long graft_test_s3_get(const graft_test_s3_t *t, const char *key, uint8_t **data_p, size_t *len_p);
long graft_test_s3_put(const graft_test_s3_t *t, const char *key, const uint8_t *data, size_t len);
long graft_test_s3_delete(const graft_test_s3_t *t, const char *key);

/* Every key in the bucket below prefix, newline-separated (malloc'd);
 * NULL on failure. */
char *graft_test_s3_keys(const graft_test_s3_t *t, const char *prefix);

#endif
