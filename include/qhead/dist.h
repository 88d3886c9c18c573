// qhead/dist.h — a vocab-parallel head: one table sharded by vocab rows over
// N GPUs (one process per GPU), joined by NCCL.
//
// Rank r of N holds rows [begin_r, end_r) of the [V, H] table (ShardRange):
// every shard has S = ceil(V / N) rows (rounded up to `row_align`), the last
// one the rest, so any V works and only the last shard may be short. A shard
// is a Table of its own — packed codes and scales are row slices of the
// host's tensors (a row is contiguous), the zero points, which are packed
// along V, are repacked for the shard, and a column order (col_perm) is
// shared by every shard — so every single-GPU op runs on it unchanged.
//
// What crosses the GPUs per call (the point of doing this ourselves rather
// than gathering [M, V] logits as serving engines do):
//   topk    each rank's top-k + log-sum-exp of its slice → ONE all-gather of
//           M·(k + 1) 64-bit words per rank → an exact merge on the GPU:
//           O(M·k) bytes, not O(M·V).
//   embed   each rank gathers the rows of the ids it owns (zeros for the
//           others) → one all-reduce (sum) of [N_ids, H]: exact, because
//           exactly one rank contributes a non-zero to each element.
//   logits  each rank's [M, V_shard] slice stays where it is; all_gather_logits
//           assembles [M, V] for callers that need every logit.
//
// Processes: `launch` (and `qhead tp-run -n N -- CMD`) starts one process per
// rank with QHEAD_TP_RANK / QHEAD_TP_WORLD / QHEAD_TP_DEVICE / QHEAD_TP_ID_FILE
// and NCCL_NVLS_ENABLE=0 in its environment; Comm::from_env() joins them.
// NVLink multicast (NVLS) stays off: Comm sets NCCL_NVLS_ENABLE=0 itself too.
//
// Built without NCCL (QHEAD_NCCL=OFF, or no nccl.h), everything that needs a
// communicator throws Error(kUnsupported); the sharding, the candidate format
// and its merge and the launcher are plain C++ and always built.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qhead/ops.h"
#include "qhead/table.h"
#include "qhead/tensor.h"

namespace qhead::dist {

// ---- sharding (host side, no GPU needed) ----------------------------------------

struct ShardRange {
  int64_t begin = 0;  // first global row
  int64_t end = 0;    // one past the last
  int64_t size() const { return end - begin; }
};

// The row ranges of `world` shards of `vocab` rows: shard r is
// [r·S, min((r + 1)·S, V)) with S = ceil(V / world) rounded up to a multiple
// of row_align. Throws kInvalidArgument when a shard would be empty (V too
// small for world × row_align), naming V, world and S.
std::vector<ShardRange> shard_ranges(int64_t vocab, int world, int64_t row_align = 1);

// Rows [begin, end) of a CPU table as a Table (still on the CPU): packed codes
// and scales are views of the host tensors (kept alive by the shard), zero
// points are repacked for the shard's rows, col_perm is shared; a dense table
// gives a view of its rows. Throws kInvalidArgument for an empty or
// out-of-range interval or a table not on the CPU.
Table shard_rows(const Table& host, int64_t begin, int64_t end);

// One rank's part of a sharded table.
struct ShardedTable {
  Table table;          // rows [range.begin, range.end) (CPU or this rank's GPU)
  int64_t vocab = 0;    // V of the whole table
  int64_t hidden = 0;   // H
  ShardRange range;     // this rank's rows
  int64_t stride = 0;   // S: rows of every shard but (possibly) the last
  int rank = 0;
  int world = 1;
};

// Rank `rank`'s shard of a CPU table, on the CPU.
ShardedTable shard(const Table& host, int rank, int world, int64_t row_align = 1);
// The same shard copied to the current CUDA device (cuda::to_device: one allocation).
ShardedTable to_device(const ShardedTable& s);

// ---- the candidate exchange (host reference of what the GPUs run) ---------------
//
// A (logit, global id) candidate travels as one 64-bit word: the logit's
// order-preserving key in the high 32 bits, the complemented id in the low
// 32, so that a larger word IS a better candidate (value descending, ties to
// the lower id — the order of qhead::topk) and one unsigned compare orders
// two of them. 0 is "no candidate" (below every real one: −inf has key
// 0x007FFFFF). One rank's message for M rows is [M, k + 1] words: its k best
// (padding 0 when the shard has fewer than k rows), then its row's
// log-sum-exp as f32 bits in the low half of the last word.

uint64_t candidate_word(float value, int64_t global_id);
float candidate_value(uint64_t w);  // −inf for 0
int32_t candidate_id(uint64_t w);   // −1 for 0

// Packs one rank's local top-k (values/ids [M, k_local], sorted as qhead::topk
// sorts; lse [M]) into its message [M, k + 1], ids shifted by `first_row`.
// k_local <= k.
void pack_candidates(const float* values, const int32_t* local_ids, const float* lse, int64_t m, int64_t k_local,
                     int64_t k, int64_t first_row, uint64_t* out);

// The exact global top-k and log-sum-exp from `world` messages laid end to
// end ([world, M, k + 1], what an all-gather delivers): values/ids [M, k]
// sorted descending, ties to the lower id; lse [M] = log Σ_r exp(lse_r),
// computed stably (largest term factored out, in double). Throws
// kInvalidArgument when a row holds fewer than k candidates in all.
void merge_candidates(const uint64_t* gathered, int world, int64_t m, int64_t k, float* values, int32_t* ids,
                      float* lse);

// log Σ_i exp(x_i) of n values, stably; −inf for none (or all −inf), NaN if
// any is NaN, +inf if any is +inf.
float combine_logsumexp(const float* x, int n, int64_t stride = 1);

// ---- communicator ----------------------------------------------------------------

// True when this build has the NCCL path (QHEAD_NCCL).
bool nccl_available();
// CUDA devices visible to this process (0 without CUDA).
int device_count();

// An NCCL communicator of `world` ranks, one per process and GPU. A handle:
// copies share one communicator, destroyed with the last copy.
class Comm {
 public:
  Comm() = default;
  // A new NCCL unique id (rank 0 makes it; the others receive it), as 256
  // hex characters. Keeps a bootstrap listener alive in this process until
  // the communicator is made.
  static std::string new_unique_id();
  // Selects `device` (cudaSetDevice) and joins the communicator
  // (ncclCommInitRank). Blocks until all `world` ranks have joined.
  static Comm init(int rank, int world, const std::string& unique_id, int device);
  // From the launcher's environment: QHEAD_TP_RANK, QHEAD_TP_WORLD,
  // QHEAD_TP_DEVICE (default: rank), QHEAD_TP_ID_FILE (rank 0 writes the id
  // there, the others wait up to QHEAD_TP_ID_TIMEOUT_S, default 120 s).
  // Without QHEAD_TP_RANK: a communicator of one rank on device 0.
  static Comm from_env();
  // True inside a process started by `launch`.
  static bool in_launched_process();

