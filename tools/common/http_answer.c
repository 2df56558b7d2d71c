/* The HTTP answer the tools share (http_answer.h). */
#include "http_answer.h"

#include <stdlib.h>
#include <string.h>

enum MHD_Result tool_http_answer(struct MHD_Connection *conn, unsigned code, const char *type,
                                 char *body)
{
    if (body == NULL)
        return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}
