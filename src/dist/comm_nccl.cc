// The NCCL communicator (built with QHEAD_NCCL): joining the ranks, the
// collectives, the workspace. The sharded ops over it are in sharded_ops.cc.
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "dist/ops_internal.h"
#include "qhead/cuda.h"
#include "qhead/dist.h"
#include "qhead/error.h"

namespace qhead::dist {

namespace {

[[noreturn]] void fail(const char* op, const std::string& what) { throw Error(ErrorCode::kInvalidArgument, op, what); }

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(ErrorCode::kInternal, "dist", std::string(what) + " failed: " + cudaGetErrorString(e));
}

void nccl_check(ncclResult_t r, const char* what, ncclComm_t comm = nullptr) {
  if (r == ncclSuccess) return;
  std::string msg = std::string(what) + " failed: " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) msg += " (" + std::string(last) + ")";
  throw Error(r == ncclInvalidUsage || r == ncclInvalidArgument ? ErrorCode::kInvalidArgument : ErrorCode::kInternal,
              "dist.nccl", msg);
}

cudaStream_t stream() { return static_cast<cudaStream_t>(cuda::stream()); }

std::string to_hex(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t b = static_cast<const uint8_t*>(p)[i];
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

ncclUniqueId from_hex(const std::string& s) {
  ncclUniqueId id;
  if (s.size() != 2 * sizeof id.internal)
    fail("dist.comm", "a unique id has " + std::to_string(2 * sizeof id.internal) + " hex characters, got " +
                          std::to_string(s.size()));
  auto nib = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    fail("dist.comm", "the unique id is not lowercase hex");
  };
  for (size_t i = 0; i < sizeof id.internal; ++i) id.internal[i] = char(nib(s[2 * i]) << 4 | nib(s[2 * i + 1]));
  return id;
}

// An integer from the launcher's environment: `dflt` when unset or empty,
// else the whole value as a decimal integer in [lo, hi]; anything else is
// kInvalidArgument naming the variable and the values allowed.
int env_int(const char* name, int dflt, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  int x = 0;
  const char* end = v + std::strlen(v);
  const auto [p, ec] = std::from_chars(v, end, x);
  if (ec != std::errc() || p != end || x < lo || x > hi)
    fail("dist.comm", std::string(name) + "='" + v + "' is not an integer in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "]");
  return x;
}

ncclDataType_t nccl_type(DType t, const char* op) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
    default: fail(op, std::string("no NCCL reduction for ") + dtype_name(t));
  }
}

void check_cuda(const TensorView& v, const char* op, const char* name) {
  if (v.device != Device::kCUDA) fail(op, std::string(name) + " must be a CUDA tensor");
  check_contiguous(v, op, name);
}

}  // namespace

// ---- Comm ------------------------------------------------------------------------

struct Comm::Impl {
  ncclComm_t comm = nullptr;
  int rank = 0, world = 1, device = 0;
  mutable std::mutex mu;
  mutable std::vector<Tensor> ws{size_t(internal::kWsCount)};
  ~Impl() {
    if (comm) ncclCommDestroy(comm);
  }
};

bool nccl_available() { return true; }

std::string Comm::new_unique_id() {
  ncclUniqueId id;
  nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return to_hex(id.internal, sizeof id.internal);
}

Comm Comm::init(int rank, int world, const std::string& unique_id, int device) {
  if (world < 1 || rank < 0 || rank >= world)
    fail("dist.comm", "rank " + std::to_string(rank) + " of world " + std::to_string(world) + " is not valid");
  const int n = device_count();
  if (device < 0 || device >= n)
    fail("dist.comm", "rank " + std::to_string(rank) + " asks for CUDA device " + std::to_string(device) + " but " +
                          std::to_string(n) + " are visible");
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);  // never NVLink multicast (device README)
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  const ncclUniqueId id = from_hex(unique_id);
  auto impl = std::make_shared<Impl>();
  impl->rank = rank;
  impl->world = world;
  impl->device = device;
  const std::string what = "ncclCommInitRank(rank " + std::to_string(rank) + " of " + std::to_string(world) +
                           " on CUDA device " + std::to_string(device) + ")";
  nccl_check(ncclCommInitRank(&impl->comm, world, id, rank), what.c_str());
  Comm c;
  c.impl_ = std::move(impl);
  return c;
}

