/*
 * What libgraft.so exports: the public API and nothing else
 * (scripts/libgraft.map). Its dynamic symbol table, as `nm -D
 * --defined-only` reads it, holds no internal graft__* symbol (functions,
 * the generated protobuf-c code, test hooks), no symbol of ours without the
 * graft_ prefix, and only functions declared in the headers of include/graft/; and
 * every function those headers declare is there, so that the Python
 * package (cffi over libgraft.so) finds each one. The static libgraft.a,
 * which the tests and benchmarks link, keeps its internal symbols: that
 * too is checked, so the check itself is shown to see what it looks for.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char build_dir[PATH_MAX];
static char src_dir[PATH_MAX];

typedef struct names {
    char **v;
    size_t n;
} names_t;

static void names_add(names_t *s, const char *name, size_t len)
{
    for (size_t i = 0; i < s->n; i++)
        if (strlen(s->v[i]) == len && memcmp(s->v[i], name, len) == 0)
            return;
    s->v = realloc(s->v, (s->n + 1) * sizeof(*s->v));
    assert_non_null(s->v);
    s->v[s->n] = strndup(name, len);
    assert_non_null(s->v[s->n]);
    s->n++;
}

static bool names_has(const names_t *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->v[i], name) == 0)
            return true;
    return false;
}

static void names_free(names_t *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof(*s));
}

/* The defined symbols `nm` lists for a file (nm_flags: "-D" for the
 * dynamic table of the shared library, "" for an archive's objects), with
 * their type letters. */
typedef struct sym {
    char type;
    char name[256];
} sym_t;

static sym_t *read_symbols(const char *nm_flags, const char *rel, size_t *n_p)
{
    char cmd[PATH_MAX + 128];
    snprintf(cmd, sizeof(cmd), "nm %s --defined-only '%s/%s' 2>&1", nm_flags, build_dir, rel);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    sym_t *v = NULL;
    size_t n = 0;
    char line[512];
    while (fgets(line, sizeof(line), p) != NULL) {
        char addr[64], type[8], name[256];
        /* "ADDRESS T name"; archive member headers and blank lines are
         * skipped. */
        if (sscanf(line, "%63s %7s %255s", addr, type, name) != 3 || strlen(type) != 1)
            continue;
        v = realloc(v, (n + 1) * sizeof(*v));
        assert_non_null(v);
        v[n].type = type[0];
        snprintf(v[n].name, sizeof(v[n].name), "%s", name);
        n++;
    }
    int rc = pclose(p);
    if (rc != 0)
        fail_msg("%s: nm failed (exit %d): not built?", cmd, rc);
    *n_p = n;
    return v;
}

/* Every graft_<name>( the public headers declare (a declaration starts a
 * line after its return type; calls in comments are in prose, never at a
 * line's start after a type). Names are collected from any "graft_x(" that
 * is not preceded by an identifier character and sits outside comments
 * and macros. */
static void public_functions(names_t *out)
{
    char dir[PATH_MAX + 32];
    snprintf(dir, sizeof(dir), "%s/include/graft", src_dir);
    DIR *d = opendir(dir);
    if (d == NULL)
        fail_msg("%s: cannot open the public headers", dir);
    for (struct dirent *e = readdir(d); e != NULL; e = readdir(d)) {
        size_t len = strlen(e->d_name);
        if (len < 3 || strcmp(e->d_name + len - 2, ".h") != 0)
            continue;
        char path[2 * PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        char line[1024];
        bool in_comment = false;
        while (fgets(line, sizeof(line), f) != NULL) {
            char *s = line;
            /* Comments: block comments may span lines; the rest of a line
             * after // is dropped. */
            char buf[1024];
            size_t k = 0;
            while (*s != '\0' && k + 1 < sizeof(buf)) {
                if (in_comment) {
                    if (s[0] == '*' && s[1] == '/') {
                        in_comment = false;
                        s += 2;
                    } else {
                        s++;
                    }
                } else if (s[0] == '/' && s[1] == '*') {
                    in_comment = true;
                    s += 2;
                } else if (s[0] == '/' && s[1] == '/') {
                    break;
                } else {
                    buf[k++] = *s++;
                }
            }
            buf[k] = '\0';
            const char *t = buf;
            while (isspace((unsigned char)*t))
                t++;
            if (*t == '#')
                continue; /* macros (#define GRAFT_x(...) ...) */
            for (const char *p = strstr(t, "graft_"); p != NULL; p = strstr(p + 1, "graft_")) {
                if (p > buf && (isalnum((unsigned char)p[-1]) || p[-1] == '_'))
                    continue;
                const char *q = p;
                while (isalnum((unsigned char)*q) || *q == '_')
                    q++;
                const char *r = q;
                while (*r == ' ')
                    r++;
                /* A function declaration: the name, then "(", and not a
                 * pointer-to-function typedef: neither its name
                 * "(*graft_x_fn)" nor its return type "graft_x_t (*". */
                if (*r == '(' && r[1] != '*' && !(p > buf + 1 && p[-1] == '*' && p[-2] == '('))
                    names_add(out, p, (size_t)(q - p));
            }
        }
        fclose(f);
    }
    closedir(d);
    assert_true(out->n > 50);
}

static void test_shared_library_exports_only_the_public_api(void **state)
{
    (void)state;
    size_t n = 0;
    sym_t *syms = read_symbols("-D", "lib/libgraft.so", &n);
    names_t api = {0};
    public_functions(&api);
    size_t bad = 0, exported = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = syms[i].name;
        /* Absolute symbols are the linker's own (a version node's name). */
        if (syms[i].type == 'A')
            continue;
        exported++;
        if (strncmp(name, "graft__", 7) == 0) {
            print_error("libgraft.so exports the internal symbol %s\n", name);
            bad++;
        } else if (strncmp(name, "graft_", 6) != 0) {
            print_error("libgraft.so exports %s, which is not graft's public API\n", name);
            bad++;
        } else if (!names_has(&api, name)) {
            print_error("libgraft.so exports %s, which no header in include/graft/ declares\n",
                        name);
            bad++;
        }
    }
    assert_int_equal(bad, 0);
    /* Every function the public headers declare is there. */
    for (size_t a = 0; a < api.n; a++) {
        bool found = false;
        for (size_t i = 0; i < n && !found; i++)
            found = strcmp(syms[i].name, api.v[a]) == 0;
        if (!found) {
            print_error("include/graft/ declares %s, which libgraft.so does not export\n",
                        api.v[a]);
            bad++;
        }
    }
    assert_int_equal(bad, 0);
    assert_int_equal(exported, api.n);
    names_free(&api);
    free(syms);
}

