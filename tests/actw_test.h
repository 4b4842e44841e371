/* actw_test.h - shared helpers of test_weights.c and test_model.c: load a real .actw file into
 * memory, take it apart (header fields, metadata text, directory records, stored data), put a
 * modified copy back together with consistent offsets and checksum, write it to a temp file and
 * check that loading it fails with a message that names what is wrong.
 *
 * Rebuilding (rather than only patching bytes) matters: a corruption that the checksum would
 * catch first never reaches the check it is meant to exercise, so every structural test
 * recomputes the checksum and offsets and lets the deeper check speak.
 */
#ifndef ACTW_TEST_H
#define ACTW_TEST_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "act.h"
#include "model.h"
#include "test_common.h"
#include "weights.h"

#if defined(__GNUC__)
#define ACT_TEST_SENTINEL __attribute__((sentinel))
#define ACT_PRINTF_TEST __attribute__((format(printf, 3, 4)))
#else
#define ACT_TEST_SENTINEL
#define ACT_PRINTF_TEST
#endif


typedef struct bytes { unsigned char *p; size_t n; } bytes;

static inline size_t rnd_below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }
static inline bytes read_all(const char *path) {
    bytes b = {NULL, 0};
    FILE *f = fopen(path, "rb");
    if (!f) return b;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    b.p = (unsigned char *)malloc(n > 0 ? (size_t)n : 1);
    if (b.p && fread(b.p, 1, (size_t)n, f) == (size_t)n) b.n = (size_t)n;
    else { free(b.p); b.p = NULL; }
    fclose(f);
    return b;
}

static inline bytes bytes_dup(bytes b) {
    bytes c = {(unsigned char *)malloc(b.n ? b.n : 1), b.n};
    memcpy(c.p, b.p, b.n);
    return c;
}

/* Opens a real test file; exits 1 (a test failure, not a skip) when it is missing, because the
 * make_testdata fixture is supposed to have written it. */
static inline bytes need_file(const char *name, char *path, size_t pathlen) {
    snprintf(path, pathlen, "%s/%s", data_dir(), name);
    bytes b = read_all(path);
    if (!b.p) {
        fprintf(stderr, "missing test file %s (run the make_testdata ctest or tests/make_testdata.py)\n", path);
        exit(1);
    }
    return b;
}

