#include "engine/generate.h"

#include <algorithm>

#include "util/clock.h"
#include "util/error.h"

namespace promptly {

GenerateResult generate(const Model& model, const Tokenizer& tokenizer, const std::vector<std::int32_t>& prompt,
                        const GenerateOptions& options, ThreadPool& pool,
                        const std::function<void(const std::string&)>& on_text, bool keep_logits) {
  if (prompt.empty()) throw Error("the prompt has no tokens (an empty prompt still needs BOS)");
  const ModelConfig& cfg = model.config();
  const std::size_t ctx = options.ctx_size ? options.ctx_size : cfg.n_ctx_train;
  const std::size_t max_tokens = options.max_tokens < 0 ? ctx : static_cast<std::size_t>(options.max_tokens);
  if (prompt.size() >= ctx) {
    throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens but the context holds " + std::to_string(ctx));
  }
  const std::size_t budget = std::min(max_tokens, ctx - prompt.size());

  GenerateResult result;
  result.finish_reason = "length";
  KvCache cache = model.make_cache(ctx, options.kv_type);
  Sampler sampler(options.sampling);
  StreamingDetokenizer detok(tokenizer, prompt);
  const std::vector<std::int32_t> stop_ids = tokenizer.vocab().end_of_generation_ids();
  std::vector<std::int32_t> history = prompt;
  std::vector<float> logits;
  Batch batch;
  constexpr int kSeq = 0;

  const auto t0 = SteadyClock::now();
  const std::size_t chunk = std::max<std::size_t>(1, options.prefill_chunk);
  for (std::size_t start = 0; start < prompt.size(); start += chunk) {
    batch.clear();
    const std::size_t end = std::min(prompt.size(), start + chunk);
    for (std::size_t i = start; i < end; ++i) {
      batch.add(prompt[i], static_cast<std::int32_t>(i), kSeq, i + 1 == prompt.size());
    }
    model.forward(batch, cache, pool, logits);
  }
  result.timings.n_prompt = prompt.size();
  result.timings.prompt_ms = seconds_since(t0) * 1000.0;

  SteadyClock::time_point t_first{};
  for (std::size_t n = 0; n < budget; ++n) {
    if (n > 0) {
      batch.clear();
      batch.add(history.back(), static_cast<std::int32_t>(history.size() - 1), kSeq, true);
      model.forward(batch, cache, pool, logits);
    }
    if (keep_logits) result.logits.push_back(logits);
    const std::int32_t id = sampler.sample(logits.data(), cfg.n_vocab, history);
    if (n == 0) {
      t_first = SteadyClock::now();
      result.timings.ttft_ms = std::chrono::duration<double, std::milli>(t_first - t0).count();
    }
    if (!options.ignore_eos && std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) {
      result.finish_reason = "stop";
      break;
    }
    history.push_back(id);
    result.ids.push_back(id);
    const std::string text = detok.push(id);
    result.text += text;
    if (on_text && !text.empty()) on_text(text);
  }
  const std::string tail = detok.flush();
  result.text += tail;
  if (on_text && !tail.empty()) on_text(tail);
  result.timings.n_gen = result.ids.size();
  if (!result.ids.empty()) result.timings.gen_ms = seconds_since(t_first) * 1000.0;
  return result;
}

}  // namespace promptly