/* The static library still has the internals that tests and benchmarks
 * call, among them the ones whose absence the check above asserts. */
static void test_static_library_keeps_internals(void **state)
{
    (void)state;
    size_t n = 0;
    sym_t *syms = read_symbols("", "lib/libgraft.a", &n);
    static const char *const want[] = {"graft__mac_equal", "graft__quorum_decide",
                                       "graft__event__unpack", "graft_init"};
    for (size_t w = 0; w < sizeof(want) / sizeof(want[0]); w++) {
        bool found = false;
        for (size_t i = 0; i < n && !found; i++)
            found = strcmp(syms[i].name, want[w]) == 0;
        if (!found)
            fail_msg("libgraft.a lacks %s: the symbol reader sees nothing", want[w]);
    }
    free(syms);
}

/* The Python package loads the shared library and finds what it declares
 * (python/graft/_lib.py): every graft_x( named in its declarations is
 * exported. */
static void test_python_declarations_are_exported(void **state)
{
    (void)state;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/python/graft/_lib.py", src_dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        skip(); /* a tree without the Python package */
    size_t n = 0;
    sym_t *syms = read_symbols("-D", "lib/libgraft.so", &n);
    char line[1024];
    size_t declared = 0, bad = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        for (const char *p = strstr(line, "graft_"); p != NULL; p = strstr(p + 1, "graft_")) {
            if (p > line && (isalnum((unsigned char)p[-1]) || p[-1] == '_' || p[-1] == '*'))
                continue;
            const char *q = p;
            while (isalnum((unsigned char)*q) || *q == '_')
                q++;
            if (*q != '(')
                continue;
            char name[256];
            snprintf(name, sizeof(name), "%.*s", (int)(q - p), p);
            bool found = false;
            for (size_t i = 0; i < n && !found; i++)
                found = strcmp(syms[i].name, name) == 0;
            declared++;
            if (!found) {
                print_error("python/graft/_lib.py declares %s, not exported\n", name);
                bad++;
            }
        }
    }
    fclose(f);
    assert_true(declared > 10);
    assert_int_equal(bad, 0);
    free(syms);
}

/* BUILD/tests/test_lib_exports -> BUILD; the source tree is the first
 * folder above BUILD that holds include/graft/graft.h. */
static int find_dirs(void)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return -1;
    self[n] = '\0';
    *strrchr(self, '/') = '\0';
    *strrchr(self, '/') = '\0';
    snprintf(build_dir, sizeof(build_dir), "%s", self);
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", self);
    for (;;) {
        char probe[PATH_MAX + 32];
        snprintf(probe, sizeof(probe), "%s/include/graft/graft.h", dir);
        if (access(probe, R_OK) == 0) {
            snprintf(src_dir, sizeof(src_dir), "%s", dir);
            return 0;
        }
        char *slash = strrchr(dir, '/');
        if (slash == NULL || slash == dir)
            break;
        *slash = '\0';
    }
    /* A build folder outside the tree: the tests run from its root. */
    return getcwd(src_dir, sizeof(src_dir)) != NULL ? 0 : -1;
}

int main(void)
{
    if (find_dirs() != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_library_exports_only_the_public_api),
        cmocka_unit_test(test_static_library_keeps_internals),
        cmocka_unit_test(test_python_declarations_are_exported),
    };
    if (getenv("TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
