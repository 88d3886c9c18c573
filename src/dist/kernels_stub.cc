// Built without CUDA: the device helpers of the sharded ops throw, and no
// device is visible.
#include "dist/kernels.h"
#include "qhead/dist.h"
#include "qhead/error.h"

namespace qhead::dist {

int device_count() { return 0; }

namespace kernels {

namespace {
[[noreturn]] void no_cuda() { throw Error(ErrorCode::kUnsupported, "dist", "qhead was built without CUDA"); }
}  // namespace

void pack_candidates(const float*, const int32_t*, const float*, int64_t, int64_t, int64_t, int64_t, uint64_t*, void*) {
  no_cuda();
}
void merge_candidates(const uint64_t*, int, int64_t, int64_t, float*, int32_t*, float*, void*) { no_cuda(); }
void map_ids(const void*, bool, int64_t, int64_t, int64_t, int64_t, int32_t*, uint8_t*, int*, void*) { no_cuda(); }
void zero_unowned(void*, int64_t, int64_t, const uint8_t*, void*) { no_cuda(); }
void clear_flag(int*, void*) { no_cuda(); }
int read_flag(const int*, void*) { no_cuda(); }
void copy_rows(void*, size_t, const void*, size_t, size_t, int64_t, void*) { no_cuda(); }

}  // namespace kernels
}  // namespace qhead::dist
