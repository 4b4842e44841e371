/* conv_plan.cuh - the inside of a cuDNN convolution plan, shared by conv.cu (planning by
 * heuristics, running) and conv_find.cu (choosing by measurement). Not part of the kernels' API:
 * the backend sees act_conv_plan only through conv.cuh.
 * defines: struct act_conv_plan, act_conv_key, act_k_conv_math, act_k_conv_usable,
 *          act_k_conv_pick, act_k_conv_transforms16 */
#ifndef ACT_KERNELS_CONV_PLAN_CUH
#define ACT_KERNELS_CONV_PLAN_CUH
#include "conv.cuh"

/* what makes two plans interchangeable: the device, the data type and precision, the layout
 * and the geometry (the workspace limit is the backend's one constant) */
typedef struct {
    int dev, dt, prec, nhwc, N, cin, H, W, cout, k, stride, pad;
} act_conv_key;

struct act_conv_plan {
    cudnnTensorDescriptor_t xd, yd, bd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    cudnnActivationDescriptor_t relu, ident;
    cudnnConvolutionFwdAlgo_t algo;
    cudnnMathType_t math;           /* the math type set on cd for algo */
    size_t ws;                      /* workspace bytes algo needs */
    size_t ws_limit;                /* the most any algorithm of this plan may use */
    size_t find_ws;                 /* the most any usable heuristic candidate needs */
    act_conv_key key;
    int Ho, Wo;
    int fused;                      /* bias/activation fusion: 0 untried, 1 works, -1 not offered */
};

/* the math type a plan of precision prec asks cuDNN for (and Find explores): fp32 FMA only
 * (no TF32), tf32 cuDNN's default (TF32 allowed), bf16/fp16 tensor ops */
static inline cudnnMathType_t act_k_conv_math(int prec) {
    return prec == 0 ? CUDNN_FMA_MATH : prec == 1 ? CUDNN_DEFAULT_MATH : CUDNN_TENSOR_OP_MATH;
}
/* 1 when a candidate (heuristic or measured) may serve a plan of this precision: status
 * success, workspace within ws_limit, in fp32 and tf32 a GEMM-family algorithm (Winograd and
 * FFT transforms lose digits that their parity budgets cannot spare), in fp32 on FMA math, in
 * tf32 never with CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION (fp32 computed in fp16) */
int act_k_conv_usable(const cudnnConvolutionFwdAlgoPerf_t *c, int prec, size_t ws_limit);
/* 1 when ACT_CUDA_CONV_TRANSFORMS16 lets bf16/fp16 convs take FFT and Winograd algorithms too
 * (read once a process); part of a measured choice's key, since it widens what Find may pick */
int act_k_conv_transforms16(void);
/* Take the first entry of perf (best first, from the heuristics or from a measurement) that this
 * plan may use (act_k_conv_usable, and a workspace query that agrees). Sets algo, math (on cd
 * too) and ws, and nothing else of the plan. 0 taken, 1 none usable (cd's math type is then
 * whatever the last candidate set: the caller restores it from p->math), -1 error. */
int act_k_conv_pick(cudnnHandle_t h, act_conv_plan *p, const cudnnConvolutionFwdAlgoPerf_t *perf,
                    int got, char *err, size_t errlen);
#endif
