/* backend_cuda_loader.c - the CUDA entry points of the core library: they load the CUDA backend
 * plugin (libact_cuda.so, see backend_cuda_plugin.h) on first use and forward to it.
 * defines: act_backend_cuda_create, act_cuda_available
 *
 * Why a plugin: linking cuBLAS/cuDNN/cudart into every binary costs ~210 MB of resident memory
 * at process start and makes the binaries unusable where no CUDA library is installed. Only a
 * caller that asks for CUDA reaches this file, so the CPU path never dlopens anything.
 *
 * The plugin is opened once per process (pthread_once) and never closed (the backends it
 * creates point into it). Search order, first existing file wins:
 *   1. $ACT_CUDA_PLUGIN (a path to the .so)
 *   2. the directory of the running executable (build/act-infer -> build/libact_cuda.so)
 *   3. that directory's parent (build/tests/test_x -> build/libact_cuda.so)
 *   4. dlopen("libact_cuda.so"): LD_LIBRARY_PATH, the system library directories
 * A plugin file that exists but cannot be loaded (a CUDA library it needs is missing) stops the
 * search with dlerror()'s reason rather than silently trying the next one. A build without
 * CUDA has no plugin and says so without searching.
 * Before any of that, the NVIDIA driver (libcuda.so.1, a few MB) is asked whether a device
 * exists: where there is none, the plugin - and the ~210 MB of cuBLAS it maps - is never loaded,
 * so `--device auto` on a CPU-only machine costs nothing.
 * $ACT_CUDA_EMULATOR (a path to libact_cuda_emu.so, tests/cuda_emu) replaces all of that: the
 * same backend and kernels built against a host emulation of CUDA, for the tests on machines
 * without a GPU. Its device name says it is an emulator; it is never picked up by itself. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backend_cuda_plugin.h"

#define NO_CUDA_BUILD "act-engine was built without CUDA (nvcc not found or ACT_ENABLE_CUDA=OFF)"

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static act_cuda_plugin_create_fn g_create;
static act_cuda_plugin_available_fn g_available;
static char g_err[2048];                 /* why the plugin is unavailable, when it is */

/* dlopen what (a path or a bare name) and resolve the entry points; on failure g_err says why */
static int open_plugin(const char *what) {
    void *h = dlopen(what, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        snprintf(g_err, sizeof g_err, "CUDA backend unavailable: cannot load %s: %s (a CUDA "
                 "library it needs - cudart, cuBLAS, cuDNN - is missing or not on the library "
                 "path)", what, why ? why : "unknown dlopen error");
        return -1;
    }
    g_create = (act_cuda_plugin_create_fn)dlsym(h, "act_cuda_plugin_create");
    g_available = (act_cuda_plugin_available_fn)dlsym(h, "act_cuda_plugin_available");
    act_cuda_plugin_abi_fn abi = (act_cuda_plugin_abi_fn)dlsym(h, "act_cuda_plugin_abi");
    if (!g_create || !g_available || !abi) {
        g_create = NULL;
        g_available = NULL;
        snprintf(g_err, sizeof g_err, "CUDA backend unavailable: %s is not an act-engine CUDA "
                 "plugin (act_cuda_plugin_create/_available/_abi not exported)", what);
        return -1;
    }
    if (abi() != ACT_CUDA_PLUGIN_ABI) {
        g_create = NULL;
        g_available = NULL;
        snprintf(g_err, sizeof g_err, "CUDA backend unavailable: %s comes from another build of "
                 "act-engine (plugin ABI %08x, this program %08x): rebuild, or point "
                 "ACT_CUDA_PLUGIN at the plugin built with this program", what, abi(),
                 ACT_CUDA_PLUGIN_ABI);
        return -1;
    }
    return 0;
}

/* the emulated plugin, when the environment names one: 1 = that decides (loaded or failed) */
static int try_emulator(void) {
    const char *emu = getenv("ACT_CUDA_EMULATOR");
    if (!emu || !*emu) return 0;
    if (access(emu, F_OK) != 0)
        snprintf(g_err, sizeof g_err, "CUDA emulator unavailable: ACT_CUDA_EMULATOR=%s does not "
                 "exist", emu);
    else
        open_plugin(emu);
    return 1;
}

