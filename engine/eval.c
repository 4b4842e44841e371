/* eval.c - metrics accumulation, the JSON summary and the shard merge (see eval.h).
 * Sums are doubles written with %.17g, which strtod reads back to the same bits: that is what
 * makes `eval-merge` exact. Non-finite means (an episode with nothing valid) are written as null. */
#include "eval.h"
#include "outfile.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "episode.h"
#include "json.h"
#include "weights.h"

double act_eval_steady_rate(const act_eval_summary *s) {
    return s->steady_timesteps > 0 && s->steady_s > 0 ? s->steady_timesteps / s->steady_s : NAN;
}

int act_eval_init(act_eval_summary *s, const act_config *cfg, const char *device, const char *precision,
                  int shard_index, int shard_count, int n_episodes, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    snprintf(s->model_hash, sizeof s->model_hash, "%s", cfg->model_hash);
    snprintf(s->device, sizeof s->device, "%s", device);
    snprintf(s->precision, sizeof s->precision, "%s", precision);
    s->kl_weight = cfg->kl_weight;
    s->action_dim = cfg->action_dim;
    s->pred_horizon = cfg->pred_horizon;
    s->obs_horizon = cfg->obs_horizon > 1 ? cfg->obs_horizon : 1;
    s->num_cams = cfg->num_cams;
    s->shard_count = shard_count;
    s->n_shards = 1;
    s->shards = malloc(sizeof(int));
    s->n_episodes = n_episodes;
    s->episodes = calloc((size_t)(n_episodes ? n_episodes : 1), sizeof(act_eval_episode));
    int ok = s->shards && s->episodes;
    for (int i = 0; ok && i < n_episodes; i++) {
        s->episodes[i].number = -1;
        s->episodes[i].s.joint_l1 = calloc((size_t)cfg->action_dim, sizeof(double));
        ok = s->episodes[i].s.joint_l1 != NULL;
    }
    if (!ok) {
        act_eval_free(s);
        snprintf(err, errlen, "out of memory for %d episode records", n_episodes);
        return -1;
    }
    s->shards[0] = shard_index;
    return 0;
}

void act_eval_add_batch(act_eval_episode *e, const act_config *cfg, int n, const float *pred,
                        const float *targets, const uint8_t *is_pad, const float *post_norm,
                        const float *targets_norm, const float *kl) {
    int H = cfg->pred_horizon, A = cfg->action_dim;
    act_eval_sums *s = &e->s;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < H; k++) {
            size_t row = (size_t)i * H + k;
            if (is_pad[row]) continue;
            for (int j = 0; j < A; j++) {
                size_t x = row * A + j;
                double d = (double)pred[x] - (double)targets[x];
                s->l1 += fabs(d);
                s->sq += d * d;
                s->joint_l1[j] += fabs(d);
                s->val_l1 += fabs((double)post_norm[x] - (double)targets_norm[x]);
            }
            s->count += A;
        }
        s->kl += kl[i];
        s->kl_count++;
    }
}

void act_eval_set_list(act_eval_summary *s, char *const *paths, int n) {
    uint64_t h = ACT_FNV_INIT;
    for (int i = 0; i < n; i++) {
        const char *b = act_episode_basename(paths[i]);
        h = act_fnv1a64(b, strlen(b) + 1, h);   /* with its NUL: "ab","c" differs from "a","bc" */
        /* and its size: array tasks pointed at two folders of like-named episodes (heldout/ and
         * train/, both episode_0..N) are two lists (0 where it cannot be read: it fails anyway) */
        struct stat st;
        uint8_t le[8];
        uint64_t size = stat(paths[i], &st) == 0 ? (uint64_t)st.st_size : 0;
        for (int k = 0; k < 8; k++) le[k] = (uint8_t)(size >> (8 * k));
        h = act_fnv1a64(le, sizeof le, h);
    }
    s->list_count = n;
    snprintf(s->list_hash, sizeof s->list_hash, "%016llx", (unsigned long long)h);
}

