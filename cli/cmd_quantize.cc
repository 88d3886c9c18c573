// qhead quantize IN --tensor NAME --scheme SCHEME -o OUT: quantize one
// dense [V, H] tensor into the compressed-tensors pack-quantized tensors
// NAME'.weight_packed / .weight_scale [/ .weight_zero_point] / .weight_shape
// (NAME' = NAME without a trailing ".weight"); every other tensor and the
// metadata are copied unchanged. The output is written atomically and never
// over the input.
//
// qhead quantize MODEL_DIR --embedding S --head S -o OUT_DIR: the same for a
// Hugging Face model directory's two roles, writing a compressed-tensors model
// directory (write_quantized_model, qhead/model_write.h), with progress bars on
// a terminal.
//
// --quantizer rtn|mse|gptq|gptq-mse picks the quantizer (qhead/quantize.h);
// --calibration FILE[:TENSOR] gives the head's inputs [N, H] the GPTQ ones need.
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "progress.h"
#include "qhead/error.h"
#include "qhead/model_write.h"
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

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

bool looks_gguf(const std::string& path) {
  if (ends_with(path, ".gguf")) return true;
  std::ifstream in(path, std::ios::binary);
  char m[4] = {};
  return in.read(m, 4) && std::string(m, 4) == "GGUF";
}

// --damp: only where calibration is read (the GPTQ quantizers, mse with
// --calibration; qhead::quantize checks its value). Without it,
// QuantizeOptions's default.
double damp_of(const QuantizeArgs& a, Quantizer q, bool calibrated, const std::string& what) {
  if (!a.damp) return QuantizeOptions{}.damp;
  if (!calibrated || q == Quantizer::kRtn)
    throw Error(ErrorCode::kInvalidArgument, "quantize",
                what + ": --damp applies to a quantizer that reads --calibration (gptq, gptq-mse, or mse with "
                       "--calibration); --quantizer is " + quantizer_name(q) +
                       (calibrated ? "" : " without --calibration"));
  return *a.damp;
}

// The calibration activations of --calibration FILE[:TENSOR]: TENSOR, else
// "hidden" (qhead agree's states files), else the file's only 2-D tensor.
// Empty spec: none. The returned Tensor keeps the mapping alive.
std::optional<Tensor> load_calibration(const std::string& spec, Quantizer q, const std::string& what) {
  if (spec.empty()) {
    if (quantizer_needs_calibration(q))
      throw Error(ErrorCode::kInvalidArgument, "quantize",
                  what + ": --quantizer " + quantizer_name(q) +
                      " needs --calibration STATES.safetensors (the head's inputs [N, H], e.g. qhead agree's states "
                      "file)");
    return std::nullopt;
  }
  std::string path = spec, tensor;
  if (!std::filesystem::exists(path)) {
    const auto colon = spec.rfind(':');
    if (colon != std::string::npos) {
      path = spec.substr(0, colon);
      tensor = spec.substr(colon + 1);
    }
  }
  const SafetensorsFile f = SafetensorsFile::open(path);
  if (tensor.empty()) {
    if (f.contains("hidden")) {
      tensor = "hidden";
    } else {
      std::vector<std::string> two_d;
      for (const auto& n : f.names())
        if (f.get(n).shape().size() == 2) two_d.push_back(n);
      if (two_d.size() != 1)
        throw Error(ErrorCode::kInvalidArgument, "quantize",
                    "--calibration " + path + ": no tensor 'hidden' and " + std::to_string(two_d.size()) +
                        " 2-D tensors; name one as FILE:TENSOR");
      tensor = two_d[0];
    }
  }
  if (!f.contains(tensor))
    throw Error(ErrorCode::kInvalidArgument, "quantize", "--calibration " + path + ": no tensor named '" + tensor + "'");
  Tensor t = f.get(tensor);
  if (t.shape().size() != 2 || !is_float_dtype(t.dtype()))
    throw Error(ErrorCode::kInvalidArgument, "quantize",
                "--calibration " + path + ": tensor '" + tensor + "' must be 2-D F32/F16/BF16 [N, H], got " +
                    dtype_name(t.dtype()) + " " + shape_str(t.shape()));
  return t;
}