#ifdef ACT_WITH_CUDA
/* add item to the comma-separated list of places tried; a full list ends in "..." */
static void append(char *list, size_t cap, const char *item) {
    size_t n = strlen(list);
    int w = snprintf(list + n, cap - n, "%s%s", n ? ", " : "", item);
    if (w < 0 || (size_t)w >= cap - n) memcpy(list + cap - 4, "...", 4);
}

/* try one candidate file: 1 = search over (loaded, or it exists and failed), 0 = not there */
static int try_file(const char *path, char *tried, size_t cap) {
    if (access(path, F_OK) != 0) {
        append(tried, cap, path);
        return 0;
    }
    open_plugin(path);
    return 1;
}

/* 0 when the driver reports at least one device; else g_err says why not */
static int probe_driver(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_err, sizeof g_err, "no usable CUDA device: the NVIDIA driver (libcuda.so.1) "
                 "is not installed");
        return -1;
    }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
    int n = 0, rc = init && count ? init(0) : -1;
    if (rc == 0) rc = count(&n);
    /* an initialized driver stays loaded (the plugin's runtime uses it next): unloading a
     * library whose cuInit ran is asking for its threads and handlers to outlive its code */
    if (rc != 0) dlclose(h);
    if (rc != 0 || n < 1) {
        snprintf(g_err, sizeof g_err, "no usable CUDA device: the NVIDIA driver %s",
                 rc != 0 ? "failed to initialize (cuInit error)" : "reports no device");
        return -1;
    }
    return 0;
}

static void load_plugin(void) {
    if (try_emulator() || probe_driver()) return;
    char tried[1024] = "";
    char path[4096];
    const char *env = getenv("ACT_CUDA_PLUGIN");
    if (env && *env && try_file(env, tried, sizeof tried)) return;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        for (int up = 0; up < 2; up++) {   /* the executable's directory, then its parent */
            char *slash = strrchr(exe, '/');
            if (!slash || slash == exe) break;
            *slash = '\0';
            int w = snprintf(path, sizeof path, "%s/%s", exe, ACT_CUDA_PLUGIN_FILE);
            if (w < 0 || (size_t)w >= sizeof path) continue;   /* no such path can exist */
            if (try_file(path, tried, sizeof tried)) return;
        }
    }
    if (!open_plugin(ACT_CUDA_PLUGIN_FILE)) return;
    /* dlerror names the file it could not open: the plugin itself, or one of its libraries */
    if (strstr(g_err, ACT_CUDA_PLUGIN_FILE ": cannot open shared object file")) {
        append(tried, sizeof tried, "the library path");
        snprintf(g_err, sizeof g_err, "CUDA backend unavailable: %s not found (tried %s): this "
                 "build has no CUDA support or the plugin was not installed next to act-infer "
                 "(set ACT_CUDA_PLUGIN to its path)", ACT_CUDA_PLUGIN_FILE, tried);
    }
}
#else
static void load_plugin(void) {
    if (try_emulator()) return;
    snprintf(g_err, sizeof g_err, "%s", NO_CUDA_BUILD);
}
#endif

int act_cuda_available(char *why, size_t whylen) {
    pthread_once(&g_once, load_plugin);
    if (g_available) return g_available(why, whylen);
    if (why && whylen) snprintf(why, whylen, "%s", g_err);
    return 0;
}

int act_backend_cuda_create(int device, act_precision prec, act_backend **out, char *err,
                            size_t errlen) {
    pthread_once(&g_once, load_plugin);
    if (g_create) return g_create(device, prec, out, err, errlen);
    *out = NULL;
#ifdef ACT_WITH_CUDA
    if (err && errlen) snprintf(err, errlen, "%s", g_err);   /* it names the CUDA backend */
#else
    if (err && errlen) snprintf(err, errlen, "cuda backend: %s; use the cpu device", g_err);
#endif
    return -1;
}
