// qhead/cuda.h — tables and tensors on an NVIDIA GPU.
//
// A table moves to the GPU as ONE allocation holding its packed codes, its
// scales and (asymmetric) its zero points, in the same pack-quantized layout
// as on the host (docs/architecture.md, Decisions): a tied table used by embed and logits
// is one copy on the device too. The ops in qhead/ops.h dispatch on the
// table's device; on CUDA they take device tensors and run on the current
// stream (the default stream unless set_stream says otherwise).
//
// Built without CUDA, available() is false and everything else throws
// Error(kUnsupported).
#pragma once

#include <cstddef>
#include <cstdint>

#include "qhead/table.h"
#include "qhead/tensor.h"

namespace qhead::cuda {

// True when qhead was built with CUDA and a device is visible.
bool available();
// Human-readable device name ("NVIDIA H200"), or "" without a device.
const char* device_name();

// A zero-filled device tensor (plain cudaMalloc, 256-byte aligned).
Tensor empty(DType t, Shape shape);
// Host → device / device → host copies (contiguous tensors).
Tensor to_device(const TensorView& host);
Tensor to_host(const TensorView& dev);
// Copies a host table to the device as one allocation (validated first).
Table to_device(const Table& host);
// Waits for all work on the current stream; throws on an asynchronous error.
void synchronize();
// The stream ops run on (a cudaStream_t; nullptr = the legacy default stream).
void set_stream(void* stream);
void* stream();

// Device memory qhead currently holds through empty()/to_device(), and the
// number of live allocations (tests check a tied table is one allocation).
size_t allocated_bytes();
size_t allocation_count();

}  // namespace qhead::cuda
