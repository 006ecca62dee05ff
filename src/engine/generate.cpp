#include "engine/generate.h"

#include <algorithm>
#include <thread>

#include "backend/device_draw.h"
#include "grammar/mask_worker.h"
#include "kv/spool.h"
#include "model/fingerprint.h"
#include "spec/verify.h"
#include "util/clock.h"
#include "util/error.h"

namespace promptly {

namespace {

// Reads the longest spooled prefix of the prompt (whole blocks, never its last token) into the
// sequence's blocks; returns how many tokens it covers.
std::size_t read_spooled_prefix(KvSpool& spool, const std::vector<std::int32_t>& prompt, KvCache& cache, int seq,
                                std::vector<ChainHash>& chain) {
  const std::size_t bt = cache.block_tokens();
  const std::size_t n_full = (prompt.size() - 1) / bt;
  extend_chain(chain, prompt, bt, n_full);
  const std::size_t n = spool.present_run(chain, 0);
  if (n == 0) return 0;
  cache.reserve(seq, n * bt);
  const std::vector<int> blocks = cache.blocks(seq);
  std::vector<std::shared_ptr<const KvSpool::Read>> reads;
  for (std::size_t i = 0; i < n; ++i) {
    reads.push_back(read_spooled_block(spool, cache, blocks[i], chain[i], i * bt, std::span<const std::int32_t>(prompt).subspan(i * bt, bt)));
  }
  std::size_t arrived = 0;
  bool failed = false;
  for (const auto& r : reads) {  // all of them: none may still be writing into the cache after this
    while (!r->done.load(std::memory_order_acquire)) std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (!r->ok) failed = true;
    if (!failed) ++arrived;
  }
  cache.set_length(seq, arrived * bt);
  return arrived * bt;
}

// Spools the sequence's full blocks from index `first` on and returns how many it has spooled in
// all: called before each release behind the window, which may let a block's local layers' KV go.
// With `wait`, returns once they are on disk.
std::size_t spool_computed_blocks(KvSpool& spool, std::span<const std::int32_t> tokens, KvCache& cache, int seq,
                                  std::vector<ChainHash>& chain, std::size_t first, bool wait) {
  const std::size_t bt = cache.block_tokens();
  const std::size_t n_full = std::min(cache.length(seq), tokens.size()) / bt;
  extend_chain(chain, tokens, bt, n_full);
  const std::vector<int>& blocks = cache.blocks(seq);
  for (std::size_t i = first; i < n_full; ++i) {
    spool_block(spool, cache, blocks[i], chain[i], i == 0 ? 0 : chain[i - 1], i * bt, tokens.subspan(i * bt, bt), /*wait_for_room=*/true);
  }
  if (wait) spool.flush(std::chrono::steady_clock::time_point::max());
  return std::max(first, n_full);
}

}  // namespace

void add_tree(const spec::Proposal& proposal, std::int32_t context, Batch& batch, int seq) {
  if (proposal.tokens.size() > Batch::kMaxTreeNodes) throw Error("internal: a token tree of more than 64 nodes");
  std::vector<std::uint64_t> ancestors(proposal.tokens.size());
  std::vector<std::int32_t> depth(proposal.tokens.size());
  for (std::size_t i = 0; i < proposal.tokens.size(); ++i) {
    const std::int32_t parent = proposal.parents[i];
    if (parent >= static_cast<std::int32_t>(i)) throw Error("internal: a token tree's node before its parent");
    const auto up = static_cast<std::size_t>(parent);
    ancestors[i] = (std::uint64_t{1} << i) | (parent < 0 ? 0 : ancestors[up]);
    depth[i] = parent < 0 ? 1 : depth[up] + 1;
    batch.add_tree_node(proposal.tokens[i], seq, context, static_cast<std::int32_t>(i), depth[i], ancestors[i], true);
  }
}

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
  KvCache cache = model.make_cache(ctx, options.kv_type, 1, options.release_window_kv);
  Sampler sampler(options.sampling);
  StreamingDetokenizer detok(tokenizer, prompt);
  const std::vector<std::int32_t> stop_ids = tokenizer.vocab().end_of_generation_ids();
  std::vector<std::int32_t> history = prompt;
  std::vector<float> logits;
  Batch batch;
  constexpr int kSeq = 0;
  // The next token's mask is computed on the worker while the forward pass runs. The worker is
  // declared after the stream so that it stops before the stream goes away.
  std::unique_ptr<grammar::ConstrainedStream> constraint;
  grammar::MaskWorker mask_worker(grammar::MaskWorker::spare_core(pool.size()));
  if (options.grammar) {
    constraint = std::make_unique<grammar::ConstrainedStream>(options.grammar);
    mask_worker.request(*constraint);
  }
  auto constrain = [&](float* row) {
    if (!constraint) return;
    grammar::mask_logits(mask_worker.wait(*constraint), options.grammar->vocab().size(), row, cfg.n_vocab);
  };

