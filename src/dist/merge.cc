// The top-k candidate exchange on the host: the reference of the kernels in
// kernels.cu (same words, a plainer algorithm: collect, sort, cut).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/entry.h"
#include "qhead/dist.h"
#include "qhead/error.h"

namespace qhead::dist {

uint64_t candidate_word(float value, int64_t global_id) { return entry::make_entry(value, global_id); }
float candidate_value(uint64_t w) { return entry::entry_value(w); }
int32_t candidate_id(uint64_t w) { return entry::entry_id(w); }

void pack_candidates(const float* values, const int32_t* local_ids, const float* lse, int64_t m, int64_t k_local,
                     int64_t k, int64_t first_row, uint64_t* out) {
  if (k_local < 0 || k_local > k)
    throw Error(ErrorCode::kInvalidArgument, "dist.pack_candidates",
                "k_local = " + std::to_string(k_local) + " must be in [0, k = " + std::to_string(k) + "]");
  for (int64_t r = 0; r < m; ++r) {
    uint64_t* o = out + r * (k + 1);
    for (int64_t j = 0; j < k; ++j)
      o[j] = j < k_local ? entry::make_entry(values[r * k_local + j], first_row + local_ids[r * k_local + j]) : 0;
    o[k] = entry::lse_entry(lse[r]);
  }
}

float combine_logsumexp(const float* x, int n, int64_t stride) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) {
    const double v = x[i * stride];
    if (std::isnan(v)) return std::numeric_limits<float>::quiet_NaN();
    mx = std::max(mx, v);
  }
  if (!std::isfinite(mx)) return float(mx);  // −inf: no mass; +inf: infinite mass
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(double(x[i * stride]) - mx);
  return float(mx + std::log(s));
}

void merge_candidates(const uint64_t* gathered, int world, int64_t m, int64_t k, float* values, int32_t* ids,
                      float* lse) {
  std::vector<uint64_t> all;
  std::vector<float> l(static_cast<size_t>(world));
  for (int64_t r = 0; r < m; ++r) {
    all.clear();
    for (int w = 0; w < world; ++w) {
      const uint64_t* msg = gathered + (int64_t(w) * m + r) * (k + 1);
      for (int64_t j = 0; j < k; ++j)
        if (msg[j]) all.push_back(msg[j]);
      l[size_t(w)] = entry::entry_lse(msg[k]);
    }
    if (int64_t(all.size()) < k)
      throw Error(ErrorCode::kInvalidArgument, "dist.merge_candidates",
                  "row " + std::to_string(r) + " has " + std::to_string(all.size()) + " candidates in all, fewer than k = " +
                      std::to_string(k));
    std::partial_sort(all.begin(), all.begin() + k, all.end(), std::greater<uint64_t>());
    for (int64_t j = 0; j < k; ++j) {
      values[r * k + j] = entry::entry_value(all[size_t(j)]);
      ids[r * k + j] = entry::entry_id(all[size_t(j)]);
    }
    lse[r] = combine_logsumexp(l.data(), world);
  }
}

}  // namespace qhead::dist