nlohmann::json role_json(const ModelWriteReport::Role& r) {
  nlohmann::json j = {{"tensor", r.tensor},           {"module", r.module},
                      {"action", r.action},           {"before", r.before},
                      {"bytes_before", r.bytes_before}, {"bytes_after", r.bytes_after},
                      {"seconds", r.seconds},         {"file", r.file}};
  if (r.scheme) {
    j["scheme"] = r.scheme->name();
    j["scale_dtype"] = dtype_name(r.scheme->scale_dtype);
    j["bits"] = r.scheme->bits;
    j["group_size"] = r.scheme->group_size;
    j["symmetric"] = r.scheme->symmetric;
  } else {
    j["scheme"] = nullptr;
  }
  return j;
}

}  // namespace

nlohmann::json quantize_model_dir(const QuantizeArgs& a, bool progress) {
  if (is_directory_checked(a.input) && (!a.tensor.empty() || !a.scheme.empty()))
    throw Error(ErrorCode::kInvalidArgument, "quantize",
                a.input + " is a model directory: give --embedding SCHEME and/or --head SCHEME (--tensor/--scheme "
                          "select one tensor of a .safetensors file)");
  ModelWriteOptions o;
  o.embedding_scheme = a.embedding;
  o.head_scheme = a.head;
  if (a.scale_dtype) o.scale_dtype = parse_scale_dtype(*a.scale_dtype);
  o.requantize = a.requantize;
  o.mixed_schemes = a.mixed_schemes;
  o.force = a.force;
  o.untie = a.untie;
  o.threads = a.threads;
  o.quantizer = parse_quantizer(a.quantizer);
  const std::optional<Tensor> calib = load_calibration(a.calibration, o.quantizer, a.input);
  if (calib) o.calibration = calib->view();
  o.damp = damp_of(a, o.quantizer, calib.has_value(), a.input);
  o.overrides = {a.embedding_tensor, a.head_tensor};
  ProgressBar bar(progress && !a.json && ProgressBar::stderr_is_tty());
  o.progress = [&](const ModelWriteProgress& p) {
    const bool q = p.stage == ModelWriteProgress::Stage::kQuantize;
    bar.update((q ? "quantize " : "copy ") + p.what, p.done, p.total, q ? "rows" : "bytes");
  };
  const ModelWriteReport r = write_quantized_model(a.input, a.output, o);
  bar.done();
  nlohmann::json notes = nlohmann::json::array();
  if (a.mixed_schemes)
    notes.push_back("--mixed-schemes: config groups may have different weight schemes; compressed-tensors' "
                    "ModelCompressor reads each group's, transformers decompresses every module with the first "
                    "group's and misreads the others");
  nlohmann::json skipped = nlohmann::json::array();
  for (const auto& [f, why] : r.skipped_files) {
    skipped.push_back({{"file", f}, {"reason", why}});
    notes.push_back(f + " was not copied: it is " + why);
  }
  for (const auto& c : r.cleaned) notes.push_back("removed a killed run's temporary " + c);
  return {{"input", r.input_dir},
          {"output", r.output_dir},
          {"quantizer", quantizer_name(o.quantizer)},
          {"damp", calib ? nlohmann::json(o.damp) : nlohmann::json()},
          {"architecture", r.architecture},
          {"vocab", r.vocab},
          {"hidden", r.hidden},
          {"tied", r.tied},
          {"untied", r.untied},
          {"roles", {{"embedding", role_json(r.embedding)}, {"head", role_json(r.head)}}},
          {"rewritten_files", r.rewritten_files},
          {"copied_files", r.copied_files},
          {"skipped_files", skipped},
          {"cleaned", r.cleaned},
          {"tensors_checked", r.tensors_checked},
          {"verified", r.verified},
          {"seconds", r.seconds},
          {"notes", notes}};
}

