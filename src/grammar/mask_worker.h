#pragma once
// Token masks computed off the decoding thread: as soon as a constrained stream accepts a token,
// its next mask is queued for a worker thread, which works while the engine runs the model's next
// forward pass; the engine only waits if the mask is not ready when that stream is sampled.
// Only where a core is spare: on a machine whose cores all run the forward pass, a third thread
// deschedules the pool's spinning workers and costs far more than it hides (2 cores, -t 2: 670 ->
// 17 tokens/s on the code model), so there the mask is computed when it is needed.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "grammar/matcher.h"

namespace promptly::grammar {

// One constrained stream: its matcher and the mask of its next token.
class ConstrainedStream {
 public:
  explicit ConstrainedStream(std::shared_ptr<const GrammarIndex> index) : matcher(std::move(index)), mask(matcher.index().mask_words()) {}
  Matcher matcher;
  std::vector<std::uint32_t> mask;

 private:
  friend class MaskWorker;
  enum class State { Stale, Queued, Running, Ready };
  State state = State::Stale;
};

// Gives the tokens `mask` does not allow (and any id at or past `mask_ids`, beyond the grammar's
// vocabulary) a logit of -inf, so that no sampler or log-probability sees them.
void mask_logits(const std::uint32_t* mask, std::size_t mask_ids, float* logits, std::size_t n_vocab);

class MaskWorker {
 public:
  // `background`: use a worker thread (see above); false computes every mask in wait().
  explicit MaskWorker(bool background = true) : background_(background) {}
  // Whether a core is left for the worker beside `compute_threads` busy ones.
  static bool spare_core(int compute_threads);
  ~MaskWorker();
  MaskWorker(const MaskWorker&) = delete;
  MaskWorker& operator=(const MaskWorker&) = delete;

  // The stream's matcher has moved on: compute its next mask in the background.
  void request(ConstrainedStream& s);
  // The stream's current mask (computed here if the worker has not started on it).
  const std::uint32_t* wait(ConstrainedStream& s);
  // Call before the stream is destroyed or its matcher changes.
  void forget(ConstrainedStream& s);

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable work_, done_;
  std::deque<ConstrainedStream*> queue_;
  std::thread thread_;
  bool stopping_ = false;
  bool background_;
};

}  // namespace promptly::grammar
