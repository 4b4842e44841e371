/* test_weights.c - the .actw reader against real converter output and corrupted copies of it.
 *
 * The files come from tests/make_testdata.py (the make_testdata ctest fixture): small.actw
 * (raw) and small_zstd.actw (the same model, zstd) converted from a randomized reference
 * checkpoint, plus small.expect (per-tensor sums computed by the converter's Python reader).
 * Every corruption must give -1 and a message naming the file and the broken field - never a
 * crash (this test runs under ASan/UBSan in CI), never a success. Random positions are drawn
 * fresh each run; the seed is printed (replay: ACT_TEST_SEED=<seed>).
 */
#include "actw_test.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#ifdef ACT_WITH_ZSTD
#include <zstd.h>
#endif

static char g_raw_path[512], g_zst_path[512];

/* ---- good files ---- */

static void check_expectations(const act_weights *w) {
    char path[512], name[128];
    snprintf(path, sizeof path, "%s/small.expect", data_dir());
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "missing %s", path);
    if (!f) return;
    int seen = 0;
    long long numel;
    double sum, first, last;
    char kind[16];
    while (fscanf(f, "%15s", kind) == 1) {
        if (strcmp(kind, "tensor") != 0) {
            int c;
            while ((c = fgetc(f)) != '\n' && c != EOF) {}
            continue;
        }
        if (fscanf(f, "%127s %lld %lf %lf %lf", name, &numel, &sum, &first, &last) != 5) break;
        const act_tensor *t = act_weights_find(w, name);
        CHECK(t != NULL, "tensor %s from small.expect not found", name);
        if (!t) continue;
        seen++;
        double s = 0, mag = 0;
        for (int64_t i = 0; i < t->numel; i++) {
            s += t->data[i];
            mag += fabs(t->data[i]);
        }
        CHECK(t->numel == numel, "%s: numel %lld, expected %lld", name, (long long)t->numel, numel);
        /* double sums of the same fp32 values: only the summation order differs */
        CHECK(fabs(s - sum) <= 1e-9 * (mag + 1), "%s: sum %.17g, expected %.17g", name, s, sum);
        CHECK(t->data[0] == (float)first && t->data[t->numel - 1] == (float)last,
              "%s: first/last %g %g, expected %g %g", name, t->data[0], t->data[t->numel - 1], first, last);
    }
    fclose(f);
    CHECK(seen == w->n_tensors, "small.expect lists %d tensors, the file has %d", seen, w->n_tensors);
}