nlohmann::json quantize_file(const QuantizeArgs& a) {
  if (a.embedding || a.head || a.requantize || a.mixed_schemes || a.force || a.untie || !a.embedding_tensor.empty() ||
      !a.head_tensor.empty())
    throw Error(ErrorCode::kInvalidArgument, "quantize",
                a.input + " is a file: --embedding/--head/--requantize/--mixed-schemes/--force/--untie/"
                          "--embedding-tensor/--head-tensor are for a model directory; for a .safetensors file give "
                          "--tensor NAME --scheme SCHEME");
  if (a.tensor.empty() || a.scheme.empty())
    throw Error(ErrorCode::kInvalidArgument, "quantize",
                a.input + " is a file: give --tensor NAME and --scheme SCHEME (or a model directory with "
                          "--embedding/--head)");
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

  QuantizeOptions qo;
  qo.quantizer = parse_quantizer(a.quantizer);
  qo.threads = a.threads;
  qo.name = a.input + ": " + a.tensor;
  const std::optional<Tensor> calib = load_calibration(a.calibration, qo.quantizer, qo.name);
  if (calib) qo.calibration = calib->view();
  qo.damp = damp_of(a, qo.quantizer, calib.has_value(), qo.name);
  const auto t0 = std::chrono::steady_clock::now();
  const PackedTable q = quantize(w.view(), scheme, qo);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  SafetensorsWriter out;
  for (const auto& n : in.names())
    if (n != a.tensor) out.add(n, in.get(n).view());  // copied unchanged (views into the mapping)
  for (const auto& [k, v] : in.metadata()) out.set_metadata(k, v);
  Tensor shape_store;
  add_packed(out, prefix, q, shape_store);
  // The written file is re-read and checked before it is renamed to OUT: a
  // failed check leaves OUT as it was.
  size_t packed_bytes = 0;
  out.write(a.output, {a.input}, [&](const std::string& written) {
    const SafetensorsFile check = SafetensorsFile::open(written);
    const Table back = load_packed(check, prefix);
    const PackedTable& p = back.packed();
    auto same = [](const Tensor& x, const Tensor& y) {
      return x.dtype() == y.dtype() && x.shape() == y.shape() && std::memcmp(x.data(), y.data(), x.nbytes()) == 0;
    };
    if (!same(p.packed, q.packed) || !same(p.scale, q.scale) || (!scheme.symmetric && !same(p.zero_point, q.zero_point)))
      throw Error(ErrorCode::kInternal, "quantize", a.output + ": the written file does not read back as written");
    packed_bytes = back.nbytes();
  });
  return {{"input", a.input},
          {"tensor", a.tensor},
          {"output", a.output},
          {"prefix", prefix},
          {"scheme", scheme.name()},
          {"quantizer", quantizer_name(qo.quantizer)},
          {"damp", calib ? nlohmann::json(qo.damp) : nlohmann::json()},
          {"scale_dtype", dtype_name(scheme.scale_dtype)},
          {"input_dtype", dtype_name(w.dtype())},
          {"vocab", q.vocab},
          {"hidden", q.hidden},
          {"dense_bytes", w.nbytes()},
          {"packed_bytes", packed_bytes},
          {"seconds", secs}};
}

