/* weights.c - the .actw reader (weights/FORMAT.md).
 *
 * Design: distrust every byte, and never let a field decide how much memory is allocated before
 * it has been checked against something real. The header is checked first against the actual
 * file size, so every section size below is bounded by bytes that exist. The file is then read
 * once, front to back (fread, chunked: any size), feeding the FNV-1a checksum as it goes; only a
 * file whose checksum matches is parsed further (metadata, directory), so a flipped byte reads
 * as "checksum mismatch", not as a misleading structural complaint. Compressed data is inflated
 * with a growing buffer, so a header that lies about data_size costs no more memory than the
 * frame really produces. Finally every tensor is scanned for NaN/Inf.
 *
 * The open comes in two phases: act_weights_open_index does everything up to the inflation
 * (reading, checksum, metadata, directory, data_size against the tensors: memory bounded by the
 * file's real size), act_weights_load_data inflates and scans. A frame of zeros inflates
 * ~30000:1, so a directory that declares a gigabyte tensor where the model expects 37 KB must be
 * refused by its names and shapes (act_model_load checks them between the phases) before the
 * frame is inflated, not after.
 *
 * Every error is "<path>: <field or tensor>: <what is wrong>". Every failure path frees all it
 * allocated through act_weights_free on the partly built object.
 */
#define _POSIX_C_SOURCE 200809L
#include "weights.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef ACT_WITH_ZSTD
#include <zstd.h>
#endif

#define READ_CHUNK ((size_t)1 << 24)

typedef struct actw_header {
    uint32_t version, endian, header_size, compression, alignment;
    uint64_t file_size, meta_offset, meta_size, dir_offset, n_tensors;
    uint64_t data_offset, data_size, stored_size, checksum;
} actw_header;

