#include "qhead/table.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>
#include <nlohmann/json.hpp>

#include "core/printable.h"
#include "qhead/error.h"
#include "core/parallel.h"
#include "qhead/safetensors.h"

namespace qhead {

namespace {

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::kInvalidFile, where, what);
}

void expect_tensor(const Tensor& t, DType dtype, const Shape& shape, const std::string& where,
                   const std::string& name) {
  if (t.dtype() != dtype)
    bad(where, name + ": expected dtype " + dtype_name(dtype) + ", got " + dtype_name(t.dtype()));
  if (t.shape() != shape)
    bad(where, name + ": expected shape " + shape_str(shape) + ", got " + shape_str(t.shape()));
  if (t.numel() > 0 && t.data() == nullptr) bad(where, name + ": no data");
}

}  // namespace

// ---- PackedTable ---------------------------------------------------------------

void PackedTable::validate(const std::string& where) const {
  try {
    scheme.validate();
  } catch (const Error& e) {
    bad(where, std::string("bad scheme: ") + e.what());
  }
  if (vocab < 0 || hidden <= 0)
    bad(where, "table shape must be [V >= 0, H > 0], got [" + std::to_string(vocab) + ", " +
                   std::to_string(hidden) + "]");
  if (!scheme.per_row() && hidden % scheme.group_size != 0)
    bad(where, "hidden size " + std::to_string(hidden) + " is not a multiple of group size " +
                   std::to_string(scheme.group_size));
  try {
    scheme.table_bytes(vocab, hidden, where, "table");
  } catch (const Error& e) {
    bad(where, e.what());
  }
  const int64_t g = scheme.groups(hidden);
  expect_tensor(packed, DType::kI32, {vocab, scheme.packed_cols(hidden)}, where, "weight_packed");
  expect_tensor(scale, scheme.scale_dtype, {vocab, g}, where, "weight_scale");
  if (scheme.symmetric) {
    if (zero_point.defined()) bad(where, "weight_zero_point given for a symmetric scheme");
  } else {
    expect_tensor(zero_point, DType::kI32, {scheme.zero_point_rows(vocab), g}, where,
                  "weight_zero_point");
  }
  if (col_perm.defined()) expect_tensor(col_perm, DType::kI32, {hidden}, where, "col_perm");
  if (packed.view().device != scale.view().device ||
      (zero_point.defined() && zero_point.view().device != packed.view().device) ||
      (col_perm.defined() && col_perm.view().device != packed.view().device))
    bad(where, "weight_packed, weight_scale, weight_zero_point and col_perm must be on one device");
  // Scales must be finite: a NaN/Inf scale poisons every logit of its row.
  // (Device tables are validated on the host before they are copied.)
  if (packed.view().device != Device::kCPU) return;
  if (col_perm.defined()) {
    std::vector<uint8_t> seen(static_cast<size_t>(hidden), 0);
    const int32_t* p = col_perm.ptr<int32_t>();
    for (int64_t j = 0; j < hidden; ++j) {
      if (p[j] < 0 || p[j] >= hidden || seen[static_cast<size_t>(p[j])])
        bad(where, "col_perm[" + std::to_string(j) + "] = " + std::to_string(p[j]) +
                       (p[j] < 0 || p[j] >= hidden ? " is out of range" : " repeats an earlier entry") +
                       " (col_perm must be a permutation of 0.." + std::to_string(hidden - 1) + ")");
      seen[static_cast<size_t>(p[j])] = 1;
    }
  }
  const int64_t n = scale.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float s = load_as_f32(scale.data(), scale.dtype(), i);
    if (!std::isfinite(s))
      bad(where, "weight_scale[" + std::to_string(i / g) + ", " + std::to_string(i % g) +
                     "] is " + std::to_string(s) + " (scales must be finite)");
  }
}

size_t PackedTable::nbytes() const {
  return packed.nbytes() + scale.nbytes() + (zero_point.defined() ? zero_point.nbytes() : 0) +
         (col_perm.defined() ? col_perm.nbytes() : 0);
}

