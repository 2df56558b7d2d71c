/*
 * --params FILE (graft_sim_params_load, see sim_params.h): a JSON object of
 * parameters by name (sim_params.c), or one of graft's benchmarks' --json
 * objects mapped onto the parameters it measures (sim_bench_json.c). Above
 * both, so that neither calls the other back.
 */
#include "sim_params.h"
#include "sim_params_int.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

graft_status_t graft_sim_params_load(graft_sim_params_t *params, const char *path, char *err,
                                     size_t errlen)
{
    graft_status_t st = GRAFT_OK;
    json_t *root = NULL;
    graft_sim_params_t tmp;
    const char *key;
    json_t *value;

    if (params == NULL || path == NULL || err == NULL || errlen == 0) {
        return GRAFT_EINVAL;
    }
    root = graft_sim_params_parse_file(path, err, errlen, &st);
    if (root == NULL) {
        goto out;
    }
    json_t *obj = root;
    if (json_is_object(root) && json_object_get(root, "model_params") != NULL) {
        obj = json_object_get(root, "model_params");
    } else if (json_is_object(root) && json_is_string(json_object_get(root, "bench"))) {
        char e2[200];
        tmp = *params;
        st = graft_sim_params_from_bench(
            &tmp, root, json_string_value(json_object_get(root, "bench")), e2, sizeof(e2));
        if (st != GRAFT_OK) {
            snprintf(err, errlen, "%s: %s", path, e2);
            goto out;
        }
        *params = tmp;
        goto out;
    }
    if (!json_is_object(obj)) {
        snprintf(err, errlen, "%s: expected a JSON object of parameters", path);
        st = GRAFT_EFORMAT;
        goto out;
    }
    tmp = *params;
    json_object_foreach(obj, key, value)
    {
        if (graft_sim_params_index(key) < 0 || strchr(key, '-') != NULL) {
            snprintf(err, errlen, "%s: unknown parameter '%s'", path, key);
            st = GRAFT_ENOTFOUND;
            goto out;
        }
        if (!json_is_number(value)) {
            snprintf(err, errlen, "%s: %s: expected a number", path, key);
            st = GRAFT_EINVAL;
            goto out;
        }
        char e2[200];
        st = graft_sim_params_store(&tmp, key, json_number_value(value), e2, sizeof(e2));
        if (st != GRAFT_OK) {
            snprintf(err, errlen, "%s: %s", path, e2);
            goto out;
        }
    }
    *params = tmp;
out:
    json_decref(root);
    return st;
}
