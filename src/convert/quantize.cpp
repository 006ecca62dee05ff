#include "convert/quantize.h"

#include <map>
#include <memory>
#include <vector>

#include "convert/file_type.h"
#include "gguf/writer.h"
#include "tensor/quant.h"
#include "util/error.h"

namespace promptly {
namespace {


}  // namespace

std::string quantize_model(const std::string& in_path, const std::string& out_path, const std::string& target,
                           ThreadPool& pool) {
  const auto parsed = parse_quant_target(target);
  if (!parsed) throw Error("cannot quantize to '" + target + "'; supported: " + kQuantTargets);
  const auto [base, mix_m] = *parsed;
  if (in_path == out_path) throw Error("quantize: the output must be a different file from the input");
  std::shared_ptr<gguf::File> in = gguf::File::open(in_path);

  int n_layers = 0;
  bool has_output = false;
  for (const auto& t : in->tensors()) {
    n_layers = std::max(n_layers, layer_of(t.name) + 1);
    has_output = has_output || t.name == "output.weight";
  }

  gguf::Writer w;
  for (const auto& [key, value] : in->metadata()) w.set(key, value);
  w.set_u32("general.file_type", file_type_for(base, mix_m));
  w.set_u32("general.quantization_version", 2);

  std::map<std::string, int> counts;
  for (const gguf::TensorInfo& t : in->tensors()) {
    DType type = t.type;
    // MoE routers stay F32, as llama.cpp keeps them (small, and they decide which experts run).
    if (t.dims.size() >= 2 && t.name.ends_with(".weight") && !t.name.ends_with("ffn_gate_inp.weight")) {
      type = quantized_matrix_type(base, mix_m, t.name, t.dims[0], n_layers, has_output);
      if (!dtype_info(t.type).supported) {
        throw Error("cannot requantize tensor '" + t.name + "' of unsupported type " + std::string(dtype_name(t.type)));
      }
    }
    ++counts[std::string(dtype_name(type))];
    const gguf::TensorInfo* src = &t;
    w.add_tensor(t.name, t.dims, type, [src, type, &pool](std::uint8_t* out) {
      if (type == src->type) {
        std::copy_n(src->data, src->n_bytes, out);
        return;
      }
      const std::size_t cols = src->dims[0];
      const std::size_t in_stride = row_bytes(src->type, cols), out_stride = row_bytes(type, cols);
      pool.parallel_for(src->rows(), 16, [&](std::size_t begin, std::size_t end, int) {
        std::vector<float> row(cols);
        for (std::size_t r = begin; r < end; ++r) {
          dequantize_row(src->type, src->data + r * in_stride, row.data(), cols);
          quantize_row(type, row.data(), out + r * out_stride, cols);
        }
      });
    });
  }
  w.write(out_path);

  std::string summary = "wrote " + out_path + ":";
  for (const auto& [name, n] : counts) summary.append(" ").append(std::to_string(n)).append(" x ").append(name);
  return summary;
}

}  // namespace promptly