uint64_t act_fnv1a64(const void *data, size_t n, uint64_t h) {
    const unsigned char *p = (const unsigned char *)data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const unsigned char *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

static int all_zero(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

/* Reads exactly n bytes (in chunks, so any size works) and folds them into the checksum. */
static int read_exact(FILE *f, void *buf, size_t n, uint64_t *h) {
    unsigned char *p = (unsigned char *)buf;
    while (n) {
        size_t want = n < READ_CHUNK ? n : READ_CHUNK;
        size_t got = fread(p, 1, want, f);
        if (got != want) return -1;
        if (h) *h = act_fnv1a64(p, got, *h);
        p += got;
        n -= got;
    }
    return 0;
}

static int check_header(const char *path, const unsigned char *b, uint64_t actual, actw_header *h,
                        char *err, size_t errlen) {
    if (memcmp(b, ACTW_MAGIC, 4) != 0)
        return act_errf(err, errlen, "%s: bad magic 0x%02x%02x%02x%02x (expected \"ACTW\"): not an .actw weight file",
                        path, b[0], b[1], b[2], b[3]);
    h->endian = rd32(b + 8);
    if (h->endian == 0x04030201u)
        return act_errf(err, errlen, "%s: endian tag 0x04030201: the file was written big-endian, refused", path);
    if (h->endian != ACTW_ENDIAN_TAG)
        return act_errf(err, errlen, "%s: bad endian tag 0x%08x (expected 0x%08x)", path, h->endian, ACTW_ENDIAN_TAG);
    h->version = rd32(b + 4);
    if (h->version != ACTW_VERSION)
        return act_errf(err, errlen, "%s: unsupported format version %u (this reader knows version %u)",
                        path, h->version, ACTW_VERSION);
    h->header_size = rd32(b + 12);
    if (h->header_size != ACTW_HEADER_SIZE)
        return act_errf(err, errlen, "%s: header_size is %u, expected %u", path, h->header_size, ACTW_HEADER_SIZE);
    h->file_size = rd64(b + 16);
    if (h->file_size != actual)
        return act_errf(err, errlen, "%s: header file_size is %llu but the file has %llu bytes (%s)", path,
                        (unsigned long long)h->file_size, (unsigned long long)actual,
                        actual < h->file_size ? "truncated" : "trailing bytes");
    h->meta_offset = rd64(b + 24);
    h->meta_size = rd64(b + 32);
    h->dir_offset = rd64(b + 40);
    h->n_tensors = rd64(b + 48);
    h->data_offset = rd64(b + 56);
    h->data_size = rd64(b + 64);
    h->stored_size = rd64(b + 72);
    h->compression = rd32(b + 80);
    h->alignment = rd32(b + 84);
    h->checksum = rd64(b + 88);
    if (h->meta_offset != ACTW_HEADER_SIZE)
        return act_errf(err, errlen, "%s: meta_offset is %llu, expected %u", path,
                        (unsigned long long)h->meta_offset, ACTW_HEADER_SIZE);
    if (h->meta_size > ACTW_MAX_META_BYTES)
        return act_errf(err, errlen, "%s: meta_size %llu exceeds the limit of %u bytes", path,
                        (unsigned long long)h->meta_size, ACTW_MAX_META_BYTES);
    /* from here on sums are of bounded values: meta <= 1 MiB, directory <= 8 MiB */
    if (h->dir_offset != h->meta_offset + h->meta_size)
        return act_errf(err, errlen, "%s: dir_offset is %llu, expected meta_offset + meta_size = %llu", path,
                        (unsigned long long)h->dir_offset, (unsigned long long)(h->meta_offset + h->meta_size));
    if (h->n_tensors < 1 || h->n_tensors > ACTW_MAX_TENSORS)
        return act_errf(err, errlen, "%s: n_tensors is %llu, expected 1..%u", path,
                        (unsigned long long)h->n_tensors, ACTW_MAX_TENSORS);
    uint64_t dir_end = h->dir_offset + h->n_tensors * ACTW_DIR_ENTRY_SIZE;
    uint64_t want_data = (dir_end + ACTW_ALIGN - 1) / ACTW_ALIGN * ACTW_ALIGN;
    if (h->data_offset != want_data)
        return act_errf(err, errlen, "%s: data_offset is %llu, expected %llu (directory end rounded up to %u)", path,
                        (unsigned long long)h->data_offset, (unsigned long long)want_data, ACTW_ALIGN);
    if (h->data_offset > actual)
        return act_errf(err, errlen, "%s: data_offset %llu is past the end of the file (%llu bytes): truncated", path,
                        (unsigned long long)h->data_offset, (unsigned long long)actual);
    if (h->stored_size != actual - h->data_offset)
        return act_errf(err, errlen, "%s: stored_size is %llu, but data_offset + stored_size must equal file_size %llu",
                        path, (unsigned long long)h->stored_size, (unsigned long long)actual);
    if (h->compression != ACTW_RAW && h->compression != ACTW_ZSTD)
        return act_errf(err, errlen, "%s: unknown compression %u (0 = raw, 1 = zstd)", path, h->compression);
    if (h->alignment != ACTW_ALIGN)
        return act_errf(err, errlen, "%s: alignment is %u, expected %u", path, h->alignment, ACTW_ALIGN);
    if (h->compression == ACTW_RAW && h->data_size != h->stored_size)
        return act_errf(err, errlen, "%s: data_size %llu differs from stored_size %llu in an uncompressed file", path,
                        (unsigned long long)h->data_size, (unsigned long long)h->stored_size);
    /* zstd shrinks trained (or randomized) weights ~1.1:1; a frame claiming more than 64:1 (past
     * 1 MiB) is mostly zeros, which a file of a few KB can stretch to gigabytes whatever model its
     * header describes: no converter writes one (tools/actw.py stores such data raw) */
    if (h->compression == ACTW_ZSTD && h->data_size > 64 * h->stored_size + ((uint64_t)1 << 20))
        return act_errf(err, errlen, "%s: data_size %llu from %llu zstd bytes is more than 64:1 (a frame of mostly "
                        "zeros): not a weight file the converter writes (convert the checkpoint again: "
                        "tools/convert_checkpoint.py stores such data uncompressed)", path, (unsigned long long)h->data_size,
                        (unsigned long long)h->stored_size);
    if (h->data_size % 4 != 0 || h->data_size > (uint64_t)(SIZE_MAX / 2) || h->data_size > (uint64_t)INT64_MAX / 2)
        return act_errf(err, errlen, "%s: data_size %llu is not a plausible size of float32 data", path,
                        (unsigned long long)h->data_size);
    if (!all_zero(b + 96, 32))
        return act_errf(err, errlen, "%s: header reserved bytes [96, 128) are not zero", path);
    return 0;
}

/* Metadata: one block holds the key/value array followed by a copy of the text, so the
 * kv pointers point into the same allocation and one free releases everything. */
static int cmp_kv(const void *a, const void *b) {
    return strcmp(((const act_meta_kv *)a)->key, ((const act_meta_kv *)b)->key);
}

/* n bytes of well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF) */
static int utf8_ok(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!len || i + len > n) return 0;
        unsigned cp = len == 1 ? c : c & (0x7Fu >> len);
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (p[i + k] & 0x3Fu);
        }
        static const unsigned min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += len;
    }
    return 1;
}

