/*
 * graftctl prints what others wrote (event details, member addresses, a
 * checkpoint's names and code revision) with control characters escaped:
 * whoever can write the job's etcd records or a checkpoint root must not
 * drive the operator's terminal. Against a real etcd, with records written
 * through the library as a job would write them:
 *
 *  - `events`, `drift` and `status` (human output) show ESC, BEL, a C1
 *    control and bytes that are not UTF-8 as \x1b, \x07, \u{9b}, \xff,
 *    and no such byte reaches stdout;
 *  - their --json output carries the same text JSON-escaped (decoded, it is
 *    the bytes written), or, for bytes that are not UTF-8, the escaped form;
 *  - `ckpt inspect` and `ckpt ls` escape a manifest's region name and code
 *    revision alike.
 */
#include "graftctl_fixture.h"

#include <graft/persist.h>

/* ESC sequences (colour, window title), BEL and a C1 CSI (U+009B, UTF-8). */
static const char hostile[] =
    "red \x1b[31mALERT\x1b[0m bell\a title \x1b]0;owned\x07 csi \xc2\x9b end";
static const char hostile_shown[] =
    "red \\x1b[31mALERT\\x1b[0m bell\\x07 title \\x1b]0;owned\\x07 csi \\u{9b} end";
/* Bytes that are not UTF-8, among them a raw 8-bit CSI (0x9b). */
static const char not_utf8[] = "bytes \xff\xfe raw \x9b end";
static const char not_utf8_shown[] = "bytes \\xff\\xfe raw \\x9b end";

/* Output a terminal shows as it is: valid UTF-8 with no C0 control but the
 * newline, no DEL and no C1 control. Checked byte by byte, apart from the
 * code under test. */
static void assert_terminal_safe(const char *what, const char *out)
{
    const unsigned char *p = (const unsigned char *)out;
    size_t at = 0;
    while (p[at] != '\0') {
        unsigned c = p[at];
        size_t n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
                                : (c & 0xf8) == 0xf0 ? 4 : 0;
        bool bad = n == 0 || (c < 0x20 && c != '\n') || c == 0x7f || c == 0xc0 || c == 0xc1;
        for (size_t i = 1; !bad && i < n; i++)
            bad = (p[at + i] & 0xc0) != 0x80;
        if (!bad && n == 2) {
            unsigned cp = ((c & 0x1fu) << 6) | (p[at + 1] & 0x3fu);
            bad = cp >= 0x80 && cp <= 0x9f;
        }
        if (bad)
            fail_msg("%s: byte 0x%02x at offset %zu reaches the terminal raw:\n%s", what, c, at,
                     out);
        at += n;
    }
}

static graft_membership_t *member(const char *job, const char *address)
{
    const char *eps[] = {gc_endpoint};
    graft_etcd_config_t ec = {.endpoints = eps, .n_endpoints = 1};
    graft_membership_config_t mc = {.job = job, .etcd = &ec, .group = 0,
                                    .transfer_address = address};
    graft_membership_t *m = NULL;
    assert_int_equal(graft_membership_create(&mc, &m), GRAFT_OK);
    return m;
}

static void append(graft_membership_t *m, graft_event_kind_t kind, const char *detail)
{
    graft_event_t e = {.kind = kind, .group = 0, .step = 7, .detail = (char *)detail};
    assert_int_equal(graft_membership_event_append(m, &e), GRAFT_OK);
}

/* The detail of the event of the given kind with the given step in
 * `events --json`. */
static const char *json_detail(json_t *events, const char *kind, size_t nth)
{
    size_t i, seen = 0;
    json_t *e;
    json_array_foreach(json_object_get(events, "events"), i, e)
        if (strcmp(json_string_value(json_object_get(e, "kind")), kind) == 0 && seen++ == nth)
            return json_string_value(json_object_get(e, "detail"));
    return NULL;
}

