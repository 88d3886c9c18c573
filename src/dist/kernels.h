// Device helpers of the sharded ops (internal; src/dist/kernels.cu). They
// need CUDA but not NCCL, so the merge is tested on one GPU without a
// communicator. Every function runs on `stream` (a cudaStream_t) and throws
// qhead::Error on a launch failure; built without CUDA they throw kUnsupported.
#pragma once

#include <cstddef>
#include <cstdint>

namespace qhead::dist::kernels {

// One rank's message [M, k + 1] (qhead/dist.h) from its local top-k: values /
// local ids [M, k_local], lse [M]; ids shifted by first_row; padding words 0.
void pack_candidates(const float* values, const int32_t* local_ids, const float* lse, int64_t m, int64_t k_local,
                     int64_t k, int64_t first_row, uint64_t* out, void* stream);

// The exact global top-k from world messages [world, M, k + 1]: one thread per
// candidate finds its rank in the merged order (its position in its own
// sorted list plus, by binary search, how many candidates of each other list
// beat it) and writes itself there if the rank is below k. values/ids [M, k],
// lse [M] (double-precision combine).
void merge_candidates(const uint64_t* gathered, int world, int64_t m, int64_t k, float* values, int32_t* ids,
                      float* lse, void* stream);

// Global ids (I32 or I64 [n]) → local ids of rows [begin, end) (0 for ids
// another rank owns) and an ownership mask; *bad = 1 if an id is outside
// [0, vocab).
void map_ids(const void* ids, bool ids_i64, int64_t n, int64_t begin, int64_t end, int64_t vocab, int32_t* local,
             uint8_t* owned, int* bad, void* stream);

// Zeroes rows i of out ([n, row_bytes]) whose owned[i] is 0.
void zero_unowned(void* out, int64_t n, int64_t row_bytes, const uint8_t* owned, void* stream);

// The out-of-range flag of map_ids: set to 0 (on the stream), and read back
// to the host (waits for the stream).
void clear_flag(int* flag, void* stream);
int read_flag(const int* flag, void* stream);

// Copies `rows` rows of `row_bytes` bytes from src (a row every src_pitch
// bytes) to dst (a row every dst_pitch bytes), device to device.
void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, int64_t rows,
               void* stream);

}  // namespace qhead::dist::kernels
