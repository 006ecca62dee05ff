#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "convert/file_type.h"
#include "convert/quantize.h"
#include "convert/synthetic_model.h"
#include "util/clock.h"
#include "util/error.h"
#include "util/file_io.h"

namespace promptly::cli {

int gen_model(const GenModelOptions& o) {
  SyntheticModelSpec spec = synthetic_preset(o.preset);
  if (o.layers < 0 || static_cast<std::uint32_t>(o.layers) > spec.n_layer) {
    throw Error("--layers " + std::to_string(o.layers) + ": preset " + o.preset + " has " + std::to_string(spec.n_layer) + " blocks");
  }
  if (o.layers > 0) spec.n_layer = static_cast<std::uint32_t>(o.layers);
  const auto target = parse_quant_target(o.dtype);
  if (!target) throw Error("unknown --dtype '" + o.dtype + "'; supported: " + kQuantTargets);
  std::string tmpl;
  if (!o.chat_template_file.empty()) {
    tmpl = read_file(o.chat_template_file, "chat template");
  }
  ThreadPool pool(o.threads > 0 ? o.threads : default_thread_count());
  const auto t0 = SteadyClock::now();
  write_synthetic_model(spec, target->base, o.seed, o.out, pool, tmpl, target->m_mix);
  std::fprintf(stderr, "wrote %s (preset %s, %s, %.1f MB) in %.1f s\n", o.out.c_str(), o.preset.c_str(), o.dtype.c_str(),
               static_cast<double>(std::filesystem::file_size(o.out)) / 1e6, seconds_since(t0));
  return 0;
}

int quantize(const QuantizeOptions& o) {
  ThreadPool pool(o.threads > 0 ? o.threads : default_thread_count());
  const auto t0 = SteadyClock::now();
  const std::string summary = quantize_model(o.in, o.out, o.type, pool);
  std::fprintf(stderr, "%s (%.1f s)\n", summary.c_str(), seconds_since(t0));
  return 0;
}

}  // namespace promptly::cli
