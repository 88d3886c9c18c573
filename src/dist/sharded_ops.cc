// The sharded ops of qhead/dist.h over a ShardedTable: embed, logits,
// all_gather_logits and topk. Always built: they reach the GPUs through the
// communicator's collectives (Comm::all_reduce_sum, Comm::all_gather; NCCL in
// comm_nccl.cc) and the device helpers of dist/kernels.h (kernels.cu). Built
// without NCCL, every op that needs a communicator throws kUnsupported
// (no_nccl) before it looks at its arguments; logits needs none.
#include <algorithm>
#include <string>

#include "dist/kernels.h"
#include "dist/ops_internal.h"
#include "qhead/cuda.h"
#include "qhead/dist.h"
#include "qhead/error.h"

namespace qhead::dist {

namespace internal {

void no_nccl(const char* op) {
  throw Error(ErrorCode::kUnsupported, op,
              "qhead was built without NCCL (configure with CUDA and NCCL found, QHEAD_NCCL=ON); the vocab-parallel "
              "ops need a communicator");
}

}  // namespace internal

namespace {

[[noreturn]] void fail(const char* op, const std::string& what) { throw Error(ErrorCode::kInvalidArgument, op, what); }

// The communicator and the table belong together: the same rank of the same
// world, the shard on the GPU. kUnsupported first when this build has no NCCL.
void check_pair(const Comm& comm, const ShardedTable& t, const char* op) {
  if (!nccl_available()) internal::no_nccl(op);
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

// The dtypes Comm::all_reduce_sum sums (NCCL's float types).
bool reducible(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// A device buffer of the communicator's workspace as a tensor view.
TensorView device_view(void* p, DType t, const Shape& s) { return TensorView(p, t, s, Device::kCUDA); }

}  // namespace

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
  if (!reducible(out.dtype)) fail(op, std::string("no NCCL reduction for ") + dtype_name(out.dtype));
  if (n == 0) return;
  void* s = cuda::stream();
  auto* local = static_cast<int32_t*>(comm.workspace(internal::kWsIds, size_t(n) * 4));
  auto* owned = static_cast<uint8_t*>(comm.workspace(internal::kWsOwned, size_t(n)));
  auto* bad = static_cast<int*>(comm.workspace(internal::kWsFlag, 256));
  kernels::clear_flag(bad, s);
  kernels::map_ids(ids.data, ids.dtype == DType::kI64, n, t.range.begin, t.range.end, t.vocab, local, owned, bad, s);
  qhead::embed(t.table, device_view(local, DType::kI32, {n}), out);  // syncs the stream
  // Every rank holds the same ids, so every rank throws here alike (none is
  // left waiting in the all-reduce).
  if (kernels::read_flag(bad, s))
    fail(op, "an id is out of range for a vocab of " + std::to_string(t.vocab) + " (ids on the GPU)");
  kernels::zero_unowned(out.data, n, t.hidden * int64_t(dtype_size(out.dtype)), owned, s);
  comm.all_reduce_sum(out);
}

Tensor embed(const Comm& comm, const ShardedTable& t, const TensorView& ids, DType out_dtype) {
  if (!nccl_available()) internal::no_nccl("dist.embed");
  check_dims(ids, 1, "dist.embed", "ids");
  Tensor out = cuda::empty(out_dtype, {ids.size(0), t.hidden});
  embed(comm, t, ids, out.view());
  return out;
}

// ---- logits ----------------------------------------------------------------------

// A rank's own slice needs no communicator.
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
  void* s = cuda::stream();
  // NCCL's all-gather moves equal counts: every slice padded to [M, S].
  float* send = static_cast<float*>(local.data);
  if (vs != S) {
    send = static_cast<float*>(comm.workspace(internal::kWsSend, size_t(m * S) * 4));
    kernels::copy_rows(send, size_t(S) * 4, local.data, size_t(vs) * 4, size_t(vs) * 4, m, s);
  }
  const int world = comm.world();
  float* recv = static_cast<float*>(comm.workspace(internal::kWsRecv, size_t(world) * size_t(m * S) * 4));
  comm.all_gather(device_view(send, DType::kF32, {m, S}), device_view(recv, DType::kF32, {int64_t(world) * m, S}));
  for (int r = 0; r < world; ++r) {
    const int64_t begin = int64_t(r) * S, rows = std::min<int64_t>(S, t.vocab - begin);
    kernels::copy_rows(static_cast<float*>(out.data) + begin, size_t(t.vocab) * 4, recv + int64_t(r) * m * S,
                       size_t(S) * 4, size_t(rows) * 4, m, s);
  }
}

Tensor all_gather_logits(const Comm& comm, const ShardedTable& t, const TensorView& local) {
  if (!nccl_available()) internal::no_nccl("dist.all_gather_logits");
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
  qhead::topk(t.table, x, kl, device_view(v, DType::kF32, {m, kl}), device_view(i, DType::kI32, {m, kl}),
              device_view(l, DType::kF32, {m}), backend);
  return kl;
}

void exchange_topk(const Comm& comm, const ShardedTable& t, int64_t m, int64_t k_local, int64_t k,
                   const TensorView& values, const TensorView& ids, const TensorView& lse) {
  void* s = cuda::stream();
  const int world = comm.world();
  const size_t words = size_t(m * (k + 1));
  auto* send = static_cast<uint64_t*>(comm.workspace(kWsSend, words * 8));
  auto* recv = static_cast<uint64_t*>(comm.workspace(kWsRecv, words * 8 * size_t(world)));
  kernels::pack_candidates(static_cast<const float*>(comm.workspace(kWsLocalValues, 0)),
                           static_cast<const int32_t*>(comm.workspace(kWsLocalIds, 0)),
                           static_cast<const float*>(comm.workspace(kWsLocalLse, 0)), m, k_local, k, t.range.begin,
                           send, s);
  comm.all_gather(device_view(send, DType::kU64, {m, k + 1}),
                  device_view(recv, DType::kU64, {int64_t(world) * m, k + 1}));
  kernels::merge_candidates(recv, world, m, k, values.ptr<float>(), ids.ptr<int32_t>(), lse.ptr<float>(), s);
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
  if (!nccl_available()) internal::no_nccl("dist.topk");
  check_dims(x, 2, "dist.topk", "x");
  const int64_t m = x.size(0);
  TopK r{cuda::empty(DType::kF32, {m, k}), cuda::empty(DType::kI32, {m, k}), cuda::empty(DType::kF32, {m})};
  topk(comm, t, x, k, r.values.view(), r.ids.view(), r.logsumexp.view(), Backend::kAuto);
  return r;
}

}  // namespace qhead::dist
