/*
 * graftctl: the operator's command line. One file per command family:
 * graftctl_main.c (options, dispatch), graftctl_job.c (status, watch,
 * drift, evict), graftctl_events.c (events) and graftctl_ckpt.c
 * (checkpoint roots, without etcd); below the commands, graftctl_conn.c
 * (the connection to etcd), graftctl_util.c (numbers, clocks, times,
 * printing JSON) and graftctl_text.c, which escapes what others wrote
 * before it is printed; graftctl_help.c has each command's --help.
 * No file calls back up into one that calls it. Public headers only.
 *
 * Exit status: 0 success, 1 failure (etcd unreachable, unknown job, a
 * checkpoint that does not verify, ...), 2 bad usage.
 */
#ifndef GRAFTCTL_H
#define GRAFTCTL_H

#include <graft/common.h>
#include <graft/etcd.h>
#include <graft/membership.h>

#include <jansson.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GRAFTCTL_OK 0
#define GRAFTCTL_FAIL 1
#define GRAFTCTL_USAGE 2

/* Options common to every command, from flags or GRAFT_* variables. */
typedef struct graftctl_opts {
    const char *endpoints_text; /* as given, for messages */
    char **endpoints;
    size_t n_endpoints;
    const char *job;
    const char *user;
    const char *password;
    const char *ca_file;
    const char *cert_file;
    const char *key_file;
    uint32_t timeout_ms;
    bool json;
    bool yes;
} graftctl_opts_t;

/* An etcd client and an observer of the job, after checking that etcd
 * answers and the job exists. */
typedef struct graftctl_conn {
    graft_etcd_t *etcd;
    graft_membership_t *obs;
    char prefix[96]; /* /graft/<job>/ */
} graftctl_conn_t;

/* Connect (graftctl_conn.c; prints the error and returns GRAFTCTL_FAIL on
 * failure). */
int graftctl_connect(const graftctl_opts_t *o, graftctl_conn_t *c);
/* The same, with the message in why (len bytes) instead of on stderr. */
int graftctl_connect_why(const graftctl_opts_t *o, graftctl_conn_t *c, char *why, size_t len);
void graftctl_disconnect(graftctl_conn_t *c);

/* Commands: argv[0] is the command's name; each returns an exit status. */
int graftctl_cmd_status(const graftctl_opts_t *o, int argc, char **argv);
int graftctl_cmd_watch(const graftctl_opts_t *o, int argc, char **argv);
int graftctl_cmd_drift(const graftctl_opts_t *o, int argc, char **argv);
int graftctl_cmd_evict(const graftctl_opts_t *o, int argc, char **argv);
int graftctl_cmd_events(const graftctl_opts_t *o, int argc, char **argv);
int graftctl_cmd_ckpt(const graftctl_opts_t *o, int argc, char **argv);

int graftctl_cmd_dashboard(const graftctl_opts_t *o, int argc, char **argv);

/* Prints the help of command cmd (sub: its first argument, for `ckpt SUB`)
 * on stdout (graftctl_help.c); false for a command that has none. */
bool graftctl_help_print(const char *cmd, const char *sub);

/* Views shared by the commands and the dashboard (json_t *, owned by the
 * caller). The status: groups, ranks, health and the latest quorum; NULL
 * with *st_p set on failure. */
json_t *graftctl_status_json(graftctl_conn_t *c, const char *job, graft_status_t *st_p);
/* One event. */
json_t *graftctl_event_json(const graft_event_t *e);
/* The recovery that ev[done_i] (a recovery_done) ends, with its phases cut
 * from the events before it (graftctl_events.c). */
json_t *graftctl_recovery_json(const graft_event_t *ev, size_t n, size_t done_i);

/* The job's states from more than one record (graftctl_state.c): the
 * detail of the group's newest failed vote when it names a config mismatch
 * and no rank of the group joined since (NULL otherwise); and, for a
 * status with ranks live whose groups' progress records are all stale
 * (older than three record periods and three of the group's steps),
 * state "paused" with its "state_reason". */
const char *graftctl_group_mismatch(const graft_event_t *ev, size_t nev, uint32_t group);
void graftctl_job_pause_check(json_t *status, const graft_event_t *ev, size_t nev);
/* Failed votes in a row that make a group "voting-no", and how recent the
 * newest of them must be (graftctl_state.c). */
#define GRAFTCTL_VOTING_NO_AFTER 3
#define GRAFTCTL_VOTING_NO_WITHIN_MS 15000
/* Whether the group votes no repeatedly: GRAFTCTL_VOTING_NO_AFTER failed
 * votes (a config mismatch aside) since its newest join, none before the
 * step its progress record last reported (@p committed: 0 without one),
 * the newest within GRAFTCTL_VOTING_NO_WITHIN_MS. Writes the reason (the
 * count and the newest vote's detail, which names the rank that voted no
 * and why) into why and returns true. */
bool graftctl_group_voting_no(const graft_event_t *ev, size_t nev, uint32_t group,
                              uint64_t committed, uint64_t now_ms, char *why, size_t len);
/* Why a group is "cannot-serve": its ranks whose member record says so,
 * and the newest GRAFT_CANNOT_SERVE_TEXT error event of the group (the
 * accept failures the rank counted), written into why. */
void graftctl_group_cannot_serve_reason(const graft_membership_view_t *v, const graft_event_t *ev,
                                        size_t nev, uint32_t group, char *why, size_t len);

/* A folder of job folders (graftctl_ckpt_jobs.c): each folder under root
 * that holds step-* folders, as {"job", "checkpoints", "newest_step"}, by
 * name; and that list for a person (or as JSON). */
json_t *graftctl_ckpt_job_folders(const char *root);
void graftctl_ckpt_jobs_print(const char *root, json_t *jobs, bool json);

/* Text from etcd or a checkpoint file, for a human output
 * (graftctl_text.c): printable UTF-8 as it is, control characters (C0,
 * DEL, C1), bidirectional overrides and bytes that are not UTF-8 escaped
 * (\x1b, \u{9b}, ...); escaping twice changes nothing. Writes into buf
 * (len bytes; longer text ends in "...") and returns it; "" for NULL. */
#define GRAFTCTL_TEXT_LEN 4096
const char *graftctl_text(const char *s, char *buf, size_t len);
/* s as a JSON string: as it is when it is UTF-8 (jansson escapes control
 * characters), else in graftctl_text()'s form. */
json_t *graftctl_json_text(const char *s);

/* Helpers shared by the commands (graftctl_util.c). */
void graftctl_print_json(void *json_t_root); /* prints and decrefs a json_t */
bool graftctl_parse_u64(const char *s, uint64_t *v_p);
uint64_t graftctl_now_ms(void);
/* Unix milliseconds as local "YYYY-MM-DD HH:MM:SS.mmm", for a person
 * (--json keeps the number). */
const char *graftctl_time_text(uint64_t unix_ms, char *buf, size_t len);

#endif
