/* HTTP helpers of the dashboard tests (graftctl_http.h). */
#include "graftctl_http.h"

int gc_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    char **body = arg;
    size_t old = *body != NULL ? strlen(*body) : 0;
    char *grown = realloc(*body, old + size * n + 1);
    assert_non_null(grown);
    memcpy(grown + old, p, size * n);
    grown[old + size * n] = '\0';
    *body = grown;
    return size * n;
}

long gc_http(int port, const char *method, const char *path, const char *host,
             const char *auth, char **body_p)
{
    CURL *c = curl_easy_init();
    struct curl_slist *h = NULL;
    char url[256], line[512];
    char *body = NULL;
    long code = -1;
    assert_non_null(c);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
    if (host != NULL) {
        snprintf(line, sizeof(line), "Host:%s%s", host[0] ? " " : "", host);
        h = curl_slist_append(h, line);
        if (host[0] == '\0')
            curl_easy_setopt(c, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_0);
    }
    if (auth != NULL) {
        snprintf(line, sizeof(line), "Authorization: %s", auth);
        h = curl_slist_append(h, line);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
    if (strcmp(method, "POST") == 0) {
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, "");
    }
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (body_p != NULL)
        *body_p = body != NULL ? body : strdup("");
    else
        free(body);
    return code;
}