namespace {

void print_model_summary(const nlohmann::json& j) {
  fmt::print("{} -> {} ({}, vocab {} x hidden {}, {})\n", j["input"].get<std::string>(), j["output"].get<std::string>(),
             j["architecture"].get<std::string>(), j["vocab"].get<int64_t>(), j["hidden"].get<int64_t>(),
             j["tied"].get<bool>()     ? "tied: one table for both roles"
             : j["untied"].get<bool>() ? "tied model written untied: a table per role"
                                       : "untied");
  for (const char* role : {"embedding", "head"}) {
    const auto& r = j["roles"][role];
    const std::string action = r["action"].get<std::string>();
    const double before = r["bytes_before"].get<double>(), after = r["bytes_after"].get<double>();
    if (action == "shared") {
      fmt::print("  {:<10} {:<28} shares the embedding's table{}\n", role, r["module"].get<std::string>(),
                 before > 0 ? fmt::format(" (its stored copy, {}, dropped)", human_bytes(before)) : std::string());
      continue;
    }
    const std::string now = r["scheme"].is_null()
                                ? r["before"].get<std::string>()
                                : fmt::format("{} ({} scales)", r["scheme"].get<std::string>(),
                                              r["scale_dtype"].get<std::string>());
    if (action == "kept") {
      fmt::print("  {:<10} {:<28} kept: {}, {}\n", role, r["module"].get<std::string>(), now, human_bytes(before));
      continue;
    }
    if (before == 0) {  // an untied head: a table of its own, from the shared one
      fmt::print("  {:<10} {:<28} {} -> {}: a new table of its own, {} in {:.2f} s\n", role,
                 r["module"].get<std::string>(), r["before"].get<std::string>(), now, human_bytes(after),
                 r["seconds"].get<double>());
      continue;
    }
    fmt::print("  {:<10} {:<28} {} -> {}: {} -> {} ({:.2f}x) in {:.2f} s{}\n", role, r["module"].get<std::string>(),
               r["before"].get<std::string>(), now, human_bytes(before), human_bytes(after),
               after > 0 ? before / after : 0.0, r["seconds"].get<double>(),
               action == "requantized" ? " (requantized from its dequantized values)" : "");
  }
  std::string rewritten, copied;
  for (const auto& f : j["rewritten_files"]) rewritten += (rewritten.empty() ? "" : ", ") + f.get<std::string>();
  for (const auto& f : j["copied_files"]) copied += (copied.empty() ? "" : ", ") + f.get<std::string>();
  fmt::print("  rewrote {}; copied {} file(s){}\n", rewritten, j["copied_files"].size(),
             copied.empty() ? std::string() : " (" + copied + ")");
  fmt::print("  checked: re-opened {}: roles load as quantized, all {} tensors equal what was written (others "
             "byte-identical to the input); {:.2f} s\n",
             j["output"].get<std::string>(), j["tensors_checked"].get<int64_t>(), j["seconds"].get<double>());
  for (const auto& n : j["notes"]) fmt::print("  note: {}\n", n.get<std::string>());
}

}  // namespace

int run_quantize(const QuantizeArgs& a) {
  if (is_directory_checked(a.input) || looks_gguf(a.input)) {
    // A GGUF file goes to the library, which says what it takes instead.
    const nlohmann::json j = quantize_model_dir(a, /*progress=*/true);
    if (a.json) fmt::print("{}\n", j.dump(2));
    else print_model_summary(j);
    return 0;
  }
  const nlohmann::json j = quantize_file(a);
  if (a.json) {
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("{}: {} [{} x {}] {} -> {} scheme {} (scales {}, {}): {} -> {} ({:.2f}x) in {:.2f} s; wrote {}\n",
               a.input, a.tensor, j["vocab"].get<int64_t>(), j["hidden"].get<int64_t>(),
               j["input_dtype"].get<std::string>(), j["prefix"].get<std::string>(), j["scheme"].get<std::string>(),
               j["scale_dtype"].get<std::string>(), j["quantizer"].get<std::string>(), human_bytes(j["dense_bytes"].get<double>()),
               human_bytes(j["packed_bytes"].get<double>()),
               j["dense_bytes"].get<double>() / j["packed_bytes"].get<double>(), j["seconds"].get<double>(), a.output);
  }
  return 0;
}

}  // namespace qhead::cli
