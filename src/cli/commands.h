#pragma once
// One function per `promptly` sub-command; main.cpp parses flags into these option structs.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/device.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "sampling/sampler.h"
#include "spec/proposer.h"
#include "tokenizer/vocab.h"

namespace promptly::cli {

// Speculative decoding flags shared by run and bench spec.
struct SpecFlags {
  std::string draft;         // --draft: a draft model of the target's vocabulary
  std::string mode;          // --spec none|ngram|draft|tree; empty: draft when --draft is given, else none
  long tokens = -1;          // --spec-tokens: most guesses a pass verifies (-1: the mode's default)
  std::size_t ngram = 3;     // --spec-ngram: longest suffix n-gram lookup matches
  float draft_min_p = -1;    // --spec-draft-min-p: greedy drafting stops below this confidence (<0: default)
  long tree_width = -1;      // --spec-tree-width: children per tree node (-1: default)
  long tree_nodes = -1;      // --spec-tree-nodes: most nodes of a tree (-1: default)
  float tree_min_p = -1;     // --spec-tree-min-p: least cumulative draft probability of a tree node (<0: default)
  std::string draft_weights = "Q8_0";  // --draft-weights: the type the draft's float matrices run in, or "stored"
};
// The proposer the flags ask for (null for none); `draft_model` keeps the draft model alive. A draft
// model runs on `device` (the target's, resolve_device's answer).
std::unique_ptr<spec::Proposer> make_proposer(const SpecFlags& flags, const Vocab& target_vocab, std::size_t ctx,
                                              KvType kv_type, const SamplingParams& sampling, ThreadPool& pool,
                                              std::unique_ptr<Model>& draft_model, std::size_t& spec_tokens,
                                              const backend::DeviceSpec& device = {});

// The engine's speculation settings from the flags (validated as make_proposer does); the draft
// model, when there is one, is loaded into `draft_model`, on `device`.
void apply_spec_flags(const SpecFlags& flags, const Vocab& target_vocab, EngineOptions& engine, std::unique_ptr<Model>& draft_model,
                      const backend::DeviceSpec& device = {});

// --device, shared by run, serve, bench model and perplexity (device_flags.cpp). Where the model
// will run: the flag parsed (Error on a bad value); the CPU, with a warning on stderr, when it names
// a GPU that this binary or machine cannot use.
backend::DeviceSpec resolve_device(const std::string& flag);
// Loads the model for `device` (resolve_device's answer). On a GPU: in the file's own layout, which
// the device uploads, then placed there, saying so on stderr; under tensor parallelism each rank on
// its own device (backend::device_of_rank).
std::unique_ptr<Model> load_model(std::shared_ptr<const gguf::File> file, std::shared_ptr<parallel::Communicator> tp,
                                  const backend::DeviceSpec& device);
// `promptly devices`: the GPUs this binary can run on, or why there are none.
int devices();

// Tensor parallelism (--tp R, under mpirun -n R): joins the MPI world; null for R = 1. Throws Error
// for R < 1 or a world of another size.
std::shared_ptr<parallel::Communicator> join_tensor_parallel(int ranks);
// Ranks other than 0 of a tensor-parallel command: compute rank 0's forward passes until it is done,
// then report this rank's memory (model_rss_mb: what loading its slices added, < 0: not measured).
int follow_rank0(const Model& model, int threads, double model_rss_mb);

struct RunOptions {
  std::string model;  // empty: the built-in model
  std::string prompt;
  std::string prompt_file;
  GenerateOptions gen;
  int threads = 0;
  bool json = false;
  bool no_bos = false;
  bool parse_special = false;
  std::string kv_type = "f32";
  SpecFlags spec;
  int tp = 1;            // tensor-parallel ranks (started by mpirun -n tp)
  std::string kv_spool;  // the KV spool's directory (empty: none)
  std::string kv_spool_size = "10%";
  std::string json_schema;  // output constrained to this JSON Schema (a file), or
  std::string grammar;      // to this GBNF grammar (a file)
  std::string device = "cpu";  // --device: cpu, cuda or cuda:N
};
int run(const RunOptions& o);

struct InfoOptions {
  std::string model;
  bool tensors = false;
  bool metadata = false;
};
int info(const InfoOptions& o);

struct GenModelOptions {
  std::string preset = "tiny";
  std::string dtype = "F32";
  std::string out;
  std::uint64_t seed = 42;
  std::string chat_template_file;
  int threads = 0;
  int layers = 0;  // > 0: only this many blocks of the preset (a slice of a large model, for benchmarks)
};
int gen_model(const GenModelOptions& o);

struct QuantizeOptions {
  std::string in, out, type;
  int threads = 0;
};
int quantize(const QuantizeOptions& o);

struct PerplexityOptions {
  std::string model;
  std::string text_file;
  std::size_t ctx = 512;
  std::size_t batch = 0;  // 0: one chunk per pass
  long chunks = -1;       // -1: all the text holds
  int threads = 0;
  std::string kv_type = "f16";
  std::string kld_ref;      // reference model evaluated alongside
  std::string save_logits;  // write the reference's top-k here
  std::string kld_base;     // compare against a file written by --save-logits
  std::size_t top_k = 64;
  bool json = false;
  std::string device = "cpu";  // --device: the model (and the reference) run there
};
int perplexity(const PerplexityOptions& o);

struct TokenizeOptions {
  std::string model;  // GGUF (full or vocab-only) or tokenizer.json
  std::string text;
  bool no_bos = false;
  bool parse_special = false;
};
int tokenize(const TokenizeOptions& o);

struct TemplateOptions {
  std::string model;
  std::string template_file;
  std::optional<std::string> bos_token, eos_token;
  std::string messages_file;
  bool add_generation_prompt = false;
};
int render_template(const TemplateOptions& o);

struct BenchTokenizeOptions {
  std::string model;
  std::string file;  // empty: a built-in 1 MB mixed-script text
  int repetitions = 5;
  bool json = false;
};
int bench_tokenize(const BenchTokenizeOptions& o);

struct BenchGrammarOptions {
  std::string vocab;    // GGUF model or vocab file, or a tokenizer.json
  std::string schema;   // a JSON Schema file, or
  std::string grammar;  // a GBNF file
  int walks = 20;       // random walks through the grammar (the first one starts cold)
  int max_tokens = 2000;
  int threads = 0;      // > 0: precompute every position's mask on this many threads first
  std::string samples;  // write each finished walk's text here, one JSON string per line
  std::uint64_t seed = 1;
  bool json = false;
};
int bench_grammar(const BenchGrammarOptions& o);

struct BenchModelOptions {
  std::string model;
  int n_prompt = 512;
  int n_gen = 128;
  int streams = 1;  // sequences decoding at once: each generation step a token of each
  int depth = 0;  // context already cached before each measurement (llama-bench's -d)
  int repetitions = 5;
  int threads = 0;
  double int8_peak_tops = 1.9;  // this machine's int8 VNNI peak (2 cores), the prefill reference
  double device_peak_tflops = 989;  // --device cuda: the GPU's dense FP16/BF16 tensor peak (H100/H200 SXM)
  int tp = 1;                   // tensor-parallel ranks (started by mpirun -n tp)
  std::string sample;           // decode draws its tokens as this named draw does (bench_model_draws), not greedily
  bool json = false;
  std::string device = "cpu";   // --device: cpu, cuda or cuda:N
};
// The ways `bench model --sample=NAME` can draw decode's tokens: the requests users send most.
struct BenchDraw {
  std::string name;
  SamplingParams params;
  std::string what;  // for --help
};
const std::vector<BenchDraw>& bench_model_draws();
int bench_model(const BenchModelOptions& o);

struct BenchSpecOptions {
  std::string model;
  SpecFlags spec;
  std::string modes = "none,ngram,draft,tree";
  std::string prompts = "../shared/models/code/val.txt";
  std::size_t n_prompts = 20;
  std::size_t prompt_bytes = 1200;
  bool repeat = false;  // each prompt ends with its own first lines again (prompt lookup's case)
  int n_gen = 256;
  int repetitions = 3;
  int threads = 0;
  bool json = false;
};
int bench_spec(const BenchSpecOptions& o);

// `bench serve`: an OpenAI-compatible server measured from the client, over HTTP.
struct BenchServeOptions {
  std::string url;
  std::string model;    // empty: the first of the server's /v1/models
  std::string api_key;
  std::string api = "chat";  // chat or completions
  std::string dataset = "random";
  std::size_t num_prompts = 100;
  std::string request_rate = "inf";  // one rate, or a comma-separated sweep
  double burstiness = 1;
  std::size_t max_concurrency = 0;  // 0: no limit
  std::size_t input_len = 1024;     // words
  std::optional<std::size_t> output_len;
  std::size_t turns = 0;  // 0: the dataset's own (4 for multiturn)
  double think_ms = 1000;
  std::optional<double> slo_ttft_ms, slo_tpot_ms, slo_e2el_ms;
  bool ignore_eos = false;
  double timeout_s = 300;
  std::uint64_t seed = 0;
  std::string json_file;
  std::string plot_file;
};
int bench_serve(const BenchServeOptions& o);

// The serving engine's flags, shared by `serve` and `bench engine`.
struct EngineFlags {
  int threads = 0;
  std::string kv_type = "f16";
  std::string kv_memory;           // empty: the engine's default
  std::size_t max_batch_tokens = 512;
  double itl_target_ms = EngineOptions::kDefaultItlTargetMs;  // 0: steps sized by max_batch_tokens alone
  std::string kv_spool;                 // directory of the KV spool; empty or "none": none (serve: see default_kv_spool_dir)
  std::string kv_spool_size = kDefaultSpoolSize;
  static constexpr const char* kDefaultSpoolSize = "10%";
  // Throws Error for an unknown KV type or a malformed memory size.
  EngineOptions to_options() const {
    EngineOptions e;
    if (!kv_spool.empty() && kv_spool != "none") {
      e.kv_spool_dir = kv_spool;
      e.kv_spool_bytes = parse_disk_size(kv_spool_size, kv_spool);
    }
    e.threads = threads;
    e.kv_type = parse_kv_type(kv_type);
    if (!kv_memory.empty()) e.kv_memory = parse_memory_size(kv_memory);
    e.max_batch_tokens = max_batch_tokens;
    e.itl_target_ms = itl_target_ms;
    return e;
  }
};

struct BenchEngineOptions {
  std::string model;
  std::string scenario = "all";
  EngineFlags engine;
  int conversations = 8;           // multiturn
  std::size_t history = 2000;      // multiturn: conversations end past this many tokens
  double think_ms = 2000;          // multiturn: mean of the exponential think time
  std::size_t long_prompt = 4000;  // head-of-line
  int turns = 4;                   // sessions: turns per session
  std::size_t first_turn = 1500;   // sessions: tokens of each session's first turn
  std::size_t system_tokens = 2000;  // burst: the shared system prompt
  int streams = 8;                 // throughput
  int gen_tokens = 128;            // throughput
  int rounds = 3;                  // throughput: alternating 1-stream / many-stream measurements
  std::size_t spool_sessions = 64;    // spool: sessions whose histories overflow the KV memory
  std::size_t spool_history = 1500;   // spool: tokens of each session's history
  std::size_t spool_in_ram = 8;       // spool: histories the KV memory holds
  std::size_t restart_prompt = 2000;  // spool: the prompt re-sent after a restart
  std::uint64_t seed = 1;
  bool json = false;
};
int bench_engine(const BenchEngineOptions& o);

struct ServeOptions {
  std::string model;
  std::string host = "127.0.0.1";
  unsigned short port = 8080;
  EngineFlags engine;
  std::size_t ctx_size = 0;
  std::size_t max_running = 32;
  std::size_t max_queue = 256;
  std::string api_key;
  std::string alias;
  std::string chat_template_file;
  double shutdown_grace_s = 10;
  double drain_delay_s = 0;
  SpecFlags spec;
  std::size_t spec_max_streams = 2;
  bool no_webui = false;
  int tp = 1;  // tensor-parallel ranks (started by mpirun -n tp)
  std::string device = "cpu";  // --device: cpu, cuda or cuda:N
};
int serve(const ServeOptions& o);
// serve's KV spool when --kv-spool is not given: $XDG_CACHE_HOME/promptly/kv-spool, else
// ~/.cache/promptly/kv-spool; empty when neither variable is set.
std::string default_kv_spool_dir();

}  // namespace promptly::cli
