// The CPU kernels for AVX-512 F/BW/VL/DQ (16 f32 lanes). Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c
// (CMakeLists.txt); run only when CPUID says so.
#define QHEAD_ISA_AVX512 1
#define QHEAD_ISA_NS avx512
#define QHEAD_ISA_NAME "avx512"
#include "ops/cpu/kernels_impl.h"