act_eval_means act_eval_means_of(const act_eval_sums *s, float kl_weight) {
    act_eval_means m;
    m.action_l1 = s->count ? s->l1 / (double)s->count : NAN;
    m.action_mse = s->count ? s->sq / (double)s->count : NAN;
    m.val_l1 = s->count ? s->val_l1 / (double)s->count : NAN;
    m.val_kl = s->kl_count ? s->kl / (double)s->kl_count : NAN;
    m.val_loss = m.val_l1 + (double)kl_weight * m.val_kl;
    return m;
}

static void put_num(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.17g", v);
    else fputs("null", f);
}

static void write_metrics(FILE *f, const act_eval_sums *s, int A, float kl_weight, const char *ind) {
    act_eval_means m = act_eval_means_of(s, kl_weight);
    fprintf(f, "%s\"action_l1\": ", ind); put_num(f, m.action_l1);
    fprintf(f, ",\n%s\"action_mse\": ", ind); put_num(f, m.action_mse);
    fprintf(f, ",\n%s\"per_joint_l1\": [", ind);
    for (int j = 0; j < A; j++) {
        if (j) fputs(", ", f);
        put_num(f, s->count ? s->joint_l1[j] / (double)(s->count / A) : NAN);
    }
    fprintf(f, "],\n%s\"val_l1\": ", ind); put_num(f, m.val_l1);
    fprintf(f, ",\n%s\"val_kl\": ", ind); put_num(f, m.val_kl);
    fprintf(f, ",\n%s\"val_loss\": ", ind); put_num(f, m.val_loss);
    fprintf(f, ",\n%s\"valid_elements\": %lld", ind, (long long)s->count);
    /* a sum is NaN when the model predicted NaN, and totals can overflow to Inf: JSON has
     * neither, so such a sum is written as null (the file stays valid; eval-merge refuses it) */
    fprintf(f, ",\n%s\"sums\": {\"l1\": ", ind); put_num(f, s->l1);
    fputs(", \"sq\": ", f); put_num(f, s->sq);
    fprintf(f, ", \"count\": %lld, \"val_l1\": ", (long long)s->count); put_num(f, s->val_l1);
    fputs(", \"kl\": ", f); put_num(f, s->kl);
    fprintf(f, ", \"kl_count\": %lld, \"joint_l1\": [", (long long)s->kl_count);
    for (int j = 0; j < A; j++) {
        if (j) fputs(", ", f);
        put_num(f, s->joint_l1[j]);
    }
    fputs("]}", f);
}

/* The counts of the episodes that succeeded, added up: -1 if they do not fit in int64 (only a
 * forged or corrupt summary gets near), so that totals never overflow (signed overflow is UB). */
static int count_totals(const act_eval_episode *eps, int n, int64_t *count, int64_t *kl_count) {
    *count = *kl_count = 0;
    for (int i = 0; i < n; i++) {
        if (eps[i].failed) continue;
        if (__builtin_add_overflow(*count, eps[i].s.count, count) ||
            __builtin_add_overflow(*kl_count, eps[i].s.kl_count, kl_count))
            return -1;
    }
    return 0;
}

int act_eval_overall(const act_eval_summary *s, act_eval_sums *o, int *failed) {
    memset(o, 0, sizeof *o);
    o->joint_l1 = calloc((size_t)s->action_dim, sizeof(double));
    if (!o->joint_l1) return -1;
    *failed = 0;
    for (int i = 0; i < s->n_episodes; i++) {
        const act_eval_episode *e = &s->episodes[i];
        if (e->failed) { (*failed)++; continue; }
        o->l1 += e->s.l1;
        o->sq += e->s.sq;
        o->val_l1 += e->s.val_l1;
        o->kl += e->s.kl;
        for (int j = 0; j < s->action_dim; j++) o->joint_l1[j] += e->s.joint_l1[j];
    }
    if (count_totals(s->episodes, s->n_episodes, &o->count, &o->kl_count)) {
        free(o->joint_l1);
        o->joint_l1 = NULL;
        return -1;
    }
    return 0;
}