static void test_good_files(const bytes *raw, const bytes *zst) {
    char err[ACT_ERR_LEN];
    act_weights *a = NULL, *b = NULL;
    int ra = act_weights_open(g_raw_path, &a, err, sizeof err);
    CHECK(ra == 0, "open %s: %s", g_raw_path, err);
    if (zst) {
        int rb = act_weights_open(g_zst_path, &b, err, sizeof err);
#ifdef ACT_WITH_ZSTD
        CHECK(rb == 0, "open %s: %s", g_zst_path, err);
#else
        CHECK(rb == -1 && strstr(err, "without zstd"), "zstd file in a build without zstd: %s", err);
#endif
    }
    if (ra) return;
    CHECK(!a->compressed && a->checksum == get64(raw, H_CHECKSUM), "raw: flags/checksum");
    CHECK(a->checksum == act_fnv1a64(raw->p + 128, raw->n - 128, ACT_FNV_INIT), "raw: checksum is FNV-1a of [128, end)");
    CHECK((uintptr_t)a->blob % 64 == 0, "blob is not 64-byte aligned");
    CHECK(a->blob_elems * 4 == get64(raw, H_DATA_SIZE), "blob_elems");
    CHECK(a->n_tensors == (int)get64(raw, H_NT), "n_tensors");
    for (int i = 0; i < a->n_tensors; i++) {
        const act_tensor *t = &a->tensors[i];
        CHECK(t->index == i && t->data == a->blob + t->offset && (t->offset * 4) % 64 == 0,
              "tensor %d (%s): index/offset/data", i, t->name);
        CHECK(act_weights_find(a, t->name) == t, "find(%s)", t->name);
    }
    CHECK(act_weights_find(a, "no.such.tensor") == NULL, "find of an absent name");
    CHECK(act_meta_get(a, "format") && strcmp(act_meta_get(a, "format"), "actw") == 0, "meta format=actw");
    CHECK(act_meta_get(a, "no.such.key") == NULL, "absent meta key");
    check_expectations(a);
    if (b) {
        CHECK(b->compressed && b->checksum == get64(zst, H_CHECKSUM) && b->checksum != a->checksum,
              "zstd: flags/checksum");
        CHECK((uintptr_t)b->blob % 64 == 0, "zstd blob is not 64-byte aligned");
        CHECK(b->n_tensors == a->n_tensors && b->blob_elems == a->blob_elems && b->n_meta == a->n_meta,
              "zstd and raw files differ in structure");
        CHECK(memcmp(a->blob, b->blob, a->blob_elems * 4) == 0, "zstd data inflates to different bytes");
        for (int i = 0; i < a->n_tensors && i < b->n_tensors; i++)
            CHECK(strcmp(a->tensors[i].name, b->tensors[i].name) == 0 && a->tensors[i].numel == b->tensors[i].numel,
                  "tensor %d differs between raw and zstd", i);
    }
    /* the two phases act_model_load uses: the index is checked but holds no tensor data (a zstd
     * frame is kept as stored, not inflated); load_data then gives what act_weights_open gives */
    for (int k = 0; k < 2; k++) {
        const char *path = k ? g_zst_path : g_raw_path;
        const act_weights *full = k ? b : a;
        if (!full) continue;
        act_weights *ix = NULL;
        int rc = act_weights_open_index(path, &ix, err, sizeof err);
        CHECK(rc == 0 && ix, "open_index %s: %s", path, err);
        if (rc) continue;
        int nodata = 1;
        for (int i = 0; i < ix->n_tensors; i++) nodata &= ix->tensors[i].data == NULL;
        CHECK(!ix->data_loaded && nodata && ix->blob_elems == 0 && ix->n_tensors == full->n_tensors &&
              ix->n_meta == full->n_meta && ix->checksum == full->checksum && ix->data_size == full->blob_elems * 4,
              "%s: index: loaded %d, tensor data unset %d, blob_elems %zu", path, ix->data_loaded, nodata,
              ix->blob_elems);
        CHECK(k ? ix->blob == NULL && ix->stored && ix->stored_size == (size_t)get64(zst, H_STORED) : ix->blob != NULL,
              "%s: index: a zstd frame is held as stored, not inflated", path);
        rc = act_weights_load_data(ix, err, sizeof err);
        CHECK(rc == 0 && ix->data_loaded && !ix->stored && ix->blob_elems == full->blob_elems &&
              memcmp(ix->blob, full->blob, full->blob_elems * 4) == 0, "%s: load_data: %s", path, rc ? err : "");
        for (int i = 0; rc == 0 && i < ix->n_tensors; i++)
            CHECK(ix->tensors[i].data == ix->blob + ix->tensors[i].offset, "%s: load_data: tensor %d data", path, i);
        CHECK(act_weights_load_data(ix, err, sizeof err) == 0, "%s: load_data twice", path);
        act_weights_free(ix);
    }
    act_weights_free(a);
    act_weights_free(b);

    act_weights *w = NULL;
    CHECK(act_weights_open("/nonexistent/dir/x.actw", &w, err, sizeof err) == -1 && strstr(err, "/nonexistent/dir/x.actw")
          && w == NULL, "nonexistent file: %s", err);
    CHECK(act_weights_open(data_dir(), &w, err, sizeof err) == -1 && strstr(err, "not a regular file"),
          "directory: %s", err);
}

/* A FIFO with no writer given as the model: refused as "not a regular file", not a reader
 * blocked in open() for ever (act-infer/act-serve --model fifo hung). The alarm turns a hang
 * into a failure. */
static void on_fifo_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_weights: FAIL act_weights_open blocked on a FIFO (no writer) for 20 s\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(1);
    _exit(1);
}

