#pragma once
// What a client asks the engine for, and what the engine tells it back. A request moves through
//   WAITING -> PREFILLING -> DECODING -> FINISHED(stop | length | cancelled | timeout | error)
// and, when KV memory runs out, PREEMPTED -> WAITING (its blocks are released and its tokens are
// recomputed later, mostly from the prefix cache). Every transition is stamped with the monotonic
// clock; those stamps are the latency metrics (queue time, TTFT, inter-token latency, end-to-end).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sampling/sampler.h"
#include "util/clock.h"

namespace promptly {
namespace grammar {
class GrammarIndex;
}

enum class RequestState { Waiting, Prefilling, Decoding, Finished, Preempted };  // lifecycle order
enum class FinishReason { None, Stop, Length, Cancelled, Timeout, Error };

const char* request_state_name(RequestState s);
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "timeout", "error"

struct TokenLogprob {
  std::int32_t token = -1;
  float logprob = 0.0f;
};

// Monotonic stamps of a request's life; default-constructed (epoch) until they happen.
struct RequestTimes {
  SteadyClock::time_point arrival;         // submit()
  SteadyClock::time_point scheduled;       // first left WAITING
  SteadyClock::time_point first_token;     // first token sampled
  SteadyClock::time_point last_token;      // latest token sampled
  SteadyClock::time_point preempted;       // latest PREEMPTED -> WAITING (epoch if never)
  SteadyClock::time_point resumed;         // latest re-admission after a preemption
  SteadyClock::time_point finished;
  double queue_seconds() const { return std::chrono::duration<double>(scheduled - arrival).count(); }
  double ttft_seconds() const { return std::chrono::duration<double>(first_token - arrival).count(); }
  double prefill_seconds() const { return std::chrono::duration<double>(first_token - scheduled).count(); }
  double e2e_seconds() const { return std::chrono::duration<double>(finished - arrival).count(); }
};

struct RequestUsage {
  std::size_t prompt_tokens = 0;
  std::size_t cached_tokens = 0;      // prompt tokens served from the prefix cache at admission
  std::size_t completion_tokens = 0;
  std::size_t preemptions = 0;
};

struct EngineEvent {
  enum class Kind { Token, Finished };
  Kind kind = Kind::Token;
  std::uint64_t request_id = 0;
  SteadyClock::time_point time;
  // Token: the sampled id, the text it completes (UTF-8 whole, stop strings never partially shown:
  // may be empty while bytes are held back), and log-probabilities when asked for.
  std::int32_t token = -1;
  std::string text;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs;
  // Finished: why, any text still held back (emitted now), the usage and the life's stamps.
  FinishReason finish_reason = FinishReason::None;
  std::string error;
  RequestUsage usage;
  RequestTimes times;
};

// Called on the engine's thread after each step (once the step's stats are published): it must be
// quick (post the event to your own thread or queue); calling submit/cancel/stats from it is fine.
using EventCallback = std::function<void(const EngineEvent&)>;

struct Request {
  std::vector<std::int32_t> prompt;  // token ids, at least one
  int max_tokens = -1;               // < 0: until the context is full
  SamplingParams sampling;
  std::vector<std::pair<std::int32_t, float>> logit_bias;  // added to the logits before sampling
  std::vector<std::string> stop;                           // generation ends before any of these
  bool ignore_eos = false;
  int priority = 0;                  // higher runs first
  double timeout_s = 0;              // > 0: finished as "timeout" this long after submit
  int top_logprobs = -1;             // < 0: none; 0: the chosen token's; n: also the n most likely
  bool speculative = true;           // false: this request is never speculated (see EngineOptions::spec)
  // Constrained decoding: only tokens the grammar allows are sampled (and scored for logprobs);
  // generation ends when the grammar is complete. Built for this model's tokenizer (grammar/).
  // Constrained requests are not speculated.
  std::shared_ptr<const grammar::GrammarIndex> grammar;
  EventCallback on_event;
};

}  // namespace promptly
