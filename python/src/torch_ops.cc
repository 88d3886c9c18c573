// qhead/_torch_ops: the torch ops qhead::{embed, logits, topk, rescore} as C++
// kernels (TORCH_LIBRARY), for CPU, CUDA and Meta.
//
// The schemas are those python/qhead/torch.py defines when this library is
// not built. Per call a kernel looks up the qhead::Table built over the
// table's tensors (a small cache, below), wraps the other tensors as
// TensorViews (no copy), allocates the outputs with at::empty and runs the op
// through qhead._C's copy of the library (torch_api.h); on CUDA on torch's
// current stream of the outputs' device.
//
// Errors: a qhead::Error becomes the qhead.Error subclass of its code with the
// same message. The kernel calls the op qhead::_raise, whose Python kernel
// (qhead.torch) raises it; the Python exception passes through the dispatcher
// unchanged. Without that kernel (the library loaded without qhead.torch) it
// is a c10 error: ValueError for invalid arguments and files,
// NotImplementedError for unsupported input, RuntimeError otherwise.
//
// The cache: one entry per weight_packed (or dense weight) storage, holding
// the key it was built for (per tensor: storage, data pointer, dtype, sizes,
// strides, version counter; the scheme and shape) and the Table. The Table
// reads the tensors' memory without owning it; the entry holds weak
// references to the storages, so it keeps no memory alive, and an entry whose
// storage was freed never matches (the weak reference keeps the storage
// object, so no new storage has its address while the entry exists). A buffer
// changed in place moves its version counter and the table is rebuilt (and
// validated again). Inference tensors have no version counter: they are
// keyed without it, as in qhead.torch's Python cache.
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/library.h>

#include <atomic>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qhead/error.h"
#include "torch_api.h"