static void test_fifo(void) {
    char path[600], err[1024];
    tmp_path(path, sizeof path);
    if (mkfifo(path, 0600) != 0) {
        printf("test_weights: mkfifo %s: %s: FIFO case skipped\n", path, strerror(errno));
        return;
    }
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fifo_alarm;
    sigaction(SIGALRM, &sa, &old);
    alarm(20);
    act_weights *w = NULL;
    int rc = act_weights_open(path, &w, err, sizeof err);
    alarm(0);
    sigaction(SIGALRM, &old, NULL);
    CHECK(rc == -1 && w == NULL && strstr(err, path) && strstr(err, "not a regular file"), "fifo: rc %d, %s", rc, err);
    act_model *m = NULL;
    sigaction(SIGALRM, &sa, &old);
    alarm(20);
    rc = act_model_load(path, &m, err, sizeof err);
    alarm(0);
    sigaction(SIGALRM, &old, NULL);
    CHECK(rc != 0 && m == NULL && strstr(err, "not a regular file"), "fifo via act_model_load: rc %d, %s", rc, err);
    unlink(path);
}

/* ---- truncation and extension ---- */

static int cmp_desc(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void test_truncation(const bytes *good, const char *tag) {
    size_t ms = get64(good, H_META_SIZE), doff = get64(good, H_DIR_OFF), nt = get64(good, H_NT);
    size_t data = get64(good, H_DATA_OFF), n = good->n;
    enum { NB = 24, NR = 24 };
    size_t cuts[NB + NR] = {0, 1, 4, 12, 64, 127, 128, 129, 128 + ms / 2, doff - 1, doff, doff + 1, doff + 128,
                            doff + nt * 64, doff + nt * 128 - 1, doff + nt * 128, data - 1, data, data + 1,
                            data + 64, (data + n) / 2, n - 64, n - 4, n - 1};
    for (int i = 0; i < NR; i++) cuts[NB + i] = rnd_below(n);
    qsort(cuts, NB + NR, sizeof cuts[0], cmp_desc);
    scratch s;
    CHECK(scratch_open(&s, good) == 0, "cannot write a scratch copy");
    char what[96];
    for (int i = 0; i < NB + NR; i++) {
        snprintf(what, sizeof what, "%s truncated at %zu", tag, cuts[i]);
        expect_fail_truncated(&s, cuts[i], what, "truncated", NULL);
    }
    scratch_close(&s);
    bytes b = {(unsigned char *)calloc(n + 16, 1), n + 16};
    memcpy(b.p, good->p, n);
    snprintf(what, sizeof what, "%s + 16 trailing bytes", tag);
    expect_fail(b, 0, what, "file_size", "trailing", NULL);
}

/* ---- flipped bytes: the header is checked field by field, everything after by the checksum ---- */

static void test_flips(const bytes *good, const char *tag) {
    char what[96];
    scratch s;
    CHECK(scratch_open(&s, good) == 0, "cannot write a scratch copy");
    size_t meta = get64(good, H_META_SIZE), dir = get64(good, H_DIR_OFF), dir_n = get64(good, H_NT) * 128;
    for (int i = 0; i < 48; i++) {
        /* every section gets its share: header, metadata, directory, then anywhere (mostly data) */
        size_t pos = i % 4 == 0 ? rnd_below(128) : i % 4 == 1 ? 128 + rnd_below(meta)
                   : i % 4 == 2 ? dir + rnd_below(dir_n) : rnd_below(good->n);
        unsigned char v = good->p[pos] ^ (unsigned char)(1 + rnd_below(255));
        snprintf(what, sizeof what, "%s byte %zu flipped", tag, pos);
        if (pos >= 128) expect_fail_patch(&s, pos, &v, 1, 0, what, "checksum mismatch", NULL);
        else expect_fail_patch(&s, pos, &v, 1, 0, what, NULL);
    }
    scratch_close(&s);
}

/* ---- header fields ---- */

static void hdr_case(scratch *s, size_t off, int width, uint64_t v, const char *what, const char *word) {
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(v >> (8 * i));
    expect_fail_patch(s, off, le, (size_t)width, 0, what, word, NULL);
}

static void test_header(const bytes *good) {
    const uint64_t huge = 1ull << 63, nt = get64(good, H_NT);
    scratch s;
    CHECK(scratch_open(&s, good) == 0, "cannot write a scratch copy");
    expect_fail_patch(&s, 0, "ACTX", 4, 0, "wrong magic", "magic", NULL);
    hdr_case(&s, H_VERSION, 4, 2, "version 2", "version");
    hdr_case(&s, H_VERSION, 4, 0, "version 0", "version");
    hdr_case(&s, H_ENDIAN, 4, 0x04030201u, "big-endian tag", "big-endian");
    hdr_case(&s, H_ENDIAN, 4, 0xdeadbeefu, "garbage endian tag", "endian");
    hdr_case(&s, H_HSIZE, 4, 256, "header_size 256", "header_size");
    hdr_case(&s, H_FILE_SIZE, 8, huge, "huge file_size", "truncated");
    hdr_case(&s, H_META_OFF, 8, 0, "meta_offset 0", "meta_offset");
    hdr_case(&s, H_META_OFF, 8, huge, "huge meta_offset", "meta_offset");
    hdr_case(&s, H_META_SIZE, 8, huge, "huge meta_size", "meta_size");
    hdr_case(&s, H_META_SIZE, 8, (1u << 20) + 1, "meta_size 1 MiB + 1", "meta_size");
    hdr_case(&s, H_META_SIZE, 8, get64(good, H_META_SIZE) + 1, "meta_size + 1", "dir_offset");
    hdr_case(&s, H_DIR_OFF, 8, huge, "huge dir_offset", "dir_offset");
    hdr_case(&s, H_NT, 8, 0, "n_tensors 0", "n_tensors");
    hdr_case(&s, H_NT, 8, 65537, "n_tensors 65537", "n_tensors");
    hdr_case(&s, H_NT, 8, huge, "huge n_tensors", "n_tensors");
    hdr_case(&s, H_NT, 8, UINT64_MAX, "n_tensors 2^64-1", "n_tensors");
    hdr_case(&s, H_NT, 8, nt + 1, "n_tensors + 1", "data_offset");
    hdr_case(&s, H_NT, 8, nt - 1, "n_tensors - 1", "data_offset");
    hdr_case(&s, H_DATA_OFF, 8, get64(good, H_DATA_OFF) + 64, "data_offset + 64", "data_offset");
    hdr_case(&s, H_DATA_OFF, 8, huge, "huge data_offset", "data_offset");
    hdr_case(&s, H_STORED, 8, huge, "huge stored_size", "stored_size");
    hdr_case(&s, H_STORED, 8, get64(good, H_STORED) - 4, "stored_size - 4", "stored_size");
    hdr_case(&s, H_DATA_SIZE, 8, huge, "huge data_size (raw)", "data_size");
    hdr_case(&s, H_DATA_SIZE, 8, get64(good, H_DATA_SIZE) + 64, "data_size + 64 (raw)", "data_size");
    hdr_case(&s, H_COMP, 4, 2, "compression 2", "compression");
    hdr_case(&s, H_ALIGN, 4, 32, "alignment 32", "alignment");
    hdr_case(&s, H_CHECKSUM, 8, get64(good, H_CHECKSUM) ^ 1, "checksum field off by a bit", "checksum mismatch");
    unsigned char one = 1;
    expect_fail_patch(&s, 96 + rnd_below(32), &one, 1, 0, "reserved header byte set", "reserved", NULL);
    scratch_close(&s);
}

/* ---- directory records (offsets and checksum recomputed, so the record check itself speaks) ---- */

typedef void (*rec_edit)(parts *p, int i, int j);
static void e_overlap(parts *p, int i, int j) {
    /* move another record onto the one at offset 0: it stays in range, only the overlap is wrong */
    int first = 0;
    for (int k = 0; k < p->n; k++)
        if (rec64(rec(p, k), R_OFFSET) == 0) first = k;
    rec_put64(rec(p, first == i ? j : i), R_OFFSET, 0);
}
static void e_out_of_range(parts *p, int i, int j) { rec_put64(rec(p, i), R_OFFSET, p->data_size); }
static void e_huge_offset(parts *p, int i, int j) { rec_put64(rec(p, i), R_OFFSET, 1ull << 63); }
static void e_wrapping(parts *p, int i, int j) { rec_put64(rec(p, i), R_OFFSET, UINT64_MAX - 63); }
static void e_unaligned(parts *p, int i, int j) { rec_put64(rec(p, i), R_OFFSET, rec64(rec(p, i), R_OFFSET) + 4); }
static void e_dup_name(parts *p, int i, int j) { memcpy(rec(p, j), rec(p, i), 64); }
static void e_unterminated(parts *p, int i, int j) { memset(rec(p, i), 'a', 64); }
static void e_nonprintable(parts *p, int i, int j) { rec(p, i)[1] = 0x07; }
static void e_empty_name(parts *p, int i, int j) { memset(rec(p, i), 0, 64); }
static void e_not_padded(parts *p, int i, int j) { rec(p, i)[63] = 'x'; rec(p, i)[62] = 0; }
static void e_dtype(parts *p, int i, int j) { rec_put32(rec(p, i), R_DTYPE, 1); }
static void e_ndim0(parts *p, int i, int j) { rec_put32(rec(p, i), R_NDIM, 0); }
static void e_ndim5(parts *p, int i, int j) { rec_put32(rec(p, i), R_NDIM, 5); }
static void e_dim0(parts *p, int i, int j) { rec_put64(rec(p, i), R_DIMS, 0); }
static void e_tail_dim(parts *p, int i, int j) {
    while (rec32(rec(p, i), R_NDIM) == 4) i = (i + 1) % p->n;  /* a record with a dim past ndim */
    rec_put64(rec(p, i), R_DIMS + 24, 3);
}
static void e_overflow_dims(parts *p, int i, int j) {
    unsigned char *r = rec(p, i);
    rec_put32(r, R_NDIM, 4);
    for (int d = 0; d < 4; d++) rec_put64(r, R_DIMS + 8 * d, 1ull << 32);  /* product wraps to 0 mod 2^64 */
    rec_put64(r, R_NBYTES, 0);
}
static void e_nbytes(parts *p, int i, int j) { rec_put64(rec(p, i), R_NBYTES, rec64(rec(p, i), R_NBYTES) + 4); }
static void e_reserved(parts *p, int i, int j) { rec(p, i)[R_RESERVED + 3] = 9; }

static void test_directory(const bytes *good) {
    static const struct { rec_edit f; const char *what, *word; } cases[] = {
        {e_overlap, "overlapping tensors", "overlap"},
        {e_out_of_range, "offset at data end", "out of range"},
        {e_huge_offset, "offset 2^63", "out of range"},
        {e_wrapping, "offset + nbytes wraps", "out of range"},
        {e_unaligned, "unaligned offset", "aligned"},
        {e_dup_name, "duplicate name", "twice"},
        {e_unterminated, "name without NUL", "NUL-terminated"},
        {e_nonprintable, "control char in name", "non-printable"},
        {e_empty_name, "empty name", "empty name"},
        {e_not_padded, "garbage after name", "NUL-padded"},
        {e_dtype, "dtype 1", "dtype"},
        {e_ndim0, "ndim 0", "ndim"},
        {e_ndim5, "ndim 5", "ndim"},
        {e_dim0, "dims[0] = 0", "dims[0]"},
        {e_tail_dim, "dims[3] set past ndim", "dims[3]"},
        {e_overflow_dims, "dims whose product overflows", "out of range"},
        {e_nbytes, "nbytes != numel*4", "nbytes"},
        {e_reserved, "record reserved byte", "reserved"},
    };
    parts p0 = split(good);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        parts p = split(good);
        int i = (int)rnd_below((size_t)p.n), j = (i + 1 + (int)rnd_below((size_t)p.n - 1)) % p.n;
        cases[c].f(&p, i, j);
        char what[128];
        snprintf(what, sizeof what, "%s (record %d, %d)", cases[c].what, i, j);
        expect_fail(assemble(&p), 0, what, cases[c].word, NULL);
        parts_free(&p);
    }
    /* the tensor name appears in record-level messages once the name itself is valid */
    parts p = split(good);
    int i = (int)rnd_below((size_t)p.n);
    char name[65];
    memcpy(name, rec(&p, i), 64);
    name[64] = 0;
    e_dtype(&p, i, 0);
    expect_fail(assemble(&p), 0, "dtype error names the tensor", name, NULL);
    parts_free(&p);
    /* nonzero padding between the directory and the data */
    bytes b = assemble(&p0);
    size_t dend = get64(&b, H_DIR_OFF) + (size_t)p0.n * 128, data = get64(&b, H_DATA_OFF);
    if (data > dend) {
        b.p[dend] = 0x5a;
        fix_checksum(&b);
        expect_fail(b, 0, "nonzero padding before data", "padding", NULL);
    } else {
        free(b.p);
    }
    parts_free(&p0);
}

