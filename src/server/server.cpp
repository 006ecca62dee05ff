#include "server/server.h"

#include "grammar/compile.h"
#include "grammar/json_schema.h"
#include "grammar/mask_worker.h"
#include "grammar/token_bytes_of.h"
#include "server/grammar_cache.h"
#include "server/tool_grammar.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <array>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <thread>
#include <vector>

#include "backend/gpu_stats.h"
#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "grammar/compile.h"
#include "grammar/json_schema.h"
#include "grammar/token_bytes_of.h"
#include "server/answer_cache.h"
#include "server/grammar_cache.h"
#include "server/tool_grammar.h"
#include "server/api.h"
#include "server/prefix_key.h"
#include "server/webui.h"
#include "metrics/process.h"
#include "util/error.h"

namespace promptly::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using json = nlohmann::ordered_json;

namespace {

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string finish_reason_text(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Timeout: return "timeout";
    case FinishReason::Cancelled: return "cancelled";
    default: return "error";
  }
}

double ms_between(SteadyClock::time_point a, SteadyClock::time_point b) {
  if (a == SteadyClock::time_point{} || b == SteadyClock::time_point{}) return -1;
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

std::map<std::int32_t, std::string> tool_marker_tokens(const Tokenizer& tokenizer, const std::vector<std::string>& markers) {
  std::map<std::int32_t, std::string> by_id;
  for (const std::string& marker : markers) {
    const std::vector<std::int32_t> ids = tokenizer.encode(marker, false, /*parse_special=*/true);
    if (ids.size() == 1 && tokenizer.piece(ids[0]).empty()) by_id[ids[0]] = marker;
  }
  return by_id;
}

struct Server::Impl {
  const Model& model;
  const Tokenizer& tokenizer;
  Engine& engine;
  ServerOptions options;
  std::optional<ChatTemplate> chat_template;
  ToolCallFormat tool_format = ToolCallFormat::Fallback;
  // The format's markers that the vocabulary holds as control tokens, which the detokenizer never
  // shows: the parser gets their text back from the token id.
  std::map<std::int32_t, std::string> tool_marker_tokens;
  std::string bos_text, eos_text;
  // Structured output: the vocabulary as grammars see it (made on first use: ~70 ms for 151k
  // tokens), a second view where the tool-call markers are allowed, and the compiled grammars.
  std::once_flag grammar_vocab_once;
  std::shared_ptr<const grammar::TokenBytes> grammar_vocab, tool_grammar_vocab;
  GrammarCache grammars;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  net::signal_set signals{ioc, SIGINT, SIGTERM};
  std::atomic<bool> draining{false};       // SIGTERM seen: /health answers 503 (see --drain-delay)
  std::atomic<bool> shutting_down{false};  // no new requests; in-flight ones finish
  std::atomic<std::uint64_t> next_request{1};
  std::mutex live_mutex;
  std::set<std::uint64_t> live_engine_ids;  // engine requests in flight (for shutdown)
  // Recent answers' ids, put back into the next turns' prompts (see answer_cache.h). 64 MiB: a
  // few hundred conversations of a few thousand tokens.
  AnswerCache answers{tokenizer, std::size_t{64} << 20};

  metrics::Registry registry{"promptly:"};
  // The standard process_* metrics keep their usual names (no prefix), as Prometheus clients and
  // dashboards expect them.
  metrics::Registry process_registry{""};
  metrics::Histogram *ttft, *itl, *e2e, *queue, *prefill;
  metrics::Counter *prompt_tokens, *generation_tokens;
  std::map<FinishReason, metrics::Counter*> success;

  Impl(const Model& m, const Tokenizer& t, Engine& e, ServerOptions o) : model(m), tokenizer(t), engine(e), options(std::move(o)) {
    const std::string& source = !options.chat_template.empty() ? options.chat_template
                                : !tokenizer.vocab().chat_template.empty() ? tokenizer.vocab().chat_template
                                                                            : ChatTemplate::chatml_source();
    chat_template.emplace(source);
    tool_format = detect_tool_call_format(source);
    const int compute_threads = engine.options().threads > 0 ? engine.options().threads : default_thread_count();
    grammars.set_warm_in_background(grammar::MaskWorker::spare_core(compute_threads));
    tool_marker_tokens = server::tool_marker_tokens(tokenizer, tool_call_control_markers(tool_format));
    const Vocab& v = tokenizer.vocab();
    if (v.bos >= 0) bos_text = v.tokens[static_cast<std::size_t>(v.bos)];
    if (v.eos >= 0) eos_text = v.tokens[static_cast<std::size_t>(v.eos)];

    const auto buckets = metrics::latency_buckets();
    ttft = &registry.histogram("time_to_first_token_seconds", "Time from arrival to the first token", buckets);
    itl = &registry.histogram("inter_token_latency_seconds", "Time between consecutive tokens of a request", buckets);
    e2e = &registry.histogram("e2e_request_latency_seconds", "Time from arrival to the end of a request", buckets);
    queue = &registry.histogram("request_queue_time_seconds", "Time a request waited before it was scheduled", buckets);
    prefill = &registry.histogram("request_prefill_time_seconds", "Time from scheduling to the first token", buckets);
    registry.gauge("num_requests_running", "Requests prefilling or decoding", [this] { return static_cast<double>(engine.stats().running); });
    registry.gauge("num_requests_waiting", "Requests waiting to be scheduled", [this] { return static_cast<double>(engine.stats().waiting); });
    registry.gauge("kv_cache_usage_perc", "Fraction of KV cache blocks held by running requests", [this] { return engine.stats().kv_usage(); });
    registry.gauge("kv_cache_bytes_in_use", "K/V bytes held by cached and running requests' blocks (sliding-window layers' KV behind every window excluded)",
                   [this] { return static_cast<double>(engine.stats().kv_bytes_in_use); });
    prompt_tokens = &registry.counter("prompt_tokens_total", "Prompt tokens of finished requests");
    generation_tokens = &registry.counter("generation_tokens_total", "Generated tokens of finished requests");
    registry.counter_fn("prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache",
                        [this] { return static_cast<double>(engine.stats().prefix_cache_queries); });
    registry.counter_fn("prefix_cache_hits_total", "Prompt tokens found in the prefix cache",
                        [this] { return static_cast<double>(engine.stats().prefix_cache_hits); });
    registry.counter_fn("num_preemptions_total", "Requests preempted for KV cache memory (recomputed later)",
                        [this] { return static_cast<double>(engine.stats().preemptions); });
    // The step cost model (engine/step_cost.h): what the engine believes a step costs on this
    // machine now, and the step time it sizes steps to.
    registry.gauge("engine_step_time_limit_seconds", "Predicted time an engine step is sized to (0: no ITL target)",
                   [this] { return engine.stats().step_limit_ms / 1000; });
    registry.gauge("engine_step_cost_fixed_seconds", "Learned fixed cost of an engine step",
                   [this] { return engine.stats().step_fixed_ms / 1000; });
    registry.gauge("engine_step_cost_per_token_seconds", "Learned cost of each token in an engine step",
                   [this] { return engine.stats().step_per_token_ms / 1000; });
    registry.gauge("engine_step_cost_per_attended_position_seconds", "Learned cost of each position a step's tokens attend to",
                   [this] { return engine.stats().step_per_1k_attended_ms / 1e6; });
    registry.counter_fn("engine_steps_interrupted_total", "Engine steps stopped early so that a follow-up could run first",
                        [this] { return static_cast<double>(engine.stats().steps_interrupted); });
    // Utilisation: how much of the time the step loop computes, on how many threads, and the
    // tokens as they are made (generation_tokens_total counts a request's when it finishes).
    registry.gauge("engine_busy_ratio", "Fraction of the last 10 s of wall time the engine's step loop spent computing batches",
                   [this] { return engine.busy().recent_ratio(SteadyClock::now()); });
    registry.counter_fn("engine_busy_seconds_total", "Seconds the engine's step loop spent computing batches",
                        [this] { return engine.busy().busy_seconds(SteadyClock::now()); });
    registry.gauge("cpu_threads", "Threads that compute an engine step (-t)", [this] { return static_cast<double>(engine.compute_threads()); });
    registry.counter_fn("engine_generated_tokens_total", "Tokens generated, counted at the step that made them",
                        [this] { return static_cast<double>(engine.stats().generation_tokens); });
    if (options.gpu) {
      register_gpu_metrics(*options.gpu);
      registry.counter_fn("engine_device_sampled_tokens_total", "Tokens drawn on the GPU (only the token came back, not its logits)",
                          [this] { return static_cast<double>(engine.stats().device_sampled_tokens); });
    }
    process_registry.counter_fn("process_cpu_seconds_total", "User and system CPU time of this process", [] { return metrics::process_cpu_seconds(); });
    process_registry.gauge("process_resident_memory_bytes", "Resident memory of this process",
                           [] { return static_cast<double>(metrics::process_resident_bytes()); });
    // Speculative decoding, vLLM's names (spec_decode_*).
    registry.counter_fn("spec_decode_num_drafts_total", "Verification rounds with guesses (one per speculated stream and step)",
                        [this] { return static_cast<double>(engine.stats().spec_drafts); });
    registry.counter_fn("spec_decode_num_draft_tokens_total", "Guessed tokens the model verified",
                        [this] { return static_cast<double>(engine.stats().spec_draft_tokens); });
    registry.counter_fn("spec_decode_num_accepted_tokens_total", "Guessed tokens the model accepted",
                        [this] { return static_cast<double>(engine.stats().spec_accepted_tokens); });
    for (std::size_t pos = 0; pos < engine.options().spec_tokens && engine.options().spec != EngineOptions::Spec::None; ++pos) {
      registry.counter_fn(
          "spec_decode_num_accepted_tokens_per_pos_total", "Accepted guesses by their position in the chain",
          [this, pos] {
            const EngineStats st = engine.stats();
            return pos < st.spec_accepted_per_pos.size() ? static_cast<double>(st.spec_accepted_per_pos[pos]) : 0.0;
          },
          "position=\"" + std::to_string(pos) + "\"");
    }
    if (const KvSpool* spool = engine.spool()) register_spool_metrics(*spool);
    for (FinishReason r : {FinishReason::Stop, FinishReason::Length, FinishReason::Cancelled, FinishReason::Timeout, FinishReason::Error}) {
      success[r] = &registry.counter("request_success_total", "Finished requests by reason",
                                     "finished_reason=\"" + finish_reason_text(r) + "\"");
    }
  }

  // The engine may outlive the server: it must not call into this registry then.
  ~Impl() { engine.set_spool_read_observer({}); }

  void accept();
  void begin_drain();  // SIGINT/SIGTERM: /health 503 for drain_delay_s, then begin_shutdown
  void begin_shutdown();

  // Read from NVML at each scrape; left out while it cannot say (no driver, device gone). The GPU
  // is found by its PCI bus id, which names the same card to CUDA and NVML.
  void register_gpu_metrics(const std::string& device) {
    registry.gauge_if_known("gpu_utilization_perc", "Fraction of the last sample period the model's GPU was computing (NVML), 0 to 1",
                            [device]() -> std::optional<double> {
                              const auto stats = backend::read_gpu_stats(device);
                              return stats ? std::optional(stats->utilization_perc / 100) : std::nullopt;
                            });
    registry.gauge_if_known("gpu_memory_used_bytes", "Memory in use on the model's GPU, by every process (NVML)", [device]() -> std::optional<double> {
      const auto stats = backend::read_gpu_stats(device);
      return stats ? std::optional(static_cast<double>(stats->memory_used_bytes)) : std::nullopt;
    });
  }

  void register_spool_metrics(const KvSpool& spool) {
    registry.gauge("kv_spool_blocks", "KV blocks in the spool on disk", [&spool] { return static_cast<double>(spool.stats().blocks); });
    registry.gauge("kv_spool_bytes", "Bytes of the KV spool's block files", [&spool] { return static_cast<double>(spool.stats().bytes); });
    registry.counter_fn("kv_spool_hits_total", "KV blocks read back from the spool for requests instead of computed",
                        [this] { return static_cast<double>(engine.stats().spool_hit_blocks); });
    registry.counter_fn("kv_spool_written_total", "KV blocks written to the spool", [&spool] { return static_cast<double>(spool.stats().written); });
    registry.counter_fn("kv_spool_write_dropped_total", "KV block writes skipped because the write queue was full",
                        [&spool] { return static_cast<double>(spool.stats().write_dropped); });
    registry.counter_fn("kv_spool_evicted_total", "KV blocks deleted from the spool for its size cap",
                        [&spool] { return static_cast<double>(spool.stats().evicted); });
    for (std::size_t r = 0; r < static_cast<std::size_t>(SpoolReject::kCount); ++r) {
      registry.counter_fn(
          "kv_spool_rejected_total", "Spooled KV blocks never used, by reason",
          [&spool, r] { return static_cast<double>(spool.stats().rejected[r]); },
          std::string("reason=\"") + spool_reject_name(static_cast<SpoolReject>(r)) + "\"");
    }
    metrics::Histogram* read_seconds =
        &registry.histogram("kv_spool_read_seconds", "Time a request waited for its spooled KV blocks to be read back", metrics::latency_buckets());
    engine.set_spool_read_observer([read_seconds](double s) { read_seconds->observe(s); });
  }
};

namespace {

// One prompt's generation inside a request (completions may carry several prompts).
struct Choice {
  std::uint64_t engine_id = 0;
  std::vector<std::int32_t> prompt, generated;  // as submitted and as generated (the answer cache keeps them)
  std::string text;
  std::vector<EngineEvent> tokens;  // only kept when logprobs were asked for
  std::string tool_text;            // text with tool markers held as control tokens written back in
  std::optional<ToolCallParser> tool_parser;  // streaming with tools
  std::optional<ReasoningSplitter> reasoning;  // streaming from a model that thinks (<think>...</think>)
  bool finished = false;
  bool counts_prompt = true;  // the first choice of its prompt (usage counts a prompt once)
  EngineEvent end;
  SteadyClock::time_point last_token;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Server::Impl& server) : stream_(std::move(socket)), server_(server) {}

  void start() {
    // Tokens are small writes that must leave at once: without TCP_NODELAY, Nagle holds a write
    // until the peer ACKs the previous one, and a proxy in front (HAProxy) delays its ACKs by up
    // to 40-200 ms.
    beast::error_code ignored;
    stream_.socket().set_option(tcp::no_delay(true), ignored);
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

 private:
  beast::tcp_stream stream_;
  Server::Impl& server_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> request_;

  // The generation in flight (one per connection: HTTP/1.1 answers in order).
  bool generating_ = false;
  bool peer_gone_ = false;
  bool watching_ = false;
  bool resume_after_watch_ = false;
  ApiRequest api_;
  std::string request_id_;
  std::string route_;
  std::optional<std::string> prefix_key_;  // chat: X-Promptly-Prefix-Key (server/prefix_key.h)
  std::int64_t created_ = 0;
  std::vector<Choice> choices_;
  std::size_t n_finished_ = 0;
  bool sent_role_ = false;
  bool parse_tools_ = false;  // the model was offered tools: its output may hold calls
  // The template writes <think> blocks (Qwen3): the answer's reasoning goes to reasoning_content;
  // reasoning_opened_: the prompt itself opened the block. With tools, the tool-call parser reads
  // the answer after it (not where a call is required: its grammar starts the output with the call).
  bool split_reasoning_ = false;
  bool reasoning_opened_ = false;
  // Streaming output: chunks written one at a time, in order.
  struct Out {
    std::string data;
    bool header = false;
    bool last = false;
  };
  std::deque<Out> out_;
  bool writing_ = false;
  std::shared_ptr<http::response<http::empty_body>> stream_header_;
  std::shared_ptr<http::response_serializer<http::empty_body>> stream_serializer_;

  void read_request() {
    parser_.emplace();
    parser_->body_limit(server_.options.max_body_bytes);
    parser_->header_limit(64 * 1024);
    stream_.expires_after(std::chrono::milliseconds(static_cast<std::int64_t>(server_.options.idle_timeout_s * 1000)));
    http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      // Answer, then drain what the client is still sending before closing: closing with unread
      // data would reset the connection and the client would never see the 413.
      auto res = std::make_shared<http::response<http::string_body>>(http::status::payload_too_large, 11);
      res->set(http::field::content_type, "application/json");
      res->body() = ApiError(413, "the request body exceeds " + std::to_string(server_.options.max_body_bytes) + " bytes").body();
      res->keep_alive(false);
      res->prepare_payload();
      stream_.expires_after(std::chrono::seconds(10));
      http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
        if (ec) return self->close();
        beast::error_code ignored;
        self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
        self->drain();
      });
      return;
    }
    if (ec == http::error::end_of_stream || ec) {
      if (ec && ec != http::error::end_of_stream && ec != beast::error::timeout && ec != net::error::operation_aborted &&
          ec != net::error::connection_reset && ec != net::error::eof) {
        // Malformed HTTP: say so, then close.
        send_error(ApiError(400, std::string("malformed HTTP request: ") + ec.message()), false);
        return;
      }
      close();
      return;
    }
    request_ = parser_->release();
    handle();
  }

  void drain() {
    auto sink = std::make_shared<std::array<char, 65536>>();
    stream_.async_read_some(net::buffer(*sink), [self = shared_from_this(), sink](beast::error_code ec, std::size_t) {
      if (ec) return self->close();  // EOF, or the 10 s timeout
      self->drain();
    });
  }

  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.socket().close(ec);
  }

  template <class Body>
  void send(std::shared_ptr<http::response<Body>> res, bool keep_alive) {
    res->keep_alive(keep_alive);
    res->prepare_payload();
    stream_.expires_after(std::chrono::seconds(30));
    http::async_write(stream_, *res, [self = shared_from_this(), res, keep_alive](beast::error_code ec, std::size_t) {
      if (ec || !keep_alive) {
        self->close();
        return;
      }
      self->continue_reading();
    });
  }

  // A HEAD answer: the headers a GET would get, Content-Length included, and no body.
  void send_head(std::shared_ptr<http::response<http::string_body>> res, bool keep_alive) {
    res->keep_alive(keep_alive);
    auto serializer = std::make_shared<http::response_serializer<http::string_body>>(*res);
    stream_.expires_after(std::chrono::seconds(30));
    http::async_write_header(stream_, *serializer, [self = shared_from_this(), res, serializer, keep_alive](beast::error_code ec, std::size_t) {
      if (ec || !keep_alive) {
        self->close();
        return;
      }
      self->continue_reading();
    });
  }

  // The next request, once the disconnect watch (if any) has stopped: one read at a time.
  void continue_reading() {
    if (watching_) {
      resume_after_watch_ = true;
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
    } else {
      read_request();
    }
  }

  void send_json(int status, const std::string& body, bool keep_alive, const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), request_.version());
    res->set(http::field::server, "promptly");
    res->set(http::field::content_type, "application/json");
    for (const auto& [k, v] : headers) res->set(k, v);
    res->body() = body;
    send(res, keep_alive);
  }

  void send_error(const ApiError& e, bool keep_alive = true) {
    std::vector<std::pair<std::string, std::string>> headers;
    if (e.status() == 429) headers.emplace_back("Retry-After", "1");
    if (e.status() == 401) headers.emplace_back("WWW-Authenticate", "Bearer");
    send_json(e.status(), e.body(), keep_alive && request_.keep_alive(), headers);
  }

  void handle() {
    const std::string target(request_.target());
    const std::string path = target.substr(0, target.find('?'));
    const auto method = request_.method();
    try {
      if (path == "/health") {
        if (server_.shutting_down) throw ApiError(503, "the server is shutting down", "server_error");
        if (server_.draining) throw ApiError(503, "the server is draining: it finishes its requests, then exits", "server_error");
        send_json(200, R"({"status":"ok"})", request_.keep_alive());
        return;
      }
      if (path == "/metrics") {
        auto res = std::make_shared<http::response<http::string_body>>(http::status::ok, request_.version());
        res->set(http::field::content_type, "text/plain; version=0.0.4");
        res->body() = server_.registry.render() + server_.process_registry.render();
        send(res, request_.keep_alive());
        return;
      }
      if (server_.options.webui) {
        if (const WebAsset* asset = find_web_asset(path)) {
          if (method != http::verb::get && method != http::verb::head) throw ApiError(405, "use GET for " + path);
          send_web_asset(*asset, method == http::verb::head);
          return;
        }
      }
      if (path.rfind("/v1/", 0) != 0) throw ApiError(404, "no route for " + path, "invalid_request_error", "", "not_found");
      authorize();
      if (path == "/v1/models") {
        if (method != http::verb::get) throw ApiError(405, "use GET for /v1/models");
        const json body = {{"object", "list"},
                           {"data", json::array({{{"id", server_.options.model_id}, {"object", "model"}, {"created", unix_now()}, {"owned_by", "promptly"}}})}};
        send_json(200, body.dump(), request_.keep_alive());
        return;
      }
      if (path == "/v1/chat/completions" || path == "/v1/completions") {
        if (method != http::verb::post) throw ApiError(405, "use POST for " + path);
        if (server_.shutting_down) throw ApiError(503, "the server is shutting down", "server_error");
        start_generation(path == "/v1/chat/completions");
        return;
      }
      throw ApiError(404, "no route for " + path, "invalid_request_error", "", "not_found");
    } catch (const ApiError& e) {
      log_rejected(path, e);
      send_error(e);
    } catch (const std::exception& e) {
      send_error(ApiError(500, std::string("internal error: ") + e.what(), "server_error"));
    }
  }

  // The UI's files carry no secrets (the API key guards /v1/*), so they are served without one.
  // no-cache: the browser revalidates on every load, which costs a 304 and shows a new binary's UI
  // at once.
  void send_web_asset(const WebAsset& asset, bool head_only) {
    const auto header = [this](http::field f) {
      const beast::string_view v = request_[f];
      return std::string_view(v.data(), v.size());
    };
    const bool gzip = accepts_gzip(header(http::field::accept_encoding));
    const std::string& etag = gzip ? asset.etag_gzipped : asset.etag_plain;
    const bool not_modified = etag_matches(header(http::field::if_none_match), etag);
    auto res = std::make_shared<http::response<http::string_body>>(not_modified ? http::status::not_modified : http::status::ok,
                                                                    request_.version());
    res->set(http::field::server, "promptly");
    res->set(http::field::etag, etag);
    res->set(http::field::cache_control, "no-cache");
    res->set(http::field::vary, "Accept-Encoding");
    if (not_modified) {
      send(res, request_.keep_alive());
      return;
    }
    res->set(http::field::content_type, std::string(asset.content_type));
    res->set("X-Content-Type-Options", "nosniff");
    if (gzip) res->set(http::field::content_encoding, "gzip");
    const std::span<const std::uint8_t> bytes = gzip ? asset.gzipped : asset.plain;
    if (head_only) {
      res->content_length(bytes.size());
      send_head(res, request_.keep_alive());
      return;
    }
    res->body().assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    send(res, request_.keep_alive());
  }

  void authorize() {
    const std::string& key = server_.options.api_key;
    if (key.empty()) return;
    const auto it = request_.find(http::field::authorization);
    if (it == request_.end() || std::string(it->value()) != "Bearer " + key) {
      throw ApiError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')", "authentication_error", "", "invalid_api_key");
    }
  }

  void log_rejected(const std::string& path, const ApiError& e) {
    std::fprintf(stderr, "%s\n",
                 json({{"event", "request"}, {"route", path}, {"status", e.status()}, {"error", e.what()}})
                     .dump(-1, ' ', false, json::error_handler_t::replace)
                     .c_str());
  }

  std::vector<std::int32_t> tokenize_chat() {
    ChatRenderOptions ro;
    ro.add_generation_prompt = true;
    ro.bos_token = server_.bos_text;
    ro.eos_token = server_.eos_text;
    ro.extra = api_.chat_template_kwargs;
    // tool_choice "none" keeps the tools out of the prompt (as llama.cpp does): a model shown tools
    // tends to call them, and nothing would parse the call.
    const bool offer_tools = !api_.tools.empty() && api_.tool_choice.mode != ToolChoice::Mode::None;
    json messages = api_.messages;
    if (server_.tool_format == ToolCallFormat::Fallback) {
      messages = fallback_tool_messages(messages, offer_tools ? api_.tools : json::array(), server_.chat_template->tool_caps().system_role);
    } else if (offer_tools) {
      ro.extra["tools"] = api_.tools;
    }
    parse_tools_ = offer_tools;
    std::string text;
    try {
      text = server_.chat_template->render(server_.chat_template->adapt_messages(messages), ro);
    } catch (const jinja::RaisedException& e) {
      throw ApiError(400, std::string("the chat template rejected the conversation: ") + e.what(), "invalid_request_error", "messages");
    } catch (const std::exception& e) {
      throw ApiError(400, std::string("the chat template failed on these messages: ") + e.what(), "invalid_request_error", "messages");
    }
    // Templates usually write the BOS token themselves; never add a second one.
    const bool has_bos = !server_.bos_text.empty() && text.rfind(server_.bos_text, 0) == 0;
    split_reasoning_ = !(offer_tools && tool_call_required()) && ReasoningSplitter::template_thinks(server_.chat_template->source());
    reasoning_opened_ = split_reasoning_ && ReasoningSplitter::prompt_opens_reasoning(text);
    return server_.tokenizer.encode(text, !has_bos, /*parse_special=*/true);
  }

  void start_generation(bool chat) {
    api_ = parse_api_request(request_.body(), chat);
    if (!api_.model.empty() && api_.model != server_.options.model_id) {
      throw ApiError(404, "the model '" + api_.model + "' does not exist; this server serves '" + server_.options.model_id + "'",
                     "invalid_request_error", "model", "model_not_found");
    }
    const EngineStats st = server_.engine.stats();
    if (st.waiting >= server_.options.max_queue) {
      throw ApiError(429, "the server is at capacity (" + std::to_string(st.waiting) + " requests waiting); retry shortly",
                     "rate_limit_error", "", "queue_full");
    }
    std::vector<std::vector<std::int32_t>> prompts;
    if (chat) {
      prompts.push_back(tokenize_chat());
    } else {
      for (const std::string& p : api_.prompts) prompts.push_back(server_.tokenizer.encode(p, true, false));
    }
    const std::shared_ptr<const grammar::GrammarIndex> constraint = output_grammar();
    if (st.waiting + prompts.size() * static_cast<std::size_t>(api_.n) > server_.options.max_queue) {
      throw ApiError(429, "the server is at capacity: " + std::to_string(prompts.size() * static_cast<std::size_t>(api_.n)) +
                         " choices would not fit the queue; retry shortly or ask for fewer (n)",
                     "rate_limit_error", "", "queue_full");
    }
    for (auto& p : prompts) server_.answers.restore(p);
    const std::size_t ctx = server_.engine.ctx_size();
    for (const auto& p : prompts) {
      const std::size_t want = p.size() + static_cast<std::size_t>(api_.max_tokens.value_or(0));
      if (p.size() >= ctx || want > ctx) {
        throw ApiError(400,
                       "this model's maximum context length is " + std::to_string(ctx) + " tokens, but the request needs " +
                           std::to_string(want) + " (" + std::to_string(p.size()) + " in the prompt, " +
                           std::to_string(api_.max_tokens.value_or(0)) + " to generate); shorten the prompt or lower max_tokens",
                       "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded");
      }
    }

    route_ = chat ? "chat" : "completions";
    prefix_key_ = chat ? prefix_key(api_.messages) : std::nullopt;
    request_id_ = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(server_.next_request++);
    created_ = unix_now();
    // n choices per prompt (index: prompt * n + choice), each with its own seed. Identical prompts
    // wait for the first one's blocks (Scheduler::waits_for_leader): the prompt is computed once
    // and its KV blocks shared; each choice recomputes only the last, partial block.
    const std::size_t n = static_cast<std::size_t>(api_.n);
    std::vector<std::vector<std::int32_t>> per_choice;
    for (const auto& p : prompts)
      for (std::size_t j = 0; j < n; ++j) per_choice.push_back(p);
    prompts = std::move(per_choice);
    const std::uint64_t base_seed = api_.seed ? *api_.seed : std::random_device{}();
    choices_.assign(prompts.size(), Choice{});
    n_finished_ = 0;
    sent_role_ = false;
    if (!chat) parse_tools_ = false;
    if (!chat) split_reasoning_ = false;
    if (parse_tools_ && api_.stream) {
      for (Choice& c : choices_) c.tool_parser.emplace(tool_options());
    }
    if (split_reasoning_ && api_.stream) {
      for (Choice& c : choices_) c.reasoning.emplace(reasoning_opened_);
    }
    generating_ = true;
    peer_gone_ = false;
    if (api_.stream) begin_stream();

    for (std::size_t i = 0; i < prompts.size(); ++i) {
      Request r;
      r.prompt = prompts[i];
      r.max_tokens = api_.max_tokens.value_or(-1);
      r.sampling = api_.sampling();
      r.sampling.seed = base_seed + i % n;  // seed + choice index, as llama.cpp and vLLM do
      r.grammar = constraint;
      r.logit_bias = api_.logit_bias;
      r.stop = api_.stop;
      r.ignore_eos = api_.ignore_eos;
      r.speculative = api_.speculative;
      r.priority = api_.priority;
      r.timeout_s = api_.timeout_s;
      r.top_logprobs = api_.top_logprobs;
      auto self = shared_from_this();
      r.on_event = [self, i](const EngineEvent& e) {
        net::post(self->stream_.get_executor(), [self, i, e] { self->on_event(i, e); });
      };
      choices_[i].prompt = prompts[i];
      choices_[i].counts_prompt = i % n == 0;  // usage counts each prompt once, whatever n is
      try {
        choices_[i].engine_id = server_.engine.submit(std::move(r));
      } catch (const Error& e) {
        for (std::size_t k = 0; k < i; ++k) server_.engine.cancel(choices_[k].engine_id);
        generating_ = false;
        throw ApiError(400, e.what());
      }
      std::lock_guard lock(server_.live_mutex);
      server_.live_engine_ids.insert(choices_[i].engine_id);
    }
    watch_peer();
  }

  // While a generation runs, a read on the socket tells us at once when the client goes away.
  void watch_peer() {
    if (watching_ || peer_gone_) return;
    watching_ = true;
    stream_.socket().async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, std::size_t n) {
      self->watching_ = false;
      if (!ec) {
        self->buffer_.commit(n);  // a pipelined request: kept for the next read
        if (self->generating_) self->watch_peer();
      } else if (ec != net::error::operation_aborted) {
        self->peer_gone();
      }
      if (self->resume_after_watch_ && !self->watching_) {
        self->resume_after_watch_ = false;
        self->read_request();
      }
    });
  }

  void peer_gone() {
    if (peer_gone_) return;
    peer_gone_ = true;
    for (const Choice& c : choices_) {
      if (!c.finished) server_.engine.cancel(c.engine_id);
    }
  }

  void on_event(std::size_t index, const EngineEvent& e) {
    Choice& c = choices_[index];
    if (e.kind == EngineEvent::Kind::Token) {
      if (c.last_token != SteadyClock::time_point{}) server_.itl->observe(std::chrono::duration<double>(e.time - c.last_token).count());
      c.last_token = e.time;
      c.generated.push_back(e.token);
      c.text += e.text;
      if (api_.top_logprobs >= 0) c.tokens.push_back(e);
      const EngineEvent* logprob_event = api_.top_logprobs >= 0 ? &e : nullptr;
      if (parse_tools_) {
        std::string piece = e.text;
        if (auto marker = server_.tool_marker_tokens.find(e.token); marker != server_.tool_marker_tokens.end()) piece += marker->second;
        c.tool_text += piece;
        if (api_.stream && !peer_gone_) stream_tool_piece(index, c, piece, logprob_event, /*last=*/false, /*natural_end=*/false);
        return;
      }
      if (c.reasoning) {
        if (api_.stream && !peer_gone_) stream_reasoning(index, c.reasoning->push(e.text), logprob_event);
        return;
      }
      if (api_.stream && !peer_gone_ && (!e.text.empty() || logprob_event)) stream_piece(index, e.text, logprob_event);
      return;
    }
    c.text += e.text;
    c.tool_text += e.text;
    c.finished = true;
    c.end = e;
    ++n_finished_;
    record(c);
    if (e.finish_reason != FinishReason::Error) server_.answers.remember(c.prompt, c.generated, c.text);
    {
      std::lock_guard lock(server_.live_mutex);
      server_.live_engine_ids.erase(c.engine_id);
    }
    if (api_.stream && !peer_gone_) {
      if (parse_tools_) {
        // An end of its own (EOS, a stop string) may close a call; max_tokens leaves it content.
        const bool natural_end = e.finish_reason == FinishReason::Stop;
        stream_tool_piece(index, c, e.text, nullptr, /*last=*/true, natural_end);
        stream_finish(index, natural_end && c.tool_parser->calls() > 0 ? "tool_calls" : finish_reason_text(e.finish_reason));
      } else if (c.reasoning) {
        stream_reasoning(index, c.reasoning->push(e.text), nullptr);
        stream_reasoning(index, c.reasoning->finish(), nullptr);
        stream_finish(index, finish_reason_text(e.finish_reason));
      } else {
        if (!e.text.empty()) stream_piece(index, e.text, nullptr);
        stream_finish(index, finish_reason_text(e.finish_reason));
      }
    }
    if (n_finished_ < choices_.size()) return;
    if (api_.stream) {
      if (!peer_gone_) end_stream();
    } else if (!peer_gone_) {
      send_completion();
    }
    generating_ = false;
    if (peer_gone_) close();
  }

  void record(const Choice& c) {
    const RequestTimes& t = c.end.times;
    if (t.first_token != SteadyClock::time_point{}) {
      server_.ttft->observe(t.ttft_seconds());
      server_.prefill->observe(t.prefill_seconds());
    }
    if (t.scheduled != SteadyClock::time_point{}) server_.queue->observe(t.queue_seconds());
    server_.e2e->observe(t.e2e_seconds());
    server_.prompt_tokens->add(static_cast<double>(c.end.usage.prompt_tokens));
    server_.generation_tokens->add(static_cast<double>(c.end.usage.completion_tokens));
    server_.success[c.end.finish_reason == FinishReason::None ? FinishReason::Error : c.end.finish_reason]->add();
    std::fprintf(stderr, "%s\n",
                 json({{"event", "request"},
                       {"id", request_id_},
                       {"route", route_},
                       {"stream", api_.stream},
                       {"prompt_tokens", c.end.usage.prompt_tokens},
                       {"cached_tokens", c.end.usage.cached_tokens},
                       {"completion_tokens", c.end.usage.completion_tokens},
                       {"queue_ms", ms_between(t.arrival, t.scheduled)},
                       {"ttft_ms", ms_between(t.arrival, t.first_token)},
                       {"total_ms", ms_between(t.arrival, t.finished)},
                       {"finish_reason", finish_reason_text(c.end.finish_reason)},
                       {"preemptions", c.end.usage.preemptions}})
                     .dump()
                     .c_str());
  }

  json usage_json() const {
    std::size_t prompt = 0, completion = 0, cached = 0;
    for (const Choice& c : choices_) {
      if (c.counts_prompt) {
        prompt += c.end.usage.prompt_tokens;
        cached += c.end.usage.cached_tokens;
      }
      completion += c.end.usage.completion_tokens;
    }
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }

  std::string token_text(std::int32_t id) const { return server_.tokenizer.piece(id, true); }

  json chat_logprob(const EngineEvent& e) const {
    auto entry = [&](std::int32_t id, float lp) {
      const std::string t = token_text(id);
      json bytes = json::array();
      for (unsigned char ch : t) bytes.push_back(ch);
      return json{{"token", t}, {"logprob", lp}, {"bytes", bytes}};
    };
    json j = entry(e.token, e.logprob);
    j["top_logprobs"] = json::array();
    for (const TokenLogprob& t : e.top_logprobs) j["top_logprobs"].push_back(entry(t.token, t.logprob));
    return j;
  }

  json completion_logprobs(const std::vector<EngineEvent>& events) const {
    json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    std::size_t offset = 0;
    for (const EngineEvent& e : events) {
      const std::string t = token_text(e.token);
      tokens.push_back(t);
      lps.push_back(e.logprob);
      json top = json::object();
      for (const TokenLogprob& x : e.top_logprobs) top[token_text(x.token)] = x.logprob;
      tops.push_back(top);
      offsets.push_back(offset);
      offset += t.size();
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  void send_completion() {
    const std::string reason_error = first_error();
    if (!reason_error.empty()) {
      send_error(ApiError(500, "generation failed: " + reason_error, "server_error"));
      return;
    }
    json choices = json::array();
    for (std::size_t i = 0; i < choices_.size(); ++i) {
      const Choice& c = choices_[i];
      json choice = {{"index", i}};
      std::string finish_reason = finish_reason_text(c.end.finish_reason);
      if (api_.chat) {
        choice["message"] = {{"role", "assistant"}, {"content", c.text}};
        // With tools, the text their parser reads (markers written back); calls follow the reasoning.
        std::string tool_text = c.tool_text;
        if (split_reasoning_) {
          ReasoningSplitter::Delta d = ReasoningSplitter::split(parse_tools_ ? c.tool_text : c.text, reasoning_opened_);
          if (!d.reasoning.empty()) choice["message"]["reasoning_content"] = d.reasoning;
          if (parse_tools_) {
            tool_text = std::move(d.content);
          } else {
            choice["message"]["content"] = d.content;
          }
        }
        if (parse_tools_) {
          const bool natural_end = c.end.finish_reason == FinishReason::Stop;
          const ParsedToolCalls parsed = parse_tool_calls(tool_text, tool_options(), natural_end);
          choice["message"]["content"] = parsed.content ? json(*parsed.content) : json(nullptr);
          if (!parsed.calls.empty()) {
            json calls = json::array();
            for (const ToolCall& call : parsed.calls) calls.push_back(tool_call_json(call));
            choice["message"]["tool_calls"] = std::move(calls);
            if (natural_end) finish_reason = "tool_calls";
          }
        }
        if (api_.top_logprobs >= 0) {
          json content = json::array();
          for (const EngineEvent& e : c.tokens) content.push_back(chat_logprob(e));
          choice["logprobs"] = {{"content", content}};
        } else {
          choice["logprobs"] = nullptr;
        }
      } else {
        choice["text"] = c.text;
        choice["logprobs"] = api_.top_logprobs >= 0 ? completion_logprobs(c.tokens) : json(nullptr);
      }
      choice["finish_reason"] = finish_reason;
      choices.push_back(choice);
    }
    const json body = {{"id", request_id_},
                       {"object", api_.chat ? "chat.completion" : "text_completion"},
                       {"created", created_},
                       {"model", server_.options.model_id},
                       {"choices", choices},
                       {"usage", usage_json()}};
    std::vector<std::pair<std::string, std::string>> headers;
    if (prefix_key_) headers.emplace_back(kPrefixKeyHeader, *prefix_key_);
    send_json(200, body.dump(-1, ' ', false, json::error_handler_t::replace), request_.keep_alive(), headers);
  }

  std::string first_error() const {
    for (const Choice& c : choices_) {
      if (c.end.finish_reason == FinishReason::Error) return c.end.error;
    }
    return {};
  }

  // --- streaming (server-sent events over a chunked response) ---
  void begin_stream() {
    stream_header_ = std::make_shared<http::response<http::empty_body>>(http::status::ok, request_.version());
    stream_header_->set(http::field::server, "promptly");
    stream_header_->set(http::field::content_type, "text/event-stream");
    stream_header_->set(http::field::cache_control, "no-cache");
    if (prefix_key_) stream_header_->set(kPrefixKeyHeader, *prefix_key_);
    stream_header_->keep_alive(request_.keep_alive());
    stream_header_->chunked(true);
    stream_serializer_ = std::make_shared<http::response_serializer<http::empty_body>>(*stream_header_);
    out_.push_back({"", true, false});
    pump();
  }

  json chunk_base() const {
    return {{"id", request_id_}, {"object", api_.chat ? "chat.completion.chunk" : "text_completion"}, {"created", created_},
            {"model", server_.options.model_id}};
  }

  void push_event(const json& j) {
    out_.push_back({"data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n", false, false});
    pump();
  }

  bool tool_call_required() const {
    return api_.tool_choice.mode == ToolChoice::Mode::Required || api_.tool_choice.mode == ToolChoice::Mode::Function;
  }

  // The grammar the output must match: a valid call of the offered tools where tool_choice requires
  // one, else response_format's or the `grammar` extension's; null when unconstrained.
  std::shared_ptr<const grammar::GrammarIndex> output_grammar() {
    const bool must_call = parse_tools_ && tool_call_required();
    if (!must_call && api_.grammar.empty()) return nullptr;
    std::call_once(server_.grammar_vocab_once, [this] {
      server_.grammar_vocab = grammar::token_bytes_of(server_.tokenizer);
      server_.tool_grammar_vocab = server_.tool_marker_tokens.empty() ? server_.grammar_vocab
                                                                        : grammar::token_bytes_of(server_.tokenizer, server_.tool_marker_tokens);
    });
    std::string gbnf = api_.grammar, param = api_.grammar_param;
    if (must_call) {
      if (!api_.grammar.empty())
        throw ApiError(400, "a required tool call cannot also follow '" + api_.grammar_param + "'", "invalid_request_error", api_.grammar_param);
      try {
        gbnf = tool_call_grammar(tool_call_syntax(server_.tool_format), api_.tools, api_.tool_choice, api_.parallel_tool_calls);
      } catch (const grammar::SchemaError& e) {
        throw ApiError(400, std::string("tools: a function's parameters cannot be enforced: ") + e.what() + " (keyword '" + e.keyword() + "')",
                       "invalid_request_error", "tools", "unsupported_schema");
      } catch (const nlohmann::json::exception& e) {
        throw ApiError(400, std::string("tools: malformed parameters schema: ") + e.what(), "invalid_request_error", "tools");
      }
      param = "tools";
    }
    try {
      return server_.grammars.get(gbnf, must_call ? server_.tool_grammar_vocab : server_.grammar_vocab);
    } catch (const grammar::GrammarError& e) {
      throw ApiError(400, param + ": " + e.what(), "invalid_request_error", param, "invalid_grammar");
    }
  }

  ToolCallOptions tool_options() const {
    ToolCallOptions o;
    o.format = server_.tool_format;
    o.tool_names = api_.tool_choice.mode == ToolChoice::Mode::Function ? std::vector<std::string>{api_.tool_choice.function} : api_.tool_names();
    o.parallel = api_.parallel_tool_calls;
    return o;
  }

  // The parser's decisions as chunks: content deltas, and per call its head then its arguments.
  // A token's log-probabilities ride on its first chunk, or on an empty one while text is held.
  void stream_tool_events(std::size_t index, const std::vector<ToolCallEvent>& events, const EngineEvent* logprob_event) {
    bool sent = false;
    for (const ToolCallEvent& event : events) {
      for (const json& delta : tool_call_event_deltas(event)) {
        stream_delta(index, delta, sent ? nullptr : logprob_event);
        sent = true;
      }
    }
    if (!sent && logprob_event) stream_delta(index, json{{"content", ""}}, logprob_event);
  }

  void stream_delta(std::size_t index, json delta, const EngineEvent* logprob_event) {
    json j = chunk_base();
    if (!sent_role_) {
      json with_role = {{"role", "assistant"}};
      if (!delta.contains("content")) with_role["content"] = nullptr;
      for (auto& [k, v] : delta.items()) with_role[k] = v;
      delta = std::move(with_role);
      sent_role_ = true;
    }
    json choice = {{"index", index}, {"delta", std::move(delta)}};
    choice["logprobs"] = logprob_event ? json{{"content", json::array({chat_logprob(*logprob_event)})}} : json(nullptr);
    choice["finish_reason"] = nullptr;
    j["choices"] = json::array({choice});
    push_event(j);
  }

  // A piece of a tools request's stream: with a thinking template its reasoning streams as
  // reasoning_content and the rest goes to the tool-call parser; `last` ends both.
  void stream_tool_piece(std::size_t index, Choice& c, const std::string& piece, const EngineEvent* logprob_event, bool last, bool natural_end) {
    std::string answer = piece;
    if (c.reasoning) {
      ReasoningSplitter::Delta d = c.reasoning->push(piece);
      if (last) {
        ReasoningSplitter::Delta rest = c.reasoning->finish();
        d.reasoning += rest.reasoning;
        d.content += rest.content;
      }
      if (!d.reasoning.empty()) {
        stream_delta(index, json{{"reasoning_content", d.reasoning}}, logprob_event);
        logprob_event = nullptr;
      }
      answer = std::move(d.content);
    }
    std::vector<ToolCallEvent> events = c.tool_parser->push(answer);
    if (last) {
      for (ToolCallEvent& x : c.tool_parser->finish(natural_end)) events.push_back(std::move(x));
    }
    stream_tool_events(index, events, logprob_event);
  }

  // A thinking model's piece: reasoning as reasoning_content deltas, the answer as content; a token's
  // log-probabilities ride on its first chunk, or on an empty one while a tag is held.
  void stream_reasoning(std::size_t index, const ReasoningSplitter::Delta& d, const EngineEvent* logprob_event) {
    bool sent = false;
    if (!d.reasoning.empty()) {
      stream_delta(index, json{{"reasoning_content", d.reasoning}}, logprob_event);
      sent = true;
    }
    if (!d.content.empty() || (!sent && logprob_event)) stream_delta(index, json{{"content", d.content}}, sent ? nullptr : logprob_event);
  }

  void stream_piece(std::size_t index, const std::string& text, const EngineEvent* logprob_event) {
    json j = chunk_base();
    json choice = {{"index", index}};
    if (api_.chat) {
      json delta = {{"content", text}};
      if (!sent_role_) {
        delta = {{"role", "assistant"}, {"content", text}};
        sent_role_ = true;
      }
      choice["delta"] = delta;
      choice["logprobs"] = logprob_event ? json{{"content", json::array({chat_logprob(*logprob_event)})}} : json(nullptr);
    } else {
      choice["text"] = text;
      choice["logprobs"] = logprob_event ? completion_logprobs({*logprob_event}) : json(nullptr);
    }
    choice["finish_reason"] = nullptr;
    j["choices"] = json::array({choice});
    push_event(j);
  }

  void stream_finish(std::size_t index, const std::string& reason) {
    json j = chunk_base();
    json choice = {{"index", index}};
    if (api_.chat) {
      choice["delta"] = sent_role_ ? json::object() : json{{"role", "assistant"}, {"content", ""}};
      sent_role_ = true;
    } else {
      choice["text"] = "";
    }
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = reason;
    j["choices"] = json::array({choice});
    push_event(j);
  }

  void end_stream() {
    const std::string error = first_error();
    if (!error.empty()) {
      push_event(json{{"error", {{"message", "generation failed: " + error}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}});
    }
    if (api_.include_usage) {
      json j = chunk_base();
      j["choices"] = json::array();
      j["usage"] = usage_json();
      push_event(j);
    }
    out_.push_back({"data: [DONE]\n\n", false, false});
    out_.push_back({"", false, true});
    pump();
  }

  void pump() {
    if (writing_ || out_.empty()) return;
    writing_ = true;
    auto item = std::make_shared<Out>(std::move(out_.front()));
    out_.pop_front();
    auto done = [self = shared_from_this(), item](beast::error_code ec, std::size_t) {
      self->writing_ = false;
      if (ec) {
        self->out_.clear();
        self->peer_gone();
        return;
      }
      if (item->last) {
        self->stream_header_.reset();
        self->stream_serializer_.reset();
        if (!self->request_.keep_alive()) {
          self->close();
          return;
        }
        self->continue_reading();
        return;
      }
      self->pump();
    };
    stream_.expires_after(std::chrono::seconds(30));  // a client that stops reading is dropped
    if (item->header) {
      http::async_write_header(stream_, *stream_serializer_, done);
    } else if (item->last) {
      net::async_write(stream_, http::make_chunk_last(), done);
    } else {
      net::async_write(stream_, http::make_chunk(net::buffer(item->data)), done);
    }
  }
};

}  // namespace

void Server::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
    } else {
      std::make_shared<Session>(std::move(socket), *this)->start();
    }
    accept();
  });
}

