/*
 * HTTP helpers of the dashboard tests (compiled once, in tests/support): a free
 * loopback port and one request to a dashboard with libcurl.
 */
#ifndef GRAFT_TEST_GRAFTCTL_HTTP_H
#define GRAFT_TEST_GRAFTCTL_HTTP_H

#include "graftctl_fixture.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <sys/socket.h>

int gc_free_port(void);

/* One request; host NULL: curl's own (127.0.0.1:port), "" : no Host header
 * at all (HTTP/1.0). Returns the status, or -1 when none came. */
long gc_http(int port, const char *method, const char *path, const char *host,
             const char *auth, char **body_p);

#endif