static int parse_meta(const char *path, const unsigned char *text, size_t n, act_weights *w,
                      char *err, size_t errlen) {
    size_t lines = 0;
    for (size_t i = 0; i < n; i++) lines += text[i] == '\n';
    if (n && text[n - 1] != '\n')
        return act_errf(err, errlen, "%s: metadata does not end with a newline (truncated?)", path);
    size_t head;
    if (!act_mul_ok(lines, sizeof(act_meta_kv), &head)) return act_errf(err, errlen, "%s: metadata too large", path);
    char *block = (char *)malloc(head + n + 1);
    if (!block) return act_errf(err, errlen, "%s: out of memory for %zu bytes of metadata", path, n);
    act_meta_kv *kv = (act_meta_kv *)block;
    char *t = block + head;
    memcpy(t, text, n);
    t[n] = 0;
    w->meta = kv;
    size_t line = 0, pos = 0;
    while (pos < n) {
        char *s = t + pos, *nl = memchr(s, '\n', n - pos); /* found: the text ends with '\n' */
        size_t len = (size_t)(nl - s);
        if (memchr(s, 0, len))
            return act_errf(err, errlen, "%s: metadata line %zu contains a NUL byte", path, line + 1);
        char *eq = memchr(s, '=', len);
        if (!eq || eq == s)
            return act_errf(err, errlen, "%s: metadata line %zu is not key=value", path, line + 1);
        for (char *c = s; c < eq; c++)
            if (*c < 0x21 || *c > 0x7e)
                return act_errf(err, errlen, "%s: metadata line %zu: key has a non-printable or space character",
                                path, line + 1);
        for (char *c = eq + 1; c < nl; c++)
            if ((unsigned char)*c < 0x20 && *c != '\t')
                return act_errf(err, errlen, "%s: metadata line %zu: value has a control character 0x%02x",
                                path, line + 1, (unsigned)(unsigned char)*c);
        if (!utf8_ok((const unsigned char *)eq + 1, (size_t)(nl - eq - 1)))
            return act_errf(err, errlen, "%s: metadata line %zu: value is not UTF-8", path, line + 1);
        *eq = 0;
        *nl = 0;
        kv[line].key = s;
        kv[line].value = eq + 1;
        line++;
        pos += len + 1;
    }
    w->n_meta = (int)line;
    act_meta_kv *sorted = (act_meta_kv *)act_array_alloc(line, sizeof(act_meta_kv));
    if (!sorted) return act_errf(err, errlen, "%s: out of memory checking metadata keys", path);
    memcpy(sorted, kv, line * sizeof(act_meta_kv));
    qsort(sorted, line, sizeof(act_meta_kv), cmp_kv);
    for (size_t i = 1; i < line; i++) {
        if (strcmp(sorted[i - 1].key, sorted[i].key) == 0) {
            int rc = act_errf(err, errlen, "%s: metadata key '%s' appears more than once", path, sorted[i].key);
            free(sorted);
            return rc;
        }
    }
    free(sorted);
    return 0;
}

/* comparators over an array of tensor pointers (no globals: loads may run in parallel threads) */
static int cmp_name(const void *a, const void *b) {
    return strcmp((*(const act_tensor *const *)a)->name, (*(const act_tensor *const *)b)->name);
}
static int cmp_offset(const void *a, const void *b) {
    size_t x = (*(const act_tensor *const *)a)->offset, y = (*(const act_tensor *const *)b)->offset;
    return x < y ? -1 : x > y;
}