int act_eval_write_json(const act_eval_summary *s, const char *path, char *err, size_t errlen) {
    act_eval_sums o;
    int failed;
    if (act_eval_overall(s, &o, &failed) != 0) {
        snprintf(err, errlen, "%s: cannot total the episodes (out of memory, or counts past 2^63)", path);
        return -1;
    }
    act_outfile out;   /* whole or not at all: a failed write leaves the previous summary */
    if (act_outfile_open(&out, path, "w", err, errlen) != 0) {
        free(o.joint_l1);
        return -1;
    }
    FILE *f = out.fp;
    fprintf(f, "{\n  \"format\": \"act-eval-summary\",\n  \"version\": 1,\n");
    /* strings that came from a file being merged may hold anything: escaped, like every string */
    fputs("  \"model_hash\": ", f);
    act_json_write_string(f, s->model_hash);
    fputs(",\n  \"device\": ", f);
    act_json_write_string(f, s->device);
    fputs(",\n  \"device_name\": ", f);
    act_json_write_string(f, s->device_name);
    fputs(",\n  \"precision\": ", f);
    act_json_write_string(f, s->precision);
    /* the sums' last bits depend on the rows each step computed: a merge matches a single run
     * bit for bit only from the same batch size and padding */
    if (s->batch > 0) fprintf(f, ",\n  \"batch\": %d", s->batch);
    else fputs(",\n  \"batch\": null", f);
    fputs(",\n  \"pad_batches\": ", f);
    if (s->pad_batches[0]) act_json_write_string(f, s->pad_batches);
    else fputs("null", f);
    fputs(",\n", f);
    fprintf(f, "  \"kl_weight\": %.9g,\n  \"action_dim\": %d,\n  \"pred_horizon\": %d,\n  \"obs_horizon\": %d,\n"
            "  \"num_cams\": %d,\n", s->kl_weight, s->action_dim, s->pred_horizon, s->obs_horizon, s->num_cams);
    fprintf(f, "  \"shard_count\": %d,\n  \"shards\": [", s->shard_count);
    for (int i = 0; i < s->n_shards; i++) fprintf(f, "%s%d", i ? ", " : "", s->shards[i]);
    fprintf(f, "],\n");
    if (s->list_hash[0]) {
        fprintf(f, "  \"episode_list\": {\"count\": %d, \"hash\": ", s->list_count);
        act_json_write_string(f, s->list_hash);
        fprintf(f, "},\n");
    }
    fprintf(f, "  \"overall\": {\n");
    write_metrics(f, &o, s->action_dim, s->kl_weight, "    ");
    double el = s->elapsed_s;
    fprintf(f, ",\n    \"episodes\": %d,\n    \"failed\": %d,\n    \"timesteps\": %lld,\n", s->n_episodes,
            failed, (long long)s->timesteps);
    fprintf(f, "    \"throughput\": {\"timesteps_per_s\": ");
    put_num(f, el > 0 ? (double)s->timesteps / el : NAN);
    fprintf(f, ", \"images_per_s\": ");
    put_num(f, el > 0 ? (double)s->timesteps * s->num_cams / el : NAN);
    fprintf(f, ", \"elapsed_s\": %.17g, \"elapsed_max_s\": %.17g, \"steady_s\": ", el, s->elapsed_max_s);
    put_num(f, s->steady_s);
    fprintf(f, ", \"steady_timesteps\": ");
    put_num(f, s->steady_timesteps);
    fprintf(f, ", \"steady_timesteps_per_s\": ");
    put_num(f, act_eval_steady_rate(s));
    fprintf(f, ", \"reader_wait_s\": ");
    put_num(f, s->reader_wait_s);
    fprintf(f, ", \"padded_rows\": ");
    put_num(f, s->padded_rows);
    fprintf(f, "}\n  },\n  \"episodes\": [");
    for (int i = 0; i < s->n_episodes; i++) {
        const act_eval_episode *e = &s->episodes[i];
        fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
        act_json_write_string(f, e->name);
        fprintf(f, ", \"index\": %d", e->index);
        if (e->number >= 0) fprintf(f, ", \"number\": %lld", e->number);
        fprintf(f, ", \"steps\": %d, \"status\": \"%s\"", e->steps, e->failed ? "failed" : "ok");
        if (e->reader[0]) {
            fprintf(f, ", \"reader\": ");
            act_json_write_string(f, e->reader);
        }
        if (e->failed) {
            fprintf(f, ", \"error\": ");
            act_json_write_string(f, e->error);
            fprintf(f, "}");
            continue;
        }
        fprintf(f, ",\n");
        write_metrics(f, &e->s, s->action_dim, s->kl_weight, "     ");
        fprintf(f, "}");
    }
    fprintf(f, "\n  ]\n}\n");
    free(o.joint_l1);
    return act_outfile_commit(&out, err, errlen);
}

