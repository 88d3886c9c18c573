// The DLPack C exchange API (DLPack 1.3, dlpack.h `DLPackExchangeAPI`): a
// table of C functions a framework attaches to its array type as the capsule
// `type(x).__dlpack_c_exchange_api__` (name "dlpack_exchange_api"). torch
// has it since 2.10. Its non-owning export fills a DLTensor in place with no
// Python call, no allocation and no stream synchronization, which is what a
// kernel library needs per call (torch's __dlpack__ is Python code, ~5 us).
//
// Only the ABI is declared here (dlpack.h is C and its layout stable within
// a major version); DLTensor itself is nanobind's nb::dlpack::dltensor.
#pragma once

#include <nanobind/ndarray.h>

#include <cstdint>

namespace qhead::py::dlx {

struct Version {
  uint32_t major, minor;
};

// DLManagedTensorVersioned: an owning export; `deleter(self)` releases it.
struct ManagedVersioned {
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedVersioned* self);
  uint64_t flags;  // bit 0: read-only, bit 1: a copy
  nanobind::dlpack::dltensor dl_tensor;
};
constexpr uint64_t kFlagReadOnly = 1;

struct Header {
  Version version;  // major must be 1 for this layout
  Header* prev_api;
};

struct ExchangeApi {
  Header header;
  // int alloc(DLTensor* prototype, DLManagedTensorVersioned** out, void* ctx, void (*set_error)(...))
  void* managed_tensor_allocator;
  // Owning export of a Python object of the type the table came from; 0 on success, -1 with a Python error.
  int (*managed_tensor_from_py_object_no_sync)(void* py_object, ManagedVersioned** out);
  // int to_py(DLManagedTensorVersioned*, void** out_py_object)
  void* managed_tensor_to_py_object_no_sync;
  // Non-owning export into *out (shape and strides owned by the producer, valid
  // while the object is unchanged); may be NULL. 0 on success, -1 with a Python error.
  int (*dltensor_from_py_object_no_sync)(void* py_object, nanobind::dlpack::dltensor* out);
  // The producer's current work stream for a device (torch.cuda.current_stream()).
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};

}  // namespace qhead::py::dlx
