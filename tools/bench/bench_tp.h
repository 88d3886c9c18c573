// `qhead bench --device cuda --tp N` inside one rank (tools/bench/bench_tp.cc;
// without NCCL it throws kUnsupported).
#pragma once

#include <vector>

#include "bench/bench.h"
#include "qhead/dist.h"

namespace qhead::dist {

// Every rank calls it with the same config; rank 0 gets the rows, the others
// an empty vector. Paths (us_median per step; the same JSON fields as
// `qhead bench`):
//   ceiling              device-to-device copy bandwidth of one GPU (read + write)
//   single_gpu_topk      qhead::topk on the whole table on rank 0's GPU alone (the baseline)
//   tp_local_topk        qhead::topk on each rank's shard (per step: the slowest rank)
//   tp_exchange          pack + one ncclAllGather of M·(k+1) words + merge: the communication
//   tp_topk              the whole sharded step (dist::topk); note: speedup vs single_gpu_topk
//   tp_logits_allgather  the engines' way: each slice's logits + an all-gather of [M, V]
//   tp_allgather_logits_comm  that all-gather alone
std::vector<bench::BenchRow> run_tp_bench(const bench::BenchConfig& cfg, const Comm& comm);

}  // namespace qhead::dist
