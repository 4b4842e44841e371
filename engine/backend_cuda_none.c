/* backend_cuda_none.c - the CUDA entry points of a build without CUDA (no nvcc found, or
 * -DACT_ENABLE_CUDA=OFF): they say so clearly, and the CPU backend works as before.
 * defines: act_backend_cuda_create, act_cuda_available */
#include <stdio.h>
#include "backend.h"

int act_cuda_available(char *why, size_t whylen) {
    if (why && whylen) snprintf(why, whylen, "act-engine was built without CUDA (nvcc not found "
                                "or ACT_ENABLE_CUDA=OFF)");
    return 0;
}

int act_backend_cuda_create(int device, act_precision prec, act_backend **out, char *err,
                            size_t errlen) {
    (void)device;
    (void)prec;
    *out = NULL;
    if (err && errlen) snprintf(err, errlen, "cuda backend: act-engine was built without CUDA "
                                "(nvcc not found or ACT_ENABLE_CUDA=OFF); use the cpu device");
    return -1;
}
