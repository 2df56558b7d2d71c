/*
 * Small helpers every part of the live engine uses (growing arrays, making
 * directories, recording why a run failed, the run's namespaces), in a file
 * of their own so that the engine's files call down into it rather than
 * into each other.
 */
#include "sim_live_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* --netns: the namespaces of this run (NULL without --netns). */
graft_sim_netns_t *graft_sim_net;

int graft_sim_grow(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap) {
        return 0;
    }
    size_t nc = *cap ? *cap * 2 : 64;
    void *na = realloc(*arr, nc * elem);
    if (na == NULL) {
        return -1;
    }
    *arr = na;
    *cap = nc;
    return 0;
}

/* Creates the directories above path (not path itself). */
void graft_sim_mkdirs(const char *path)
{
    char *buf = strdup(path);
    for (char *s = buf != NULL ? buf + 1 : NULL; s != NULL && *s; s++) {
        if (*s == '/') {
            *s = '\0';
            mkdir(buf, 0755);
            *s = '/';
        }
    }
    free(buf);
}

void graft_sim_run_fail(graft_sim_run_t *r, const char *fmt, ...)
{
    if (r->res->error != NULL) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&r->res->error, fmt, ap) < 0) {
        r->res->error = NULL;
    }
    va_end(ap);
}
