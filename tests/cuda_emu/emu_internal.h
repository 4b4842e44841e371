/* emu_internal.h (CUDA emulator) - what the emulated libraries (emu_blas.cc, emu_dnn.cc) use
 * of the emulated runtime (emu_runtime.cc). Not seen by engine or kernel code. */
#ifndef EMU_INTERNAL_H
#define EMU_INTERNAL_H

#include <stddef.h>
#include <functional>
#include <string>
#include <vector>
#include "cuda_runtime.h"

/* The device operands of one recorded operation: the allocation each pointed into when the
 * call was made. An operation runs later than its call (deferred streams) and a captured one
 * runs again at every graph replay, with the pointers of capture time; each run first checks
 * that every remembered allocation is still the live one, and faults instead of running when
 * one was freed since (on a GPU: a graph replayed after cudaFree corrupts memory silently). */
struct emu_operand {
    const char *what;               /* "the workspace", "operand A"; "argument" for kernels */
    int arg;                        /* a kernel argument's position, from 1; 0 for the others */
    const void *p;
    unsigned long long alloc;       /* the serial number of the allocation p pointed into */
};
typedef std::vector<emu_operand> emu_operands;

/* Every stream operation goes through here: `op` runs later, in stream order (streams are
 * deferred until something synchronizes), or is recorded into a graph when the stream is
 * capturing. `what` names it in traces and errors; `operands` (from emu_on_device) are
 * re-checked before every run. Returns cudaSuccess or the error the real runtime would give (a
 * bad stream handle, a sticky fault, a capture already invalidated). */
cudaError_t emu_enqueue(cudaStream_t st, const char *what, std::function<void(void)> op,
                        emu_operands operands);
/* the same with a name of its own for traces and errors: kind (a string literal) is what
 * ACT_EMU_TRACE counts it as, what is the name the node listing and faults give */
cudaError_t emu_enqueue_as(cudaStream_t st, const char *kind, std::string what,
                           std::function<void(void)> op, emu_operands operands);

/* 1 when the stream records into a capture (a library call can refuse to be captured) */
int emu_stream_capturing(cudaStream_t st);
/* 1 when [p, p + bytes) lies inside one live cudaMalloc allocation */
int emu_is_device_range(const void *p, size_t bytes);
/* the same check for an operand of a library call: 0 after reporting a fault that names the
 * call and the operand (a real GPU faults on a host pointer). When it passes (and bytes > 0)
 * the operand is appended to *keep, for emu_enqueue to re-check at every run. */
int emu_on_device(const char *call, const char *what, const void *p, size_t bytes,
                  emu_operands *keep);

/* A device-side fault found while an operation runs (an out-of-range access, an unsupported
 * combination): printed to stderr with the operation's name and made sticky, so every later
 * runtime call returns cudaErrorIllegalAddress as on a real GPU. printf-style. */
void emu_fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Element i of a buffer of type t (CUDA_R_32F / 16F / 16BF) as float, and the reverse with
 * round-to-nearest-even. */
float emu_load(const void *p, cudaDataType_t t, size_t i);
void emu_store(void *p, cudaDataType_t t, size_t i, float v);
/* an fp32 value rounded to TF32 (10 explicit mantissa bits, nearest even), as tensor cores
 * read fp32 operands in TF32 mode */
float emu_round_tf32(float v);

/* how the emulated GEMMs read fp32 operands under a compute type (TF32, or fp16/bf16 for the
 * FAST_16F/16BF types) */
enum emu_rounding { EMU_ROUND_NONE, EMU_ROUND_TF32, EMU_ROUND_F16, EMU_ROUND_BF16 };
float emu_round_operand(float v, emu_rounding r);
/* a rows x cols column-major matrix (leading dimension ld) of type t as packed fp32 */
std::vector<float> emu_widen(const void *p, cudaDataType_t t, size_t rows, size_t cols, size_t ld,
                             emu_rounding r);


#endif
