// Built without NCCL (QHEAD_NCCL=OFF, or nccl.h / libnccl not found): the
// communicator throws kUnsupported. The
// sharded ops (sharded_ops.cc) then throw it too, before they use a
// communicator; the sharding, the candidate merge and the launcher (shard.cc,
// merge.cc, launch.cc) still work.
#include <string>

#include "dist/ops_internal.h"
#include "qhead/dist.h"
#include "qhead/error.h"

namespace qhead::dist {

using internal::no_nccl;

struct Comm::Impl {};

bool nccl_available() { return false; }
std::string Comm::new_unique_id() { no_nccl("dist.comm"); }
Comm Comm::init(int, int, const std::string&, int) { no_nccl("dist.comm"); }
Comm Comm::from_env() { no_nccl("dist.comm"); }
int Comm::rank() const { return 0; }
int Comm::world() const { return 0; }
int Comm::device() const { return -1; }
int Comm::nccl_version() const { return 0; }
void* Comm::nccl_comm() const { return nullptr; }
void Comm::all_reduce_sum(const TensorView&) const { no_nccl("dist.all_reduce_sum"); }
void Comm::all_gather(const TensorView&, const TensorView&) const { no_nccl("dist.all_gather"); }
void Comm::barrier() const { no_nccl("dist.barrier"); }
void* Comm::workspace(int, size_t) const { no_nccl("dist.comm"); }


}  // namespace qhead::dist