static inline uint32_t get32(const bytes *b, size_t off) {
    const unsigned char *p = b->p + off;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t get64(const bytes *b, size_t off) { return get32(b, off) | (uint64_t)get32(b, off + 4) << 32; }
static inline void put32(bytes *b, size_t off, uint32_t v) {
    for (int i = 0; i < 4; i++) b->p[off + i] = (unsigned char)(v >> (8 * i));
}
static inline void put64(bytes *b, size_t off, uint64_t v) {
    for (int i = 0; i < 8; i++) b->p[off + i] = (unsigned char)(v >> (8 * i));
}

/* header field offsets (weights/FORMAT.md) */
enum { H_VERSION = 4, H_ENDIAN = 8, H_HSIZE = 12, H_FILE_SIZE = 16, H_META_OFF = 24, H_META_SIZE = 32,
       H_DIR_OFF = 40, H_NT = 48, H_DATA_OFF = 56, H_DATA_SIZE = 64, H_STORED = 72, H_COMP = 80,
       H_ALIGN = 84, H_CHECKSUM = 88 };
/* directory record field offsets */
enum { R_DTYPE = 64, R_NDIM = 68, R_DIMS = 72, R_OFFSET = 104, R_NBYTES = 112, R_RESERVED = 120 };

static inline void fix_checksum(bytes *b) { put64(b, H_CHECKSUM, act_fnv1a64(b->p + 128, b->n - 128, ACT_FNV_INIT)); }

/* A file taken apart: edit any piece, then assemble() makes a consistent file again. */
typedef struct parts {
    char *meta;                /* NUL-terminated text */
    unsigned char *dir;        /* n * 128 bytes */
    int n;
    unsigned char *stored;     /* data section as stored (raw or zstd frame) */
    size_t stored_n, data_size;
    uint32_t compression;
} parts;

static inline parts split(const bytes *b) {
    parts p;
    size_t ms = get64(b, H_META_SIZE), doff = get64(b, H_DIR_OFF), data = get64(b, H_DATA_OFF);
    p.meta = (char *)calloc(ms + 1, 1);
    memcpy(p.meta, b->p + 128, ms);
    p.n = (int)get64(b, H_NT);
    p.dir = (unsigned char *)malloc((size_t)p.n * 128);
    memcpy(p.dir, b->p + doff, (size_t)p.n * 128);
    p.stored_n = get64(b, H_STORED);
    p.stored = (unsigned char *)malloc(p.stored_n ? p.stored_n : 1);
    memcpy(p.stored, b->p + data, p.stored_n);
    p.data_size = get64(b, H_DATA_SIZE);
    p.compression = get32(b, H_COMP);
    return p;
}

static inline void parts_free(parts *p) {
    free(p->meta);
    free(p->dir);
    free(p->stored);
}

static inline bytes assemble(const parts *p) {
    size_t ms = strlen(p->meta), doff = 128 + ms, dend = doff + (size_t)p->n * 128;
    size_t data = (dend + 63) / 64 * 64, total = data + p->stored_n;
    bytes b = {(unsigned char *)calloc(total, 1), total};
    memcpy(b.p, "ACTW", 4);
    put32(&b, H_VERSION, 1);
    put32(&b, H_ENDIAN, 0x01020304u);
    put32(&b, H_HSIZE, 128);
    put64(&b, H_FILE_SIZE, total);
    put64(&b, H_META_OFF, 128);
    put64(&b, H_META_SIZE, ms);
    put64(&b, H_DIR_OFF, doff);
    put64(&b, H_NT, (uint64_t)p->n);
    put64(&b, H_DATA_OFF, data);
    put64(&b, H_DATA_SIZE, p->data_size);
    put64(&b, H_STORED, p->stored_n);
    put32(&b, H_COMP, p->compression);
    put32(&b, H_ALIGN, 64);
    memcpy(b.p + 128, p->meta, ms);
    memcpy(b.p + doff, p->dir, (size_t)p->n * 128);
    memcpy(b.p + data, p->stored, p->stored_n);
    fix_checksum(&b);
    return b;
}

/* index of the directory record named `name`, or -1 */
static inline int rec_find(const parts *p, const char *name) {
    for (int i = 0; i < p->n; i++)
        if (strncmp((const char *)p->dir + (size_t)i * 128, name, 64) == 0) return i;
    return -1;
}
static inline unsigned char *rec(const parts *p, int i) { return p->dir + (size_t)i * 128; }
static inline uint64_t rec64(const unsigned char *r, int off) {
    bytes b = {(unsigned char *)r, 128};
    return get64(&b, (size_t)off);
}
static inline uint32_t rec32(const unsigned char *r, int off) {
    bytes b = {(unsigned char *)r, 128};
    return get32(&b, (size_t)off);
}
static inline void rec_put64(unsigned char *r, int off, uint64_t v) {
    bytes b = {r, 128};
    put64(&b, (size_t)off, v);
}
static inline void rec_put32(unsigned char *r, int off, uint32_t v) {
    bytes b = {r, 128};
    put32(&b, (size_t)off, v);
}

/* Removes record i from the directory (its data stays, unreferenced). */
static inline void rec_remove(parts *p, int i) {
    memmove(rec(p, i), rec(p, i + 1), (size_t)(p->n - i - 1) * 128);
    p->n--;
}

/* Sets metadata key to value (NULL removes the line); adds the key if absent. */
static inline void meta_set(parts *p, const char *key, const char *value) {
    size_t kl = strlen(key), cap = strlen(p->meta) + kl + (value ? strlen(value) : 0) + 4;
    char *out = (char *)calloc(cap, 1), *line = p->meta, *o = out;
    int found = 0;
    while (*line) {
        char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) + 1 : strlen(line);
        if (strncmp(line, key, kl) == 0 && line[kl] == '=') {
            found = 1;
            if (value) o += sprintf(o, "%s=%s\n", key, value);
        } else {
            memcpy(o, line, len);
            o += len;
        }
        line += len;
    }
    if (!found && value) sprintf(o, "%s=%s\n", key, value);
    free(p->meta);
    p->meta = out;
}

static inline const char *meta_value(const parts *p, const char *key, char *buf, size_t n) {
    size_t kl = strlen(key);
    for (const char *line = p->meta; *line;) {
        const char *nl = strchr(line, '\n');
        if (strncmp(line, key, kl) == 0 && line[kl] == '=') {
            size_t len = (size_t)(nl - line) - kl - 1;
            snprintf(buf, n, "%.*s", (int)len, line + kl + 1);
            return buf;
        }
        line = nl + 1;
    }
    return NULL;
}

static int g_tmp_counter;
/* Corrupted copies are written hundreds of times (each tens of MB: the ResNet18 trunk has 11M
 * parameters at any config), so prefer memory-backed /dev/shm over a disk-backed /tmp. */