/* ---- reading ---- */

static char *slurp(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        if (cap > (256u << 20)) { free(buf); buf = NULL; break; }
        char *nb = realloc(buf, cap * 2);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb;
        cap *= 2;
    }
    fclose(f);
    if (!buf) snprintf(err, errlen, "%s: too large or out of memory", path);
    else buf[n] = '\0';
    return buf;
}

static int get_int(const act_json *o, const char *key, long long lo, long long hi, long long *out) {
    double v = act_json_num(o, key);
    if (!isfinite(v) || v != floor(v) || v < (double)lo || v > (double)hi) return -1;
    *out = (long long)v;
    return 0;
}

static int get_str(const act_json *o, const char *key, char *dst, size_t len) {
    const act_json *v = act_json_get(o, key);
    if (!v || v->type != ACT_JSON_STR) return -1;
    snprintf(dst, len, "%s", v->str);
    return 0;
}

static int read_sums(const act_json *m, act_eval_sums *s, int A) {
    const act_json *sums = act_json_get(m, "sums");
    long long cnt, klc;
    if (!sums || get_int(sums, "count", 0, INT64_MAX / 2, &cnt) || get_int(sums, "kl_count", 0, INT64_MAX / 2, &klc))
        return -1;
    s->count = cnt;
    s->kl_count = klc;
    s->l1 = act_json_num(sums, "l1");
    s->sq = act_json_num(sums, "sq");
    s->val_l1 = act_json_num(sums, "val_l1");
    s->kl = act_json_num(sums, "kl");
    if (!isfinite(s->l1) || !isfinite(s->sq) || !isfinite(s->val_l1) || !isfinite(s->kl)) return -1;
    const act_json *j = act_json_get(sums, "joint_l1");
    if (!j || j->type != ACT_JSON_ARR || j->n != A) return -1;
    for (int k = 0; k < A; k++) {
        if (j->items[k].type != ACT_JSON_NUM || !isfinite(j->items[k].num)) return -1;
        s->joint_l1[k] = j->items[k].num;
    }
    return 0;
}