/* ---- metadata syntax ---- */

static void meta_case(const bytes *good, const char *text, const char *what, const char *word) {
    parts p = split(good);
    free(p.meta);
    p.meta = strdup(text);
    expect_fail(assemble(&p), 0, what, word, NULL);
    parts_free(&p);
}

static void test_meta(const bytes *good) {
    meta_case(good, "format=actw\narch=act_resnet", "metadata without final newline", "newline");
    meta_case(good, "format=actw\nno equals sign\n", "line without '='", "key=value");
    meta_case(good, "format=actw\n=value\n", "empty key", "key=value");
    meta_case(good, "format=actw\narch=a\nformat=actw\n", "duplicate key", "more than once");
    meta_case(good, "format=actw\nbad key=1\n", "space in key", "key");
    meta_case(good, "format=actw\nk=a\rb\n", "control character in value", "control");
    meta_case(good, "format=actw\n\n", "empty line", "key=value");
    /* a NUL inside the text: strlen-based assembly cannot carry it, so patch and re-checksum */
    bytes b = bytes_dup(*good);
    b.p[128 + rnd_below(get64(good, H_META_SIZE) - 1)] = 0;
    fix_checksum(&b);
    expect_fail(b, 0, "NUL byte in metadata", "NUL", NULL);
}

