/*
 * The HTTP answer graftctl's dashboard and graft-agent share: a body they
 * made (malloc'd) queued with libmicrohttpd, never cached by the browser
 * or a proxy.
 */
#ifndef GRAFT_TOOLS_HTTP_ANSWER_H
#define GRAFT_TOOLS_HTTP_ANSWER_H

#include <microhttpd.h>

/* Queue `body` (freed here, whatever happens; NULL: out of memory, the
 * connection is closed) with status `code` and Content-Type `type`. */
enum MHD_Result tool_http_answer(struct MHD_Connection *conn, unsigned code, const char *type,
                                 char *body);

#endif /* GRAFT_TOOLS_HTTP_ANSWER_H */