static int parse_record(const char *path, int i, const unsigned char *r, uint64_t data_size, act_tensor *t,
                        char *err, size_t errlen) {
    const unsigned char *nul = memchr(r, 0, ACTW_NAME_MAX);
    if (!nul) return act_errf(err, errlen, "%s: directory record %d: name is not NUL-terminated", path, i);
    size_t nlen = (size_t)(nul - r);
    if (nlen == 0) return act_errf(err, errlen, "%s: directory record %d: empty name", path, i);
    for (size_t c = 0; c < nlen; c++)
        if (r[c] < 0x21 || r[c] > 0x7e)   /* as actw.py's reader: no canonical name has a space */
            return act_errf(err, errlen, "%s: directory record %d: name has a space or non-printable byte 0x%02x",
                            path, i, r[c]);
    if (!all_zero(nul, ACTW_NAME_MAX - nlen))
        return act_errf(err, errlen, "%s: directory record %d: name is not NUL-padded", path, i);
    memcpy(t->name, r, nlen + 1);
    t->index = i;
    const char *nm = t->name;
    uint32_t dtype = rd32(r + 64), ndim = rd32(r + 68);
    if (dtype != ACTW_F32)
        return act_errf(err, errlen, "%s: tensor '%s': dtype %u, expected 0 (float32)", path, nm, dtype);
    if (ndim < 1 || ndim > ACTW_MAX_DIMS)
        return act_errf(err, errlen, "%s: tensor '%s': ndim %u, expected 1..%d", path, nm, ndim, ACTW_MAX_DIMS);
    t->ndim = (int)ndim;
    uint64_t numel = 1;
    for (int d = 0; d < ACTW_MAX_DIMS; d++) {
        uint64_t v = rd64(r + 72 + 8 * d);
        if (d < (int)ndim) {
            /* numel*4 must stay within data_size (< 2^62): bound each step before multiplying */
            if (v < 1 || v > data_size || numel > data_size / v)
                return act_errf(err, errlen, "%s: tensor '%s': dims[%d] = %llu is out of range (data_size %llu)",
                                path, nm, d, (unsigned long long)v, (unsigned long long)data_size);
            numel *= v;
            t->dims[d] = (int64_t)v;
        } else {
            if (v != 0)
                return act_errf(err, errlen, "%s: tensor '%s': dims[%d] = %llu past ndim %u, expected 0",
                                path, nm, d, (unsigned long long)v, ndim);
            t->dims[d] = 0;
        }
    }
    uint64_t offset = rd64(r + 104), nbytes = rd64(r + 112);
    if (nbytes != numel * 4)
        return act_errf(err, errlen, "%s: tensor '%s': nbytes %llu, expected product(dims)*4 = %llu", path, nm,
                        (unsigned long long)nbytes, (unsigned long long)(numel * 4));
    if (offset % ACTW_ALIGN != 0)
        return act_errf(err, errlen, "%s: tensor '%s': offset %llu is not aligned to %u", path, nm,
                        (unsigned long long)offset, ACTW_ALIGN);
    if (offset > data_size || nbytes > data_size - offset)
        return act_errf(err, errlen, "%s: tensor '%s': bytes [%llu, +%llu) are out of range of the data (%llu bytes)",
                        path, nm, (unsigned long long)offset, (unsigned long long)nbytes,
                        (unsigned long long)data_size);
    if (!all_zero(r + 120, 8))
        return act_errf(err, errlen, "%s: tensor '%s': reserved bytes are not zero", path, nm);
    t->numel = (int64_t)numel;
    t->offset = (size_t)(offset / 4);
    return 0;
}