namespace qhead::torch_ops {

namespace {

using py::TorchApi;

std::atomic<const TorchApi*> g_api{nullptr};

const TorchApi& api() {
  const TorchApi* a = g_api.load(std::memory_order_acquire);
  if (!a)
    throw Error(ErrorCode::kInternal, "qhead::_torch_ops",
                "the ops were called before qhead.torch bound them to qhead._C (import qhead.torch first)");
  return *a;
}

[[noreturn]] void bad(const std::string& op, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, op, what);
}

std::string sizes_str(c10::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

DType qdtype(at::ScalarType t, const std::string& op, const char* name) {
  switch (t) {
    case at::kDouble: return DType::kF64;
    case at::kFloat: return DType::kF32;
    case at::kHalf: return DType::kF16;
    case at::kBFloat16: return DType::kBF16;
    case at::kLong: return DType::kI64;
    case at::kInt: return DType::kI32;
    case at::kShort: return DType::kI16;
    case at::kChar: return DType::kI8;
    case at::kUInt64: return DType::kU64;
    case at::kUInt32: return DType::kU32;
    case at::kUInt16: return DType::kU16;
    case at::kByte: return DType::kU8;
    case at::kBool: return DType::kBool;
    case at::kFloat8_e4m3fn: return DType::kF8E4M3;
    case at::kFloat8_e5m2: return DType::kF8E5M2;
    default: break;
  }
  bad(op, std::string(name) + " has dtype " + c10::toString(t) + ", which qhead does not take");
}

// A view of t (no copy). Strides are given only when t is not contiguous, so
// that the ops' contiguity checks see them.
TensorView view(const at::Tensor& t, const std::string& op, const char* name) {
  TensorView v;
  const c10::DeviceType d = t.device().type();
  if (d == c10::DeviceType::CPU) {
    v.device = Device::kCPU;
  } else if (d == c10::DeviceType::CUDA) {
    v.device = Device::kCUDA;
  } else {
    bad(op, std::string(name) + " is on " + t.device().str() + "; qhead takes CPU and CUDA tensors");
  }
  v.dtype = qdtype(t.scalar_type(), op, name);
  v.data = t.data_ptr();
  v.shape.assign(t.sizes().begin(), t.sizes().end());
  if (!t.is_contiguous()) v.strides.assign(t.strides().begin(), t.strides().end());
  return v;
}

// A Tensor over t's memory that does not own it (the cache's tables; see above).
Tensor unowned(const at::Tensor& t, const std::string& op, const char* name) {
  return Tensor::borrow(nullptr, view(t, op, name));
}

void need_contiguous(const at::Tensor& t, const std::string& op, const char* name) {
  if (!t.is_contiguous())
    bad(op, std::string(name) + " must be contiguous (shape " + sizes_str(t.sizes()) + ", strides " +
                sizes_str(t.strides()) + "); call .contiguous() first");
}

// ---- the table cache ------------------------------------------------------------

struct TensorKey {
  const c10::StorageImpl* storage = nullptr;
  c10::weak_intrusive_ptr<c10::StorageImpl> weak{c10::intrusive_ptr<c10::StorageImpl>()};
  const void* data = nullptr;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes, strides;
  int64_t version = -1;
  bool defined = false;
};

int64_t version_of(const at::Tensor& t) {
  return t.is_inference() ? -1 : static_cast<int64_t>(t.unsafeGetTensorImpl()->version_counter().current_version());
}

bool matches(const TensorKey& k, const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return !k.defined;
  const at::Tensor& x = *t;
  return k.defined && k.storage == x.storage().unsafeGetStorageImpl() && k.data == x.const_data_ptr() &&
         k.dtype == x.scalar_type() && k.version == version_of(x) && x.sizes().equals(k.sizes) &&
         x.strides().equals(k.strides) && !k.weak.expired();
}

TensorKey key_of(const std::optional<at::Tensor>& t) {
  TensorKey k;
  if (!t.has_value() || !t->defined()) return k;
  const at::Tensor& x = *t;
  k.defined = true;
  k.storage = x.storage().unsafeGetStorageImpl();
  k.weak = c10::weak_intrusive_ptr<c10::StorageImpl>(x.storage().getWeakStorageImpl());
  k.data = x.const_data_ptr();
  k.dtype = x.scalar_type();
  k.sizes.assign(x.sizes().begin(), x.sizes().end());
  k.strides.assign(x.strides().begin(), x.strides().end());
  k.version = version_of(x);
  return k;
}

struct Entry {
  std::string scheme;  // "" for a dense table
  int64_t vocab = 0, hidden = 0;
  TensorKey t[4];
  Table table;
  bool expired() const {
    for (const TensorKey& k : t)
      if (k.defined && k.weak.expired()) return true;
    return false;
  }
};

constexpr size_t kCacheMax = 64;
std::mutex g_cache_mutex;
std::vector<Entry> g_cache;  // most recently used first
int64_t g_builds = 0;
std::atomic<bool> g_poison{false};

void drop_expired() {
  std::erase_if(g_cache, [](const Entry& e) { return e.expired(); });
}

void remember(Entry e) {
  drop_expired();
  g_cache.insert(g_cache.begin(), std::move(e));
  if (g_cache.size() > kCacheMax) g_cache.resize(kCacheMax);
  ++g_builds;
}

// The cached entry matching `tensors` (moved to the front), or nullptr.
const Table* lookup(std::string_view scheme, int64_t vocab, int64_t hidden,
                    const std::optional<at::Tensor>* tensors) {
  for (size_t i = 0; i < g_cache.size(); ++i) {
    Entry& e = g_cache[i];
    if (e.scheme != scheme || e.vocab != vocab || e.hidden != hidden) continue;
    if (!(matches(e.t[0], tensors[0]) && matches(e.t[1], tensors[1]) && matches(e.t[2], tensors[2]) &&
          matches(e.t[3], tensors[3])))
      continue;
    if (i != 0) std::rotate(g_cache.begin(), g_cache.begin() + static_cast<std::ptrdiff_t>(i),
                            g_cache.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    return &g_cache.front().table;
  }
  return nullptr;
}

void check_scale_dtype(const at::Tensor& ws, const std::string& op) {
  const at::ScalarType t = ws.scalar_type();
  if (t != at::kHalf && t != at::kBFloat16 && t != at::kFloat)
    bad(op, std::string("weight_scale must be float16, bfloat16 or float32, got ") + c10::toString(t));
}

// The Table over the compressed-tensors tensors (zero copy), built once and
// cached. Returned by value (shared storage): the entry may be evicted by
// another thread while the op runs.
Table packed_table(const std::string& op, const at::Tensor& wp, const at::Tensor& ws,
                   const std::optional<at::Tensor>& wz, const std::optional<at::Tensor>& cp, std::string_view scheme,
                   int64_t vocab, int64_t hidden) {
  const std::optional<at::Tensor> tensors[4] = {wp, ws, wz, cp};
  {
    const std::lock_guard<std::mutex> lock(g_cache_mutex);
    if (const Table* t = lookup(scheme, vocab, hidden, tensors)) return *t;
  }
  const char* names[4] = {"weight_packed", "weight_scale", "weight_zero_point", "col_perm"};
  for (int i = 1; i < 4; ++i)
    if (tensors[i].has_value() && tensors[i]->defined() && tensors[i]->device() != wp.device())
      bad(op, std::string(names[i]) + " is on " + tensors[i]->device().str() + " but weight_packed is on " +
                  wp.device().str() + ": a table's tensors share one device");
  check_scale_dtype(ws, op);
  const TorchApi& a = api();
  PackedTable p;
  p.scheme = a.parse_scheme(std::string(scheme), qdtype(ws.scalar_type(), op, "weight_scale"));
  p.vocab = vocab;
  p.hidden = hidden;
  p.packed = unowned(wp, op, "weight_packed");
  p.scale = unowned(ws, op, "weight_scale");
  if (wz.has_value() && wz->defined()) p.zero_point = unowned(*wz, op, "weight_zero_point");
  if (cp.has_value() && cp->defined()) p.col_perm = unowned(*cp, op, "col_perm");
  // The pack-quantized readers index rows directly: every tensor must be dense row-major.
  check_contiguous(p.packed.view(), op.c_str(), "weight_packed");
  check_contiguous(p.scale.view(), op.c_str(), "weight_scale");
  if (p.zero_point.defined()) check_contiguous(p.zero_point.view(), op.c_str(), "weight_zero_point");
  if (p.col_perm.defined()) check_contiguous(p.col_perm.view(), op.c_str(), "col_perm");
  if (!p.scheme.symmetric && !p.zero_point.defined())
    bad(op, "scheme " + p.scheme.name() + " is asymmetric: weight_zero_point is required");
  Table table;
  try {
    table = a.make_packed(std::move(p), op);
  } catch (const Error& e) {
    // The tensors are the caller's arguments: what validation finds wrong with them is an
    // invalid argument (the same checks name a file's tensors kInvalidFile in the loaders).
    if (e.code() != ErrorCode::kInvalidFile) throw;
    std::string msg = e.what();
    const std::string prefix = op + ": ";
    if (msg.rfind(prefix, 0) == 0) msg.erase(0, prefix.size());
    throw Error(ErrorCode::kInvalidArgument, op, msg);
  }
  Entry e;
  e.scheme = std::string(scheme);
  e.vocab = vocab;
  e.hidden = hidden;
  for (int i = 0; i < 4; ++i) e.t[i] = key_of(tensors[i]);
  e.table = table;
  const std::lock_guard<std::mutex> lock(g_cache_mutex);
  remember(std::move(e));
  return table;
}

Table dense_table(const std::string& op, const at::Tensor& w) {
  const std::optional<at::Tensor> tensors[4] = {w, std::nullopt, std::nullopt, std::nullopt};
  {
    const std::lock_guard<std::mutex> lock(g_cache_mutex);
    if (const Table* t = lookup("", 0, 0, tensors)) return *t;
  }
  Table table = api().make_dense(unowned(w, op, "dense"));
  Entry e;
  for (int i = 0; i < 4; ++i) e.t[i] = key_of(tensors[i]);
  e.table = table;
  const std::lock_guard<std::mutex> lock(g_cache_mutex);
  remember(std::move(e));
  return table;
}

// ---- errors -------------------------------------------------------------------------

[[noreturn]] void raise(const Error& e) {
  const auto op = c10::Dispatcher::singleton().findSchema({"qhead::_raise", ""});
  if (op.has_value() && op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
    // Straight to the Python kernel (past any mode or tracer): it raises the qhead.Error.
    op->typed<void(int64_t, c10::string_view)>().redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                             static_cast<int64_t>(e.code()), e.what());
  }
  switch (e.code()) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kInvalidFile: TORCH_CHECK_VALUE(false, e.what());
    case ErrorCode::kUnsupported: TORCH_CHECK_NOT_IMPLEMENTED(false, e.what());
    default: TORCH_CHECK(false, e.what());
  }
  TORCH_CHECK(false, e.what());  // not reached
}

template <class F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    raise(e);
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    raise(Error(ErrorCode::kInternal, "qhead::_torch_ops", std::string("internal error: ") + e.what()));
  }
}

