/*
 * etcd endpoint lists and where they point: splitting a comma-separated
 * list, and whether an endpoint is on loopback and a configuration keeps
 * what it sends private. Pure functions over strings, used by the client
 * (etcd_client.c), the runtime's configuration and graftctl.
 */
#include "etcd_internal.h"

#include <arpa/inet.h>
#include <string.h>
#include <strings.h>

bool graft_etcd_endpoint_is_loopback(const char *url)
{
    char host[256];
    const char *p = url != NULL ? strstr(url, "://") : NULL;
    if (p == NULL)
        return false;
    p += 3;
    size_t n = strcspn(p, "/?#");
    const char *at = memchr(p, '@', n); /* user:password@host */
    if (at != NULL) {
        n -= (size_t)(at + 1 - p);
        p = at + 1;
    }
    if (n > 0 && p[0] == '[') {
        const char *close = memchr(p, ']', n);
        if (close == NULL)
            return false;
        n = (size_t)(close - p - 1);
        p++;
    } else {
        const char *colon = memchr(p, ':', n);
        if (colon != NULL)
            n = (size_t)(colon - p);
    }
    if (n == 0 || n >= sizeof(host))
        return false;
    memcpy(host, p, n);
    host[n] = '\0';
    if (strcasecmp(host, "localhost") == 0 || strcasecmp(host, "localhost.") == 0)
        return true;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return false;
}

bool graft_etcd_config_is_private(const graft_etcd_config_t *config, const char **first_p,
                                  const char **why_p)
{
    bool authenticated = config->username != NULL || config->cert_file != NULL;
    for (size_t i = 0; i < config->n_endpoints; i++) {
        const char *e = config->endpoints[i];
        const char *why = NULL;
        if (graft_etcd_endpoint_is_loopback(e))
            continue;
        if (e == NULL || strncmp(e, "https://", 8) != 0)
            why = "plain http to an address that is not loopback: what the job keeps there "
                  "would cross the network in clear";
        else if (!authenticated)
            why = "https without authentication (no user, no client certificate): anyone who "
                  "reaches etcd reads what the job keeps there";
        if (why == NULL)
            continue;
        if (first_p != NULL)
            *first_p = e != NULL ? e : "(null)";
        if (why_p != NULL)
            *why_p = why;
        return false;
    }
    return true;
}

graft_status_t graft_etcd_endpoints_split(const char *list, char ***endpoints_p, size_t *n_p)
{
    graft_status_t st = GRAFT_EINVAL;
    char **out = NULL;
    size_t k = 0;

    if (list == NULL || endpoints_p == NULL || n_p == NULL)
        goto out;
    size_t n = 1;
    for (const char *p = list; *p != '\0'; p++)
        n += *p == ',';
    st = GRAFT_ENOMEM;
    out = graft__calloc(n, sizeof(*out));
    if (out == NULL)
        goto out;
    for (const char *p = list; *p != '\0';) {
        size_t len = strcspn(p, ",");
        if (len > 0) {
            out[k] = graft__strndup(p, len);
            if (out[k] == NULL)
                goto err_out;
            k++;
        }
        p += len;
        if (*p == ',')
            p++;
    }
    if (k == 0) {
        st = GRAFT_EINVAL;
        goto err_out;
    }
    *endpoints_p = out;
    *n_p = k;
    return GRAFT_OK;

err_out:
    graft_etcd_endpoints_free(out, k);
out:
    return st;
}

void graft_etcd_endpoints_free(char **endpoints, size_t n)
{
    if (endpoints == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        graft_free(endpoints[i]);
    graft_free(endpoints);
}
