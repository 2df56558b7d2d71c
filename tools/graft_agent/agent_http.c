/*
 * graft-agent: /metrics (Prometheus text) and /status (the JSON status)
 * over HTTP with libmicrohttpd, as graftctl's dashboard serves its own.
 * Read-only: GET and HEAD only; the bodies are the last ones the loop made
 * (agent_report), copied under the report lock.
 */
#include "agent.h"
#include "../common/http_answer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_len, void **ctx)
{
    agent_t *a = cls;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return tool_http_answer(conn, 405, "text/plain", strdup("GET only\n"));
    bool metrics = strcmp(url, "/metrics") == 0;
    if (!metrics && strcmp(url, "/status") != 0)
        return tool_http_answer(conn, 404, "text/plain",
                                strdup("graft-agent serves /metrics and /status\n"));
    pthread_mutex_lock(&a->report_mu);
    const char *src = metrics ? a->metrics_text : a->status_json;
    char *body = strdup(src != NULL ? src : "");
    pthread_mutex_unlock(&a->report_mu);
    return tool_http_answer(conn, 200, metrics ? "text/plain; version=0.0.4" : "application/json",
                            body);
}

/* "HOST:PORT" (HOST an IPv4 address; empty: every address). */
static bool parse_listen(const char *s, struct sockaddr_in *sa)
{
    const char *colon = strrchr(s, ':');
    char host[64];
    char *end = NULL;
    if (colon == NULL || (size_t)(colon - s) >= sizeof(host))
        return false;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (colon[1] == '\0' || *end != '\0' || port > 65535)
        return false;
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (host[0] == '\0')
        sa->sin_addr.s_addr = htonl(INADDR_ANY);
    else if (inet_pton(AF_INET, strcmp(host, "localhost") == 0 ? "127.0.0.1" : host,
                       &sa->sin_addr) != 1)
        return false;
    return true;
}

bool agent_http_start(agent_t *a, char *why, size_t len)
{
    struct sockaddr_in sa;
    if (a->o.listen == NULL)
        return true;
    if (!parse_listen(a->o.listen, &sa)) {
        snprintf(why, len, "--listen '%s': give IPV4:PORT (e.g. 127.0.0.1:9470 or :9470)",
                 a->o.listen);
        return false;
    }
    errno = 0;
    a->http = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, on_request, a,
                               MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                               MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_END);
    if (a->http == NULL) {
        snprintf(why, len, "cannot listen on %s: %s", a->o.listen,
                 errno != 0 ? strerror(errno) : "libmicrohttpd refused");
        return false;
    }
    return true;
}

void agent_http_stop(agent_t *a)
{
    if (a->http != NULL)
        MHD_stop_daemon(a->http);
    a->http = NULL;
}