// ---- outputs and streams -----------------------------------------------------------------

at::Tensor alloc(c10::IntArrayRef sizes, at::ScalarType dtype, const at::Device& dev) {
  // CPU: the allocator directly (at::empty would dispatch once more); CUDA: at::empty (the
  // caching allocator, through the dispatcher: no CUDA headers here).
  at::Tensor t = dev.is_cpu() ? at::Tensor(at::detail::empty_cpu(sizes, dtype))
                              : at::empty(sizes, at::TensorOptions().dtype(dtype).device(dev));
  if (g_poison.load(std::memory_order_relaxed)) {
    if (at::isFloatingType(dtype)) {
      t.fill_(std::numeric_limits<double>::quiet_NaN());
    } else if (dtype == at::kInt) {
      t.fill_(std::numeric_limits<int32_t>::min());
    } else if (dtype == at::kLong) {
      t.fill_(std::numeric_limits<int64_t>::min());
    }
  }
  return t;
}

// torch's current stream on dev (a cudaStream_t), nullptr on CPU.
void* stream_of(const Table& table, const at::Device& dev) {
  if (table.device() != Device::kCUDA || !dev.is_cuda()) return nullptr;
  const c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  return impl.getStream(dev).native_handle();
}

// ---- the kernels ----------------------------------------------------------------------

