/*
 * graftctl: small helpers every command shares (numbers, clocks, times for
 * a person, printing JSON). Below the commands; calls none of them.
 */
#include "graftctl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <jansson.h>

const char *graftctl_time_text(uint64_t unix_ms, char *buf, size_t len)
{
    time_t t = (time_t)(unix_ms / 1000u);
    struct tm tm;
    char day[32];
    if (localtime_r(&t, &tm) == NULL || strftime(day, sizeof(day), "%Y-%m-%d %H:%M:%S", &tm) == 0)
        snprintf(buf, len, "%" PRIu64, unix_ms);
    else
        snprintf(buf, len, "%s.%03u", day, (unsigned)(unix_ms % 1000u));
    return buf;
}

bool graftctl_parse_u64(const char *s, uint64_t *v_p)
{
    char *end = NULL;
    if (s == NULL || *s == '\0' || *s == '-')
        return false;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return false;
    *v_p = v;
    return true;
}

uint64_t graftctl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void graftctl_print_json(void *root)
{
    json_t *j = root;
    if (j == NULL) {
        fprintf(stderr, "graftctl: out of memory\n");
        return;
    }
    /* ASCII only: a C1 control (U+0080..U+009F) that jansson would write
     * as UTF-8 reaches a terminal as \u0080..\u009f instead. */
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
    if (text != NULL)
        printf("%s\n", text);
    free(text);
    json_decref(j);
}
