#include "graft_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

uint64_t graft__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t graft__wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void graft__sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

uint64_t graft__jitter_ns(uint64_t ns)
{
    /* xorshift64*, one state per thread, seeded from the clock and the
     * state's address (which differs between threads and processes). */
    static _Thread_local uint64_t x;
    if (x == 0)
        x = (graft__now_ns() ^ (uint64_t)(uintptr_t)&x ^ ((uint64_t)getpid() << 32)) | 1u;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    uint64_t r = x * 0x2545F4914F6CDD1Dull;
    uint64_t half = ns / 2;
    return half + (ns - half == 0 ? 0 : r % (ns - half + 1));
}

void graft__buf_init(graft_buf_t *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void graft__buf_free(graft_buf_t *b)
{
    graft_free(b->data);
    graft__buf_init(b);
}

void graft__buf_reset(graft_buf_t *b)
{
    b->len = 0;
    if (b->data != NULL)
        b->data[0] = '\0';
}

static graft_status_t buf_reserve(graft_buf_t *b, size_t extra)
{
    if (extra > SIZE_MAX - b->len - 1)
        return GRAFT_ENOMEM;
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return GRAFT_OK;
    size_t cap = b->cap < 256 ? 256 : b->cap;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *p = graft__realloc(b->data, cap);
    if (p == NULL)
        return GRAFT_ENOMEM;
    b->data = p;
    b->cap = cap;
    return GRAFT_OK;
}

graft_status_t graft__buf_append(graft_buf_t *b, const void *data, size_t len)
{
    graft_status_t st = buf_reserve(b, len);
    if (st != GRAFT_OK)
        return st;
    if (len > 0)
        memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
    return GRAFT_OK;
}

graft_status_t graft__buf_printf(graft_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return GRAFT_EINVAL;
    graft_status_t st = buf_reserve(b, (size_t)n);
    if (st != GRAFT_OK)
        return st;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return GRAFT_OK;
}

void graft__buf_consume(graft_buf_t *b, size_t n)
{
    if (n >= b->len) {
        graft__buf_reset(b);
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = '\0';
}