void Server::Impl::begin_drain() {
  if (draining.exchange(true) || shutting_down) return;
  if (options.drain_delay_s <= 0) {
    begin_shutdown();
    return;
  }
  // A load balancer polling /health sees 503 now and stops sending new requests here; those that
  // arrive meanwhile are still served, so none is refused before it has noticed.
  std::fprintf(stderr, "draining: /health answers 503; still serving new requests for %.1f s\n", options.drain_delay_s);
  std::fflush(stderr);
  auto timer = std::make_shared<net::steady_timer>(ioc);
  timer->expires_after(std::chrono::milliseconds(static_cast<std::int64_t>(options.drain_delay_s * 1000)));
  timer->async_wait([this, timer](beast::error_code) { begin_shutdown(); });
}

void Server::Impl::begin_shutdown() {
  if (shutting_down.exchange(true)) return;
  draining = true;
  std::fprintf(stderr, "shutting down: no new requests; finishing in-flight ones for up to %.0f s\n", options.shutdown_grace_s);
  if (options.on_shutdown) options.on_shutdown();
  beast::error_code ec;
  acceptor.close(ec);
  const auto deadline = SteadyClock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(options.shutdown_grace_s * 1000));
  auto timer = std::make_shared<net::steady_timer>(ioc);
  auto check = std::make_shared<std::function<void()>>();
  *check = [this, timer, check, deadline, cancelled = false]() mutable {
    std::size_t live;
    {
      std::lock_guard lock(live_mutex);
      live = live_engine_ids.size();
      if (live > 0 && SteadyClock::now() >= deadline && !cancelled) {
        for (std::uint64_t id : live_engine_ids) engine.cancel(id);
        cancelled = true;
      }
    }
    if (live == 0 || SteadyClock::now() >= deadline + std::chrono::seconds(5)) {
      // Give the last writes a moment, then stop.
      timer->expires_after(std::chrono::milliseconds(200));
      timer->async_wait([this, check](beast::error_code) {
        ioc.stop();
        *check = nullptr;  // breaks the self-reference
      });
      return;
    }
    timer->expires_after(std::chrono::milliseconds(50));
    timer->async_wait([check](beast::error_code) {
      if (*check) (*check)();
    });
  };
  (*check)();
}