static int parse_directory(const char *path, const unsigned char *dir, int n, uint64_t data_size, act_weights *w,
                           char *err, size_t errlen) {
    w->tensors = (act_tensor *)act_array_alloc((size_t)n, sizeof(act_tensor));
    const act_tensor **order = (const act_tensor **)act_array_alloc((size_t)n, sizeof(act_tensor *));
    if (!w->tensors || !order) {
        free(order);
        return act_errf(err, errlen, "%s: out of memory for %d directory records", path, n);
    }
    w->n_tensors = n;
    for (int i = 0; i < n; i++) {
        if (parse_record(path, i, dir + (size_t)i * ACTW_DIR_ENTRY_SIZE, data_size, &w->tensors[i], err, errlen)) {
            free(order);
            return -1;
        }
        order[i] = &w->tensors[i];
    }
    int rc = 0;
    qsort(order, (size_t)n, sizeof order[0], cmp_name);
    for (int i = 1; i < n && !rc; i++)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0)
            rc = act_errf(err, errlen, "%s: tensor '%s' appears twice in the directory (records %d and %d)", path,
                          order[i]->name, order[i - 1]->index, order[i]->index);
    qsort(order, (size_t)n, sizeof order[0], cmp_offset);
    for (int i = 1; i < n && !rc; i++) {
        const act_tensor *a = order[i - 1], *b = order[i];
        if (a->offset + (size_t)a->numel > b->offset)
            rc = act_errf(err, errlen, "%s: tensors '%s' and '%s' overlap in the data (offsets %zu and %zu bytes)",
                          path, a->name, b->name, a->offset * 4, b->offset * 4);
    }
    free(order);
    return rc;
}

/* Inflates one zstd frame of exactly data_size bytes into a 64-byte aligned blob. */
static int inflate_data(const char *path, const unsigned char *src, size_t n, size_t data_size, float **out,
                        char *err, size_t errlen) {
#ifdef ACT_WITH_ZSTD
    unsigned long long claimed = ZSTD_getFrameContentSize(src, n);
    if (claimed == ZSTD_CONTENTSIZE_ERROR)
        return act_errf(err, errlen, "%s: data section is not a valid zstd frame", path);
    if (claimed != ZSTD_CONTENTSIZE_UNKNOWN && claimed != data_size)
        return act_errf(err, errlen, "%s: zstd frame holds %llu bytes but header data_size is %zu", path, claimed,
                        data_size);
    /* grow with what the frame really produces, never straight to the header's claim */
    size_t cap = n * 4 > ((size_t)1 << 20) ? n * 4 : ((size_t)1 << 20);
    if (cap > data_size) cap = data_size;
    unsigned char *buf = (unsigned char *)act_aligned_alloc(cap);
    ZSTD_DCtx *dctx = ZSTD_createDCtx();
    int rc = 0;
    if (!buf || !dctx) {
        rc = act_errf(err, errlen, "%s: out of memory inflating the zstd data", path);
        goto done;
    }
    ZSTD_inBuffer in = {src, n, 0};
    ZSTD_outBuffer ob = {buf, cap, 0};
    for (;;) {
        if (ob.pos == cap && cap < data_size) {
            size_t ncap = cap > data_size / 2 ? data_size : cap * 2;
            unsigned char *nb = (unsigned char *)act_aligned_alloc(ncap);
            if (!nb) {
                rc = act_errf(err, errlen, "%s: out of memory inflating the zstd data (%zu bytes)", path, ncap);
                goto done;
            }
            memcpy(nb, buf, ob.pos);
            act_aligned_free(buf);
            buf = nb;
            cap = ncap;
            ob.dst = buf;
            ob.size = cap;
        }
        size_t in0 = in.pos, out0 = ob.pos;
        size_t r = ZSTD_decompressStream(dctx, &ob, &in);
        if (ZSTD_isError(r)) {
            rc = act_errf(err, errlen, "%s: zstd data is corrupt: %s", path, ZSTD_getErrorName(r));
            goto done;
        }
        if (r == 0) break;
        if (in.pos == in0 && ob.pos == out0) {
            rc = act_errf(err, errlen, "%s: zstd frame is truncated or inflates beyond data_size %zu", path, data_size);
            goto done;
        }
    }
    if (in.pos != in.size)
        rc = act_errf(err, errlen, "%s: %zu bytes after the zstd frame", path, in.size - in.pos);
    else if (ob.pos != data_size)
        rc = act_errf(err, errlen, "%s: zstd data inflates to %zu bytes, header data_size is %zu", path, ob.pos,
                      data_size);
done:
    ZSTD_freeDCtx(dctx);
    if (rc) act_aligned_free(buf);
    else *out = (float *)buf;
    return rc;
#else
    (void)src; (void)n; (void)data_size; (void)out;
    return act_errf(err, errlen, "%s: the tensor data is zstd-compressed but this library was built without zstd",
                    path);
#endif
}

