// The CPU kernels for AVX2 + FMA + F16C (8 f32 lanes). Compiled with
// -mavx2 -mfma -mf16c (CMakeLists.txt); run only when CPUID says so.
#define QHEAD_ISA_AVX2 1
#define QHEAD_ISA_NS avx2
#define QHEAD_ISA_NAME "avx2"
#include "ops/cpu/kernels_impl.h"
