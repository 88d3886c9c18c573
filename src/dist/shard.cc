// Sharding a table by vocab rows (host side; no GPU, no NCCL).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "qhead/cuda.h"
#include "qhead/dist.h"
#include "qhead/error.h"

namespace qhead::dist {

namespace {

[[noreturn]] void fail(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, "dist.shard", what); }

// Rows [begin, end) of a contiguous CPU tensor [V, ...] as a view that keeps
// the source's storage alive.
Tensor row_view(const Tensor& src, int64_t begin, int64_t end) {
  Shape shape = src.shape();
  const int64_t row_elems = shape_numel(shape) / (shape[0] ? shape[0] : 1);
  shape[0] = end - begin;
  char* p = static_cast<char*>(src.data()) + size_t(begin * row_elems) * dtype_size(src.dtype());
  return Tensor::borrow(std::make_shared<Tensor>(src), TensorView(p, src.dtype(), std::move(shape), Device::kCPU));
}

}  // namespace

std::vector<ShardRange> shard_ranges(int64_t vocab, int world, int64_t row_align) {
  if (world < 1) fail("world size must be >= 1, got " + std::to_string(world));
  if (row_align < 1) fail("row_align must be >= 1, got " + std::to_string(row_align));
  if (vocab < 1) fail("vocab must be >= 1, got " + std::to_string(vocab));
  int64_t s = (vocab + world - 1) / world;
  s = (s + row_align - 1) / row_align * row_align;
  if (int64_t(world - 1) * s >= vocab)
    fail("V = " + std::to_string(vocab) + " rows in shards of S = " + std::to_string(s) + " (ceil(V / " +
         std::to_string(world) + ") rounded up to row_align " + std::to_string(row_align) +
         ") leave the last rank without rows; use fewer ranks or a smaller row_align");
  std::vector<ShardRange> r(static_cast<size_t>(world));
  for (int i = 0; i < world; ++i) r[size_t(i)] = {int64_t(i) * s, std::min<int64_t>(int64_t(i + 1) * s, vocab)};
  return r;
}

Table shard_rows(const Table& host, int64_t begin, int64_t end) {
  if (host.device() != Device::kCPU) fail("shard_rows takes a CPU table (shard first, then cuda::to_device)");
  if (begin < 0 || end > host.vocab() || begin >= end)
    fail("rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") are not a non-empty range of a vocab of " +
         std::to_string(host.vocab()));
  if (!host.is_packed()) return Table::dense(row_view(host.dense(), begin, end));
  const PackedTable& p = host.packed();
  PackedTable s;
  s.scheme = p.scheme;
  s.vocab = end - begin;
  s.hidden = p.hidden;
  s.packed = row_view(p.packed, begin, end);  // rows are contiguous: a view
  s.scale = row_view(p.scale, begin, end);
  if (p.zero_point.defined()) {
    // Zero points are packed along V (bits per row, 32 / bits rows per word
    // for 2/4/8 bits): a boundary inside a word needs the shard's own packing.
    const int64_t g = p.scheme.groups(p.hidden), n = end - begin;
    const int bits = p.scheme.bits;
    std::vector<int8_t> z(static_cast<size_t>(n * g));
    const int32_t* zp = p.zero_point.ptr<const int32_t>();
    for (int64_t v = 0; v < n; ++v)
      for (int64_t j = 0; j < g; ++j) z[size_t(v * g + j)] = int8_t(zero_point_at(zp, g, begin + v, j, bits));
    s.zero_point = Tensor::empty(DType::kI32, {(n * bits + 31) / 32, g});
    pack_zero_points(z.data(), n, g, bits, s.zero_point.ptr<int32_t>());
  }
  s.col_perm = p.col_perm;  // the same column order on every shard
  return Table::packed(std::move(s), "dist.shard rows [" + std::to_string(begin) + ", " + std::to_string(end) + ")");
}

ShardedTable shard(const Table& host, int rank, int world, int64_t row_align) {
  const auto ranges = shard_ranges(host.vocab(), world, row_align);
  if (rank < 0 || rank >= world)
    fail("rank " + std::to_string(rank) + " is not in [0, " + std::to_string(world) + ")");
  ShardedTable t;
  t.range = ranges[size_t(rank)];
  t.table = shard_rows(host, t.range.begin, t.range.end);
  t.vocab = host.vocab();
  t.hidden = host.hidden();
  t.stride = ranges[0].size();
  t.rank = rank;
  t.world = world;
  return t;
}

ShardedTable to_device(const ShardedTable& s) {
  ShardedTable d = s;
  d.table = cuda::to_device(s.table);
  return d;
}

}  // namespace qhead::dist
