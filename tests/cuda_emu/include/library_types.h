/* library_types.h (CUDA emulator) - the data type codes cuBLAS and cuDNN callers pass. */
#ifndef EMU_LIBRARY_TYPES_H
#define EMU_LIBRARY_TYPES_H
typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14
} cudaDataType_t;
#endif
