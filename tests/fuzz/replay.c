/* replay.c - test_fuzz_corpus: every committed fuzz input, through the same harness functions
 * libFuzzer runs (fuzz.h), in any build (gcc, no libFuzzer). tests/fuzz/corpus/<target>/ holds
 * inputs that once failed; a crash, a sanitizer report (ACT_SANITIZE builds) or a FUZZ_ASSERT
 * fails the test. An empty or missing corpus fails too: the test cannot pass by replaying
 * nothing.
 *   test_fuzz_corpus [CORPUS_DIR]      (default: $ACT_SOURCE_DIR/tests/fuzz/corpus)
 *   test_fuzz_corpus TARGET FILE...    (one target on given files, e.g. a libFuzzer crash file) */
#define _POSIX_C_SOURCE 200809L
#include "fuzz.h"

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

typedef struct target { const char *name; int (*fn)(const uint8_t *, size_t); } target;
static const target k_targets[] = {
    {"protocol", act_fuzz_protocol},
    {"weights", act_fuzz_weights},
    {"json", act_fuzz_json},
    {"episode", act_fuzz_episode},
    {"lzf", act_fuzz_lzf},
    {"proxy", act_fuzz_proxy},
};
#define N_TARGETS (int)(sizeof k_targets / sizeof k_targets[0])

static int replay_file(const target *t, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (n < 0 || !buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "%s: read error\n", path);
        fclose(f);
        free(buf);
        return -1;
    }
    fclose(f);
    t->fn(buf, (size_t)n);
    free(buf);
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Replays dir's regular files in name order; returns how many, or -1. */
static int replay_dir(const target *t, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    char **names = NULL;
    int n = 0, cap = 0, rc = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            names = realloc(names, sizeof *names * (size_t)cap);
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 0; i < n; i++) {
        char path[8192];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && replay_file(t, path) != 0) rc = -1;
        free(names[i]);
    }
    free(names);
    return rc ? -1 : n;
}

static const target *find_target(const char *name)
{
    for (int i = 0; i < N_TARGETS; i++)
        if (strcmp(k_targets[i].name, name) == 0) return &k_targets[i];
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc >= 3) {
        const target *t = find_target(argv[1]);
        if (!t) {
            fprintf(stderr, "unknown target '%s' (protocol, weights, json, episode, lzf, proxy)\n", argv[1]);
            return 2;
        }
        for (int i = 2; i < argc; i++)
            if (replay_file(t, argv[i]) != 0) return 1;
        printf("%s: %d inputs replayed\n", t->name, argc - 2);
        return 0;
    }
    char root[4096];
    const char *src = getenv("ACT_SOURCE_DIR");
    if (argc == 2) snprintf(root, sizeof root, "%s", argv[1]);
    else snprintf(root, sizeof root, "%s/tests/fuzz/corpus", src ? src : ".");
    int total = 0;
    for (int i = 0; i < N_TARGETS; i++) {
        char dir[4096 + 64];
        snprintf(dir, sizeof dir, "%s/%s", root, k_targets[i].name);
        int n = replay_dir(&k_targets[i], dir);
        if (n < 0) return 1;
        printf("%-9s %d inputs replayed\n", k_targets[i].name, n);
        total += n;
    }
    if (total == 0) {
        fprintf(stderr, "%s: no corpus inputs found\n", root);
        return 1;
    }
    printf("test_fuzz_corpus: %d inputs, no crash, no broken invariant\n", total);
    return 0;
}