static int check_finite(const char *path, const act_weights *w, char *err, size_t errlen) {
    for (int i = 0; i < w->n_tensors; i++) {
        const act_tensor *t = &w->tensors[i];
        for (int64_t j = 0; j < t->numel; j++) {
            uint32_t bits;
            memcpy(&bits, &t->data[j], 4); /* exponent test: immune to -ffast-math folding isnan away */
            if ((bits & 0x7f800000u) == 0x7f800000u)
                return act_errf(err, errlen, "%s: tensor '%s' element %lld is %s (every value must be finite)", path,
                                t->name, (long long)j, (bits & 0x007fffffu) ? "NaN" : "Inf");
        }
    }
    return 0;
}

static int host_is_little_endian(void) {
    const uint32_t one = 1;
    return *(const unsigned char *)&one == 1;
}

int act_weights_open_index(const char *path, act_weights **out, char *err, size_t errlen) {
    *out = NULL;
    if (!host_is_little_endian())
        return act_errf(err, errlen, "%s: this reader needs a little-endian host", path);
    /* O_NONBLOCK: a FIFO (or a tty) given as the model must reach the S_ISREG refusal below;
     * a plain open() of a FIFO without a writer would block here forever. Checked on the opened
     * descriptor, not by stat(path) first, so the path cannot change in between. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return act_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return act_errf(err, errlen, "%s: not a regular file", path);
    }
    int fl = fcntl(fd, F_GETFL);
    FILE *f = fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0 ? NULL : fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return act_errf(err, errlen, "%s: cannot open: %s", path, strerror(e));
    }
    uint64_t actual = (uint64_t)st.st_size;
    unsigned char hb[ACTW_HEADER_SIZE];
    actw_header h = {0};
    if (actual < ACTW_HEADER_SIZE) {
        fclose(f);
        return act_errf(err, errlen, "%s: file is %llu bytes, shorter than the %u-byte header (truncated)", path,
                        (unsigned long long)actual, ACTW_HEADER_SIZE);
    }
    if (read_exact(f, hb, ACTW_HEADER_SIZE, NULL)) {
        fclose(f);
        return act_errf(err, errlen, "%s: read error in the header", path);
    }
    if (check_header(path, hb, actual, &h, err, errlen)) {
        fclose(f);
        return -1;
    }

    act_weights *w = (act_weights *)calloc(1, sizeof(act_weights));
    size_t pre_data = (size_t)(h.data_offset - ACTW_HEADER_SIZE); /* meta + directory + padding, <= 9 MiB */
    unsigned char *sect = (unsigned char *)malloc(pre_data ? pre_data : 1);
    int rc = 0;
    if (!w || !sect) {
        rc = act_errf(err, errlen, "%s: out of memory", path);
        goto fail;
    }
    snprintf(w->path, sizeof w->path, "%s", path);
    w->checksum = h.checksum;
    w->compressed = h.compression == ACTW_ZSTD;
    w->data_size = h.data_size;
    w->stored_size = (size_t)h.stored_size;
    uint64_t sum = ACT_FNV_INIT;
    if (read_exact(f, sect, pre_data, &sum)) {
        rc = act_errf(err, errlen, "%s: read error in the metadata/directory", path);
        goto fail;
    }
    /* what is read here is what the file holds (stored_size == file_size - data_offset): a raw
     * file's data is its bytes, a zstd file's the frame; data_size is not allocated until
     * act_weights_load_data */
    unsigned char *stored;
    if (w->compressed) {
        stored = w->stored = (unsigned char *)malloc(h.stored_size ? (size_t)h.stored_size : 1);
        if (!stored) {
            rc = act_errf(err, errlen, "%s: out of memory for %llu bytes of compressed data", path,
                          (unsigned long long)h.stored_size);
            goto fail;
        }
    } else {
        w->blob = (float *)act_aligned_alloc((size_t)h.data_size);
        if (!w->blob) {
            rc = act_errf(err, errlen, "%s: out of memory for %llu bytes of tensor data", path,
                          (unsigned long long)h.data_size);
            goto fail;
        }
        stored = (unsigned char *)w->blob;
    }
    if (read_exact(f, stored, (size_t)h.stored_size, &sum)) {
        rc = act_errf(err, errlen, "%s: read error in the tensor data", path);
        goto fail;
    }
    if (sum != h.checksum) {
        rc = act_errf(err, errlen, "%s: checksum mismatch: header says %016llx, contents hash to %016llx "
                      "(the file is corrupt)", path, (unsigned long long)h.checksum, (unsigned long long)sum);
        goto fail;
    }

    size_t meta_size = (size_t)h.meta_size;
    size_t dir_bytes = (size_t)h.n_tensors * ACTW_DIR_ENTRY_SIZE;
    if (!all_zero(sect + meta_size + dir_bytes, pre_data - meta_size - dir_bytes)) {
        rc = act_errf(err, errlen, "%s: padding between the directory and the data is not zero", path);
        goto fail;
    }
    if (parse_meta(path, sect, meta_size, w, err, errlen) ||
        parse_directory(path, sect + meta_size, (int)h.n_tensors, h.data_size, w, err, errlen)) {
        rc = -1;
        goto fail;
    }
    /* the data ends with the last tensor's padding: a larger claim is bytes no tensor reads,
     * which a zstd frame of zeros could make a reader inflate and hold (2 GiB from 65 KB) */
    uint64_t end = 0;
    for (int i = 0; i < w->n_tensors; i++) {
        uint64_t e = ((uint64_t)w->tensors[i].offset + (uint64_t)w->tensors[i].numel) * 4;
        if (e > end) end = e;
    }
    end = (end + ACTW_ALIGN - 1) / ACTW_ALIGN * ACTW_ALIGN;
    if (h.data_size > end) {
        rc = act_errf(err, errlen, "%s: data_size is %llu bytes, but the tensors end at %llu (with their "
                      "padding): the file claims data no tensor reads", path, (unsigned long long)h.data_size,
                      (unsigned long long)end);
        goto fail;
    }
    free(sect);
    fclose(f);
    *out = w;
    return 0;

fail:
    free(sect);
    fclose(f);
    act_weights_free(w);
    return rc;
}

