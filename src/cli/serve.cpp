// `promptly serve`: load the model, start the engine and the OpenAI-compatible HTTP server.
#include <cstdio>
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

int serve(const ServeOptions& o) {
  std::shared_ptr<const gguf::File> file = open_model_file(o.model);
  Model model(file);
  Tokenizer tokenizer(Vocab::from_gguf(*file));

  EngineOptions eo = o.engine.to_options();
  eo.ctx_size = o.ctx_size;
  eo.max_running = o.max_running;
  std::unique_ptr<Model> draft_model;
  apply_spec_flags(o.spec, tokenizer.vocab(), eo, draft_model);
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
                 eo.spec == EngineOptions::Spec::Draft ? ("the draft model " + o.spec.draft).c_str() : "n-gram prompt lookup",
                 eo.spec_sampled ? "all" : "greedy", eo.spec_tokens, eo.spec_max_streams, eo.spec_sampled ? "" : " (--spec none: off)");
  }
  if (so.webui) std::fprintf(stderr, "promptly: chat UI at http://%s:%u/ (--no-webui: off)\n", o.host.c_str(), port);
  std::fflush(stderr);
  server.run();
  return 0;
}

}  // namespace promptly::cli
