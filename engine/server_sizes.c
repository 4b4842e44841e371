/* server_sizes.c - the batch sizes act-serve runs: which, and how a batch is padded up to one.
 *
 * On CUDA every batch size is a step of its own (algorithms measured, a graph captured, again
 * with frames read in place), so warming 1..max-batch costs 4 x max-batch steps at every start.
 * Running a few sizes instead, a batch padded up to the next with copies of its first request
 * (results dropped), cuts that to a handful, as vLLM's CUDA-graph capture sizes do. The bet is
 * that a GPU step at these batch sizes is bound more by launches than by rows, so that padding
 * rows cost little (not measured yet: device_check's sizes-ab row). The CPU's time grows with
 * every row and nothing is captured there, so it runs every size unpadded. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server.h"

int act_serve_batch_sizes(const char *spec, int max_batch, act_device dev, int *pad_to, char *err, size_t errlen)
{
    if (max_batch < 1) {
        snprintf(err, errlen, "act-serve: max-batch must be >= 1");
        return -1;
    }
    if (!spec || !*spec) spec = "auto";
    /* listed[n]: size n is run */
    char *listed = calloc((size_t)max_batch + 1, 1);
    if (!listed) {
        snprintf(err, errlen, "act-serve: out of memory");
        return -1;
    }
    int all = !strcmp(spec, "all") || (!strcmp(spec, "auto") && dev != ACT_DEVICE_CUDA);
    if (all) {
        memset(listed + 1, 1, (size_t)max_batch);
    } else if (!strcmp(spec, "auto")) {   /* 1, 2, 4, then every multiple of 8 */
        for (int n = 1; n <= max_batch; n++) listed[n] = n <= 2 || n == 4 || n % 8 == 0;
    } else {
        for (const char *p = spec; *p;) {
            /* digits only (no sign, no blanks), at most 9 of them: strtol cannot overflow */
            const char *end = p;
            while (isdigit((unsigned char)*end) && end - p < 10) end++;
            long n = end > p && end - p <= 9 ? strtol(p, NULL, 10) : -1;
            if (n < 0 || (*end && *end != ',') || n < 1 || n > max_batch) {
                if (n > max_batch && (!*end || *end == ','))
                    snprintf(err, errlen, "act-serve: --batch-sizes '%s': %ld is above --max-batch %d", spec, n,
                             max_batch);
                else
                    snprintf(err, errlen, "act-serve: --batch-sizes '%s': expected 'auto', 'all' or sizes from 1 to "
                             "--max-batch (%d) separated by commas, e.g. 1,2,4,8,16,32", spec, max_batch);
                free(listed);
                return -1;
            }
            listed[n] = 1;
            p = *end ? end + 1 : end;
            if (*end && !*p) {   /* a trailing comma */
                snprintf(err, errlen, "act-serve: --batch-sizes '%s': a size is missing after the last comma", spec);
                free(listed);
                return -1;
            }
        }
    }
    listed[1] = listed[max_batch] = 1;   /* one robot alone is never padded; a full batch has a size */
    int count = 0;
    pad_to[0] = 0;
    for (int n = max_batch; n >= 1; n--) {
        pad_to[n] = listed[n] ? n : pad_to[n + 1];   /* max_batch is listed */
        count += listed[n];
    }
    free(listed);
    return count;
}

/* "1-32" for every size, else "1,2,4,8,16,24,32"; a list too long for buf ends
 * ",...,MAX (N sizes)" after as many sizes as fit */
void act_serve_batch_sizes_str(const int *pad_to, int max_batch, char *buf, size_t len)
{
    int count = 0;
    for (int n = 1; n <= max_batch; n++) count += pad_to[n] == n;
    if (count == max_batch && max_batch > 2) {
        snprintf(buf, len, "1-%d", max_batch);
        return;
    }
    char tail[48];
    snprintf(tail, sizeof tail, ",...,%d (%d sizes)", max_batch, count);
    size_t at = 0, room = len > strlen(tail) ? len - strlen(tail) : 0;
    buf[0] = 0;
    for (int n = 1; n <= max_batch; n++) {
        if (pad_to[n] != n) continue;
        char one[16];
        int w = snprintf(one, sizeof one, "%s%d", at ? "," : "", n);
        /* the last size always fits where the tail would have gone */
        if (at + (size_t)w < (n == max_batch ? len : room)) {
            memcpy(buf + at, one, (size_t)w + 1);
            at += (size_t)w;
        } else {
            snprintf(buf + at, len - at, "%s", tail);
            return;
        }
    }
}
