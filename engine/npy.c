/* npy.c - float32 .npy writer (see npy.h). The header is the NumPy 1.0 format: magic, version,
 * a little-endian u16 header length, then a Python dict literal padded with spaces so that the
 * data starts at a multiple of 64 bytes, ending in '\n'. */
#include "npy.h"
#include "outfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct act_npy {
    act_outfile out;   /* PATH.tmp.PID until a complete close renames it over PATH */
    uint64_t expected, written;
};

static int host_is_little_endian(void) {
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 1;
}

int act_npy_open(const char *path, const int64_t *shape, int ndim, act_npy **out,
                 char *err, size_t errlen) {
    *out = NULL;
    if (ndim < 1 || ndim > ACT_NPY_MAX_DIMS) {
        snprintf(err, errlen, "%s: .npy rank %d not supported", path, ndim);
        return -1;
    }
    if (!host_is_little_endian()) {
        snprintf(err, errlen, "%s: .npy writer supports little-endian hosts only", path);
        return -1;
    }
    char dict[256], dims[160] = "";
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            snprintf(err, errlen, "%s: negative .npy dimension %lld", path, (long long)shape[i]);
            return -1;
        }
        size_t len = strlen(dims);
        snprintf(dims + len, sizeof dims - len, "%lld,%s", (long long)shape[i],
                 (ndim > 1 && i < ndim - 1) ? " " : "");
        count *= (uint64_t)shape[i];
    }
    if (ndim > 1) dims[strlen(dims) - 1] = '\0'; /* (a, b) not (a, b,); 1-D keeps its comma */
    int dlen = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", dims);
    size_t total = 10 + (size_t)dlen + 1;
    size_t padded = (total + 63) / 64 * 64;
    size_t hlen = padded - 10;

    act_npy *f = calloc(1, sizeof *f);
    if (!f) { snprintf(err, errlen, "%s: out of memory", path); return -1; }
    f->expected = count;
    if (act_outfile_open(&f->out, path, "wb", err, errlen) != 0) {
        free(f);
        return -1;
    }
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                             (unsigned char)(hlen & 0xff), (unsigned char)(hlen >> 8)};
    char hdr[512];
    memset(hdr, ' ', sizeof hdr);
    memcpy(hdr, dict, (size_t)dlen);
    hdr[hlen - 1] = '\n';
    if (fwrite(pre, 1, 10, f->out.fp) != 10 || fwrite(hdr, 1, hlen, f->out.fp) != hlen) {
        snprintf(err, errlen, "%s: write failed: %s", path, strerror(errno));
        act_outfile_abandon(&f->out);
        free(f);
        return -1;
    }
    *out = f;
    return 0;
}

int act_npy_write(act_npy *f, const float *data, size_t count, char *err, size_t errlen) {
    if (f->written + count > f->expected) {
        snprintf(err, errlen, "%s: %llu values written, the shape holds %llu", f->out.path,
                 (unsigned long long)(f->written + count), (unsigned long long)f->expected);
        return -1;
    }
    if (count && fwrite(data, sizeof(float), count, f->out.fp) != count) {
        snprintf(err, errlen, "%s: write failed: %s", f->out.path, strerror(errno));
        return -1;
    }
    f->written += count;
    return 0;
}

int act_npy_finish(act_npy *f, char *err, size_t errlen) {
    if (f->written != f->expected) {
        snprintf(err, errlen, "%s: only %llu of %llu values written", f->out.path,
                 (unsigned long long)f->written, (unsigned long long)f->expected);
        return -1;
    }
    return act_outfile_finish(&f->out, err, errlen);
}

int act_npy_close(act_npy *f, int abandon, char *err, size_t errlen) {
    if (!f) return 0;
    int rc = 0;
    if (!abandon && act_npy_finish(f, err, errlen) != 0) rc = -1;
    if (abandon || rc != 0) act_outfile_abandon(&f->out);
    else rc = act_outfile_commit(&f->out, err, errlen);
    free(f);
    return rc;
}

int act_npy_save(const char *path, const float *data, const int64_t *shape, int ndim,
                 char *err, size_t errlen) {
    act_npy *f;
    if (act_npy_open(path, shape, ndim, &f, err, errlen) != 0) return -1;
    uint64_t n = f->expected;
    if (act_npy_write(f, data, (size_t)n, err, errlen) != 0) {
        act_npy_close(f, 1, NULL, 0);
        return -1;
    }
    return act_npy_close(f, 0, err, errlen);
}
