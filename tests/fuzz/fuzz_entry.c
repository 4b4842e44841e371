/* fuzz_entry.c - the libFuzzer entry point of one target: built once per harness with
 * -DACT_FUZZ_TARGET=act_fuzz_<target> (tests/fuzz/CMakeLists.txt, ACT_FUZZ=ON). */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return ACT_FUZZ_TARGET(data, size); }