void PackedTable::dequantize_row(int64_t v, float* out) const {
  const int64_t cols = scheme.packed_cols(hidden);
  const int64_t g = scheme.groups(hidden);
  const int64_t gl = scheme.group_len(hidden);
  const int32_t* row = packed.ptr<int32_t>() + v * cols;
  const int32_t* perm = col_perm.defined() ? col_perm.ptr<int32_t>() : nullptr;
  for (int64_t k = 0; k < g; ++k) {
    const float s = load_as_f32(scale.data(), scale.dtype(), v * g + k);
    const int z = scheme.symmetric ? 0 : zero_point_at(zero_point.ptr<int32_t>(), g, v, k, scheme.bits);
    for (int64_t j = k * gl; j < (k + 1) * gl; ++j)
      out[perm ? perm[j] : j] = static_cast<float>(code_at(row, j, scheme.bits) - z) * s;  // exact in f32
  }
}

// ---- Table ---------------------------------------------------------------------

Table Table::dense(Tensor weight) {
  const TensorView& v = weight.view();
  check_dims(v, 2, "Table::dense", "weight");
  check_contiguous(v, "Table::dense", "weight");
  if (!is_float_dtype(v.dtype))
    throw Error(ErrorCode::kInvalidArgument, "Table::dense",
                std::string("weight must be F32/F16/BF16, got ") + dtype_name(v.dtype));
  if (v.size(1) <= 0)
    throw Error(ErrorCode::kInvalidArgument, "Table::dense", "hidden size must be positive, got " + shape_str(v.shape));
  Table t;
  t.dense_ = std::make_shared<const Tensor>(std::move(weight));
  return t;
}

Table Table::packed(PackedTable p, const std::string& where) {
  p.validate(where);
  Table t;
  if (p.col_perm.defined()) {
    PackedTable plain = p;  // shares the tensors' storage
    plain.col_perm = Tensor();
    auto s = std::make_shared<Table>();
    s->packed_ = std::make_shared<const PackedTable>(std::move(plain));
    t.stored_ = std::move(s);
  }
  t.packed_ = std::make_shared<const PackedTable>(std::move(p));
  return t;
}

Device Table::device() const {
  if (packed_) return packed_->packed.view().device;
  if (dense_) return dense_->view().device;
  return Device::kCPU;
}

int64_t Table::vocab() const { return packed_ ? packed_->vocab : dense_ ? dense_->size(0) : 0; }
int64_t Table::hidden() const { return packed_ ? packed_->hidden : dense_ ? dense_->size(1) : 0; }
size_t Table::nbytes() const { return packed_ ? packed_->nbytes() : dense_ ? dense_->nbytes() : 0; }

const PackedTable& Table::packed() const {
  if (!packed_) throw Error(ErrorCode::kInvalidArgument, "Table", "table is not packed");
  return *packed_;
}
const Tensor& Table::dense() const {
  if (!dense_) throw Error(ErrorCode::kInvalidArgument, "Table", "table is not dense");
  return *dense_;
}

void Table::row_f32(int64_t v, float* out) const {
  if (device() != Device::kCPU)
    throw Error(ErrorCode::kInvalidArgument, "Table::row_f32", "the table is on the GPU; copy rows to the host first");
  if (packed_) {
    packed_->dequantize_row(v, out);
  } else {
    const int64_t h = hidden();
    convert(static_cast<const char*>(dense_->data()) + v * h * dtype_size(dense_->dtype()),
            dense_->dtype(), out, DType::kF32, h);
  }
}

Tensor Table::to_dense_f32() const {
  const int64_t v = vocab(), h = hidden();
  Tensor out = Tensor::empty(DType::kF32, {v, h});
  float* o = out.ptr<float>();
  parallel_for(v, 256, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) row_f32(r, o + r * h);
  });
  return out;
}

// ---- safetensors I/O --------------------------------------------------------------

