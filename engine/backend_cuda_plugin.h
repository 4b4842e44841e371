/* backend_cuda_plugin.h - the contract between the core library and libact_cuda.so.
 * defines: ACT_CUDA_PLUGIN_FILE, ACT_CUDA_PLUGIN_EXPORT, act_cuda_plugin_create,
 *          act_cuda_plugin_available (and their pointer types for dlsym)
 *
 * The CUDA backend lives in a plugin so that a process maps cuBLAS/cuDNN/cudart (about 210 MB
 * resident just for being linked) only when it asks for a CUDA device, and so that CPU-only
 * machines run the binaries without any CUDA library installed. backend_cuda_loader.c dlopens
 * the plugin once and looks up exactly these symbols; the plugin is built with hidden
 * visibility, so nothing else it carries (its own copy of act_dtype_size, the kernels) can
 * clash with the core. They behave as act_backend_cuda_create / act_cuda_available in
 * backend.h / act.h; the act_backend they return is plain data from backend.h, and its op
 * pointers (destroy included) point into the plugin, which is therefore never unloaded. */
#ifndef ACT_BACKEND_CUDA_PLUGIN_H
#define ACT_BACKEND_CUDA_PLUGIN_H

#include <stddef.h>

#include "backend.h"

#define ACT_CUDA_PLUGIN_FILE "libact_cuda.so"
/* The layout both sides must share: a plugin from another build (an older act_backend or
 * act_model) is refused instead of being called with structures it does not know. Sizes alone
 * miss a field that fills padding (image_channels took the 4 bytes after graphs: same size, the
 * fields after it moved), so the fields' places count too, and ACT_CUDA_PLUGIN_LAYOUT is raised
 * by hand whenever a field of act_backend, act_model, act_config or act_conv changes. */
#define ACT_CUDA_PLUGIN_LAYOUT 2u
#define ACT_CUDA_PLUGIN_ABI ((unsigned)(sizeof(act_backend) * 1000003u + sizeof(act_model) * 1009u + \
                                        sizeof(act_config) * 31u + sizeof(act_conv) + 1u + \
                                        offsetof(act_backend, image_channels) * 7919u + \
                                        offsetof(act_backend, graphs) * 104729u + \
                                        offsetof(act_backend, destroy) * 1299709u + \
                                        ACT_CUDA_PLUGIN_LAYOUT * 15485863u))
#define ACT_CUDA_PLUGIN_EXPORT __attribute__((visibility("default")))

typedef int (*act_cuda_plugin_create_fn)(int device, act_precision prec, act_backend **out,
                                         char *err, size_t errlen);
typedef int (*act_cuda_plugin_available_fn)(char *why, size_t whylen);
typedef unsigned (*act_cuda_plugin_abi_fn)(void);

ACT_CUDA_PLUGIN_EXPORT int act_cuda_plugin_create(int device, act_precision prec,
                                                  act_backend **out, char *err, size_t errlen);
ACT_CUDA_PLUGIN_EXPORT int act_cuda_plugin_available(char *why, size_t whylen);
ACT_CUDA_PLUGIN_EXPORT unsigned act_cuda_plugin_abi(void);   /* ACT_CUDA_PLUGIN_ABI as built */

#endif
