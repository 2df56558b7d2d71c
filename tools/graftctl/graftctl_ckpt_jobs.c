/*
 * A folder of job folders: a trainer's persist root (graft-sim's
 * --persist-root) holds one folder per job, each with the job's step-*
 * checkpoints. `ckpt ls` on it lists the jobs; the other ckpt commands name
 * them in their error.
 */
#include "graftctl.h"

#include <dirent.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The step-* folders directly under dir: how many, and the newest step. */
static size_t step_folders(const char *dir, uint64_t *newest_p)
{
    DIR *d = opendir(dir);
    size_t n = 0;
    *newest_p = 0;
    for (struct dirent *e = d != NULL ? readdir(d) : NULL; e != NULL; e = readdir(d)) {
        uint64_t step;
        if (strncmp(e->d_name, "step-", 5) != 0 || !graftctl_parse_u64(e->d_name + 5, &step))
            continue;
        n++;
        if (step > *newest_p)
            *newest_p = step;
    }
    if (d != NULL)
        closedir(d);
    return n;
}

static int cmp_job(const void *a, const void *b)
{
    return strcmp(json_string_value(json_object_get(*(json_t *const *)a, "job")),
                  json_string_value(json_object_get(*(json_t *const *)b, "job")));
}

json_t *graftctl_ckpt_job_folders(const char *root)
{
    json_t *jobs = json_array();
    json_t *found[1024];
    size_t n = 0;
    DIR *d = opendir(root);
    for (struct dirent *e = d != NULL ? readdir(d) : NULL; e != NULL && n < 1024;
         e = readdir(d)) {
        char dir[PATH_MAX];
        uint64_t newest;
        if (e->d_name[0] == '.' ||
            snprintf(dir, sizeof(dir), "%s/%s", root, e->d_name) >= (int)sizeof(dir))
            continue;
        size_t k = step_folders(dir, &newest);
        if (k > 0)
            found[n++] = json_pack("{s:o,s:I,s:I}", "job", graftctl_json_text(e->d_name),
                                   "checkpoints", (json_int_t)k, "newest_step",
                                   (json_int_t)newest);
    }
    if (d != NULL)
        closedir(d);
    qsort(found, n, sizeof(found[0]), cmp_job);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(jobs, found[i]);
    return jobs;
}

void graftctl_ckpt_jobs_print(const char *root, json_t *jobs, bool json)
{
    if (json) {
        graftctl_print_json(json_pack("{s:o,s:O}", "root", graftctl_json_text(root), "jobs",
                                      jobs));
        return;
    }
    char text[GRAFTCTL_TEXT_LEN];
    printf("%s holds job folders; list one with: graftctl ckpt ls %s/JOB\n",
           graftctl_text(root, text, sizeof(text)), text);
    printf("%-40s %-12s %s\n", "JOB", "CHECKPOINTS", "NEWEST_STEP");
    size_t i;
    json_t *j;
    json_array_foreach(jobs, i, j)
        printf("%-40s %-12" JSON_INTEGER_FORMAT " %" JSON_INTEGER_FORMAT "\n",
               graftctl_text(json_string_value(json_object_get(j, "job")), text, sizeof(text)),
               json_integer_value(json_object_get(j, "checkpoints")),
               json_integer_value(json_object_get(j, "newest_step")));
}
