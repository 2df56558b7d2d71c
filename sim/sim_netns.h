/*
 * graft-sim run --netns: every group in its own network namespace, joined
 * by tc-shaped veth links, and the `partition` failure kind.
 *
 * The layout is scripts/netns.sh's star (docs/SIM.md): a hub namespace
 * "gsim<pid>-0" holds a bridge; group g lives in "gsim<pid>-<g+1>" with
 * eth0 = 10.78.<S>.<g+2>/24, whose veth peer "p<g+1>" is a bridge port, and
 * both directions of that link are shaped with tbf. One more veth joins the
 * caller's namespace to the bridge with 10.78.<S>.1/24 (the "hub address"),
 * unshaped, so the embedded etcd started here listens there too and every
 * namespace reaches it. S = 1 + pid % 250, so concurrent runs do not
 * collide. A partition sets the group's bridge port down (both directions
 * cut at once) and up again.
 */
#ifndef GRAFT_SIM_NETNS_H
#define GRAFT_SIM_NETNS_H

#include <graft/common.h>

typedef struct graft_sim_netns graft_sim_netns_t;

/**
 * @brief Remove namespaces left by graft-sim runs that died (their pid is
 *        gone), then make the namespaces of this run. Also writes two
 *        wrapper scripts in a temporary directory: one runs the trainer of
 *        $GRAFT_GROUP in its namespace with GRAFT_TRANSFER_ADDRESS on its
 *        address (and UCX_TLS=tcp unless set), one runs etcd with its client
 *        URL also on the hub address. Exit, SIGINT, SIGTERM and SIGHUP tear
 *        the namespaces down.
 * @param [in]  groups   number of groups, 1..200.
 * @param [in]  rate     tc rate of each link, e.g. "1gbit".
 * @param [in]  trainer  the trainer program the wrapper runs.
 * @param [out] net_p    the namespaces.
 * @return GRAFT_OK; GRAFT_ENOTSUP (not root, or no "ip netns"; a message
 *         says which); GRAFT_EINVAL; GRAFT_ESYS (a command failed);
 *         GRAFT_ENOMEM.
 */
GRAFT_WUR graft_status_t graft_sim_netns_create(int groups, const char *rate, const char *trainer,
                                                graft_sim_netns_t **net_p);

/**
 * @brief Remove the namespaces and the wrapper scripts. Accepts NULL.
 * @param [in] net  the namespaces.
 */
void graft_sim_netns_destroy(graft_sim_netns_t *net);

/**
 * @brief The hub address in the caller's namespace, e.g. "10.78.7.1".
 * @param [in] net  the namespaces.
 * @return a string owned by net.
 */
const char *graft_sim_netns_hub(const graft_sim_netns_t *net);

/**
 * @brief Path of the trainer wrapper (for the supervisor).
 * @param [in] net  the namespaces.
 * @return a string owned by net.
 */
const char *graft_sim_netns_trainer(const graft_sim_netns_t *net);

/**
 * @brief Path of the etcd wrapper (graft_etcd_server_opts_t.binary).
 * @param [in] net  the namespaces.
 * @return a string owned by net.
 */
const char *graft_sim_netns_etcd(const graft_sim_netns_t *net);

/**
 * @brief Cut a group off the network, or restore its link.
 * @param [in] net    the namespaces.
 * @param [in] group  the group.
 * @param [in] cut    1: cut, 0: restore.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ESYS.
 */
GRAFT_WUR graft_status_t graft_sim_netns_partition(graft_sim_netns_t *net, int group, int cut);

/**
 * @brief Cut (cut != 0) or restore the traffic between one group and the
 *        other groups, leaving its link to the hub (and etcd) up: blackhole
 *        routes to each other group's address in its namespace, and to its
 *        address in theirs.
 * @param [in] net    the namespaces.
 * @param [in] group  0-based group.
 * @param [in] cut    1 to cut, 0 to restore.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ESYS.
 */
GRAFT_WUR graft_status_t graft_sim_netns_isolate(graft_sim_netns_t *net, int group, int cut);

#endif /* GRAFT_SIM_NETNS_H */