static void test_events_escaped(void **state)
{
    graft_membership_t *m = member("escape-events", "127.0.0.1:1");
    append(m, GRAFT_EVENT_ERROR, hostile);
    append(m, GRAFT_EVENT_ERROR, not_utf8);

    char *out = NULL, *err = NULL;
    assert_int_equal(gc_run_ctl((const char *[]){"--etcd", gc_endpoint, "--job", "escape-events",
                                                 "events", "--kind", "error", NULL},
                                &out, &err),
                     0);
    assert_terminal_safe("events", out);
    if (strstr(out, hostile_shown) == NULL || strstr(out, not_utf8_shown) == NULL)
        fail_msg("events does not show the details escaped:\n%s", out);
    free(out);
    free(err);

    /* JSON stays JSON: jansson escapes the controls (\u001b), and the
     * decoded string is the bytes written; a detail that is not UTF-8
     * cannot be a JSON string and comes escaped. */
    assert_int_equal(gc_run_ctl((const char *[]){"--etcd", gc_endpoint, "--job", "escape-events",
                                                 "--json", "events", "--kind", "error", NULL},
                                &out, NULL),
                     0);
    assert_terminal_safe("events --json", out);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_string_equal(json_detail(j, "error", 0), hostile);
    assert_string_equal(json_detail(j, "error", 1), not_utf8_shown);
    json_decref(j);
    free(out);
    graft_membership_destroy(m);
}

static void test_drift_escaped(void **state)
{
    graft_membership_t *m = member("escape-drift", "127.0.0.1:1");
    append(m, GRAFT_EVENT_DRIFT, hostile);
    char *out = NULL;
    /* Drift in the history: exit 1. */
    assert_int_equal(gc_run_ctl((const char *[]){"--etcd", gc_endpoint, "--job", "escape-drift",
                                                 "drift", NULL},
                                &out, NULL),
                     1);
    assert_terminal_safe("drift", out);
    if (strstr(out, hostile_shown) == NULL)
        fail_msg("drift does not show the detail escaped:\n%s", out);
    free(out);
    assert_int_equal(gc_run_ctl((const char *[]){"--etcd", gc_endpoint, "--job", "escape-drift",
                                                 "--json", "drift", NULL},
                                &out, NULL),
                     1);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(j, "last_drift"), "detail")), hostile);
    json_decref(j);
    free(out);
    graft_membership_destroy(m);
}

/* A member's transfer address is the member's own word: a clear-screen
 * sequence in it would hide the rows above it. */
static void test_status_escaped(void **state)
{
    static const char address[] = "127.0.0.1:9\x1b[2J\x1b[H";
    graft_membership_t *m = member("escape-status", address);
    char *out = NULL;
    assert_int_equal(gc_run_ctl((const char *[]){"--etcd", gc_endpoint, "--job", "escape-status",
                                                 "status", NULL},
                                &out, NULL),
                     0);
    assert_terminal_safe("status", out);
    if (strstr(out, "127.0.0.1:9\\x1b[2J\\x1b[H") == NULL)
        fail_msg("status does not show the address escaped:\n%s", out);
    free(out);
    json_t *st = gc_ctl_json((const char *[]){"--etcd", gc_endpoint, "--job", "escape-status",
                                              "--json", "status", NULL});
    assert_string_not_equal(gc_group_health(st, 0), "absent");
    json_t *g = json_array_get(json_object_get(st, "groups"), 0);
    json_t *r = json_array_get(json_object_get(g, "ranks"), 0);
    assert_string_equal(json_string_value(json_object_get(r, "transfer_address")), address);
    json_decref(st);
    graft_membership_destroy(m);
}

/* An error event that reports a quorum record which does not decode is
 * shown by status; its detail, bytes that are not UTF-8 and a
 * clear-screen sequence included, neither breaks the status (--json
 * would have no string for it) nor reaches the terminal raw. */