/* ---- values ---- */

static void test_nonfinite(const bytes *good) {
    const float bad[2] = {NAN, INFINITY};
    const char *word[2] = {"NaN", "Inf"};
    for (int k = 0; k < 2; k++) {
        parts p = split(good);
        int i = (int)rnd_below((size_t)p.n);
        uint64_t numel = rec64(rec(&p, i), R_NBYTES) / 4, off = rec64(rec(&p, i), R_OFFSET);
        uint64_t e = rnd_below(numel);
        float v = rnd() & 1 ? -bad[k] : bad[k];
        memcpy(p.stored + off + 4 * e, &v, 4);
        char name[65], what[128];
        memcpy(name, rec(&p, i), 64);
        name[64] = 0;
        snprintf(what, sizeof what, "%s in %s[%llu]", word[k], name, (unsigned long long)e);
        expect_fail(assemble(&p), 0, what, word[k], name, NULL);
        parts_free(&p);
    }
}

#ifdef ACT_WITH_ZSTD
/* Replaces the stored frame of p by a fresh compression of `data` (n bytes). */
static void recompress(parts *p, const void *data, size_t n, int content_size) {
    ZSTD_CCtx *c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, content_size);
    size_t cap = ZSTD_compressBound(n);
    free(p->stored);
    p->stored = (unsigned char *)malloc(cap);
    p->stored_n = ZSTD_compress2(c, p->stored, cap, data, n);
    ZSTD_freeCCtx(c);
}