static inline void tmp_path(char *buf, size_t n) {
    const char *d = getenv("TMPDIR");
    if (!d) d = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(buf, n, "%s/actw_test_%d_%d.actw", d, (int)getpid(), g_tmp_counter++);
}

static inline int write_bytes(const char *path, const bytes *b) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(b->p, 1, b->n, f);
    return fclose(f) || w != b->n ? -1 : 0;
}

/* Opens path with act_weights_open (model = 0) or act_model_load (model = 1) and expects
 * failure with a message that contains the path and every word of the NULL-terminated list. */
static inline int expect_load_fails(const char *path, int model, const char *what, va_list ap) {
    char err[ACT_ERR_LEN] = "";
    int rc;
    if (model) {
        act_model *m = NULL;
        rc = act_model_load(path, &m, err, sizeof err);
        act_model_free(m);
    } else {
        act_weights *w = NULL;
        rc = act_weights_open(path, &w, err, sizeof err);
        act_weights_free(w);
    }
    int ok = rc == -1 && strstr(err, path) != NULL;
    for (const char *word; ok && (word = va_arg(ap, const char *));) ok = strstr(err, word) != NULL;
    CHECK(ok, "%s: rc %d, message \"%s\"", what, rc, err);
    if (ok && getenv("ACT_TEST_VERBOSE")) printf("  ok %-40s %s\n", what, err);
    return ok;
}

/* Writes b (which it frees) to a temp file and expects loading it to fail (see above). */
static inline int expect_fail(bytes b, int model, const char *what, ...) ACT_TEST_SENTINEL;
static inline int expect_fail(bytes b, int model, const char *what, ...) {
    char path[512];
    tmp_path(path, sizeof path);
    int ok = 0;
    if (write_bytes(path, &b) == 0) {
        va_list ap;
        va_start(ap, what);
        ok = expect_load_fails(path, model, what, ap);
        va_end(ap);
    } else {
        CHECK(0, "%s: cannot write %s", what, path);
    }
    remove(path);
    free(b.p);
    return ok;
}

/* A scratch copy of a good file, patched in place and restored after each case: for the many
 * cases that change a few bytes or cut the file short, this saves writing the whole file. */
typedef struct scratch { char path[512]; const bytes *good; } scratch;

static inline int scratch_open(scratch *s, const bytes *good) {
    s->good = good;
    tmp_path(s->path, sizeof s->path);
    return write_bytes(s->path, good);
}

static inline void scratch_close(scratch *s) { remove(s->path); }

static inline int pwrite_at(const char *path, size_t off, const void *data, size_t n) {
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    int bad = fseek(f, (long)off, SEEK_SET) || fwrite(data, 1, n, f) != n;
    return fclose(f) || bad ? -1 : 0;
}

/* Replaces bytes [off, off+n) by data, expects loading to fail, restores the bytes. */
static inline int expect_fail_patch(scratch *s, size_t off, const void *data, size_t n, int model, const char *what,
                                    ...) ACT_TEST_SENTINEL;
static inline int expect_fail_patch(scratch *s, size_t off, const void *data, size_t n, int model, const char *what,
                                    ...) {
    int ok = 0;
    if (pwrite_at(s->path, off, data, n) == 0) {
        va_list ap;
        va_start(ap, what);
        ok = expect_load_fails(s->path, model, what, ap);
        va_end(ap);
    } else {
        CHECK(0, "%s: cannot patch %s", what, s->path);
    }
    CHECK(pwrite_at(s->path, off, s->good->p + off, n) == 0, "%s: cannot restore %s", what, s->path);
    return ok;
}

/* Cuts the scratch file to `len` bytes and expects loading to fail. Cuts must come in
 * decreasing order; scratch_restore() rewrites the whole file afterwards. */
static inline int expect_fail_truncated(scratch *s, size_t len, const char *what, ...) ACT_TEST_SENTINEL;
static inline int expect_fail_truncated(scratch *s, size_t len, const char *what, ...) {
    int ok = 0;
    if (truncate(s->path, (off_t)len) == 0) {
        va_list ap;
        va_start(ap, what);
        ok = expect_load_fails(s->path, 0, what, ap);
        va_end(ap);
    } else {
        CHECK(0, "%s: cannot truncate %s", what, s->path);
    }
    return ok;
}

static inline void scratch_restore(scratch *s) {
    CHECK(write_bytes(s->path, s->good) == 0, "cannot rewrite %s", s->path);
}

#endif