static void test_status_quorum_record_escaped(void **state)
{
    char detail[256];
    snprintf(detail, sizeof(detail), "%s at %s", GRAFT_MEMBERSHIP_QUORUM_BAD_TEXT,
             "/graft/x/quorum \xff\x1b[2J does not decode");
    graft_membership_t *m = member("escape-record", "127.0.0.1:1");
    append(m, GRAFT_EVENT_ERROR, detail);
    char *out = NULL, *err = NULL;
    int rc = gc_run_ctl((const char *[]){"--etcd", gc_endpoint, "--job", "escape-record", "status",
                                         NULL},
                        &out, &err);
    if (rc != 0)
        fail_msg("status exited %d: %s", rc, err);
    assert_terminal_safe("status", out);
    if (strstr(out, "/graft/x/quorum \\xff\\x1b[2J does not decode") == NULL)
        fail_msg("status does not show the record's event escaped:\n%s", out);
    free(out);
    free(err);
    json_t *st = gc_ctl_json((const char *[]){"--etcd", gc_endpoint, "--job", "escape-record",
                                              "--json", "status", NULL});
    assert_non_null(strstr(json_string_value(json_object_get(st, "quorum_record")),
                           "\\xff\\x1b[2J"));
    json_decref(st);
    graft_membership_destroy(m);
}

/* A checkpoint root is a file system the operator may not own alone: a
 * manifest's region name and code revision are shown escaped. */
static void test_ckpt_escaped(void **state)
{
    char root[PATH_MAX + 32];
    snprintf(root, sizeof(root), "%s/escape-ckpt", gc_tmpdir);
    static const char revision[] = "v1\x1b]0;owned\x07\xc2\x9b";
    static const char name[] = "weights\x1b[2J";
    graft_persist_config_t cfg = {.root = root, .code_revision = revision};
    graft_persist_writer_t *w = NULL;
    assert_int_equal(graft_persist_writer_create(&cfg, &w), GRAFT_OK);
    uint8_t bytes[4096];
    memset(bytes, 0x5a, sizeof(bytes));
    graft_persist_region_t reg = {.name = name, .kind = GRAFT_PERSIST_KIND_PARAM,
                                  .device = GRAFT_PERSIST_DEVICE_HOST, .ptr = bytes,
                                  .bytes = sizeof(bytes)};
    const graft_persist_region_t *ranks[] = {&reg};
    const size_t nregions[] = {1};
    assert_int_equal(graft_persist_save(w, 5, 1, ranks, nregions, NULL), GRAFT_OK);
    graft_persist_write_result_t res;
    assert_int_equal(graft_persist_wait(w, 5, &res), GRAFT_OK);
    graft_persist_writer_destroy(w);

    char *out = NULL, *err = NULL;
    int rc = gc_run_ctl((const char *[]){"ckpt", "inspect", root, "5", NULL}, &out, &err);
    if (rc != 0)
        fail_msg("ckpt inspect exited %d: %s", rc, err);
    assert_terminal_safe("ckpt inspect", out);
    if (strstr(out, "code revision v1\\x1b]0;owned\\x07\\u{9b}") == NULL ||
        strstr(out, "weights\\x1b[2J") == NULL)
        fail_msg("ckpt inspect does not show the names escaped:\n%s", out);
    free(out);
    free(err);
    json_t *j = gc_ctl_json((const char *[]){"--json", "ckpt", "inspect", root, "5", NULL});
    json_t *mf = json_object_get(j, "manifest");
    assert_string_equal(json_string_value(json_object_get(mf, "code_revision")), revision);
    json_decref(j);
    assert_int_equal(gc_run_ctl((const char *[]){"ckpt", "ls", root, NULL}, &out, NULL), 0);
    assert_terminal_safe("ckpt ls", out);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events_escaped),
        cmocka_unit_test(test_drift_escaped),
        cmocka_unit_test(test_status_escaped),
        cmocka_unit_test(test_status_quorum_record_escaped),
        cmocka_unit_test(test_ckpt_escaped),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, gc_setup, gc_teardown);
}