int act_weights_load_data(act_weights *w, char *err, size_t errlen) {
    if (w->data_loaded) return 0;
    if (w->compressed) {
        if (inflate_data(w->path, w->stored, w->stored_size, (size_t)w->data_size, &w->blob, err, errlen))
            return -1;
        free(w->stored);
        w->stored = NULL;
    }
    w->blob_elems = (size_t)w->data_size / 4;
    for (int i = 0; i < w->n_tensors; i++) w->tensors[i].data = w->blob + w->tensors[i].offset;
    if (check_finite(w->path, w, err, errlen)) return -1;
    w->data_loaded = 1;
    return 0;
}

int act_weights_open(const char *path, act_weights **out, char *err, size_t errlen) {
    act_weights *w = NULL;
    *out = NULL;
    if (act_weights_open_index(path, &w, err, errlen)) return -1;
    if (act_weights_load_data(w, err, errlen)) {
        act_weights_free(w);
        return -1;
    }
    *out = w;
    return 0;
}

void act_weights_free(act_weights *w) {
    if (!w) return;
    act_aligned_free(w->blob);
    free(w->stored);
    free(w->tensors);
    free(w->meta);
    free(w);
}

const act_tensor *act_weights_find(const act_weights *w, const char *name) {
    for (int i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0) return &w->tensors[i];
    return NULL;
}

const char *act_meta_get(const act_weights *w, const char *key) {
    for (int i = 0; i < w->n_meta; i++)
        if (strcmp(w->meta[i].key, key) == 0) return w->meta[i].value;
    return NULL;
}
