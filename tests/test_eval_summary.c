/* test_eval_summary.c - the eval metrics, the summary JSON and the shard merge, without a model:
 *   1. act_eval_add_batch against a direct computation of the formulas (1e-12 relative);
 *   2. write -> read round-trips every sum bit for bit;
 *   3. two shard summaries merged equal the single summary, field for field;
 *   4. the JSON reader survives every truncation and thousands of random byte flips of a real
 *      summary (returns an error or a value, never crashes; run under ASan in CI);
 *   5. the merge refuses a missing shard, a duplicated shard and a foreign model;
 *   6. a name that is not UTF-8 is written as valid JSON (U+FFFD per bad byte).
 * Inputs are fresh random numbers each run; the seed is printed for reproduction. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "eval.h"
#include "json.h"

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

static uint64_t rng_state;
static double urand(void) {  /* xorshift64*, uniform in [0, 1) */
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}
static float frand(void) { return (float)(urand() * 4.0 - 2.0); }

enum { A = 4, H = 5, L = 3, NEP = 5 };

typedef struct { int T; float *pred, *tgt, *post, *tnorm, *kl; uint8_t *pad; } episode_data;

static void make_episode(episode_data *e, int T) {
    e->T = T;
    size_t n = (size_t)T * H * A;
    e->pred = malloc(n * sizeof(float)); e->tgt = malloc(n * sizeof(float));
    e->post = malloc(n * sizeof(float)); e->tnorm = malloc(n * sizeof(float));
    e->kl = malloc((size_t)T * sizeof(float)); e->pad = malloc((size_t)T * H);
    for (size_t i = 0; i < n; i++) { e->pred[i] = frand(); e->tgt[i] = frand(); e->post[i] = frand(); e->tnorm[i] = frand(); }
    for (int t = 0; t < T; t++) {
        e->kl[t] = (float)(urand() * 5.0);
        for (int k = 0; k < H; k++) e->pad[t * H + k] = t + k >= T;
    }
}

static void free_episode(episode_data *e) {
    free(e->pred); free(e->tgt); free(e->post); free(e->tnorm); free(e->kl); free(e->pad);
}

static act_config test_config(void) {
    act_config c;
    memset(&c, 0, sizeof c);
    c.action_dim = A; c.pred_horizon = H; c.latent_dim = L; c.num_cams = 3;
    c.kl_weight = 10.0f;
    strcpy(c.model_hash, "0123456789abcdef");
    return c;
}

/* Feeds episode e into summary slot i in batches of `batch` timesteps. */
static void feed(act_eval_summary *s, int i, int index, const episode_data *e, int batch, const act_config *c) {
    act_eval_episode *ep = &s->episodes[i];
    snprintf(ep->name, sizeof ep->name, "episode_%d.hdf5", index);
    ep->index = index;
    ep->steps = e->T;
    for (int t0 = 0; t0 < e->T; t0 += batch) {
        int n = e->T - t0 < batch ? e->T - t0 : batch;
        size_t off = (size_t)t0 * H * A;
        act_eval_add_batch(ep, c, n, e->pred + off, e->tgt + off, e->pad + (size_t)t0 * H, e->post + off,
                           e->tnorm + off, e->kl + t0);
    }
    s->timesteps += e->T;
}

static int rel_ok(double got, double want, double tol) { return fabs(got - want) <= tol * fmax(fabs(want), 1e-12); }

