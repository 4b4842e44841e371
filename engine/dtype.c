/* dtype.c - element sizes of the backend buffer types.
 * defines: act_dtype_size
 *
 * A file of its own because both the core library and the CUDA plugin (libact_cuda.so, which
 * carries none of the session code) need it. */
#include "backend.h"

size_t act_dtype_size(act_dtype dt) {
    switch (dt) {
    case ACT_DT_F32: return 4;
    case ACT_DT_BF16:
    case ACT_DT_F16: return 2;
    case ACT_DT_U8: return 1;
    default: return 4;
    }
}