  bool valid() const { return impl_ != nullptr; }
  int rank() const;
  int world() const;
  int device() const;
  // NCCL's version code (e.g. 22809), and the raw ncclComm_t.
  int nccl_version() const;
  void* nccl_comm() const;

  // Collectives on the current stream (cuda::stream()); device tensors.
  void all_reduce_sum(const TensorView& buf) const;                         // in place
  void all_gather(const TensorView& send, const TensorView& recv) const;    // recv = world × send
  // All ranks reach this point (a one-word all-reduce + stream sync).
  void barrier() const;
  // Device scratch owned by the communicator (grow-only per slot).
  void* workspace(int slot, size_t bytes) const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// ---- the sharded ops (device tensors on this rank's GPU) -------------------------

// embed: out[n, :] = row(ids[n]) of the whole table, on every rank. ids
// I32/I64 [N] in [0, V) (the same on every rank); out F32/F16/BF16 [N, H].
void embed(const Comm& comm, const ShardedTable& t, const TensorView& ids, const TensorView& out);
Tensor embed(const Comm& comm, const ShardedTable& t, const TensorView& ids, DType out_dtype = DType::kF32);

// logits of this rank's rows: out F32 [M, V_shard] (out[m, j] is global row range.begin + j).
void logits(const ShardedTable& t, const TensorView& x, const TensorView& out, Backend backend = Backend::kAuto);
Tensor logits(const ShardedTable& t, const TensorView& x);
// Every rank's slice assembled into F32 [M, V] on every rank (one all-gather
// of [M, S] per rank, S = the shard stride, then one strided copy per rank).
void all_gather_logits(const Comm& comm, const ShardedTable& t, const TensorView& local, const TensorView& out);
Tensor all_gather_logits(const Comm& comm, const ShardedTable& t, const TensorView& local);

// topk over the whole vocab: values F32 [M, k], ids I32 [M, k] (global ids),
// lse F32 [M], identical on every rank. 1 <= k <= V; k may exceed a shard.
// Each rank runs qhead::topk on its shard (k_local = min(k, V_shard)), packs
// its message, one ncclAllGather, then the merge kernel.
void topk(const Comm& comm, const ShardedTable& t, const TensorView& x, int64_t k, const TensorView& values,
          const TensorView& ids, const TensorView& lse, Backend backend = Backend::kAuto);
TopK topk(const Comm& comm, const ShardedTable& t, const TensorView& x, int64_t k);

// ---- launching one process per rank ---------------------------------------------

struct LaunchOptions {
  // CUDA device of each rank (size n); empty: rank r on device r. Putting two
  // ranks on one device is allowed here — NCCL itself refuses it at init.
  std::vector<int> devices;
  // Seconds before every rank is killed; 0: no limit.
  int timeout_s = 0;
};

// Runs argv (argv[0] looked up in PATH unless it holds a '/') in n child
// processes, rank r with QHEAD_TP_RANK=r, QHEAD_TP_WORLD=n,
// QHEAD_TP_DEVICE=devices[r], QHEAD_TP_ID_FILE=<fresh temp dir>/nccl_id and
// NCCL_NVLS_ENABLE=0 added to this process's environment. Waits for all; when
// one fails (non-zero exit, a signal) the others get SIGTERM, then SIGKILL
// 5 s later. Returns each rank's status: the exit code, or 128 + signal.
std::vector<int> launch(int n, const std::vector<std::string>& argv, const LaunchOptions& opt = {});

}  // namespace qhead::dist
