// `promptly serve`: load the model, start the engine and the OpenAI-compatible HTTP server.
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cli/commands.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "model/builtin_model.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/file_io.h"

namespace promptly::cli {

std::string default_kv_spool_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/promptly/kv-spool";
  const char* home = std::getenv("HOME");
  if (home && *home) return std::string(home) + "/.cache/promptly/kv-spool";
  return {};
}

namespace {
// How long, once shutdown begins, a forward pass waits for the other ranks before failing its
// requests: longer than any step (steps are sized to the ITL target, 150 ms by default).
constexpr double kTensorParallelShutdownSilenceS = 2;
}  // namespace

int serve(const ServeOptions& o) {
  const backend::DeviceSpec device = resolve_device(o.device);
  EngineFlags flags = o.engine;
  std::shared_ptr<const gguf::File> file = open_model_file(o.model);
  const auto tp = join_tensor_parallel(o.tp);
  const std::unique_ptr<Model> loaded = load_model(file, tp, device);
  Model& model = *loaded;
  if (tp && tp->rank() != 0) return follow_rank0(model, o.engine.threads, -1);
  Tokenizer tokenizer(Vocab::from_gguf(*file));

  // On by default (README, KV spool), on a GPU too; not yet under tensor parallelism, where each
  // rank holds only its heads' part of a block.
  if (flags.kv_spool.empty() && !tp) flags.kv_spool = default_kv_spool_dir();
  if (tp && !flags.kv_spool.empty() && flags.kv_spool != "none") throw Error("--kv-spool does not work with --tp yet (each rank holds only its heads' KV)");
  EngineOptions eo = flags.to_options();
  eo.ctx_size = o.ctx_size;
  eo.max_running = o.max_running;
  std::unique_ptr<Model> draft_model;
  apply_spec_flags(o.spec, tokenizer.vocab(), eo, draft_model, device);
  eo.spec_max_streams = o.spec_max_streams;
  Engine engine(model, &tokenizer, eo);

  server::ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.max_queue = o.max_queue;
  so.api_key = o.api_key;
  so.model_id = !o.alias.empty() ? o.alias : o.model.empty() ? kBuiltinModelName : std::filesystem::path(o.model).stem().string();
  if (!o.chat_template_file.empty()) so.chat_template = read_file(o.chat_template_file, "chat template");
  so.shutdown_grace_s = o.shutdown_grace_s;
  so.drain_delay_s = o.drain_delay_s;
  so.webui = !o.no_webui;
  if (model.device()) so.gpu = model.device()->pci_bus_id();
  if (tp) {
    // mpirun signals every rank when one dies: a step waiting on the dead one must fail its
    // requests (their clients get the error) while rank 0 still may, not when mpirun kills it.
    so.on_shutdown = [tp] { tp->set_silence_limit(kTensorParallelShutdownSilenceS); };
  }
  server::Server server(model, tokenizer, engine, so);
  const unsigned short port = server.listen();
  const EngineStats st = engine.stats();
  std::fprintf(stderr, "promptly: serving '%s' on http://%s:%u (context %zu, KV cache %s %.0f MB = %zu tokens)\n", so.model_id.c_str(),
               o.host.c_str(), port, st.ctx_size, o.engine.kv_type.c_str(), static_cast<double>(st.kv_budget_bytes) / 1e6,
               st.kv_blocks_total * st.kv_block_tokens);
  if (st.step_limit_ms > 0) {
    std::fprintf(stderr,
                 "promptly: steps sized to %.0f ms (ITL target %.0f ms; --itl-target-ms 0: off) by their measured cost: %.2f ms + %.3f ms a "
                 "token + %.3f ms per 1000 positions attended\n",
                 st.step_limit_ms, eo.itl_target_ms, st.step_fixed_ms, st.step_per_token_ms, st.step_per_1k_attended_ms);
  }
  if (eo.spec != EngineOptions::Spec::None) {
    std::fprintf(stderr, "promptly: speculative decoding with %s for %s requests, up to %zu guesses a stream while at most %zu streams decode%s\n",
                 eo.spec == EngineOptions::Spec::Draft  ? ("the draft model " + o.spec.draft).c_str()
                 : eo.spec == EngineOptions::Spec::Tree ? ("token trees from the draft model " + o.spec.draft).c_str()
                                                        : "n-gram prompt lookup",
                 eo.spec_sampled ? "all" : "greedy", eo.spec_tokens, eo.spec_max_streams, eo.spec_sampled ? "" : " (--spec none: off)");
  }
  if (const KvSpool* spool = engine.spool()) {
    const SpoolStats ss = spool->stats();
    if (ss.enabled) {
      std::fprintf(stderr, "promptly: KV spool '%s': %llu blocks (%.0f MB) of this model and settings, cap %.0f MB\n", spool->options().dir.c_str(),
                   static_cast<unsigned long long>(ss.blocks), static_cast<double>(ss.bytes) / 1e6, static_cast<double>(spool->options().max_bytes) / 1e6);
    }
  }
  if (so.webui) std::fprintf(stderr, "promptly: chat UI at http://%s:%u/ (--no-webui: off)\n", o.host.c_str(), port);
  std::fflush(stderr);
  server.run();
  if (const KvSpool* spool = engine.spool(); spool && spool->stats().write_queue_bytes > 0) {
    // What is still queued goes to disk within the grace period; what is left then is lost (the
    // spool holds everything written before it).
    const bool all = engine.flush_spool(SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                                                 std::chrono::duration<double>(o.shutdown_grace_s)));
    if (!all) std::fprintf(stderr, "promptly: warning: KV spool: queued blocks not written within the grace period were dropped\n");
  }
  return 0;
}

}  // namespace promptly::cli
