/*
 * Shared by the files of the UCX backend (ucx.c, ucx_msg.c). Not installed.
 */
#ifndef GRAFT_UCX_INT_H
#define GRAFT_UCX_INT_H

#include "transfer_int.h"

#include <ucp/api/ucp.h>

#include <netinet/in.h>

/* A UCX status as graft's. */
graft_status_t graft__ucx_status(ucs_status_t st);
/* "a.b.c.d:port" -> sockaddr. */
GRAFT_WUR graft_status_t graft__ucx_parse_address(const char *s, struct sockaddr_in *sa);
/* A single-threaded worker on @p ctx. */
GRAFT_WUR graft_status_t graft__ucx_worker_create(ucp_context_h ctx, ucp_worker_h *w_p);
/* A client connection to the listener at @p sa, with peer error handling. */
ucs_status_t graft__ucx_connect(ucp_worker_h w, const struct sockaddr_in *sa,
                                ucp_err_handler_cb_t err_cb, void *err_arg, ucp_ep_h *ep_p);
/* The endpoint's UCX context (shared by its workers). */
ucp_context_h graft__ucx_context(graft_transfer_endpoint_t *ep);

/* ucx_msg.c: the sending half of the message channel. */
graft_status_t graft__ucx_msg_send(graft_transfer_endpoint_t *ep, const char *address,
                                   const void *msg, size_t len, uint64_t deadline_ns);
void graft__ucx_msg_forget(graft_transfer_endpoint_t *ep);
/* Free the sender (backend teardown, before the context goes). */
void graft__ucx_msg_fini(graft_transfer_endpoint_t *ep);

#endif /* GRAFT_UCX_INT_H */
