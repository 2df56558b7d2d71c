#include "graft_internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static const char *const level_names[] = {"off", "error", "warn", "info", "debug", "trace"};

static pthread_once_t level_once = PTHREAD_ONCE_INIT;
static graft_log_level_t threshold = GRAFT_LOG_WARN;
static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
static graft_log_fn sink_fn;
static void *sink_arg;

graft_status_t graft_log_level_parse(const char *name, graft_log_level_t *level_p)
{
    if (name == NULL)
        return GRAFT_EINVAL;
    for (size_t i = 0; i < GRAFT_ARRAY_SIZE(level_names); i++) {
        if (strcasecmp(name, level_names[i]) == 0) {
            *level_p = (graft_log_level_t)i;
            return GRAFT_OK;
        }
    }
    return GRAFT_EINVAL;
}

static void level_from_env(void)
{
    const char *env = getenv("GRAFT_LOG");
    graft_log_level_t level;
    if (env == NULL || *env == '\0')
        return;
    if (graft_log_level_parse(env, &level) == GRAFT_OK)
        threshold = level;
    else
        fprintf(stderr, "graft: ignoring GRAFT_LOG=%s (want off|error|warn|info|debug|trace)\n",
                env);
}

void graft_log_level_set(graft_log_level_t level)
{
    pthread_once(&level_once, level_from_env);
    __atomic_store_n(&threshold, level, __ATOMIC_RELAXED);
}

graft_log_level_t graft_log_level_get(void)
{
    pthread_once(&level_once, level_from_env);
    return __atomic_load_n(&threshold, __ATOMIC_RELAXED);
}

bool graft__log_enabled(graft_log_level_t level)
{
    return level != GRAFT_LOG_OFF && level <= graft_log_level_get();
}

void graft_log_sink_set(graft_log_fn fn, void *arg)
{
    pthread_mutex_lock(&sink_lock);
    sink_fn = fn;
    sink_arg = arg;
    pthread_mutex_unlock(&sink_lock);
}

void graft__log(graft_log_level_t level, const char *module, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    pthread_mutex_lock(&sink_lock);
    if (sink_fn != NULL) {
        sink_fn(level, module, msg, sink_arg);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        localtime_r(&ts.tv_sec, &tm);
        fprintf(stderr, "[%02d:%02d:%02d.%03ld] graft %-5s %s[%d]: %s\n", tm.tm_hour,
                tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, level_names[level], module,
                (int)getpid(), msg);
    }
    pthread_mutex_unlock(&sink_lock);
}