std::string packed_prefix(const std::string& weight_name) {
  const std::string suffix = ".weight";
  if (weight_name.size() > suffix.size() &&
      weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return weight_name.substr(0, weight_name.size() - suffix.size());
  return weight_name;
}

std::string scheme_metadata_key(const std::string& prefix) { return "qhead.scheme." + prefix; }

bool has_packed(const SafetensorsFile& file, const std::string& prefix) {
  return file.contains(prefix + ".weight_packed");
}

namespace {

// Reads weight_shape (I64 or I32, [2]) → {V, H}.
std::pair<int64_t, int64_t> read_weight_shape(const SafetensorsFile& file, const std::string& prefix,
                                              const std::string& where) {
  const std::string name = prefix + ".weight_shape";
  if (!file.contains(name)) bad(where, "missing tensor " + printable(name));
  Tensor t = file.get(name);
  if (t.shape() != Shape{2} || (t.dtype() != DType::kI64 && t.dtype() != DType::kI32))
    bad(where, printable(name) + ": expected I64 [2], got " + dtype_name(t.dtype()) + " " + shape_str(t.shape()));
  int64_t dims[2];
  for (int i = 0; i < 2; ++i) {
    if (t.dtype() == DType::kI64) {
      std::memcpy(&dims[i], static_cast<const char*>(t.data()) + 8 * i, 8);
    } else {
      int32_t d;
      std::memcpy(&d, static_cast<const char*>(t.data()) + 4 * i, 4);
      dims[i] = d;
    }
  }
  if (dims[0] < 0 || dims[1] <= 0 || dims[0] > (int64_t(1) << 40) || dims[1] > (int64_t(1) << 30))
    bad(where, printable(name) + ": implausible shape [" + std::to_string(dims[0]) + ", " + std::to_string(dims[1]) + "]");
  return {dims[0], dims[1]};
}

}  // namespace

QuantScheme infer_scheme(const SafetensorsFile& file, const std::string& prefix) {
  const std::string where = file.path() + ": " + printable(prefix);  // names come from the file
  // 1. qhead's own metadata entry, written by add_packed().
  auto it = file.metadata().find(scheme_metadata_key(prefix));
  if (it != file.metadata().end()) {
    nlohmann::json j = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("num_bits") || !j.contains("group_size") ||
        !j.contains("symmetric") || !j["num_bits"].is_number_integer() ||
        !j["group_size"].is_number_integer() || !j["symmetric"].is_boolean())
      bad(where, "metadata " + printable(it->first) + " is not a valid scheme record: " + printable(it->second));
    // Range-checked before narrowing: an out-of-range number is an error, never truncated.
    const auto in_int_range = [](const nlohmann::json& n) {
      if (n.is_number_unsigned()) return n.get<uint64_t>() <= uint64_t(std::numeric_limits<int>::max());
      const int64_t x = n.get<int64_t>();
      return x >= std::numeric_limits<int>::min() && x <= std::numeric_limits<int>::max();
    };
    if (!in_int_range(j["num_bits"]) || !in_int_range(j["group_size"]))
      bad(where, "metadata " + printable(it->first) + " has num_bits or group_size out of range: " +
                     printable(it->second));
    QuantScheme s;
    s.bits = j["num_bits"].get<int>();
    s.group_size = j["group_size"].get<int>();
    s.symmetric = j["symmetric"].get<bool>();
    try {
      s.validate();
    } catch (const Error& e) {
      bad(where, "metadata " + printable(it->first) + ": " + e.what());
    }
    const std::string sname = prefix + ".weight_scale";
    if (!file.contains(sname)) bad(where, "missing tensor " + printable(sname));
    s.scale_dtype = file.get(sname).dtype();
    return s;
  }
  // 2. From shapes: the packed width gives the bits (any of 2..8, the widths
  //    QuantScheme accepts: ceil(H·b/32) differs for every b once H >= 32),
  //    the scale columns the group size, a zero-point tensor asymmetry.
  const auto [v, h] = read_weight_shape(file, prefix, where);
  const std::string pname = prefix + ".weight_packed", sname = prefix + ".weight_scale";
  if (!file.contains(sname)) bad(where, "missing tensor " + printable(sname));
  Tensor packed = file.get(pname), scale = file.get(sname);
  if (packed.shape().size() != 2 || scale.shape().size() != 2)
    bad(where, "weight_packed and weight_scale must be 2-D, got " + shape_str(packed.shape()) + " and " +
                   shape_str(scale.shape()));
  const int64_t width = packed.size(1);
  QuantScheme s;
  std::string widths, matching;
  int matches = 0;
  for (int b = 2; b <= 8; ++b) {
    QuantScheme c;
    c.bits = b;
    widths += (b > 2 ? ", " : "") + std::to_string(b) + "-bit " + std::to_string(c.packed_cols(h));
    if (c.packed_cols(h) == width) {
      s.bits = b;
      matching += (matches ? " or " : "") + std::to_string(b);
      ++matches;
    }
  }
  if (matches == 0)
    bad(where, "weight_packed width " + std::to_string(width) + " matches no bit width 2..8 for weight_shape H = " +
                   std::to_string(h) + " (" + widths + ")");
  if (matches > 1)
    bad(where, "H = " + std::to_string(h) + " is too small to tell the bit width (" + matching +
                   ") by the packed width; the scheme must come from the checkpoint config");
  const int64_t g = scale.size(1);
  if (g <= 0 || h % g != 0)
    bad(where, "weight_scale has " + std::to_string(g) + " columns, which does not divide H = " + std::to_string(h));
  s.group_size = g == 1 ? -1 : static_cast<int>(h / g);
  s.symmetric = !file.contains(prefix + ".weight_zero_point");
  s.scale_dtype = scale.dtype();
  (void)v;
  return s;
}

