/*
 * The benchmarks' command lines: a table of long options ("--name value",
 * "--name=value" or a flag), parsed once here with getopt_long.
 */
#ifndef GRAFT_TEST_BENCH_ARGS_H
#define GRAFT_TEST_BENCH_ARGS_H

#include <stdbool.h>
#include <stddef.h>

#define GRAFT_BENCH_NARGS(a) (sizeof(a) / sizeof((a)[0]))

typedef enum graft_bench_arg_kind {
    GRAFT_BENCH_FLAG,   /* bool: set to true when given */
    GRAFT_BENCH_INT,    /* int (atoi) */
    GRAFT_BENCH_U32,    /* uint32_t (atoi) */
    GRAFT_BENCH_U64,    /* uint64_t (strtoull, any base: 0x..., 0...) */
    GRAFT_BENCH_SIZE,   /* size_t (atol) */
    GRAFT_BENCH_STR,    /* const char *: points into argv */
    GRAFT_BENCH_STRBUF, /* char[cap]: a copy, truncated to fit */
    GRAFT_BENCH_FN      /* fn(dst, value): 0, or nonzero after its own message */
} graft_bench_arg_kind_t;

typedef struct graft_bench_arg {
    const char *name; /* without the leading "--" */
    graft_bench_arg_kind_t kind;
    void *dst;
    size_t cap;                              /* GRAFT_BENCH_STRBUF */
    int (*fn)(void *dst, const char *value); /* GRAFT_BENCH_FN */
} graft_bench_arg_t;

/* Table entries: a value of `kind` stored at dst; a string copied into the
 * array buf; a value handed to fn with dst. */
#define GRAFT_BENCH_ARG(name, kind, dst) {(name), (kind), (dst), 0, NULL}
#define GRAFT_BENCH_ARG_BUF(name, buf) {(name), GRAFT_BENCH_STRBUF, (buf), sizeof(buf), NULL}
#define GRAFT_BENCH_ARG_FN(name, dst, fn) {(name), GRAFT_BENCH_FN, (dst), 0, (fn)}

/* Parse argv[1..argc) against the n options. An unknown option, a missing
 * value or a positional argument prints "usage: <argv[0]> <usage>" to
 * stderr. Returns 0, or 2 (the exit status the benchmarks use for a bad
 * command line). */
int graft_bench_args(int argc, char **argv, const graft_bench_arg_t *args, size_t n,
                     const char *usage);

#endif
