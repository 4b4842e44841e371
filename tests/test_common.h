/* test_common.h - what every C test shares: pass/fail counters with CHECK, the seeded splitmix64
 * stream (the seed is printed; ACT_TEST_SEED=<seed> replays a failing run), and where the test
 * weight files are (ACT_TEST_DATA, made by tests/make_testdata.py).
 * defines: g_fail, g_checks, CHECK, g_rng, rnd, urand, seed_rng, data_dir, listed */
#ifndef ACT_TEST_COMMON_H
#define ACT_TEST_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_fail __attribute__((unused)), g_checks __attribute__((unused));

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        g_checks++;                                                                        \
        if (!(cond)) {                                                                     \
            g_fail++;                                                                      \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                           \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fprintf(stderr, "\n");                                                         \
        }                                                                                  \
    } while (0)

static uint64_t g_rng;
static inline uint64_t rnd(void) {
    uint64_t x = (g_rng += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static inline float urand(float lo, float hi) {
    return lo + (hi - lo) * (float)((rnd() >> 40) * (1.0 / 16777216.0));
}
static inline void seed_rng(const char *prog) {
    const char *s = getenv("ACT_TEST_SEED");
    g_rng = s ? strtoull(s, NULL, 0) : ((uint64_t)time(NULL) << 16 ^ (uint64_t)getpid());
    printf("%s: seed %llu (replay with ACT_TEST_SEED)\n", prog, (unsigned long long)g_rng);
}
static inline const char *data_dir(void) {
    const char *d = getenv("ACT_TEST_DATA");
    return d ? d : "build/testdata";
}
/* the narrowing env variables of the tests (ACT_OPS_ONLY=a,b ...): is word one of the
 * comma-separated items of list (substring: does it contain one)? NULL or empty list: yes */
static inline int listed(const char *list, const char *word, int substring) {
    if (!list || !*list) return 1;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ","))
        if (substring ? strstr(word, t) != NULL : !strcmp(word, t)) return 1;
    return 0;
}

#endif