Table load_packed(const SafetensorsFile& file, const std::string& prefix, std::optional<QuantScheme> scheme) {
  const std::string where = file.path() + ": " + printable(prefix);  // names come from the file
  if (!has_packed(file, prefix)) bad(where, "missing tensor " + printable(prefix) + ".weight_packed");
  const QuantScheme s = scheme ? *scheme : infer_scheme(file, prefix);
  const auto [v, h] = read_weight_shape(file, prefix, where);
  PackedTable p;
  p.scheme = s;
  p.vocab = v;
  p.hidden = h;
  p.packed = file.get(prefix + ".weight_packed");
  const std::string sname = prefix + ".weight_scale";
  if (!file.contains(sname)) bad(where, "missing tensor " + printable(sname));
  p.scale = file.get(sname);
  const std::string zname = prefix + ".weight_zero_point";
  if (!s.symmetric) {
    if (!file.contains(zname)) bad(where, "asymmetric scheme " + s.name() + " but no tensor " + printable(zname));
    p.zero_point = file.get(zname);
  } else if (file.contains(zname)) {
    bad(where, "symmetric scheme " + s.name() + " but the file has " + printable(zname));
  }
  return Table::packed(std::move(p), where);
}

void add_packed(SafetensorsWriter& w, const std::string& prefix, const PackedTable& t, Tensor& shape_store) {
  if (t.col_perm.defined())
    throw Error(ErrorCode::kUnsupported, prefix,
                "the table's columns are stored permuted (GPTQ act-order); pack-quantized without actorder "
                "cannot express that (compressed-tensors 0.20 reads no g_idx): requantize the dequantized table "
                "(quantize_table; `qhead quantize DIR --head SCHEME --requantize` for a checkpoint whose only GPTQ "
                "module is the head)");
  shape_store = Tensor::empty(DType::kI64, {2});
  shape_store.ptr<int64_t>()[0] = t.vocab;
  shape_store.ptr<int64_t>()[1] = t.hidden;
  w.add(prefix + ".weight_packed", t.packed.view());
  w.add(prefix + ".weight_scale", t.scale.view());
  if (!t.scheme.symmetric) w.add(prefix + ".weight_zero_point", t.zero_point.view());
  w.add(prefix + ".weight_shape", shape_store.view());
  nlohmann::json j = {{"num_bits", t.scheme.bits},
                      {"group_size", t.scheme.group_size},
                      {"symmetric", t.scheme.symmetric},
                      {"strategy", t.scheme.per_row() ? "channel" : "group"},
                      {"scheme", t.scheme.name()}};
  w.set_metadata(scheme_metadata_key(prefix), j.dump());
}

}  // namespace qhead
