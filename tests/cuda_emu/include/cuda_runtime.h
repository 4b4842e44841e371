/* cuda_runtime.h (CUDA emulator) - the subset of the CUDA runtime act-engine uses, implemented
 * on the host by tests/cuda_emu/emu_runtime.cc, so that engine/backend_cuda.c and the kernel
 * files compile unchanged against it and run on a machine without a GPU.
 *
 * The C part (types, runtime API) serves backend_cuda.c; the C++ part (dim3, thread indices,
 * __global__ and friends, barriers, shuffles, the launch template) serves the kernels, which
 * tests/cuda_emu/translate.sh turns into C++ by rewriting `k<<<g, b, s, st>>>(args)` into
 * `emu_launch(k, g, b, s, st)(args)` and `extern __shared__ T x[];` into a pointer to the
 * block's dynamic shared memory. See emu_runtime.cc for what is checked. */
#ifndef EMU_CUDA_RUNTIME_H
#define EMU_CUDA_RUNTIME_H

#include <stddef.h>
#include "library_types.h"

/* CUDA's vector type for two floats (8-byte aligned, as on a GPU) */
typedef struct __attribute__((aligned(8))) float2 { float x, y; } float2;
static inline float2 make_float2(float x, float y) {
    float2 f = {x, y};
    return f;
}

/* four 32-bit words, 16-byte aligned as on a GPU (a kernel's 16-byte loads) */
typedef struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; } uint4;
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    uint4 u = {x, y, z, w};
    return u;
}

#define CUDA_EMULATOR 1
#define CUDART_CB

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidPitchValue = 12,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorNotReady = 600,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotPermitted = 800,
    cudaErrorNotSupported = 801,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureMerge = 902,
    cudaErrorStreamCaptureUnmatched = 903,
    cudaErrorStreamCaptureUnjoined = 904,
    cudaErrorStreamCaptureIsolation = 905,
    cudaErrorCapturedEvent = 907
} cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01

#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaEventWaitDefault 0x00

#define cudaHostRegisterDefault 0x00
#define cudaHostRegisterPortable 0x01
#define cudaHostRegisterMapped 0x02
#define cudaHostRegisterReadOnly 0x08

enum cudaDeviceAttr { cudaDevAttrComputeCapabilityMajor = 75, cudaDevAttrComputeCapabilityMinor = 76,
                     cudaDevAttrHostRegisterReadOnlySupported = 113 };

typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
typedef struct emu_graph *cudaGraph_t;
typedef struct emu_graph_exec *cudaGraphExec_t;
typedef void (*cudaHostFn_t)(void *userData);

struct cudaDeviceProp {
    char name[256];
    int major, minor;
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int multiProcessorCount;
    int maxThreadsPerBlock;
    int warpSize;
    int clockRate;
};

#ifdef __cplusplus
extern "C" {
#endif
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int dev);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned flags);
cudaError_t cudaHostUnregister(void *p);
cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned flags);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int dev);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t st);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                              size_t height, enum cudaMemcpyKind kind, cudaStream_t st);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t st);
cudaError_t cudaStreamCreate(cudaStream_t *st);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *st, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t st);
cudaError_t cudaStreamSynchronize(cudaStream_t st);
cudaError_t cudaLaunchHostFunc(cudaStream_t st, cudaHostFn_t fn, void *user);
cudaError_t cudaEventCreate(cudaEvent_t *ev);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t ev);
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t st);
cudaError_t cudaEventSynchronize(cudaEvent_t ev);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t ev, unsigned flags);
cudaError_t cudaStreamBeginCapture(cudaStream_t st, enum cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t *graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t st);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphUpload(cudaGraphExec_t exec, cudaStream_t st);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
#ifdef __cplusplus
}
#include "emu_device.h"
#endif

#endif
