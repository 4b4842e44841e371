/* test_serve_sizes.c - act-serve's batch sizes (engine/server_sizes.c, --batch-sizes): which sizes
 * run for 'auto' (by device), 'all' and lists; the size every batch is padded up to; the
 * messages for specs that name no valid sizes. Then random lists against a brute-force answer. */
#include "server.h"
#include "test_common.h"

#define MAXB 300

static int sizes(const char *spec, int max_batch, act_device dev, int *pad_to, char *err)
{
    err[0] = 0;
    return act_serve_batch_sizes(spec, max_batch, dev, pad_to, err, 256);
}

static void expect(const char *spec, int max_batch, act_device dev, const char *want)
{
    int pad_to[MAXB + 1];
    char err[256], got[512];
    int n = sizes(spec, max_batch, dev, pad_to, err);
    CHECK(n > 0, "'%s' max %d: refused: %s", spec, max_batch, err);
    if (n <= 0) return;
    act_serve_batch_sizes_str(pad_to, max_batch, got, sizeof got);
    CHECK(!strcmp(got, want), "'%s' max %d on %s: sizes '%s', want '%s'", spec, max_batch,
          dev == ACT_DEVICE_CUDA ? "cuda" : "cpu", got, want);
    int count = 0;
    for (int b = 1; b <= max_batch; b++) {
        count += pad_to[b] == b;
        /* the smallest run size >= b */
        int next = b;
        while (pad_to[next] != next) next++;
        CHECK(pad_to[b] == next, "'%s': batch %d padded to %d, the next size run is %d", spec, b, pad_to[b], next);
    }
    CHECK(count == n, "'%s': returned %d sizes, pad_to has %d", spec, n, count);
}

static void refuse(const char *spec, int max_batch, const char *says)
{
    int pad_to[MAXB + 1];
    char err[256];
    int n = sizes(spec, max_batch, ACT_DEVICE_CUDA, pad_to, err);
    CHECK(n == -1 && strstr(err, says) && strstr(err, "--batch-sizes"), "'%s' max %d: rc %d, message '%s' (want '%s')",
          spec, max_batch, n, err, says);
}

int main(void)
{
    seed_rng("test_serve_sizes");
    /* auto: on a GPU 1, 2, 4 and multiples of 8 (each one captured at start), max-batch always */
    expect("auto", 32, ACT_DEVICE_CUDA, "1,2,4,8,16,24,32");
    expect(NULL, 32, ACT_DEVICE_CUDA, "1,2,4,8,16,24,32");
    expect("", 20, ACT_DEVICE_CUDA, "1,2,4,8,16,20");
    expect("auto", 3, ACT_DEVICE_CUDA, "1-3");
    expect("auto", 1, ACT_DEVICE_CUDA, "1");
    /* on the CPU every row costs, nothing is captured: never padded */
    expect("auto", 32, ACT_DEVICE_CPU, "1-32");
    expect("all", 32, ACT_DEVICE_CUDA, "1-32");
    expect("all", 2, ACT_DEVICE_CUDA, "1,2");
    /* lists: 1 and max-batch added, order and repeats do not matter */
    expect("4,16", 32, ACT_DEVICE_CUDA, "1,4,16,32");
    expect("16,4,4", 32, ACT_DEVICE_CPU, "1,4,16,32");
    expect("32", 32, ACT_DEVICE_CUDA, "1,32");
    expect("1", 8, ACT_DEVICE_CUDA, "1,8");
    int pad_to[MAXB + 1];
    char err[256];
    CHECK(sizes("4,16", 32, ACT_DEVICE_CUDA, pad_to, err) == 4 && pad_to[1] == 1 && pad_to[2] == 4 &&
              pad_to[4] == 4 && pad_to[5] == 16 && pad_to[17] == 32 && pad_to[32] == 32,
          "4,16: pad_to 2->%d 5->%d 17->%d", pad_to[2], pad_to[5], pad_to[17]);

    refuse("64", 32, "64 is above --max-batch 32");
    refuse("4,64", 32, "64 is above --max-batch 32");
    refuse("0", 32, "expected 'auto', 'all' or sizes from 1 to --max-batch (32)");
    refuse("-4", 32, "expected");
    refuse("4,", 32, "missing after the last comma");
    refuse("4,,8", 32, "expected");
    refuse("four", 32, "expected");
    refuse("8x", 32, "expected");
    refuse("Auto", 32, "expected");
    refuse(",4", 32, "expected");
    refuse("4 8", 32, "expected");
    refuse(" 4", 32, "expected");
    refuse("+4", 32, "expected");
    refuse("4, 8", 32, "expected");
    refuse("99999999999999999999", 32, "expected");
    refuse("999999999", 32, "999999999 is above --max-batch 32");

    /* a list too long for the log line ends with the largest size and the count */
    {
        int big = 2048, *tab = malloc(sizeof(int) * (size_t)(big + 1));
        char line[512];
        int n = tab ? sizes("auto", big, ACT_DEVICE_CUDA, tab, err) : -1;
        if (n > 0) act_serve_batch_sizes_str(tab, big, line, sizeof line);
        size_t l = n > 0 ? strlen(line) : 0;
        CHECK(n == 3 + big / 8 && l < sizeof line && !strncmp(line, "1,2,4,8,16,", 11) &&
                  l > 20 && !strcmp(line + l - 20, "...,2048 (259 sizes)"),
              "auto at 2048: %d sizes, line '%s'", n, n > 0 ? line : err);
        char *cut = n > 0 ? strstr(line, ",...") : NULL;   /* whole sizes before it, in order */
        int prev = 0, ok = cut != NULL;
        for (char *p = line; ok && p < cut;) {
            int v = (int)strtol(p, &p, 10);
            ok = v > prev && tab[v] == v;
            prev = v;
            if (*p == ',') p++;
        }
        CHECK(ok, "auto at 2048: the sizes before the cut are not whole listed sizes: '%s'", n > 0 ? line : "");
        free(tab);
    }

    /* random lists against the brute-force next size */
    for (int it = 0; it < 500; it++) {
        int max_batch = 1 + (int)(rnd() % MAXB);
        char spec[4096];
        size_t at = 0;
        int in[MAXB + 1] = { 0 };
        int k = 1 + (int)(rnd() % 12);
        for (int i = 0; i < k; i++) {
            int b = 1 + (int)(rnd() % (uint64_t)max_batch);
            in[b] = 1;
            at += (size_t)snprintf(spec + at, sizeof spec - at, "%s%d", i ? "," : "", b);
        }
        in[1] = in[max_batch] = 1;
        int n = sizes(spec, max_batch, ACT_DEVICE_CUDA, pad_to, err), want_n = 0;
        for (int b = 1; b <= max_batch; b++) want_n += in[b];
        CHECK(n == want_n, "'%s' max %d: %d sizes, want %d (%s)", spec, max_batch, n, want_n, err);
        for (int b = 1; b <= max_batch && n > 0; b++) {
            int next = b;
            while (!in[next]) next++;
            CHECK(pad_to[b] == next, "'%s' max %d: batch %d padded to %d, want %d", spec, max_batch, b, pad_to[b], next);
        }
    }
    printf("test_serve_sizes: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
