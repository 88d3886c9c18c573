// qhead/tensor.h — a non-owning tensor view and an owning tensor.
//
// TensorView is what kernels and ops take: pointer, dtype, shape, strides (in
// elements) and device. Tensor owns (or shares) the storage behind a view; the
// storage may be heap memory or a read-only file mapping kept alive by the
// tensor (a packed table loaded by mmap is used in place, without a copy).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qhead/dtype.h"

namespace qhead {

enum class Device : uint8_t { kCPU, kCUDA };
const char* device_name(Device d);

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[151936, 1024]"
int64_t shape_numel(const Shape& s);    // product; 1 for a scalar

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  Shape strides;  // in elements; empty means contiguous row-major
  Device device = Device::kCPU;

  TensorView() = default;
  TensorView(void* d, DType t, Shape s, Device dev = Device::kCPU)
      : data(d), dtype(t), shape(std::move(s)), device(dev) {}

  int64_t dim() const { return static_cast<int64_t>(shape.size()); }
  int64_t size(int64_t i) const { return shape[static_cast<size_t>(i)]; }
  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  // Row-major contiguous (no strides given, or strides equal to the dense ones).
  bool is_contiguous() const;
  template <class T> T* ptr() const { return static_cast<T*>(data); }
};

class Tensor {
 public:
  Tensor() = default;
  // Allocates a zero-initialized contiguous CPU tensor (64-byte aligned).
  static Tensor empty(DType t, Shape shape);
  // A tensor over external storage that `owner` keeps alive (e.g. an mmap).
  static Tensor borrow(std::shared_ptr<const void> owner, TensorView view);
  // Deep copy to a new contiguous CPU tensor.
  static Tensor copy_of(const TensorView& v);

  const TensorView& view() const { return view_; }
  TensorView& view() { return view_; }
  bool defined() const { return owner_ != nullptr || view_.data != nullptr; }
  void* data() const { return view_.data; }
  DType dtype() const { return view_.dtype; }
  const Shape& shape() const { return view_.shape; }
  int64_t size(int64_t i) const { return view_.size(i); }
  int64_t numel() const { return view_.numel(); }
  size_t nbytes() const { return view_.nbytes(); }
  template <class T> T* ptr() const { return view_.ptr<T>(); }

 private:
  std::shared_ptr<const void> owner_;
  TensorView view_;
};

// Throws kInvalidArgument naming `op` and `name` unless v has `ndim` dims.
void check_dims(const TensorView& v, int64_t ndim, const char* op, const char* name);
// Throws unless v is contiguous (strides may be given for future use, but the
// reference ops take contiguous inputs only).
void check_contiguous(const TensorView& v, const char* op, const char* name);

}  // namespace qhead