static void check_direct(const act_eval_episode *ep, const episode_data *e) {
    double l1 = 0, sq = 0, vl1 = 0, kl = 0, jl[A] = {0};
    long long count = 0;
    for (int t = 0; t < e->T; t++) {
        for (int k = 0; k < H && t + k < e->T; k++)
            for (int j = 0; j < A; j++) {
                size_t x = ((size_t)t * H + k) * A + j;
                double d = (double)e->pred[x] - e->tgt[x];
                l1 += fabs(d); sq += d * d; jl[j] += fabs(d);
                vl1 += fabs((double)e->post[x] - e->tnorm[x]);
                count++;
            }
        kl += e->kl[t];
    }
    act_eval_means m = act_eval_means_of(&ep->s, 10.0f);
    CHECK(ep->s.count == count, "count %lld != %lld", (long long)ep->s.count, count);
    CHECK(rel_ok(m.action_l1, l1 / count, 1e-12), "action_l1 %.17g vs %.17g", m.action_l1, l1 / count);
    CHECK(rel_ok(m.action_mse, sq / count, 1e-12), "action_mse");
    CHECK(rel_ok(m.val_l1, vl1 / count, 1e-12), "val_l1");
    CHECK(rel_ok(m.val_kl, kl / e->T, 1e-12), "val_kl");
    CHECK(rel_ok(m.val_loss, vl1 / count + 10.0 * kl / e->T, 1e-12), "val_loss");
    for (int j = 0; j < A; j++) CHECK(rel_ok(ep->s.joint_l1[j], jl[j], 1e-12), "joint %d", j);
}

static int same_episode(const act_eval_episode *a, const act_eval_episode *b) {
    if (strcmp(a->name, b->name) || strcmp(a->reader, b->reader) || a->index != b->index || a->steps != b->steps ||
        a->failed != b->failed) return 0;
    if (a->s.l1 != b->s.l1 || a->s.sq != b->s.sq || a->s.count != b->s.count || a->s.val_l1 != b->s.val_l1 ||
        a->s.kl != b->s.kl || a->s.kl_count != b->s.kl_count) return 0;
    return memcmp(a->s.joint_l1, b->s.joint_l1, sizeof(double) * A) == 0;
}

static char *read_text(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *t = malloc(*n + 1);
    if (t && fread(t, 1, *n, f) != *n) { free(t); t = NULL; }
    if (t) t[*n] = '\0';
    fclose(f);
    return t;
}

static void write_text(const char *path, const char *t, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(t, 1, n, f);
    fclose(f);
}

/* src's text less [from, until) (until searched after from) into dst, read back into out: the
 * read's return, or -2 when src lacks either key */
static int reread_cut(const char *src, const char *from, const char *until, const char *dst, act_eval_summary *out,
                      char *err, size_t errlen) {
    size_t n = 0;
    char *t = read_text(src, &n), *k = t ? strstr(t, from) : NULL, *end = k ? strstr(k, until) : NULL;
    int rr = -2;
    if (end) {
        memmove(k, end, strlen(end) + 1);
        write_text(dst, t, strlen(t));
        rr = act_eval_read_json(dst, out, err, errlen);
    }
    free(t);
    return rr;
}