static int read_tree(const act_json *r, const char *path, act_eval_summary *s, char *err, size_t errlen) {
#define BAD(what) do { snprintf(err, errlen, "%s: not an act-infer eval summary: %s", path, what); return -1; } while (0)
    char fmt[32] = "";
    long long v;
    if (!r || r->type != ACT_JSON_OBJ || get_str(r, "format", fmt, sizeof fmt) || strcmp(fmt, "act-eval-summary"))
        BAD("\"format\" is not \"act-eval-summary\"");
    if (get_int(r, "version", 1, 1, &v)) BAD("unsupported \"version\"");
    if (get_str(r, "model_hash", s->model_hash, sizeof s->model_hash)) BAD("\"model_hash\" missing");
    if (get_str(r, "device", s->device, sizeof s->device)) BAD("\"device\" missing");
    if (get_str(r, "precision", s->precision, sizeof s->precision)) BAD("\"precision\" missing");
    get_str(r, "device_name", s->device_name, sizeof s->device_name);
    s->batch = get_int(r, "batch", 1, 1 << 16, &v) ? 0 : (int)v;   /* absent or null: unknown */
    if (get_str(r, "pad_batches", s->pad_batches, sizeof s->pad_batches)) s->pad_batches[0] = '\0';
    s->kl_weight = (float)act_json_num(r, "kl_weight");
    if (!isfinite(s->kl_weight)) BAD("\"kl_weight\" missing");
    if (get_int(r, "action_dim", 1, 1 << 16, &v)) BAD("\"action_dim\" missing");
    s->action_dim = (int)v;
    if (get_int(r, "pred_horizon", 1, 1 << 16, &v)) BAD("\"pred_horizon\" missing");
    s->pred_horizon = (int)v;
    s->obs_horizon = 1;   /* a summary written before it was kept: all were 1-aligned */
    if (act_json_get(r, "obs_horizon")) {
        if (get_int(r, "obs_horizon", 1, s->pred_horizon, &v)) BAD("\"obs_horizon\" is not 1..pred_horizon");
        s->obs_horizon = (int)v;
    }
    if (get_int(r, "num_cams", 1, ACT_MAX_CAMS, &v)) BAD("\"num_cams\" missing");
    s->num_cams = (int)v;
    if (get_int(r, "shard_count", 1, 1 << 20, &v)) BAD("\"shard_count\" missing");
    s->shard_count = (int)v;
    const act_json *sh = act_json_get(r, "shards");
    if (!sh || sh->type != ACT_JSON_ARR || sh->n < 1) BAD("\"shards\" missing");
    s->shards = malloc(sizeof(int) * (size_t)sh->n);
    if (!s->shards) BAD("out of memory");
    s->n_shards = sh->n;
    for (int i = 0; i < sh->n; i++) {
        double x = sh->items[i].num;
        if (sh->items[i].type != ACT_JSON_NUM || x < 0 || x >= s->shard_count || x != floor(x)) BAD("bad shard index");
        s->shards[i] = (int)x;
    }
    const act_json *el = act_json_get(r, "episode_list");   /* absent in older summaries */
    if (el) {
        const act_json *hv = act_json_get(el, "hash");
        if (get_int(el, "count", 0, INT32_MAX, &v) || !hv || hv->type != ACT_JSON_STR || strlen(hv->str) != 16 ||
            strspn(hv->str, "0123456789abcdef") != 16)
            BAD("\"episode_list\" malformed (a count and a hash of 16 hex digits)");
        snprintf(s->list_hash, sizeof s->list_hash, "%s", hv->str);
        s->list_count = (int)v;
    }
    const act_json *ov = act_json_get(r, "overall"), *tp = act_json_get(ov, "throughput");
    if (!ov || !tp || get_int(ov, "timesteps", 0, INT64_MAX / 2, &v)) BAD("\"overall\" incomplete");
    s->timesteps = v;
    s->elapsed_s = act_json_num(tp, "elapsed_s");
    s->elapsed_max_s = act_json_num(tp, "elapsed_max_s");
    if (!isfinite(s->elapsed_s) || !isfinite(s->elapsed_max_s)) BAD("\"overall.throughput\" incomplete");
    s->reader_wait_s = act_json_num(tp, "reader_wait_s");   /* NaN when absent (older summaries) */
    s->steady_s = act_json_num(tp, "steady_s");   /* (the same) */
    s->steady_timesteps = act_json_num(tp, "steady_timesteps");
    s->padded_rows = act_json_num(tp, "padded_rows");
    const act_json *eps = act_json_get(r, "episodes");
    if (!eps || eps->type != ACT_JSON_ARR) BAD("\"episodes\" missing");
    s->n_episodes = eps->n;
    s->episodes = calloc((size_t)(eps->n ? eps->n : 1), sizeof(act_eval_episode));
    if (!s->episodes) BAD("out of memory");
    for (int i = 0; i < eps->n; i++) {
        const act_json *e = &eps->items[i];
        act_eval_episode *d = &s->episodes[i];
        char status[16] = "";
        d->s.joint_l1 = calloc((size_t)s->action_dim, sizeof(double));
        if (!d->s.joint_l1) BAD("out of memory");
        if (get_str(e, "name", d->name, sizeof d->name) || get_int(e, "index", 0, INT32_MAX, &v)) {
            snprintf(err, errlen, "%s: episodes[%d]: \"name\" or \"index\" missing", path, i);
            return -1;
        }
        d->index = (int)v;
        d->number = get_int(e, "number", 0, INT64_MAX / 2, &v) == 0 ? v : -1;   /* absent: another name */
        if (get_int(e, "steps", 0, INT32_MAX, &v) || get_str(e, "status", status, sizeof status)) {
            snprintf(err, errlen, "%s: episodes[%d] (%s): \"steps\" or \"status\" missing", path, i, d->name);
            return -1;
        }
        d->steps = (int)v;
        d->failed = strcmp(status, "ok") != 0;
        if (get_str(e, "reader", d->reader, sizeof d->reader)) d->reader[0] = '\0';   /* older summaries */
        if (d->failed) {
            get_str(e, "error", d->error, sizeof d->error);
        } else if (read_sums(e, &d->s, s->action_dim) != 0) {
            snprintf(err, errlen, "%s: episodes[%d] (%s): \"sums\" missing, malformed or not finite (an "
                     "episode whose predictions held NaN/Inf cannot be merged)", path, i, d->name);
            return -1;
        }
    }
    int64_t tc, tk;
    if (count_totals(s->episodes, s->n_episodes, &tc, &tk)) BAD("the episodes' counts add up past 2^63");
    return 0;
#undef BAD
}