Server::Server(const Model& model, const Tokenizer& tokenizer, Engine& engine, ServerOptions options)
    : impl_(std::make_unique<Impl>(model, tokenizer, engine, std::move(options))) {}

Server::~Server() = default;

unsigned short Server::listen() {
  Impl& s = *impl_;
  beast::error_code ec;
  const auto address = net::ip::make_address(s.options.host, ec);
  if (ec) throw Error("invalid --host '" + s.options.host + "': " + ec.message());
  const tcp::endpoint endpoint(address, s.options.port);
  s.acceptor.open(endpoint.protocol(), ec);
  if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(endpoint, ec);
  if (!ec) s.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) throw Error("cannot listen on " + s.options.host + ":" + std::to_string(s.options.port) + ": " + ec.message());
  return s.acceptor.local_endpoint().port();
}

void Server::run() {
  Impl& s = *impl_;
  s.signals.async_wait([&s](beast::error_code ec, int) {
    if (ec) return;
    s.begin_drain();
    // A second signal (Ctrl-C again) skips the rest of the drain delay.
    s.signals.async_wait([&s](beast::error_code ec2, int) {
      if (!ec2) s.begin_shutdown();
    });
  });
  s.accept();
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, s.options.io_threads); ++i) threads.emplace_back([&s] { s.ioc.run(); });
  s.ioc.run();
  for (auto& t : threads) t.join();
}

void Server::stop() {
  net::post(impl_->ioc, [this] { impl_->begin_shutdown(); });
}

}  // namespace promptly::server
