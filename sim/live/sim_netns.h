/*
 * graft-sim run --netns: every group in its own network namespace, joined
 * by tc-shaped veth links, and the network failure kinds (partition,
 * isolate, netem, throttle, cut_donor).
 *
 * The layout is scripts/netns.sh's star (docs/SIM.md): a hub namespace
 * "gsim<pid>-0" holds a bridge; group g lives in "gsim<pid>-<g+1>" with
 * eth0 = 10.78.<S>.<g+2>/24, whose veth peer "p<g+1>" is a bridge port, and
 * both directions of that link are shaped with tbf. One more veth joins the
 * caller's namespace to the bridge with 10.78.<S>.1/24 (the "hub address"),
 * unshaped, so the embedded etcd started here listens there too and every
 * namespace reaches it. S = 1 + pid % 250, so concurrent runs do not
 * collide. A partition sets the group's bridge port down (both directions
 * cut at once) and up again; other faults reshape a link (netem, a slower
 * tbf) or add blackhole routes between groups (isolate, cut_donor).
 */
#ifndef GRAFT_SIM_NETNS_H
#define GRAFT_SIM_NETNS_H

#include <graft/common.h>

#include <stddef.h>

typedef struct graft_sim_netns graft_sim_netns_t;

/** How a group's link is shaped, in both directions (the group's eth0 and
 *  the hub's p<g+1>). The tc arguments are in sim_netns.c. */
typedef enum graft_sim_link_shape {
    GRAFT_SIM_LINK_BASE = 0, /**< tbf at the run's rate: the shape the run starts with */
    GRAFT_SIM_LINK_NETEM,    /**< netem at the run's rate with delay, jitter, loss and
                                  reordering */
    GRAFT_SIM_LINK_THROTTLE  /**< tbf at 10 Mbit/s */
} graft_sim_link_shape_t;

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

/**
 * @brief Cut (cut != 0) or restore the traffic between two groups only:
 *        a blackhole route to b's address in a's namespace and to a's in b's.
 *        Their links to the hub, etcd and the other groups stay up.
 * @param [in] net  the namespaces.
 * @param [in] a    0-based group.
 * @param [in] b    another 0-based group.
 * @param [in] cut  1 to cut, 0 to restore.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ESYS.
 */
GRAFT_WUR graft_status_t graft_sim_netns_cut_pair(graft_sim_netns_t *net, int a, int b, int cut);

/**
 * @brief Reshape both directions of a group's link (tc qdisc replace);
 *        GRAFT_SIM_LINK_BASE restores the shape the run started with.
 * @param [in] net    the namespaces.
 * @param [in] group  0-based group.
 * @param [in] shape  the shape.
 * @return GRAFT_OK, GRAFT_EINVAL, GRAFT_ESYS (the failed tc command is logged).
 */
GRAFT_WUR graft_status_t graft_sim_netns_shape(graft_sim_netns_t *net, int group,
                                               graft_sim_link_shape_t shape);

/**
 * @brief Whether this kernel can shape a link so (netem needs the netem
 *        qdisc, CONFIG_NET_SCH_NETEM, which not every kernel has): tries the
 *        shape on group 0's link, quietly, and restores it.
 * @param [in] net    the namespaces.
 * @param [in] shape  the shape.
 * @return GRAFT_OK; GRAFT_ENOTSUP (tc refused it); GRAFT_ESYS (the base
 *         shape could not be restored); GRAFT_EINVAL.
 */
GRAFT_WUR graft_status_t graft_sim_netns_probe(graft_sim_netns_t *net,
                                               graft_sim_link_shape_t shape);

/**
 * @brief The tc qdisc arguments of a shape in this run, e.g. "tbf rate 10mbit
 *        burst 32kb latency 20ms" (for logs and reports).
 * @param [in]  net    the namespaces.
 * @param [in]  shape  the shape.
 * @param [out] buf    where the text goes.
 * @param [in]  len    its size.
 * @return buf.
 */
const char *graft_sim_netns_shape_text(const graft_sim_netns_t *net, graft_sim_link_shape_t shape,
                                       char *buf, size_t len);

#endif /* GRAFT_SIM_NETNS_H */
