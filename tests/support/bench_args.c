/* The benchmarks' command-line parsing (bench_args.h). */
#include "bench_args.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int usage_error(char **argv, const char *usage)
{
    fprintf(stderr, "usage: %s %s\n", argv[0], usage);
    return 2;
}

static int store(const graft_bench_arg_t *a, const char *value)
{
    switch (a->kind) {
    case GRAFT_BENCH_FLAG:
        *(bool *)a->dst = true;
        return 0;
    case GRAFT_BENCH_INT:
        *(int *)a->dst = atoi(value);
        return 0;
    case GRAFT_BENCH_U32:
        *(uint32_t *)a->dst = (uint32_t)atoi(value);
        return 0;
    case GRAFT_BENCH_U64:
        *(uint64_t *)a->dst = strtoull(value, NULL, 0);
        return 0;
    case GRAFT_BENCH_SIZE:
        *(size_t *)a->dst = (size_t)atol(value);
        return 0;
    case GRAFT_BENCH_STR:
        *(const char **)a->dst = value;
        return 0;
    case GRAFT_BENCH_STRBUF:
        snprintf((char *)a->dst, a->cap, "%s", value);
        return 0;
    case GRAFT_BENCH_FN:
        return a->fn(a->dst, value) == 0 ? 0 : 2;
    }
    return 2;
}

int graft_bench_args(int argc, char **argv, const graft_bench_arg_t *args, size_t n,
                     const char *usage)
{
    /* getopt_long answers '?' (63) for an unknown option: the options'
     * own values stay below it. */
    struct option *longopts = n < '?' - 1 ? calloc(n + 1, sizeof(*longopts)) : NULL;
    if (longopts == NULL)
        return 2;
    for (size_t i = 0; i < n; i++) {
        longopts[i].name = args[i].name;
        longopts[i].has_arg = args[i].kind == GRAFT_BENCH_FLAG ? no_argument : required_argument;
        longopts[i].val = (int)i + 1;
    }
    int rc = 0, opt;
    optind = 1;
    while (rc == 0 && (opt = getopt_long(argc, argv, "", longopts, NULL)) != -1)
        rc = opt >= 1 && (size_t)opt <= n ? store(&args[opt - 1], optarg)
                                          : usage_error(argv, usage);
    if (rc == 0 && optind < argc)
        rc = usage_error(argv, usage);
    free(longopts);
    return rc;
}
