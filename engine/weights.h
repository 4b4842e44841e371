/* weights.h - the .actw weight file reader (format: weights/FORMAT.md).
 * defines: act_weights_open, act_weights_open_index, act_weights_load_data, act_weights_free,
 *          act_weights_find, act_meta_get
 * The reader distrusts every byte: any inconsistency is an error naming the file and field. */
#ifndef ACT_WEIGHTS_H
#define ACT_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#define ACTW_MAGIC "ACTW"
#define ACTW_VERSION 1u
#define ACTW_ENDIAN_TAG 0x01020304u
#define ACTW_HEADER_SIZE 128u
#define ACTW_DIR_ENTRY_SIZE 128u
#define ACTW_ALIGN 64u
#define ACTW_NAME_MAX 64u        /* including the terminating NUL */
#define ACTW_MAX_DIMS 4
#define ACTW_MAX_TENSORS 65536u
#define ACTW_MAX_META_BYTES (1u << 20)

typedef enum { ACTW_F32 = 0 } actw_dtype;
typedef enum { ACTW_RAW = 0, ACTW_ZSTD = 1 } actw_compression;

typedef struct act_tensor {
    char name[ACTW_NAME_MAX];
    int ndim;
    int64_t dims[ACTW_MAX_DIMS];
    int64_t numel;
    const float *data;   /* host, fp32, inside act_weights.blob (NULL until the data is loaded) */
    size_t offset;       /* element offset of data within blob (same offset in device copies) */
    int index;           /* position in the directory */
} act_tensor;

typedef struct act_meta_kv { char *key, *value; } act_meta_kv;

typedef struct act_weights {
    char path[512];
    float *blob;         /* all tensor data, fp32, 64-byte aligned (owned) */
    size_t blob_elems;
    act_tensor *tensors;
    int n_tensors;
    act_meta_kv *meta;
    int n_meta;
    uint64_t checksum;   /* FNV-1a 64 of the file after the header: the model hash */
    int compressed;
    int data_loaded;     /* act_weights_load_data has succeeded: blob, blob_elems, tensor data are set */
    uint64_t data_size;  /* bytes of tensor data the header declares (checked against the directory) */
    unsigned char *stored; /* the zstd frame, held from act_weights_open_index until inflated (owned) */
    size_t stored_size;
} act_weights;

/* Opens and checks a whole file: act_weights_open_index, then act_weights_load_data. */
int act_weights_open(const char *path, act_weights **out, char *err, size_t errlen);
/* The first phase: reads the file (no more than its real size), verifies header, checksum,
 * metadata and directory, and refuses a data_size past the tensors. It allocates nothing in
 * proportion to data_size beyond the bytes the file holds: a zstd frame is kept, not inflated,
 * and no tensor's data is set. A caller can check names and shapes (act_model_load does) before
 * paying for the data; metadata, names, dims and the checksum are all valid here. */
int act_weights_open_index(const char *path, act_weights **out, char *err, size_t errlen);
/* The second phase: inflates a zstd frame to data_size bytes, points every tensor at its data
 * and checks every value is finite. After a failure, w may only be freed. */
int act_weights_load_data(act_weights *w, char *err, size_t errlen);
void act_weights_free(act_weights *w);
const act_tensor *act_weights_find(const act_weights *w, const char *name);
const char *act_meta_get(const act_weights *w, const char *key);   /* NULL if absent */
uint64_t act_fnv1a64(const void *data, size_t n, uint64_t h);      /* h = ACT_FNV_INIT to start */
#define ACT_FNV_INIT 0xcbf29ce484222325ull

#endif
