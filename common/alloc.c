#include "graft_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *default_malloc(size_t size, void *arg)
{
    (void)arg;
    return malloc(size);
}

static void *default_realloc(void *ptr, size_t size, void *arg)
{
    (void)arg;
    return realloc(ptr, size);
}

static void default_free(void *ptr, void *arg)
{
    (void)arg;
    free(ptr);
}

static graft_alloc_hooks_t hooks = {default_malloc, default_realloc, default_free, NULL};

void graft_alloc_hooks_set(const graft_alloc_hooks_t *h)
{
    if (h == NULL) {
        hooks = (graft_alloc_hooks_t){default_malloc, default_realloc, default_free, NULL};
        return;
    }
    hooks = *h;
}

void *graft__malloc(size_t size)
{
    return hooks.malloc_fn(size == 0 ? 1 : size, hooks.arg);
}

void *graft__calloc(size_t nmemb, size_t size)
{
    if (size != 0 && nmemb > SIZE_MAX / size)
        return NULL;
    void *p = graft__malloc(nmemb * size);
    if (p != NULL)
        memset(p, 0, nmemb * size);
    return p;
}

void *graft__realloc(void *ptr, size_t size)
{
    return hooks.realloc_fn(ptr, size == 0 ? 1 : size, hooks.arg);
}

void graft_free(void *ptr)
{
    if (ptr != NULL)
        hooks.free_fn(ptr, hooks.arg);
}

char *graft__strndup(const char *s, size_t n)
{
    char *p = graft__malloc(n + 1);
    if (p == NULL)
        return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *graft__strdup(const char *s)
{
    return graft__strndup(s, strlen(s));
}

char *graft__asprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *p = graft__malloc((size_t)n + 1);
    if (p == NULL)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}