int act_eval_read_json(const char *path, act_eval_summary *s, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    char *text = slurp(path, err, errlen);
    if (!text) return -1;
    char jerr[256];
    act_json *r = act_json_parse(text, jerr, sizeof jerr);
    free(text);
    if (!r) {
        snprintf(err, errlen, "%s: invalid JSON: %s", path, jerr);
        return -1;
    }
    int rc = read_tree(r, path, s, err, errlen);
    act_json_free(r);
    if (rc != 0) act_eval_free(s);
    return rc;
}

/* ---- merge ---- */

static int cmp_episode(const void *a, const void *b) {
    const act_eval_episode *x = a, *y = b;
    return x->index < y->index ? -1 : x->index > y->index;
}

int act_eval_merge(const act_eval_summary *in, int n, act_eval_summary *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (n < 1) { snprintf(err, errlen, "no summaries to merge"); return -1; }
    const act_eval_summary *a = &in[0], *list = NULL;   /* list: the first that recorded its list */
    int total_eps = 0, total_shards = 0, all_listed = 1;
    for (int i = 0; i < n; i++) {
        const act_eval_summary *b = &in[i];
        if (b->obs_horizon != a->obs_horizon && !strcmp(b->model_hash, a->model_hash)) {
            snprintf(err, errlen, "summary %d scored chunks with obs_horizon %d, summary 0 with %d (a summary "
                     "written before eval aligned chunks by obs_horizon reads as 1): evaluate the shards again "
                     "with one act-infer", i, b->obs_horizon, a->obs_horizon);
            return -1;
        }
        if (strcmp(b->model_hash, a->model_hash) || b->action_dim != a->action_dim ||
            b->pred_horizon != a->pred_horizon || b->kl_weight != a->kl_weight) {
            snprintf(err, errlen, "summary %d comes from model %s, summary 0 from model %s: only evals of one model merge",
                     i, b->model_hash, a->model_hash);
            return -1;
        }
        if (b->shard_count != a->shard_count) {
            snprintf(err, errlen, "summary %d was run with --shard */%d, summary 0 with */%d", i, b->shard_count, a->shard_count);
            return -1;
        }
        if (b->list_hash[0] && !list) list = b;
        if (b->list_hash[0] && (b->list_count != list->list_count || strcmp(b->list_hash, list->list_hash))) {
            snprintf(err, errlen, "summary %d was run over another episode list than summary %d (%d episodes, "
                     "list hash %s; there %d, %s): a shard's episodes are picked by their position in the "
                     "list, so shards of different lists do not add up. Run every shard with the same "
                     "--episodes and the same files (names and sizes) present", i, (int)(list - in), b->list_count,
                     b->list_hash, list->list_count, list->list_hash);
            return -1;
        }
        if (!b->list_hash[0]) all_listed = 0;
        total_eps += b->n_episodes;
        total_shards += b->n_shards;
    }
    int *seen = calloc((size_t)a->shard_count, sizeof(int));
    if (!seen) { snprintf(err, errlen, "out of memory"); return -1; }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < in[i].n_shards; k++) seen[in[i].shards[k]]++;
    for (int k = 0; k < a->shard_count; k++) {
        if (seen[k] == 0)
            snprintf(err, errlen, "shard %d/%d is missing: merge the summaries of all %d shards", k,
                     a->shard_count, a->shard_count);
        else if (seen[k] > 1)
            snprintf(err, errlen, "shard %d/%d appears in %d summaries", k, a->shard_count, seen[k]);
        if (seen[k] != 1) {
            free(seen);
            return -1;
        }
    }
    free(seen);
    if (list && all_listed && total_eps != list->list_count) {
        snprintf(err, errlen, "the shards hold %d episodes between them, but their list had %d", total_eps,
                 list->list_count);
        return -1;
    }
    act_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.model_hash, sizeof cfg.model_hash, "%s", a->model_hash);
    cfg.kl_weight = a->kl_weight;
    cfg.action_dim = a->action_dim;
    cfg.pred_horizon = a->pred_horizon;
    cfg.obs_horizon = a->obs_horizon;
    cfg.num_cams = a->num_cams;
    if (act_eval_init(out, &cfg, a->device, a->precision, 0, a->shard_count, total_eps, err, errlen) != 0) return -1;
    free(out->shards);
    out->shards = malloc(sizeof(int) * (size_t)total_shards);
    if (!out->shards) { act_eval_free(out); snprintf(err, errlen, "out of memory"); return -1; }
    out->n_shards = 0;
    for (int k = 0; k < a->shard_count; k++) out->shards[out->n_shards++] = k;
    if (list && all_listed) {   /* a merge with an older summary cannot vouch for the list */
        out->list_count = list->list_count;
        snprintf(out->list_hash, sizeof out->list_hash, "%s", list->list_hash);
    }
    int e = 0;
    for (int i = 0; i < n; i++) {
        const act_eval_summary *b = &in[i];
        if (strcmp(b->device, out->device)) snprintf(out->device, sizeof out->device, "mixed");
        if (strcmp(b->precision, out->precision)) snprintf(out->precision, sizeof out->precision, "mixed");
        if (i == 0) snprintf(out->device_name, sizeof out->device_name, "%s", b->device_name);
        else if (strcmp(b->device_name, out->device_name)) snprintf(out->device_name, sizeof out->device_name, "mixed");
        if (i == 0) {
            out->batch = b->batch;
            snprintf(out->pad_batches, sizeof out->pad_batches, "%s", b->pad_batches);
        } else {
            if (b->batch != out->batch) out->batch = 0;
            if (strcmp(b->pad_batches, out->pad_batches))
                snprintf(out->pad_batches, sizeof out->pad_batches, "%s", b->pad_batches[0] && out->pad_batches[0] ? "mixed" : "");
        }
        if (__builtin_add_overflow(out->timesteps, b->timesteps, &out->timesteps)) {
            snprintf(err, errlen, "summary %d: the timesteps of the summaries add up past 2^63", i);
            act_eval_free(out);
            return -1;
        }
        out->elapsed_s += b->elapsed_s;
        out->reader_wait_s += b->reader_wait_s;   /* from act_eval_init's 0; NaN (unknown) stays NaN */
        out->steady_s += b->steady_s;
        out->steady_timesteps += b->steady_timesteps;
        out->padded_rows += b->padded_rows;
        if (b->elapsed_max_s > out->elapsed_max_s) out->elapsed_max_s = b->elapsed_max_s;
        for (int k = 0; k < b->n_episodes; k++, e++) {
            double *jl = out->episodes[e].s.joint_l1;
            out->episodes[e] = b->episodes[k];
            out->episodes[e].s.joint_l1 = jl;
            memcpy(jl, b->episodes[k].s.joint_l1, sizeof(double) * (size_t)a->action_dim);
        }
    }
    int64_t tc, tk;
    if (count_totals(out->episodes, total_eps, &tc, &tk) || !isfinite(out->elapsed_s)) {
        snprintf(err, errlen, "the summaries' counts or elapsed times add up past what a summary can hold");
        act_eval_free(out);
        return -1;
    }
    qsort(out->episodes, (size_t)total_eps, sizeof(act_eval_episode), cmp_episode);
    for (int k = 1; k < total_eps; k++) {
        if (out->episodes[k].index == out->episodes[k - 1].index) {
            snprintf(err, errlen, "episode #%d (%s) appears in two summaries", out->episodes[k].index,
                     out->episodes[k].name);
            act_eval_free(out);
            return -1;
        }
    }
    return 0;
}

void act_eval_free(act_eval_summary *s) {
    for (int i = 0; s->episodes && i < s->n_episodes; i++) free(s->episodes[i].s.joint_l1);
    free(s->episodes);
    free(s->shards);
    memset(s, 0, sizeof *s);
}
