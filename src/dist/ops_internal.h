// Internal pieces of the sharded ops (src/dist/sharded_ops.cc): the
// communicator's workspace slots, the halves of topk that the tensor-parallel
// benchmark times one by one, and the error of a build without NCCL.
#pragma once

#include "qhead/dist.h"

namespace qhead::dist::internal {

// Workspace slots of a Comm.
enum Slot : int {
  kWsLocalValues,  // local top-k values [M, k_local]
  kWsLocalIds,     // local top-k ids [M, k_local]
  kWsLocalLse,     // local lse [M]
  kWsSend,         // one rank's message / padded logits slice
  kWsRecv,         // the all-gathered messages / slices
  kWsIds,          // embed: local ids
  kWsOwned,        // embed: ownership mask
  kWsFlag,         // embed: out-of-range flag; barrier word
  kWsCount
};

// The local half of topk: qhead::topk on this rank's shard with
// k_local = min(k, V_shard) into the workspace; returns k_local.
int64_t local_topk(const Comm& comm, const ShardedTable& t, const TensorView& x, int64_t k, Backend backend);
// The exchange half: pack the local results left by local_topk, one
// all-gather, the merge into values/ids/lse.
void exchange_topk(const Comm& comm, const ShardedTable& t, int64_t m, int64_t k_local, int64_t k,
                   const TensorView& values, const TensorView& ids, const TensorView& lse);

// Throws Error(kUnsupported, op): this build has no NCCL (QHEAD_NCCL=OFF).
[[noreturn]] void no_nccl(const char* op);

}  // namespace qhead::dist::internal
