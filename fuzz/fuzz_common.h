/*
 * Shared by the libFuzzer harnesses: a scratch directory for the harnesses
 * whose decoder reads a file, and small byte helpers. harness_init.c, linked
 * into every harness, turns logging off.
 */
#ifndef GRAFT_FUZZ_COMMON_H
#define GRAFT_FUZZ_COMMON_H

#include <graft/common.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A private directory under $TMPDIR, made once per process. */
static inline const char *fuzz_scratch_dir(void)
{
    static char dir[512];
    if (dir[0] == '\0') {
        const char *base = getenv("TMPDIR");
        snprintf(dir, sizeof(dir), "%s/graft-fuzz.XXXXXX", base && base[0] ? base : "/tmp");
        if (mkdtemp(dir) == NULL) {
            perror("mkdtemp");
            abort();
        }
    }
    return dir;
}

/* Replace path with exactly len bytes. */
static inline void fuzz_write_file(const char *path, const uint8_t *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL || (len > 0 && fwrite(data, 1, len, f) != len) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

static inline void fuzz_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t fuzz_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

#endif