at::Tensor embed(const at::Tensor& wp, const at::Tensor& ws, const std::optional<at::Tensor>& wz,
                 const std::optional<at::Tensor>& cp, const at::Tensor& ids, c10::string_view scheme, int64_t vocab,
                 int64_t hidden, at::ScalarType out_dtype) {
  return guarded([&] {
    const std::string op = "qhead::embed";
    const Table table = packed_table(op, wp, ws, wz, cp, scheme, vocab, hidden);
    if (ids.dim() != 1) bad(op, "ids must be 1-D [N], got shape " + sizes_str(ids.sizes()));
    need_contiguous(ids, op, "ids");
    at::Tensor out = alloc({ids.size(0), hidden}, out_dtype, wp.device());
    api().embed(table, view(ids, op, "ids"), view(out, op, "out"), stream_of(table, out.device()));
    return out;
  });
}

at::Tensor logits(const at::Tensor& wp, const at::Tensor& ws, const std::optional<at::Tensor>& wz,
                  const std::optional<at::Tensor>& cp, const at::Tensor& x, c10::string_view scheme, int64_t vocab,
                  int64_t hidden, std::optional<at::ScalarType> out_dtype) {
  return guarded([&] {
    const std::string op = "qhead::logits";
    const Table table = packed_table(op, wp, ws, wz, cp, scheme, vocab, hidden);
    if (x.dim() != 2) bad(op, "x must be 2-D [M, H], got shape " + sizes_str(x.sizes()));
    need_contiguous(x, op, "x");
    at::Tensor out = alloc({x.size(0), vocab}, out_dtype.value_or(at::kFloat), wp.device());
    api().logits(table, view(x, op, "x"), view(out, op, "out"), stream_of(table, out.device()));
    return out;
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> topk(const at::Tensor& wp, const at::Tensor& ws,
                                                    const std::optional<at::Tensor>& wz,
                                                    const std::optional<at::Tensor>& cp, const at::Tensor& x,
                                                    int64_t k, c10::string_view scheme, int64_t vocab,
                                                    int64_t hidden) {
  return guarded([&] {
    const std::string op = "qhead::topk";
    const Table table = packed_table(op, wp, ws, wz, cp, scheme, vocab, hidden);
    if (x.dim() != 2) bad(op, "x must be 2-D [M, H], got shape " + sizes_str(x.sizes()));
    need_contiguous(x, op, "x");
    if (k < 1 || k > vocab)
      bad(op, "k = " + std::to_string(k) + " must be in [1, V = " + std::to_string(vocab) + "]");
    const int64_t m = x.size(0);
    at::Tensor values = alloc({m, k}, at::kFloat, wp.device());
    at::Tensor ids = alloc({m, k}, at::kInt, wp.device());
    at::Tensor lse = alloc({m}, at::kFloat, wp.device());
    api().topk(table, view(x, op, "x"), k, view(values, op, "values"), view(ids, op, "ids"),
               view(lse, op, "lse"), stream_of(table, values.device()));
    return std::make_tuple(values, ids, lse);
  });
}

at::Tensor sample(const at::Tensor& wp, const at::Tensor& ws, const std::optional<at::Tensor>& wz,
                  const std::optional<at::Tensor>& cp, const at::Tensor& x, double temperature, int64_t top_k,
                  double top_p, double min_p, int64_t seed, int64_t offset, c10::string_view scheme, int64_t vocab,
                  int64_t hidden) {
  return guarded([&] {
    const std::string op = "qhead::sample";
    const Table table = packed_table(op, wp, ws, wz, cp, scheme, vocab, hidden);
    if (x.dim() != 2) bad(op, "x must be 2-D [M, H], got shape " + sizes_str(x.sizes()));
    need_contiguous(x, op, "x");
    if (seed < 0 || offset < 0)
      bad(op, "seed = " + std::to_string(seed) + " and offset = " + std::to_string(offset) + " must be >= 0");
    SampleParams p;
    p.temperature = static_cast<float>(temperature);
    p.top_k = top_k;
    p.top_p = static_cast<float>(top_p);
    p.min_p = static_cast<float>(min_p);
    p.seed = static_cast<uint64_t>(seed);
    p.offset = static_cast<uint64_t>(offset);
    at::Tensor ids = alloc({x.size(0)}, at::kInt, wp.device());
    api().sample(table, view(x, op, "x"), p, view(ids, op, "ids"), stream_of(table, ids.device()));
    return ids;
  });
}

std::tuple<at::Tensor, at::Tensor> rescore(const at::Tensor& dense, const at::Tensor& x,
                                           const at::Tensor& candidates) {
  return guarded([&] {
    const std::string op = "qhead::rescore";
    need_contiguous(dense, op, "dense");
    const Table table = dense_table(op, dense);
    if (candidates.dim() != 2)
      bad(op, "candidates must be 2-D [M, k], got shape " + sizes_str(candidates.sizes()));
    need_contiguous(x, op, "x");
    need_contiguous(candidates, op, "candidates");
    at::Tensor values = alloc(candidates.sizes(), at::kFloat, dense.device());
    at::Tensor ids = alloc(candidates.sizes(), at::kInt, dense.device());
    api().rescore(table, view(x, op, "x"), view(candidates, op, "candidates"), view(values, op, "values"),
                  view(ids, op, "ids"), stream_of(table, values.device()));
    return std::make_tuple(values, ids);
  });
}

// ---- Meta kernels (shapes and dtypes only; symbolic sizes pass through) ----------------------

at::Tensor embed_meta(const at::Tensor& wp, const at::Tensor&, const std::optional<at::Tensor>&,
                      const std::optional<at::Tensor>&, const at::Tensor& ids, c10::string_view, int64_t,
                      int64_t hidden, at::ScalarType out_dtype) {
  TORCH_CHECK_VALUE(ids.dim() == 1, "qhead::embed: ids must be 1-D [N], got ", ids.dim(), "-D");
  return at::empty_symint({ids.sym_size(0), c10::SymInt(hidden)}, wp.options().dtype(out_dtype));
}

at::Tensor logits_meta(const at::Tensor& wp, const at::Tensor&, const std::optional<at::Tensor>&,
                       const std::optional<at::Tensor>&, const at::Tensor& x, c10::string_view, int64_t vocab,
                       int64_t, std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK_VALUE(x.dim() == 2, "qhead::logits: x must be 2-D [M, H], got ", x.dim(), "-D");
  return at::empty_symint({x.sym_size(0), c10::SymInt(vocab)}, wp.options().dtype(out_dtype.value_or(at::kFloat)));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> topk_meta(const at::Tensor& wp, const at::Tensor&,
                                                         const std::optional<at::Tensor>&,
                                                         const std::optional<at::Tensor>&, const at::Tensor& x,
                                                         int64_t k, c10::string_view, int64_t, int64_t) {
  TORCH_CHECK_VALUE(x.dim() == 2, "qhead::topk: x must be 2-D [M, H], got ", x.dim(), "-D");
  const c10::SymInt m = x.sym_size(0);
  return std::make_tuple(at::empty_symint({m, c10::SymInt(k)}, wp.options().dtype(at::kFloat)),
                         at::empty_symint({m, c10::SymInt(k)}, wp.options().dtype(at::kInt)),
                         at::empty_symint({m}, wp.options().dtype(at::kFloat)));
}

at::Tensor sample_meta(const at::Tensor& wp, const at::Tensor&, const std::optional<at::Tensor>&,
                       const std::optional<at::Tensor>&, const at::Tensor& x, double, int64_t, double, double, int64_t,
                       int64_t, c10::string_view, int64_t, int64_t) {
  TORCH_CHECK_VALUE(x.dim() == 2, "qhead::sample: x must be 2-D [M, H], got ", x.dim(), "-D");
  return at::empty_symint({x.sym_size(0)}, wp.options().dtype(at::kInt));
}

std::tuple<at::Tensor, at::Tensor> rescore_meta(const at::Tensor& dense, const at::Tensor&,
                                                const at::Tensor& candidates) {
  TORCH_CHECK_VALUE(candidates.dim() == 2, "qhead::rescore: candidates must be 2-D [M, k]");
  return std::make_tuple(at::empty_symint(candidates.sym_sizes(), dense.options().dtype(at::kFloat)),
                         at::empty_symint(candidates.sym_sizes(), dense.options().dtype(at::kInt)));
}

// ---- internal ops (qhead.torch) -------------------------------------------------------------

void bind(int64_t address) {
  const auto* a = reinterpret_cast<const TorchApi*>(static_cast<uintptr_t>(address));
  TORCH_CHECK(a != nullptr && a->version == py::kTorchApiVersion && a->size == sizeof(TorchApi),
              "qhead::_bind: qhead._C and qhead/_torch_ops are from different builds (reinstall qhead)");
  g_api.store(a, std::memory_order_release);
}

// (live entries, tables built so far); clear drops every entry first.
std::vector<int64_t> table_cache(bool clear) {
  const std::lock_guard<std::mutex> lock(g_cache_mutex);
  if (clear) g_cache.clear();
  drop_expired();
  return {static_cast<int64_t>(g_cache.size()), g_builds};
}

void poison_outputs(bool on) { g_poison.store(on, std::memory_order_relaxed); }

}  // namespace

TORCH_LIBRARY(qhead, m) {
  constexpr const char* kTable = "Tensor weight_packed, Tensor weight_scale, Tensor? weight_zero_point, Tensor? col_perm";
  constexpr const char* kKw = "str scheme, int vocab, int hidden";
  m.def((std::string("embed(") + kTable + ", Tensor ids, " + kKw + ", ScalarType out_dtype) -> Tensor").c_str());
  m.def((std::string("logits(") + kTable + ", Tensor x, " + kKw + ", ScalarType? out_dtype=None) -> Tensor").c_str());
  m.def((std::string("topk(") + kTable + ", Tensor x, int k, " + kKw + ") -> (Tensor, Tensor, Tensor)").c_str());
  m.def((std::string("sample(") + kTable + ", Tensor x, float temperature, int top_k, float top_p, float min_p, " +
         "int seed, int offset, " + kKw + ") -> Tensor").c_str());
  m.def("rescore(Tensor dense, Tensor x, Tensor candidates) -> (Tensor, Tensor)");
  // Internal: qhead.torch implements _raise (raises the qhead.Error of a code) for CPU.
  m.def("_raise(int code, str message) -> ()");
  m.def("_bind(int address) -> ()", &bind);
  m.def("_table_cache(bool clear=False) -> int[]", &table_cache);
  m.def("_poison_outputs(bool on) -> ()", &poison_outputs);
}

TORCH_LIBRARY_IMPL(qhead, CPU, m) {
  m.impl("embed", &embed);
  m.impl("logits", &logits);
  m.impl("topk", &topk);
  m.impl("sample", &sample);
  m.impl("rescore", &rescore);
}

TORCH_LIBRARY_IMPL(qhead, CUDA, m) {
  m.impl("embed", &embed);
  m.impl("logits", &logits);
  m.impl("topk", &topk);
  m.impl("sample", &sample);
  m.impl("rescore", &rescore);
}

TORCH_LIBRARY_IMPL(qhead, Meta, m) {
  m.impl("embed", &embed_meta);
  m.impl("logits", &logits_meta);
  m.impl("topk", &topk_meta);
  m.impl("sample", &sample_meta);
  m.impl("rescore", &rescore_meta);
}

}  // namespace qhead::torch_ops
