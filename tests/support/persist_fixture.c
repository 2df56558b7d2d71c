/* Helpers shared by the persist tests (persist_fixture.h). */
#include "persist_fixture.h"

#include <setjmp.h>
#include <stdarg.h>
#include <cmocka.h>

uint64_t pt_rand(uint64_t *s)
{
    /* splitmix64: seeded and reproducible */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void pt_fill(void *buf, size_t n, uint64_t seed)
{
    uint8_t *p = buf;
    uint64_t s = seed * 0x1000193 + 1;
    size_t i = 0;
    while (i < n) {
        uint64_t r = pt_rand(&s);
        size_t run = 1 + (size_t)(r % 64);
        if (run > n - i)
            run = n - i;
        if (r & 0x100)
            memset(p + i, (int)(r >> 16) & 0xff, run);
        else
            for (size_t k = 0; k < run; k++)
                p[i + k] = (uint8_t)(pt_rand(&s) >> 24);
        i += run;
    }
}

bool pt_all(const void *buf, size_t n, uint8_t v)
{
    const uint8_t *p = buf;
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return false;
    return true;
}

char *pt_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof(tmpl), "%s/graft-persist.XXXXXX", base && base[0] ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    if (d == NULL) {
        perror("mkdtemp");
        abort();
    }
    return strdup(d);
}

static int pt_rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void pt_rmtree(char *dir)
{
    nftw(dir, pt_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    free(dir);
}

void pt_rmtree_contents(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        char p[4096];
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        nftw(p, pt_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    }
    if (d)
        closedir(d);
}

int pt_count_entries(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL)
        n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
    if (d)
        closedir(d);
    return n;
}

char *pt_path(const char *root, uint64_t step, const char *name)
{
    char *p = malloc(strlen(root) + strlen(name) + 40);
    sprintf(p, "%s/step-%020llu/%s", root, (unsigned long long)step, name);
    return p;
}

void pt_mkdir_step(const char *root, uint64_t step)
{
    char p[4096];
    snprintf(p, sizeof(p), "%s/step-%020llu", root, (unsigned long long)step);
    mkdir(p, 0755);
}

void pt_touch(const char *root, uint64_t step, const char *name)
{
    char *p = pt_path(root, step, name);
    int fd = open(p, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) {
        if (write(fd, "partial", 7) != 7)
            perror("write");
        close(fd);
    }
    free(p);
}

char *pt_read_file_str(const char *root, uint64_t step, const char *name)
{
    char *p = pt_path(root, step, name);
    FILE *f = fopen(p, "rb");
    free(p);
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    s[fread(s, 1, (size_t)n, f)] = '\0';
    fclose(f);
    return s;
}

long pt_file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

void pt_flip_bit(const char *path, long off, int bit)
{
    int fd = open(path, O_RDWR);
    uint8_t b;
    if (fd < 0 || pread(fd, &b, 1, off) != 1) {
        perror(path);
        abort();
    }
    b ^= (uint8_t)(1u << bit);
    if (pwrite(fd, &b, 1, off) != 1)
        abort();
    close(fd);
}