int main(void) {
    rng_state = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid();
    if (!rng_state) rng_state = 1;
    printf("test_eval_summary: seed %llu\n", (unsigned long long)rng_state);
    act_config c = test_config();
    char err[ACT_ERR_LEN], dir[] = "/tmp/act_eval_testXXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }

    /* 1. metrics vs the direct formulas; T = 2 < H exercises all-padded tails */
    episode_data eps[NEP];
    int Ts[NEP] = {2, 7, 11, 5, 13};
    for (int i = 0; i < NEP; i++) make_episode(&eps[i], Ts[i]);
    act_eval_summary one;
    if (act_eval_init(&one, &c, "cpu", "fp32", 0, 1, NEP, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
    for (int i = 0; i < NEP; i++) feed(&one, i, i, &eps[i], 1 + (int)(urand() * 6), &c);
    for (int i = 0; i < NEP; i++) check_direct(&one.episodes[i], &eps[i]);
    one.elapsed_s = one.elapsed_max_s = 1.5;
    one.reader_wait_s = 0.375;
    snprintf(one.episodes[1].reader, sizeof one.episodes[1].reader, "l_vis, front: pread, contiguous; r_vis: hdf5");
    one.steady_s = 0.5;
    one.steady_timesteps = 6;
    one.padded_rows = 7;

    /* 2. round trip */
    char p_one[128], p_s0[128], p_s1[128], p_m[128], p_bad[128], p_old[128];
    snprintf(p_one, sizeof p_one, "%s/one.json", dir);
    snprintf(p_s0, sizeof p_s0, "%s/s0.json", dir);
    snprintf(p_s1, sizeof p_s1, "%s/s1.json", dir);
    snprintf(p_m, sizeof p_m, "%s/m.json", dir);
    snprintf(p_bad, sizeof p_bad, "%s/bad.json", dir);
    snprintf(p_old, sizeof p_old, "%s/old.json", dir);
    CHECK(act_eval_write_json(&one, p_one, err, sizeof err) == 0, "write: %s", err);
    act_eval_summary back;
    CHECK(act_eval_read_json(p_one, &back, err, sizeof err) == 0, "read: %s", err);
    CHECK(back.n_episodes == NEP && back.timesteps == one.timesteps, "round trip counts");
    CHECK(back.reader_wait_s == one.reader_wait_s, "reader wait %g after the round trip", back.reader_wait_s);
    CHECK(back.steady_s == 0.5 && back.steady_timesteps == 6, "steady %g s, %g timesteps after the round trip",
          back.steady_s, back.steady_timesteps);
    CHECK(act_eval_steady_rate(&back) == 12.0, "steady rate %g, want 12", act_eval_steady_rate(&back));
    CHECK(back.padded_rows == 7, "padded rows %g after the round trip", back.padded_rows);
    for (int i = 0; i < NEP && i < back.n_episodes; i++)
        CHECK(same_episode(&one.episodes[i], &back.episodes[i]), "episode %d differs after the round trip", i);
    act_eval_free(&back);
    { /* a summary written before reader_wait_s was kept still reads (the wait unknown: NaN) */
        int rr = reread_cut(p_one, ", \"reader_wait_s\": ", "}", p_bad, &back, err, sizeof err);
        CHECK(rr != -2, "no reader_wait_s in the summary written");
        CHECK(rr == 0 && isnan(back.reader_wait_s), "a summary without reader_wait_s: %s", rr ? err : "not NaN");
        if (rr == 0) act_eval_free(&back);
    }
    { /* one of session 20 (no padded rows): those NaN, the rest as written */
        int rr = reread_cut(p_one, ", \"padded_rows\": ", "}", p_bad, &back, err, sizeof err);
        CHECK(rr != -2, "no padded_rows in the summary written");
        CHECK(rr == 0 && isnan(back.padded_rows) && back.steady_timesteps == 6 && back.reader_wait_s == one.reader_wait_s,
              "a summary without padded_rows: %s", rr ? err : "wrong fields");
        if (rr == 0) act_eval_free(&back);
    }
    { /* ... and one of session 19 (reader wait, no steady figures): those NaN, and no steady rate */
        int rr = reread_cut(p_one, ", \"steady_s\": ", ", \"reader_wait_s\": ", p_old, &back, err, sizeof err);
        CHECK(rr != -2, "no steady_s before reader_wait_s in the summary written");
        size_t n = 0;
        char *t = read_text(p_old, &n);
        CHECK(t && !strstr(t, "steady"), "a steady key left after the cut");
        free(t);
        CHECK(rr == 0 && isnan(back.steady_s) && isnan(back.steady_timesteps) && isnan(act_eval_steady_rate(&back)) &&
              back.reader_wait_s == one.reader_wait_s, "a summary without steady_s: %s", rr ? err : "wrong fields");
        if (rr == 0) act_eval_free(&back);
    }
    { /* a file name that is not UTF-8 (Linux allows any bytes): the summary stays JSON that strict
       * parsers read, with U+FFFD for each bad byte; well-formed sequences pass as they are */
        act_eval_summary u = one;
        act_eval_episode ue[NEP];
        memcpy(ue, one.episodes, sizeof ue);
        u.episodes = ue;
        snprintf(ue[0].name, sizeof ue[0].name, "ep\xff\xc0\xaf_ok\xc3\xa9\xed\xa0\x80\xe2\x82");
        CHECK(act_eval_write_json(&u, p_bad, err, sizeof err) == 0, "write: %s", err);
        size_t n = 0;
        char *t = read_text(p_bad, &n);
        int bad_utf8 = 0;
        for (size_t i = 0; t && i < n; i++) bad_utf8 += (unsigned char)t[i] >= 0x80 &&
            !((unsigned char)t[i] == 0xc3 && (unsigned char)t[i + 1] == 0xa9) &&
            !((unsigned char)t[i] == 0xa9 && i > 0 && (unsigned char)t[i - 1] == 0xc3);
        CHECK(t && bad_utf8 == 0, "%d raw bytes other than the one e-acute left in the JSON", bad_utf8);
        CHECK(t && strstr(t, "\"ep\\ufffd\\ufffd\\ufffd_ok\xc3\xa9\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\""),
              "the name is not written with one U+FFFD per bad byte");
        free(t);
        CHECK(act_eval_read_json(p_bad, &back, err, sizeof err) == 0, "read: %s", err);
        CHECK(!strcmp(back.episodes[0].name, "ep\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd_ok\xc3\xa9"
                      "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"), "name read back: %s",
              back.episodes[0].name);
        act_eval_free(&back);
    }
    { /* no steady iteration: no steady rate */
        act_eval_summary none = one;
        none.steady_s = none.steady_timesteps = 0;
        CHECK(isnan(act_eval_steady_rate(&none)), "steady rate %g with no steady step", act_eval_steady_rate(&none));
    }

    /* 3. shards 0/2 (episodes 0, 2, 4) and 1/2 (1, 3), merged in the wrong order */
    act_eval_summary sh[2], merged;
    for (int s = 0; s < 2; s++) {
        int n = s == 0 ? 3 : 2;
        act_eval_init(&sh[s], &c, "cpu", "fp32", s, 2, n, err, sizeof err);
        for (int k = 0; k < n; k++) feed(&sh[s], k, s + 2 * k, &eps[s + 2 * k], 3, &c);
        sh[s].elapsed_s = sh[s].elapsed_max_s = 1.0 + s;
        sh[s].reader_wait_s = 0.25 + 0.5 * s;
        sh[s].steady_s = 0.125 + 0.25 * s;
        if (s == 1) memcpy(sh[1].episodes[0].reader, one.episodes[1].reader, sizeof one.episodes[1].reader);
        sh[s].steady_timesteps = 2 + s;
        sh[s].padded_rows = 1 + 2 * s;
    }
    act_eval_write_json(&sh[0], p_s0, err, sizeof err);
    act_eval_write_json(&sh[1], p_s1, err, sizeof err);
    act_eval_summary rd[2];
    CHECK(act_eval_read_json(p_s1, &rd[0], err, sizeof err) == 0, "%s", err);
    CHECK(act_eval_read_json(p_s0, &rd[1], err, sizeof err) == 0, "%s", err);
    CHECK(act_eval_merge(rd, 2, &merged, err, sizeof err) == 0, "merge: %s", err);
    CHECK(merged.n_episodes == NEP && merged.timesteps == one.timesteps, "merged counts");
    for (int i = 0; i < NEP && i < merged.n_episodes; i++)
        CHECK(same_episode(&one.episodes[i], &merged.episodes[i]), "merged episode %d differs from the single run", i);
    CHECK(merged.elapsed_s == 3.0 && merged.elapsed_max_s == 2.0, "merged timings %g %g", merged.elapsed_s, merged.elapsed_max_s);
    CHECK(merged.reader_wait_s == 1.0, "merged reader wait %g (the shards' sum, 1)", merged.reader_wait_s);
    CHECK(merged.steady_s == 0.5 && merged.steady_timesteps == 5, "merged steady %g s, %g timesteps (the "
          "shards' sums, 0.5 and 5)", merged.steady_s, merged.steady_timesteps);
    CHECK(merged.padded_rows == 4, "merged padded rows %g (the shards' sum, 4)", merged.padded_rows);
    act_eval_write_json(&merged, p_m, err, sizeof err);
    { /* a shard of session 19 beside a new one: the sums unknown (null), the rest merged */
        act_eval_summary mix[2], mm;
        int r0 = act_eval_read_json(p_s1, &mix[0], err, sizeof err) != 0;
        int r1 = act_eval_read_json(p_s0, &mix[1], err, sizeof err) != 0;
        CHECK(!r0 && !r1, "reread: %s", err);
        if (!r0 && !r1) {
            mix[1].steady_s = mix[1].steady_timesteps = mix[1].padded_rows = NAN;
            CHECK(act_eval_merge(mix, 2, &mm, err, sizeof err) == 0, "merge: %s", err);
            CHECK(isnan(mm.steady_s) && isnan(mm.steady_timesteps) && isnan(act_eval_steady_rate(&mm)) &&
                  isnan(mm.padded_rows) &&
                  mm.reader_wait_s == 1.0, "merged with an old shard: steady %g s, %g timesteps", mm.steady_s,
                  mm.steady_timesteps);
            char p_mm[140];
            snprintf(p_mm, sizeof p_mm, "%s/mm.json", dir);
            CHECK(act_eval_write_json(&mm, p_mm, err, sizeof err) == 0, "write: %s", err);
            size_t n = 0;
            char *t = read_text(p_mm, &n);
            CHECK(t && strstr(t, "\"steady_s\": null") && strstr(t, "\"steady_timesteps_per_s\": null") &&
                      strstr(t, "\"padded_rows\": null"),
                  "unknown steady figures not written as null");
            free(t);
            remove(p_mm);
            act_eval_free(&mm);
        }
        if (!r0) act_eval_free(&mix[0]);
        if (!r1) act_eval_free(&mix[1]);
    }

    /* 5. refusals */
    act_eval_summary bad;
    CHECK(act_eval_merge(rd, 1, &bad, err, sizeof err) != 0 && strstr(err, "shard 0/2 is missing"), "missing shard: %s", err);
    CHECK(act_eval_merge(&rd[1], 1, &bad, err, sizeof err) != 0 && strstr(err, "shard 1/2 is missing"), "missing shard: %s", err);
    act_eval_summary dup[3] = {rd[1], rd[0], rd[1]};
    CHECK(act_eval_merge(dup, 3, &bad, err, sizeof err) != 0 && strstr(err, "shard 0/2 appears in 2 summaries"),
          "duplicate: %s", err);
    strcpy(rd[0].model_hash, "ffffffffffffffff");
    CHECK(act_eval_merge(rd, 2, &bad, err, sizeof err) != 0 && strstr(err, "one model"), "foreign model: %s", err);
    act_eval_free(&rd[0]);
    act_eval_free(&rd[1]);

    /* 4. every truncation and random byte flips of a real summary */
    size_t n;
    char *text = read_text(p_m, &n);
    CHECK(text != NULL, "cannot read %s", p_m);
    int parsed_truncated = 0;
    for (size_t cut = 0; text && cut < n; cut++) {
        write_text(p_bad, text, cut);
        act_eval_summary t;
        if (act_eval_read_json(p_bad, &t, err, sizeof err) == 0) {
            parsed_truncated += cut + 2 < n;  /* only trailing whitespace may go */
            act_eval_free(&t);
        }
    }
    CHECK(parsed_truncated == 0, "%d truncated summaries were accepted", parsed_truncated);
    for (int it = 0; text && it < 3000; it++) {
        char *m = malloc(n + 1);
        memcpy(m, text, n + 1);
        int flips = 1 + (int)(urand() * 4);
        for (int f = 0; f < flips; f++) m[(size_t)(urand() * n)] = (char)(1 + (int)(urand() * 255));
        write_text(p_bad, m, n);
        act_eval_summary t;
        if (act_eval_read_json(p_bad, &t, err, sizeof err) == 0) act_eval_free(&t);
        else CHECK(strstr(err, "bad.json") != NULL, "error does not name the file: %s", err);
        free(m);
    }
    free(text);
    /* nesting bombs and odd JSON */
    const char *odd[] = {"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "{\"a\":",
                         "\"\\u12", "{\"format\": \"act-eval-summary\", \"version\": 1}", "nul", "-", "{} x"};
    for (size_t k = 0; k < sizeof odd / sizeof odd[0]; k++) {
        act_json *j = act_json_parse(odd[k], err, sizeof err);
        if (k == 3) { CHECK(j != NULL, "valid JSON refused: %s", err); }
        else CHECK(j == NULL && err[0], "'%s' was accepted", odd[k]);
        act_json_free(j);
    }

    /* 6. what the fuzzer found (tests/fuzz/corpus/json/eval_*): strings with quotes and
     * backslashes, NaN/Inf sums, counts whose total overflows */
    act_eval_summary q, qb;
    act_eval_init(&q, &c, "cu\"da\\0", "bf\"16", 0, 1, 2, err, sizeof err);
    for (int k = 0; k < 2; k++) feed(&q, k, k, &eps[k], 2, &c);
    q.elapsed_s = q.elapsed_max_s = 1.0;
    CHECK(act_eval_write_json(&q, p_bad, err, sizeof err) == 0, "write: %s", err);
    CHECK(act_eval_read_json(p_bad, &qb, err, sizeof err) == 0 && !strcmp(qb.device, q.device) &&
          !strcmp(qb.precision, q.precision), "quoted device/precision do not read back: %s", err);
    act_eval_free(&qb);
    /* a model that predicted NaN: the file stays JSON (null sums), and merging it says why not */
    q.episodes[1].s.l1 = NAN;
    q.episodes[1].s.joint_l1[0] = INFINITY;
    CHECK(act_eval_write_json(&q, p_bad, err, sizeof err) == 0, "write with NaN sums: %s", err);
    char *nt = read_text(p_bad, &n);
    act_json *nj = nt ? act_json_parse(nt, err, sizeof err) : NULL;
    CHECK(nj != NULL, "a summary with NaN sums is not valid JSON: %s", err);
    act_json_free(nj);
    free(nt);
    CHECK(act_eval_read_json(p_bad, &qb, err, sizeof err) != 0 && strstr(err, "not finite"), "NaN sums read: %s", err);
    /* every count 2^62 (the most one field may say): two episodes add up past 2^63, which is
     * refused at read instead of overflowing (UB) in the totals */
    q.episodes[1].s.l1 = 1.0;
    q.episodes[1].s.joint_l1[0] = 1.0;
    CHECK(act_eval_write_json(&q, p_bad, err, sizeof err) == 0, "write: %s", err);
    nt = read_text(p_bad, &n);
    char *big = nt ? malloc(2 * n + 64) : NULL, *w = big;
    for (const char *r = nt; big && *r;) {
        if (!strncmp(r, "\"count\": ", 9)) {
            w += sprintf(w, "\"count\": 4611686018427387904");
            for (r += 9; *r >= '0' && *r <= '9'; r++) {}
        } else {
            *w++ = *r++;
        }
    }
    if (big) {
        write_text(p_bad, big, (size_t)(w - big));
        CHECK(act_eval_read_json(p_bad, &qb, err, sizeof err) != 0 && strstr(err, "2^63"), "overflowing counts: %s", err);
    }
    free(big);
    free(nt);
    act_eval_free(&q);

    act_eval_free(&merged);
    act_eval_free(&sh[0]);
    act_eval_free(&sh[1]);
    act_eval_free(&one);
    for (int i = 0; i < NEP; i++) free_episode(&eps[i]);
    remove(p_one); remove(p_s0); remove(p_s1); remove(p_m); remove(p_bad); remove(p_old);
    rmdir(dir);
    if (failures) { fprintf(stderr, "test_eval_summary: %d failures\n", failures); return 1; }
    printf("test_eval_summary: all checks passed\n");
    return 0;
}
