/* npy.h - a streaming writer of float32 .npy files (NumPy format 1.0, little-endian '<f4', C order).
 * defines: act_npy_open, act_npy_write, act_npy_finish, act_npy_close, act_npy_save
 * The shape is fixed at open, rows are appended as they are computed (eval and predict never hold
 * more than a batch), and close checks that exactly the announced number of values was written,
 * so a crashed or short run never leaves a file that looks complete: rows go to a temporary
 * sibling (outfile.h) that a complete close renames over PATH; until then PATH keeps what it
 * held (a previous run's file, or nothing). */
#ifndef ACT_NPY_H
#define ACT_NPY_H

#include <stddef.h>
#include <stdint.h>

#define ACT_NPY_MAX_DIMS 4

typedef struct act_npy act_npy;

int act_npy_open(const char *path, const int64_t *shape, int ndim, act_npy **out,
                 char *err, size_t errlen);
int act_npy_write(act_npy *f, const float *data, size_t count, char *err, size_t errlen);
/* Checks the count and completes the temporary file without moving it into place yet (files
 * that belong together: finish each, then close each); -1 as for close. */
int act_npy_finish(act_npy *f, char *err, size_t errlen);
/* Finishes the file (if not yet) and moves it into place; returns -1 (removing the temporary file, PATH
 * untouched) if fewer values than the shape says were written. abandon = 1 removes the
 * temporary file without error (the run failed); PATH is left as it was. */
int act_npy_close(act_npy *f, int abandon, char *err, size_t errlen);
int act_npy_save(const char *path, const float *data, const int64_t *shape, int ndim,
                 char *err, size_t errlen);

#endif