Comm Comm::from_env() {
  if (!in_launched_process()) return init(0, 1, new_unique_id(), 0);
  constexpr int kMax = std::numeric_limits<int>::max();
  const int rank = env_int("QHEAD_TP_RANK", 0, 0, kMax), world = env_int("QHEAD_TP_WORLD", 1, 1, kMax);
  const int device = env_int("QHEAD_TP_DEVICE", rank, 0, kMax);
  const char* f = std::getenv("QHEAD_TP_ID_FILE");
  if (world == 1) return init(0, 1, new_unique_id(), device);
  if (!f || !*f) fail("dist.comm", "QHEAD_TP_ID_FILE is not set (start the ranks with `qhead tp-run`)");
  const std::string file = f;
  std::string id;
  if (rank == 0) {  // publish atomically: write a temporary, then rename
    id = new_unique_id();
    const std::string tmp = file + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream o(tmp);
      o << id;
      if (!o) throw Error(ErrorCode::kIo, "dist.comm", "cannot write " + tmp);
    }
    if (std::rename(tmp.c_str(), file.c_str()) != 0) throw Error(ErrorCode::kIo, "dist.comm", "cannot rename " + tmp + " to " + file);
  } else {
    const int timeout = env_int("QHEAD_TP_ID_TIMEOUT_S", 120, 0, kMax);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(timeout);
    for (;;) {
      std::ifstream in(file);
      if (in && std::getline(in, id) && !id.empty()) break;
      if (std::chrono::steady_clock::now() > until)
        throw Error(ErrorCode::kIo, "dist.comm",
                    "rank " + std::to_string(rank) + " waited " + std::to_string(timeout) + " s for rank 0's id in " + file);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return init(rank, world, id, device);
}

int Comm::rank() const { return impl_ ? impl_->rank : 0; }
int Comm::world() const { return impl_ ? impl_->world : 0; }
int Comm::device() const { return impl_ ? impl_->device : -1; }
int Comm::nccl_version() const {
  int v = 0;
  ncclGetVersion(&v);
  return v;
}
void* Comm::nccl_comm() const { return impl_ ? impl_->comm : nullptr; }

void* Comm::workspace(int slot, size_t bytes) const {
  if (!impl_) fail("dist.comm", "the communicator is not initialized");
  std::lock_guard<std::mutex> g(impl_->mu);
  Tensor& t = impl_->ws.at(size_t(slot));
  if (!t.defined() || t.nbytes() < bytes) {
    t = Tensor();  // free first: the old block may be large
    t = cuda::empty(DType::kU8, {int64_t(std::max<size_t>(bytes, 256))});
  }
  return t.data();
}

void Comm::all_reduce_sum(const TensorView& buf) const {
  const char* op = "dist.all_reduce_sum";
  if (!impl_) fail(op, "the communicator is not initialized");
  check_cuda(buf, op, "buf");
  nccl_check(ncclAllReduce(buf.data, buf.data, size_t(buf.numel()), nccl_type(buf.dtype, op), ncclSum, impl_->comm, stream()),
             "ncclAllReduce", impl_->comm);
}

void Comm::all_gather(const TensorView& send, const TensorView& recv) const {
  const char* op = "dist.all_gather";
  if (!impl_) fail(op, "the communicator is not initialized");
  check_cuda(send, op, "send");
  check_cuda(recv, op, "recv");
  if (send.dtype != recv.dtype || recv.nbytes() != send.nbytes() * size_t(impl_->world))
    fail(op, "recv " + shape_str(recv.shape) + " must hold world (" + std::to_string(impl_->world) + ") × send " +
                 shape_str(send.shape) + " of the same dtype");
  nccl_check(ncclAllGather(send.data, recv.data, send.nbytes(), ncclUint8, impl_->comm, stream()), "ncclAllGather",
             impl_->comm);
}

void Comm::barrier() const {
  if (!impl_) fail("dist.barrier", "the communicator is not initialized");
  void* w = workspace(internal::kWsFlag, 256);
  nccl_check(ncclAllReduce(w, w, 1, ncclInt32, ncclSum, impl_->comm, stream()), "ncclAllReduce (barrier)", impl_->comm);
  cuda_check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize (barrier)");
}

}  // namespace qhead::dist
