// The NCCL communicator and the sharded ops (built with QHEAD_NCCL).
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "dist/kernels.h"
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

int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0') fail("dist.comm", std::string(name) + "='" + v + "' is not an integer");
  return int(x);
}

ncclDataType_t nccl_type(DType t, const char* op) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
    default: fail(op, std::string("no NCCL reduction for ") + dtype_name(t));
  }
}

void check_pair(const Comm& comm, const ShardedTable& t, const char* op) {
  if (!comm.valid()) fail(op, "the communicator is not initialized");
  if (t.world != comm.world() || t.rank != comm.rank())
    fail(op, "the table is shard " + std::to_string(t.rank) + " of " + std::to_string(t.world) +
                 " but the communicator is rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.world()));
  if (t.table.device() != Device::kCUDA) fail(op, "the shard is not on the GPU (dist::to_device first)");
}

void check_cuda(const TensorView& v, const char* op, const char* name) {
  if (v.device != Device::kCUDA) fail(op, std::string(name) + " must be a CUDA tensor");
  check_contiguous(v, op, name);
}

void check_out(const TensorView& v, DType t, const Shape& s, const char* op, const char* name) {
  check_cuda(v, op, name);
  if (v.dtype != t) fail(op, std::string(name) + " must be " + dtype_name(t) + ", got " + dtype_name(v.dtype));
  if (v.shape != s) fail(op, std::string(name) + " must have shape " + shape_str(s) + ", got " + shape_str(v.shape));
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

bool Comm::in_launched_process() { return std::getenv("QHEAD_TP_RANK") != nullptr; }

Comm Comm::from_env() {
  if (!in_launched_process()) return init(0, 1, new_unique_id(), 0);
  const int rank = env_int("QHEAD_TP_RANK", 0), world = env_int("QHEAD_TP_WORLD", 1);
  const int device = env_int("QHEAD_TP_DEVICE", rank);
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
    const int timeout = env_int("QHEAD_TP_ID_TIMEOUT_S", 120);
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

// ---- embed -----------------------------------------------------------------------

void embed(const Comm& comm, const ShardedTable& t, const TensorView& ids, const TensorView& out) {
  const char* op = "dist.embed";
  check_pair(comm, t, op);
  check_cuda(ids, op, "ids");
  check_dims(ids, 1, op, "ids");
  if (ids.dtype != DType::kI32 && ids.dtype != DType::kI64)
    fail(op, std::string("ids must be I32 or I64, got ") + dtype_name(ids.dtype));
  const int64_t n = ids.size(0);
  check_out(out, out.dtype, {n, t.hidden}, op, "out");
  const ncclDataType_t nt = nccl_type(out.dtype, op);
  if (n == 0) return;
  cudaStream_t s = stream();
  auto* local = static_cast<int32_t*>(comm.workspace(internal::kWsIds, size_t(n) * 4));
  auto* owned = static_cast<uint8_t*>(comm.workspace(internal::kWsOwned, size_t(n)));
  auto* bad = static_cast<int*>(comm.workspace(internal::kWsFlag, 256));
  cuda_check(cudaMemsetAsync(bad, 0, sizeof(int), s), "cudaMemsetAsync");
  kernels::map_ids(ids.data, ids.dtype == DType::kI64, n, t.range.begin, t.range.end, t.vocab, local, owned, bad, s);
  qhead::embed(t.table, TensorView(local, DType::kI32, {n}, Device::kCUDA), out);  // syncs the stream
  int flag = 0;
  cuda_check(cudaMemcpyAsync(&flag, bad, sizeof flag, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
  cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  // Every rank holds the same ids, so every rank throws here alike (none is
  // left waiting in the all-reduce).
  if (flag) fail(op, "an id is out of range for a vocab of " + std::to_string(t.vocab) + " (ids on the GPU)");
  kernels::zero_unowned(out.data, n, t.hidden * int64_t(dtype_size(out.dtype)), owned, s);
  nccl_check(ncclAllReduce(out.data, out.data, size_t(n * t.hidden), nt, ncclSum,
                           static_cast<ncclComm_t>(comm.nccl_comm()), s),
             "ncclAllReduce (embed)", static_cast<ncclComm_t>(comm.nccl_comm()));
}

Tensor embed(const Comm& comm, const ShardedTable& t, const TensorView& ids, DType out_dtype) {
  check_dims(ids, 1, "dist.embed", "ids");
  Tensor out = cuda::empty(out_dtype, {ids.size(0), t.hidden});
  embed(comm, t, ids, out.view());
  return out;
}

// ---- logits ----------------------------------------------------------------------

void logits(const ShardedTable& t, const TensorView& x, const TensorView& out, Backend backend) {
  qhead::logits(t.table, x, out, backend);
}

Tensor logits(const ShardedTable& t, const TensorView& x) { return qhead::logits(t.table, x); }

void all_gather_logits(const Comm& comm, const ShardedTable& t, const TensorView& local, const TensorView& out) {
  const char* op = "dist.all_gather_logits";
  check_pair(comm, t, op);
  check_dims(local, 2, op, "local");
  const int64_t m = local.size(0), vs = t.range.size(), S = t.stride;
  check_out(local, DType::kF32, {m, vs}, op, "local");
  check_out(out, DType::kF32, {m, t.vocab}, op, "out");
  if (m == 0) return;
  cudaStream_t s = stream();
  // NCCL's all-gather moves equal counts: every slice padded to [M, S].
  float* send = static_cast<float*>(local.data);
  if (vs != S) {
    send = static_cast<float*>(comm.workspace(internal::kWsSend, size_t(m * S) * 4));
    cuda_check(cudaMemcpy2DAsync(send, size_t(S) * 4, local.data, size_t(vs) * 4, size_t(vs) * 4, size_t(m),
                                 cudaMemcpyDeviceToDevice, s),
               "cudaMemcpy2DAsync");
  }
  float* recv = static_cast<float*>(comm.workspace(internal::kWsRecv, size_t(comm.world()) * size_t(m * S) * 4));
  nccl_check(ncclAllGather(send, recv, size_t(m * S), ncclFloat32, static_cast<ncclComm_t>(comm.nccl_comm()), s),
             "ncclAllGather (logits)", static_cast<ncclComm_t>(comm.nccl_comm()));
  for (int r = 0; r < comm.world(); ++r) {
    const int64_t begin = int64_t(r) * S, rows = std::min<int64_t>(S, t.vocab - begin);
    cuda_check(cudaMemcpy2DAsync(static_cast<float*>(out.data) + begin, size_t(t.vocab) * 4, recv + int64_t(r) * m * S,
                                 size_t(S) * 4, size_t(rows) * 4, size_t(m), cudaMemcpyDeviceToDevice, s),
               "cudaMemcpy2DAsync");
  }
}

Tensor all_gather_logits(const Comm& comm, const ShardedTable& t, const TensorView& local) {
  check_dims(local, 2, "dist.all_gather_logits", "local");
  Tensor out = cuda::empty(DType::kF32, {local.size(0), t.vocab});
  all_gather_logits(comm, t, local, out.view());
  return out;
}

// ---- topk ------------------------------------------------------------------------

namespace internal {

int64_t local_topk(const Comm& comm, const ShardedTable& t, const TensorView& x, int64_t k, Backend backend) {
  check_dims(x, 2, "dist.topk", "x");
  const int64_t m = x.size(0), kl = std::min<int64_t>(k, t.range.size());
  void* v = comm.workspace(kWsLocalValues, size_t(m * kl) * 4);
  void* i = comm.workspace(kWsLocalIds, size_t(m * kl) * 4);
  void* l = comm.workspace(kWsLocalLse, size_t(m) * 4);
  qhead::topk(t.table, x, kl, TensorView(v, DType::kF32, {m, kl}, Device::kCUDA),
              TensorView(i, DType::kI32, {m, kl}, Device::kCUDA), TensorView(l, DType::kF32, {m}, Device::kCUDA), backend);
  return kl;
}

void exchange_topk(const Comm& comm, const ShardedTable& t, int64_t m, int64_t k_local, int64_t k,
                   const TensorView& values, const TensorView& ids, const TensorView& lse) {
  cudaStream_t s = stream();
  const size_t words = size_t(m * (k + 1));
  auto* send = static_cast<uint64_t*>(comm.workspace(kWsSend, words * 8));
  auto* recv = static_cast<uint64_t*>(comm.workspace(kWsRecv, words * 8 * size_t(comm.world())));
  kernels::pack_candidates(static_cast<const float*>(comm.workspace(kWsLocalValues, 0)),
                           static_cast<const int32_t*>(comm.workspace(kWsLocalIds, 0)),
                           static_cast<const float*>(comm.workspace(kWsLocalLse, 0)), m, k_local, k, t.range.begin,
                           send, s);
  nccl_check(ncclAllGather(send, recv, words, ncclUint64, static_cast<ncclComm_t>(comm.nccl_comm()), s),
             "ncclAllGather (top-k candidates)", static_cast<ncclComm_t>(comm.nccl_comm()));
  kernels::merge_candidates(recv, comm.world(), m, k, values.ptr<float>(), ids.ptr<int32_t>(), lse.ptr<float>(), s);
}

}  // namespace internal

void topk(const Comm& comm, const ShardedTable& t, const TensorView& x, int64_t k, const TensorView& values,
          const TensorView& ids, const TensorView& lse, Backend backend) {
  const char* op = "dist.topk";
  check_pair(comm, t, op);
  check_dims(x, 2, op, "x");
  if (k < 1 || k > t.vocab)
    fail(op, "k = " + std::to_string(k) + " must be in [1, V = " + std::to_string(t.vocab) + "]");
  const int64_t m = x.size(0);
  check_out(values, DType::kF32, {m, k}, op, "values");
  check_out(ids, DType::kI32, {m, k}, op, "ids");
  check_out(lse, DType::kF32, {m}, op, "logsumexp");
  if (m == 0) return;
  const int64_t kl = internal::local_topk(comm, t, x, k, backend);
  internal::exchange_topk(comm, t, m, kl, k, values, ids, lse);
}

TopK topk(const Comm& comm, const ShardedTable& t, const TensorView& x, int64_t k) {
  check_dims(x, 2, "dist.topk", "x");
  const int64_t m = x.size(0);
  TopK r{cuda::empty(DType::kF32, {m, k}), cuda::empty(DType::kI32, {m, k}), cuda::empty(DType::kF32, {m})};
  topk(comm, t, x, k, r.values.view(), r.ids.view(), r.logsumexp.view(), Backend::kAuto);
  return r;
}

}  // namespace qhead::dist