  // On a device, a stream whose logits the host has nothing to do with (no grammar, penalties,
  // guesses to verify, logits to keep) has its tokens drawn there: only the token comes back.
  const SamplingParams& sp = options.sampling;
  const bool draw_on_device = model.samples_on_device() && !constraint && !keep_logits && !(options.proposer && options.spec_tokens > 0) && !sp.penalizes();
  backend::DeviceSampling device_draw;
  // Runs a batch whose last token wants logits; the token the device drew, or -1 (sample `logits`).
  const auto forward_for_token = [&]() -> std::int32_t {
    if (!draw_on_device) {
      model.forward(batch, cache, pool, logits);
      return -1;
    }
    device_draw.draws.assign(1, {0, sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.temperature > 0.0f ? sampler.next_uniform() : 0.0});
    model.forward(batch, cache, pool, logits, {}, &device_draw);
    if (sp.temperature > 0.0f) sampler.skip_uniform();
    return device_draw.tokens.at(0);
  };

  const auto t0 = SteadyClock::now();
  std::unique_ptr<KvSpool> spool;
  std::vector<ChainHash> chain;
  std::size_t from_spool = 0;
  if (!options.kv_spool_dir.empty()) {
    spool = std::make_unique<KvSpool>(SpoolOptions{options.kv_spool_dir, options.kv_spool_bytes},
                                      SpoolSettings::of(model_fingerprint(model.file()), cache.pool(), cfg.n_layer));
    from_spool = read_spooled_prefix(*spool, prompt, cache, kSeq, chain);
    result.timings.n_spooled = from_spool;
  }
  std::size_t spooled_blocks = 0;
  auto spool_new_blocks = [&](bool wait) {
    if (spool) spooled_blocks = spool_computed_blocks(*spool, history, cache, kSeq, chain, spooled_blocks, wait);
  };
  // Full blocks go to the spool before the window's release may let their local layers' KV go.
  auto release_behind_window = [&] {
    spool_new_blocks(/*wait=*/false);
    cache.release_behind_window(kSeq);
  };
  const std::size_t chunk = std::max<std::size_t>(1, options.prefill_chunk);
  std::int32_t drawn = -1;
  for (std::size_t start = from_spool; start < prompt.size(); start += chunk) {
    batch.clear();
    const std::size_t end = std::min(prompt.size(), start + chunk);
    for (std::size_t i = start; i < end; ++i) {
      batch.add(prompt[i], static_cast<std::int32_t>(i), kSeq, i + 1 == prompt.size());
    }
    if (start > 0) release_behind_window();
    if (end == prompt.size()) {
      drawn = forward_for_token();
    } else {
      model.forward(batch, cache, pool, logits);
    }
  }
  // The prompt's blocks go to the spool now (written behind the generation), so that a run stopped
  // midway still leaves them.
  spool_new_blocks(/*wait=*/false);
  result.timings.n_prompt = prompt.size();
  result.timings.prompt_ms = seconds_since(t0) * 1000.0;