bool pt_files_equal(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool eq = fa != NULL && fb != NULL;
    while (eq) {
        int x = fgetc(fa), y = fgetc(fb);
        eq = x == y;
        if (x == EOF || y == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return eq;
}

const char *pt_list_str(const char *root)
{
    static char out[1024];
    graft_persist_entry_t *e = NULL;
    size_t n = 0;
    out[0] = '\0';
    if (graft_persist_list(root, &e, &n) != GRAFT_OK)
        return "(list failed)";
    for (size_t i = 0; i < n; i++)
        snprintf(out + strlen(out), sizeof(out) - strlen(out), "%s%llu", i ? " " : "",
                 (unsigned long long)e[i].step);
    graft_free(e);
    return out;
}

pt_layout_t *pt_layout_alloc(uint32_t ranks, size_t max_regions, bool owns)
{
    pt_layout_t *l = calloc(1, sizeof(*l));
    l->ranks = ranks;
    l->owns = owns;
    l->regions = calloc(ranks, sizeof(*l->regions));
    l->nregions = calloc(ranks, sizeof(*l->nregions));
    for (uint32_t r = 0; r < ranks; r++)
        l->regions[r] = calloc(max_regions + 1, sizeof(graft_persist_region_t));
    return l;
}

void pt_layout_free(pt_layout_t *l)
{
    if (l == NULL)
        return;
    for (uint32_t r = 0; r < l->ranks; r++) {
        for (size_t i = 0; l->owns && i < l->nregions[r]; i++) {
            free((char *)l->regions[r][i].name);
            free(l->regions[r][i].ptr);
        }
        free(l->regions[r]);
    }
    free(l->regions);
    free(l->nregions);
    free(l);
}

pt_layout_t *pt_layout_random(uint64_t *rng, uint32_t ranks, int iter)
{
    static const uint64_t sizes[] = {0, 1, 7, 4095, 4096, 4097, 10000, 70000, 200000, 8192};
    static const uint64_t elems[] = {1, 2, 4, 8};
    size_t nshared = 1 + pt_rand(rng) % 3;
    pt_layout_t *l = pt_layout_alloc(ranks, 6 + nshared, true);
    uint64_t shared_size[4], shared_elem[4];
    for (size_t k = 0; k < nshared; k++) {
        shared_elem[k] = elems[pt_rand(rng) % 4];
        shared_size[k] = (sizes[pt_rand(rng) % 10] / shared_elem[k] + 1) * shared_elem[k];
    }
    for (uint32_t r = 0; r < ranks; r++) {
        size_t n = pt_rand(rng) % 6;
        size_t k = 0;
        for (size_t i = 0; i < n; i++, k++) {
            graft_persist_region_t *g = &l->regions[r][k];
            char name[64];
            snprintf(name, sizeof(name), "it%d.rank%u.region%zu", iter, r, i);
            g->name = strdup(name);
            g->kind = (graft_persist_kind_t)(1 + pt_rand(rng) % 8);
            g->dtype = (uint32_t)(pt_rand(rng) % 4);
            g->bytes = (sizes[pt_rand(rng) % 10] / elems[g->dtype]) * elems[g->dtype];
            g->ptr = malloc(g->bytes + 1);
        }
        for (size_t s = 0; s < nshared; s++, k++) {
            graft_persist_region_t *g = &l->regions[r][k];
            char name[64];
            snprintf(name, sizeof(name), "shared%zu", s);
            g->name = strdup(name);
            g->kind = GRAFT_PERSIST_KIND_PARAM;
            g->dtype = 100 + (uint32_t)s;
            g->global_bytes = shared_size[s];
            if (graft_persist_split_even(shared_size[s], shared_elem[s], r, ranks,
                                         &g->global_offset, &g->bytes) != GRAFT_OK)
                abort();
            g->ptr = malloc(g->bytes + 1);
        }
        l->nregions[r] = k;
    }
    return l;
}

void pt_layout_fill(pt_layout_t *l, uint64_t seed)
{
    for (uint32_t r = 0; r < l->ranks; r++)
        for (size_t i = 0; i < l->nregions[r]; i++) {
            graft_persist_region_t *g = &l->regions[r][i];
            uint64_t h = seed;
            for (const char *c = g->name; *c; c++)
                h = h * 31 + (uint8_t)*c;
            pt_fill(g->ptr, g->bytes, h + g->global_offset);
        }
}

uint64_t pt_layout_raw(const pt_layout_t *l)
{
    uint64_t t = 0;
    for (uint32_t r = 0; r < l->ranks; r++)
        for (size_t i = 0; i < l->nregions[r]; i++)
            t += l->regions[r][i].bytes;
    return t;
}

pt_layout_t *pt_layout_clone_empty(const pt_layout_t *src)
{
    size_t max = 0;
    for (uint32_t r = 0; r < src->ranks; r++)
        max = src->nregions[r] > max ? src->nregions[r] : max;
    pt_layout_t *l = pt_layout_alloc(src->ranks, max, true);
    for (uint32_t r = 0; r < src->ranks; r++) {
        for (size_t i = 0; i < src->nregions[r]; i++) {
            l->regions[r][i] = src->regions[r][i];
            l->regions[r][i].name = strdup(src->regions[r][i].name);
            l->regions[r][i].ptr = malloc(src->regions[r][i].bytes + 1);
            memset(l->regions[r][i].ptr, 0xcd, src->regions[r][i].bytes + 1);
        }
        l->nregions[r] = src->nregions[r];
    }
    return l;
}

bool pt_layout_equal(const pt_layout_t *a, const pt_layout_t *b)
{
    for (uint32_t r = 0; r < a->ranks; r++)
        for (size_t i = 0; i < a->nregions[r]; i++)
            if (memcmp(a->regions[r][i].ptr, b->regions[r][i].ptr, a->regions[r][i].bytes) != 0)
                return false;
    return true;
}

static pt_global_t *pt_global_make(uint64_t seed, const char *const *names,
                                   const graft_persist_kind_t *kinds, const uint64_t *elem,
                                   const uint64_t *bytes, size_t n)
{
    pt_global_t *g = calloc(1, sizeof(*g));
    g->n = n;
    for (size_t i = 0; i < n; i++) {
        g->names[i] = names[i];
        g->kinds[i] = kinds[i];
        g->elem[i] = elem[i];
        g->bytes[i] = bytes[i];
        g->data[i] = malloc(bytes[i] + 1);
        pt_fill(g->data[i], bytes[i], seed * 100 + i);
    }
    return g;
}

pt_global_t *pt_global_new(uint64_t seed)
{
    static const char *const names[] = {"embed", "adam.m", "rng", "step", "big"};
    static const graft_persist_kind_t kinds[] = {GRAFT_PERSIST_KIND_PARAM, GRAFT_PERSIST_KIND_OPTIM,
                                                 GRAFT_PERSIST_KIND_RNG, GRAFT_PERSIST_KIND_STEP,
                                                 GRAFT_PERSIST_KIND_PARAM};
    static const uint64_t elem[] = {4, 2, 1, 8, 4};
    static const uint64_t bytes[] = {40000, 4097 * 4, 1, 8, 3 * 65536 + 12};
    return pt_global_make(seed, names, kinds, elem, bytes, 5);
}

pt_global_t *pt_global_small(uint64_t seed)
{
    static const char *const names[] = {"w", "m", "rng", "step"};
    static const graft_persist_kind_t kinds[] = {GRAFT_PERSIST_KIND_PARAM, GRAFT_PERSIST_KIND_OPTIM,
                                                 GRAFT_PERSIST_KIND_RNG, GRAFT_PERSIST_KIND_STEP};
    static const uint64_t elem[] = {4, 2, 1, 8};
    static const uint64_t bytes[] = {4000, 1000, 16, 8};
    return pt_global_make(seed, names, kinds, elem, bytes, 4);
}

pt_global_t *pt_global_clone_empty(const pt_global_t *src)
{
    pt_global_t *g = calloc(1, sizeof(*g));
    *g = *src;
    for (size_t i = 0; i < g->n; i++) {
        g->data[i] = malloc(g->bytes[i] + 1);
        memset(g->data[i], 0xcd, g->bytes[i] + 1);
    }
    return g;
}

bool pt_global_equal(const pt_global_t *a, const pt_global_t *b)
{
    for (size_t i = 0; i < a->n; i++)
        if (a->bytes[i] != b->bytes[i] || memcmp(a->data[i], b->data[i], a->bytes[i]) != 0)
            return false;
    return true;
}

void pt_global_free(pt_global_t *g)
{
    if (g == NULL)
        return;
    for (size_t i = 0; i < g->n; i++)
        free(g->data[i]);
    free(g);
}

pt_layout_t *pt_global_split(pt_global_t *g, uint32_t ranks)
{
    pt_layout_t *l = pt_layout_alloc(ranks, g->n, false);
    for (uint32_t r = 0; r < ranks; r++) {
        for (size_t i = 0; i < g->n; i++) {
            graft_persist_region_t *x = &l->regions[r][i];
            x->name = g->names[i];
            x->kind = g->kinds[i];
            x->dtype = (uint32_t)g->elem[i];
            x->global_bytes = g->bytes[i];
            if (graft_persist_split_even(g->bytes[i], g->elem[i], r, ranks, &x->global_offset,
                                         &x->bytes) != GRAFT_OK)
                abort();
            x->ptr = g->data[i] + x->global_offset;
        }
        l->nregions[r] = g->n;
    }
    return l;
}

void pt_restore_global(const char *root, uint32_t ranks, uint64_t step, pt_global_t *g)
{
    pt_global_t *got = pt_global_clone_empty(g);
    pt_layout_t *lay = pt_global_split(got, ranks);
    for (uint32_t r = 0; r < ranks; r++) {
        graft_persist_restore_params_t p = {0};
        p.rank = r;
        p.ranks = ranks;
        p.regions = lay->regions[r];
        p.nregions = lay->nregions[r];
        p.step = step;
        assert_int_equal(graft_persist_restore(root, &p, NULL), GRAFT_OK);
    }
    assert_true(pt_global_equal(g, got));
    pt_layout_free(lay);
    pt_global_free(got);
}
