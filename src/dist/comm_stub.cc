// Built without NCCL (QHEAD_NCCL=OFF, or nccl.h / libnccl not found): every
// part of qhead/dist.h that needs a communicator throws kUnsupported; the
// sharding, the candidate merge and the launcher (shard.cc, merge.cc,
// launch.cc) still work.
#include <cstdlib>
#include <string>

#include "qhead/dist.h"
#include "qhead/error.h"

namespace qhead::dist {

namespace {
[[noreturn]] void no_nccl(const char* what) {
  throw Error(ErrorCode::kUnsupported, what,
              "qhead was built without NCCL (configure with CUDA and NCCL found, QHEAD_NCCL=ON); the vocab-parallel "
              "ops need a communicator");
}
}  // namespace

struct Comm::Impl {};

bool nccl_available() { return false; }
std::string Comm::new_unique_id() { no_nccl("dist.comm"); }
Comm Comm::init(int, int, const std::string&, int) { no_nccl("dist.comm"); }
Comm Comm::from_env() { no_nccl("dist.comm"); }
bool Comm::in_launched_process() { return std::getenv("QHEAD_TP_RANK") != nullptr; }
int Comm::rank() const { return 0; }
int Comm::world() const { return 0; }
int Comm::device() const { return -1; }
int Comm::nccl_version() const { return 0; }
void* Comm::nccl_comm() const { return nullptr; }
void Comm::all_reduce_sum(const TensorView&) const { no_nccl("dist.all_reduce_sum"); }
void Comm::all_gather(const TensorView&, const TensorView&) const { no_nccl("dist.all_gather"); }
void Comm::barrier() const { no_nccl("dist.barrier"); }
void* Comm::workspace(int, size_t) const { no_nccl("dist.comm"); }

void embed(const Comm&, const ShardedTable&, const TensorView&, const TensorView&) { no_nccl("dist.embed"); }
Tensor embed(const Comm&, const ShardedTable&, const TensorView&, DType) { no_nccl("dist.embed"); }
void logits(const ShardedTable& t, const TensorView& x, const TensorView& out, Backend backend) {
  qhead::logits(t.table, x, out, backend);  // a rank's own slice needs no communicator
}
Tensor logits(const ShardedTable& t, const TensorView& x) { return qhead::logits(t.table, x); }
void all_gather_logits(const Comm&, const ShardedTable&, const TensorView&, const TensorView&) {
  no_nccl("dist.all_gather_logits");
}
Tensor all_gather_logits(const Comm&, const ShardedTable&, const TensorView&) { no_nccl("dist.all_gather_logits"); }
void topk(const Comm&, const ShardedTable&, const TensorView&, int64_t, const TensorView&, const TensorView&,
          const TensorView&, Backend) {
  no_nccl("dist.topk");
}
TopK topk(const Comm&, const ShardedTable&, const TensorView&, int64_t) { no_nccl("dist.topk"); }


}  // namespace qhead::dist