  SteadyClock::time_point t_first{};
  spec::Proposal proposal;
  std::vector<std::int32_t> committed;  // this round's tokens: accepted guesses, then the target's own
  std::vector<float> p;
  std::vector<std::size_t> accepted_path;  // a tree's accepted guesses, root to leaf
  std::size_t n = 0;
  bool stopped = false;
  while (n < budget && !stopped) {
    committed.clear();
    if (n == 0) {
      // The prompt's last logits give the first token, as without speculation.
      if (keep_logits) result.logits.push_back(logits);
      constrain(logits.data());
      committed.push_back(drawn >= 0 ? drawn : sampler.sample(logits.data(), cfg.n_vocab, history));
      t_first = SteadyClock::now();
      result.timings.ttft_ms = std::chrono::duration<double, std::milli>(t_first - t0).count();
    } else {
      // The cache holds history but its last token; that token and the guesses run as one batch
      // whose rows predict, in turn, what follows each prefix of the guess.
      proposal.clear();
      if (options.proposer && options.spec_tokens > 0 && !constraint) {
        const std::size_t room = std::min(budget - n, ctx - history.size()) - 1;
        const auto t_propose = SteadyClock::now();
        options.proposer->propose(history, std::min(options.spec_tokens, room), proposal);
        result.timings.spec_propose_ms += seconds_since(t_propose) * 1000.0;
        result.timings.spec_drafted += proposal.tokens.size();
      }
      ++result.timings.spec_passes;
      const std::size_t k = proposal.tokens.size();
      const std::size_t base = history.size() - 1;
      batch.clear();
      batch.add(history.back(), static_cast<std::int32_t>(base), kSeq, true);
      if (proposal.is_tree()) {
        add_tree(proposal, static_cast<std::int32_t>(history.size()), batch);
      } else {
        for (std::size_t i = 0; i < k; ++i) batch.add(proposal.tokens[i], static_cast<std::int32_t>(base + 1 + i), kSeq, true);
      }
      // Here the cache's length is the root's position (a tree's slots past it were cut off after the
      // last verification), so only what the root's window no longer sees is released: every tree
      // node's position is past the root's, its window starts no earlier, and its ancestors lie in the
      // tree's own slots past the context.
      release_behind_window();
      const auto t_target = SteadyClock::now();
      drawn = forward_for_token();
      result.timings.target_ms += seconds_since(t_target) * 1000.0;
      if (drawn >= 0) {
        committed.push_back(drawn);
      } else if (proposal.is_tree()) {
        spec::verify_tree(logits.data(), cfg.n_vocab, proposal, history, sampler, p, committed, accepted_path,
                          keep_logits ? &result.logits : nullptr);
        result.timings.spec_accepted += accepted_path.size();
        // The accepted nodes' K/V move down behind the context, in path order (a node's slot is never
        // below its depth's, so no move overwrites one still to come); the rest is cut off.
        for (std::size_t j = 0; j < accepted_path.size(); ++j) cache.move_position(kSeq, base + 1 + accepted_path[j], base + 1 + j);
        cache.set_length(kSeq, base + 1 + accepted_path.size());
      } else if (constraint) {
        if (keep_logits) result.logits.push_back(logits);
        constrain(logits.data());
        committed.push_back(sampler.sample(logits.data(), cfg.n_vocab, history));
      } else {
        const std::size_t accepted = spec::verify_chain(logits.data(), cfg.n_vocab, proposal, history, sampler, p, committed,
                                                        keep_logits ? &result.logits : nullptr);
        result.timings.spec_accepted += accepted;
        // Only the accepted guesses' K/V stay: the rest lie past the length and are overwritten later.
        cache.set_length(kSeq, base + 1 + accepted);
      }
    }
    for (const std::int32_t id : committed) {
      if ((!options.ignore_eos || constraint) && std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) {
        result.finish_reason = "stop";
        stopped = true;
        break;
      }
      if (constraint && !constraint->matcher.accept(id)) throw Error("internal error: a token outside the grammar was sampled");
      history.push_back(id);
      result.ids.push_back(id);
      const std::string text = detok.push(id);
      result.text += text;
      if (on_text && !text.empty()) on_text(text);
      if (constraint && constraint->matcher.must_end()) {
        result.finish_reason = "stop";
        stopped = true;
        break;
      }
      if (++n == budget) break;
      if (constraint) mask_worker.request(*constraint);
    }
  }
  spool_new_blocks(/*wait=*/true);
  result.timings.kv_bytes = cache.pool().bytes_in_use();
  const std::string tail = detok.flush();
  result.text += tail;
  if (on_text && !tail.empty()) on_text(tail);
  result.timings.n_gen = result.ids.size();
  if (!result.ids.empty()) result.timings.gen_ms = seconds_since(t_first) * 1000.0;
  return result;
}

}  // namespace promptly