static void test_zstd(const bytes *good) {
    parts p0 = split(good);
    unsigned char *data = (unsigned char *)malloc(p0.data_size);
    size_t got = ZSTD_decompress(data, p0.data_size, p0.stored, p0.stored_n);
    CHECK(got == p0.data_size, "test setup: decompressing the zstd test file");
    parts p;

    /* (a flip inside literals would inflate to different, valid-looking bytes: only the file
     * checksum catches that, and test_flips covers it) */
    p = split(good);
    p.stored[rnd_below(4)] ^= 0xff;
    expect_fail(assemble(&p), 0, "zstd frame magic broken", "zstd", NULL);
    parts_free(&p);

    p = split(good);
    p.stored[4] |= 0x08;  /* frame header descriptor: the reserved bit */
    expect_fail(assemble(&p), 0, "zstd frame header reserved bit", "zstd", NULL);
    parts_free(&p);

    p = split(good);
    p.stored_n -= 1 + rnd_below(p.stored_n / 2);
    expect_fail(assemble(&p), 0, "truncated zstd frame", "zstd", NULL);
    parts_free(&p);

    p = split(good);
    p.stored = (unsigned char *)realloc(p.stored, p.stored_n + 16);
    memset(p.stored + p.stored_n, 0, 16);
    p.stored_n += 16;
    expect_fail(assemble(&p), 0, "bytes after the zstd frame", "after the zstd frame", NULL);
    parts_free(&p);

    p = split(good);
    p.data_size += 64;
    expect_fail(assemble(&p), 0, "data_size disagrees with the frame", "data_size", NULL);
    parts_free(&p);

    /* a frame without a content size and a header claiming 512 GiB, as much as the directory
     * says its tensors span: refused from the header (more than 64:1), without ever allocating
     * the claim (ASan would abort); a shortfall within that ratio is "data_size disagrees" above */
    p = split(good);
    recompress(&p, data, p.data_size, 0);
    p.data_size = (1ull << 39) + 64ull * (uint64_t)p.n;
    rec_put32(rec(&p, 0), R_NDIM, 1);
    rec_put64(rec(&p, 0), R_DIMS, 1ull << 37);
    for (int d = 1; d < 4; d++) rec_put64(rec(&p, 0), R_DIMS + 8 * d, 0);
    rec_put64(rec(&p, 0), R_OFFSET, 0);
    rec_put64(rec(&p, 0), R_NBYTES, 1ull << 39);
    for (int i = 1; i < p.n; i++) rec_put64(rec(&p, i), R_OFFSET, (1ull << 39) + 64ull * (uint64_t)i);
    for (int i = 1; i < p.n; i++) rec_put64(rec(&p, i), R_NBYTES, 4);
    for (int i = 1; i < p.n; i++) {
        rec_put32(rec(&p, i), R_NDIM, 1);
        rec_put64(rec(&p, i), R_DIMS, 1);
        for (int d = 1; d < 4; d++) rec_put64(rec(&p, i), R_DIMS + 8 * d, 0);
    }
    expect_fail(assemble(&p), 0, "512 GiB claim, small frame", "more than 64:1", NULL);
    parts_free(&p);

    /* a frame that really inflates past the tensors (zeros appended: ~30000:1), data_size to
     * match: refused before inflating, naming data_size (it used to load and hold it all) */
    p = split(good);
    {
        size_t extra = (size_t)64 << 20;
        unsigned char *big = (unsigned char *)calloc(p.data_size + extra, 1);
        CHECK(big != NULL, "test setup: out of memory");
        if (big) {
            memcpy(big, data, p.data_size);
            recompress(&p, big, p.data_size + extra, 1);
            p.data_size += extra;
            free(big);
            expect_fail(assemble(&p), 0, "data past the tensors (a zstd bomb)", "data_size", "no tensor reads", NULL);
        }
    }
    parts_free(&p);

    /* NaN inside compressed data: recompress so the frame is valid and the value check speaks */
    p = split(good);
    int i = (int)rnd_below((size_t)p.n);
    uint64_t off = rec64(rec(&p, i), R_OFFSET), numel = rec64(rec(&p, i), R_NBYTES) / 4;
    float nan = NAN;
    unsigned char *mod = (unsigned char *)malloc(p.data_size);
    memcpy(mod, data, p.data_size);
    memcpy(mod + off + 4 * rnd_below(numel), &nan, 4);
    recompress(&p, mod, p.data_size, 1);
    char name[65];
    memcpy(name, rec(&p, i), 64);
    name[64] = 0;
    expect_fail(assemble(&p), 0, "NaN inside the zstd data", "NaN", name, NULL);
    parts_free(&p);
    free(mod);
    free(data);
    parts_free(&p0);
}
#endif

int main(void) {
    seed_rng("test_weights");
    bytes raw = need_file("small.actw", g_raw_path, sizeof g_raw_path);
    snprintf(g_zst_path, sizeof g_zst_path, "%s/small_zstd.actw", data_dir());
    bytes zst = read_all(g_zst_path);
    if (!zst.p)  /* make_testdata makes it only where python has the zstandard module */
        printf("test_weights: %s not made (no zstandard module): zstd cases skipped\n", g_zst_path);
    test_good_files(&raw, zst.p ? &zst : NULL);
    test_truncation(&raw, "raw");
    test_flips(&raw, "raw");
    test_header(&raw);
    test_directory(&raw);
    test_meta(&raw);
    test_nonfinite(&raw);
    test_fifo();
    if (zst.p) {
        test_truncation(&zst, "zstd");
        test_flips(&zst, "zstd");
#ifdef ACT_WITH_ZSTD
        test_zstd(&zst);
#endif
    }
    free(raw.p);
    free(zst.p);
    printf("test_weights: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
