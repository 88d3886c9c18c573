// qhead quantize IN --tensor NAME --scheme SCHEME -o OUT: RTN-quantize one
// dense [V, H] tensor into the compressed-tensors pack-quantized tensors
// NAME'.weight_packed / .weight_scale [/ .weight_zero_point] / .weight_shape
// (NAME' = NAME without a trailing ".weight"); every other tensor and the
// metadata are copied unchanged. The output is written atomically and never
// over the input.
#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "qhead/error.h"
#include "qhead/quantize.h"
#include "qhead/safetensors.h"

namespace qhead::cli {

namespace {

DType parse_scale_dtype(const std::string& s) {
  if (s == "f16") return DType::kF16;
  if (s == "bf16") return DType::kBF16;
  if (s == "f32") return DType::kF32;
  throw Error(ErrorCode::kInvalidArgument, "quantize", "--scale-dtype must be f16, bf16 or f32, got " + s);
}

}  // namespace

nlohmann::json quantize_file(const QuantizeArgs& a) {
  const SafetensorsFile in = SafetensorsFile::open(a.input);
  if (!in.contains(a.tensor))
    throw Error(ErrorCode::kInvalidArgument, "quantize",
                a.input + ": no tensor named '" + a.tensor + "' (use `qhead inspect` to list them)");
  const Tensor w = in.get(a.tensor);
  if (w.shape().size() != 2 || !is_float_dtype(w.dtype()))
    throw Error(ErrorCode::kInvalidArgument, "quantize",
                a.input + ": tensor '" + a.tensor + "' must be a 2-D F32/F16/BF16 table, got " +
                    dtype_name(w.dtype()) + " " + shape_str(w.shape()));
  const DType sdt = a.scale_dtype ? parse_scale_dtype(*a.scale_dtype) : w.dtype();
  const QuantScheme scheme = QuantScheme::parse(a.scheme, sdt);
  const std::string prefix = packed_prefix(a.tensor);
  for (const char* k : {".weight_packed", ".weight_scale", ".weight_zero_point", ".weight_shape"})
    if (in.contains(prefix + k) )
      throw Error(ErrorCode::kInvalidArgument, "quantize",
                  a.input + ": already holds " + prefix + k + "; refusing to write a second packed copy");

  const auto t0 = std::chrono::steady_clock::now();
  const PackedTable q = quantize_rtn(w.view(), scheme, a.threads, a.input + ": " + a.tensor);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  SafetensorsWriter out;
  for (const auto& n : in.names())
    if (n != a.tensor) out.add(n, in.get(n).view());  // copied unchanged (views into the mapping)
  for (const auto& [k, v] : in.metadata()) out.set_metadata(k, v);
  Tensor shape_store;
  add_packed(out, prefix, q, shape_store);
  out.write(a.output, {a.input});

  const SafetensorsFile check = SafetensorsFile::open(a.output);  // re-read and validate what we wrote
  const Table back = load_packed(check, prefix);
  return {{"input", a.input},
          {"tensor", a.tensor},
          {"output", a.output},
          {"prefix", prefix},
          {"scheme", scheme.name()},
          {"scale_dtype", dtype_name(scheme.scale_dtype)},
          {"input_dtype", dtype_name(w.dtype())},
          {"vocab", q.vocab},
          {"hidden", q.hidden},
          {"dense_bytes", w.nbytes()},
          {"packed_bytes", back.nbytes()},
          {"seconds", secs}};
}

int run_quantize(const QuantizeArgs& a) {
  const nlohmann::json j = quantize_file(a);
  if (a.json) {
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("{}: {} [{} x {}] {} -> {} scheme {} (scales {}): {} -> {} ({:.2f}x) in {:.2f} s; wrote {}\n",
               a.input, a.tensor, j["vocab"].get<int64_t>(), j["hidden"].get<int64_t>(),
               j["input_dtype"].get<std::string>(), j["prefix"].get<std::string>(), j["scheme"].get<std::string>(),
               j["scale_dtype"].get<std::string>(), human_bytes(j["dense_bytes"].get<double>()),
               human_bytes(j["packed_bytes"].get<double>()),
               j["dense_bytes"].get<double>() / j["packed_bytes"].get<double>(), j["seconds"].get<double>(), a.output);
  }
  return 0;
}

}  // namespace qhead::cli
