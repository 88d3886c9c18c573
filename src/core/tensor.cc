#include "qhead/tensor.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>

#include "qhead/checked.h"
#include "qhead/error.h"

namespace qhead {

const char* device_name(Device d) { return d == Device::kCPU ? "cpu" : "cuda"; }

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  // A zero dim anywhere makes the count 0 without multiplying the others
  // (readers accept [huge, 0]-style shapes whose non-zero product fits).
  for (int64_t d : s)
    if (d == 0) return 0;
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

bool TensorView::is_contiguous() const {
  if (strides.empty()) return true;
  if (strides.size() != shape.size()) return false;
  int64_t expect = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

Tensor Tensor::empty(DType t, Shape shape) {
  for (int64_t d : shape)
    if (d < 0)
      throw Error(ErrorCode::kInvalidArgument, "Tensor::empty", "negative dim in " + shape_str(shape));
  Tensor out;
  bool has_zero = false;
  for (int64_t d : shape) has_zero |= d == 0;
  std::optional<int64_t> numel = 1;
  if (has_zero)
    numel = 0;
  else
    for (int64_t d : shape) numel = numel ? checked_mul(*numel, d) : std::nullopt;
  const auto total = numel ? checked_mul(*numel, static_cast<int64_t>(dtype_size(t))) : std::nullopt;
  if (!total || *total > std::numeric_limits<int64_t>::max() - 128)
    throw Error(ErrorCode::kInvalidArgument, "Tensor::empty",
                "the byte size of shape " + shape_str(shape) + " does not fit in 64 bits");
  const size_t bytes = static_cast<size_t>(*total);
  const size_t rounded = (bytes + 63) / 64 * 64 + 64;  // never zero, multiple of 64
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw Error(ErrorCode::kIo, "Tensor::empty", "out of memory allocating " + std::to_string(bytes) + " bytes");
  std::memset(p, 0, rounded);
  out.owner_ = std::shared_ptr<const void>(p, [](const void* q) { std::free(const_cast<void*>(q)); });
  out.view_ = TensorView(p, t, std::move(shape));
  return out;
}

Tensor Tensor::borrow(std::shared_ptr<const void> owner, TensorView view) {
  Tensor out;
  out.owner_ = std::move(owner);
  out.view_ = std::move(view);
  return out;
}

Tensor Tensor::copy_of(const TensorView& v) {
  if (v.device != Device::kCPU)
    throw Error(ErrorCode::kUnsupported, "Tensor::copy_of", "only CPU tensors can be copied here");
  check_contiguous(v, "Tensor::copy_of", "source");
  Tensor out = empty(v.dtype, v.shape);
  if (v.nbytes()) std::memcpy(out.data(), v.data, v.nbytes());
  return out;
}

void check_dims(const TensorView& v, int64_t ndim, const char* op, const char* name) {
  if (v.dim() != ndim)
    throw Error(ErrorCode::kInvalidArgument, op,
                std::string(name) + " must have " + std::to_string(ndim) + " dims, got shape " +
                    shape_str(v.shape));
}

void check_contiguous(const TensorView& v, const char* op, const char* name) {
  if (!v.is_contiguous())
    throw Error(ErrorCode::kInvalidArgument, op, std::string(name) + " must be contiguous");
}

}  // namespace qhead
