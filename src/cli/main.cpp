// `promptly`: the command line. Flag parsing lives here; each command is in its own file.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "kernels/cpu.h"
#include "parallel/communicator.h"
#include "util/error.h"

using namespace promptly;

namespace {

void add_engine_flags(CLI::App* cmd, promptly::cli::EngineFlags& f) {
  cmd->add_option("-t,--threads", f.threads, "Compute threads (default: all cores)");
  cmd->add_option("--kv-type", f.kv_type, "KV cache element type: f16, q8_0, f32")->capture_default_str();
  cmd->add_option("--kv-memory", f.kv_memory, "KV cache budget, e.g. 4GiB or 25% (default: 8 contexts, at most half the free RAM)");
  cmd->add_option("--max-batch-tokens", f.max_batch_tokens, "Tokens per engine step")->capture_default_str();
  cmd->add_option("--itl-target-ms", f.itl_target_ms,
                  "Size steps, by their measured cost, so that streams get a token about this often while prompts prefill (0: off, steps of "
                  "--max-batch-tokens)")
      ->capture_default_str();
  cmd->add_option("--kv-spool", f.kv_spool,
                  "Directory of the KV spool: cached prompt prefixes are written there and read back instead of recomputed, also after a "
                  "restart; none: off (default: serve ~/.cache/promptly/kv-spool or $XDG_CACHE_HOME/promptly/kv-spool, bench none)");
  cmd->add_option("--kv-spool-size", f.kv_spool_size, "Size cap of the KV spool, e.g. 20GiB or 10% (of its file system)")->capture_default_str();
}

}  // namespace

int main(int argc, char** argv) {
  auto add_spec_flags = [](CLI::App* cmd, cli::SpecFlags& f) {
    cmd->add_option("--draft", f.draft, "Draft model for speculative decoding (same vocabulary as the target)");
    cmd->add_option("--spec", f.mode, "Speculation: none, ngram (prompt lookup), draft (a chain from --draft) or tree (a token tree from --draft) (default: draft with --draft; else none for run and bench, ngram for greedy requests in serve)");
    cmd->add_option("--spec-tokens", f.tokens, "Most guesses one target pass verifies: a chain's length, a tree's depth (default: 3 for draft, 4 for ngram and tree)");
    cmd->add_option("--spec-tree-width", f.tree_width, "Children each tree node offers (default 2)");
    cmd->add_option("--spec-tree-nodes", f.tree_nodes, "Most nodes of a token tree, the guesses one target pass verifies (default 6)");
    cmd->add_option("--spec-tree-min-p", f.tree_min_p, "A tree node's cumulative draft probability must be at least this (default 0.1)");
    cmd->add_option("--spec-ngram", f.ngram, "Longest n-gram prompt lookup matches (it falls back to shorter)")->capture_default_str();
    cmd->add_option("--spec-draft-min-p", f.draft_min_p, "Greedy drafting stops once the draft's top probability is below this (default 0.2)");
    cmd->add_option("--draft-weights", f.draft_weights,
                    "Type the draft's F16/BF16/F32 matrices run in: Q8_0, Q4_0, Q4_K, Q6_K (converted at load; the output stays "
                    "exactly the target's) or stored (as in the file)")
        ->capture_default_str();
  };
  auto add_device_flag = [](CLI::App* cmd, std::string& device) {
    cmd->add_option("--device", device,
                    "Where the model runs: cpu, cuda (the first GPU) or cuda:N. Without a usable GPU (no NVIDIA driver or device, or a "
                    "promptly built without CUDA) it warns and runs on the CPU; `promptly devices` lists the GPUs")
        ->capture_default_str();
  };
  CLI::App app{"Promptly: low-latency LLM inference for GGUF models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "promptly 0.1.0");

  cli::RunOptions run;
  auto* run_cmd = app.add_subcommand("run", "Generate a continuation of a prompt, streaming it to stdout");
  run_cmd->add_option("-m,--model", run.model, "GGUF model file (default: the built-in promptly-code-23m, a 23M-parameter Python code model)");
  run_cmd->add_option("-p,--prompt", run.prompt, "Prompt text (empty: start from BOS alone)");
  run_cmd->add_option("-f,--file", run.prompt_file, "Read the prompt from a file");
  run_cmd->add_option("-n,--n-predict", run.gen.max_tokens, "Tokens to generate (-1: until the context is full)")->capture_default_str();
  run_cmd->add_option("--temp", run.gen.sampling.temperature, "Temperature (0: greedy)")->capture_default_str();
  run_cmd->add_option("--top-k", run.gen.sampling.top_k, "Top-k (0: off)")->capture_default_str();
  run_cmd->add_option("--top-p", run.gen.sampling.top_p, "Top-p (1: off)")->capture_default_str();
  run_cmd->add_option("--min-p", run.gen.sampling.min_p, "Min-p (0: off)")->capture_default_str();
  run_cmd->add_option("--repeat-penalty", run.gen.sampling.repeat_penalty, "Repetition penalty (1: off)")->capture_default_str();
  run_cmd->add_option("--repeat-last-n", run.gen.sampling.repeat_last_n, "Tokens the penalties look back over")->capture_default_str();
  run_cmd->add_option("--presence-penalty", run.gen.sampling.presence_penalty, "Presence penalty")->capture_default_str();
  run_cmd->add_option("--frequency-penalty", run.gen.sampling.frequency_penalty, "Frequency penalty")->capture_default_str();
  run_cmd->add_option("-s,--seed", run.gen.sampling.seed, "Sampling seed")->capture_default_str();
  run_cmd->add_option("-t,--threads", run.threads, "Threads (default: all cores)");
  run_cmd->add_option("-c,--ctx-size", run.gen.ctx_size, "Context size (default: the model's)");
  run_cmd->add_option("-b,--batch-size", run.gen.prefill_chunk, "Prompt tokens per forward pass")->capture_default_str();
  run_cmd->add_flag("--ignore-eos", run.gen.ignore_eos, "Keep generating past end-of-generation tokens");
  run_cmd->add_option("--kv-spool", run.kv_spool, "Directory of the KV spool: a prompt seen before is read back instead of computed");
  run_cmd->add_option("--kv-spool-size", run.kv_spool_size, "Size cap of the KV spool, e.g. 20GiB or 10% (of its file system)")->capture_default_str();
  run_cmd->add_option("--kv-type", run.kv_type, "KV cache element type: f32 (exact), f16 (half the memory) or q8_0 (about a quarter)")->capture_default_str();
  run_cmd->add_option("--json-schema", run.json_schema, "Constrain the output to this JSON Schema (a file)");
  run_cmd->add_option("--grammar", run.grammar, "Constrain the output to this GBNF grammar (a file)");
  run_cmd->add_flag("--no-bos", run.no_bos, "Do not add BOS/EOS to the prompt");
  run_cmd->add_flag("--special", run.parse_special, "Parse control tokens written in the prompt");
  run_cmd->add_flag("--json", run.json, "Print one JSON object with ids, text and timings instead of streaming");
  add_spec_flags(run_cmd, run.spec);
  run_cmd->add_option("--tp", run.tp, "Tensor-parallel ranks: run under mpirun -n R, each rank holding 1/R of every layer")->capture_default_str();
  add_device_flag(run_cmd, run.device);

  cli::InfoOptions info;
  auto* info_cmd = app.add_subcommand("info", "Describe a GGUF model: architecture, shape, tensor types, tokenizer");
  info_cmd->add_option("model", info.model, "GGUF file")->required();
  info_cmd->add_flag("--tensors", info.tensors, "List every tensor");
  info_cmd->add_flag("--metadata", info.metadata, "List every metadata key");

  auto* devices_cmd = app.add_subcommand("devices", "List the GPUs --device can name (cuda:N), or say why there are none");

  cli::GenModelOptions gen;
  auto* gen_cmd = app.add_subcommand("gen-model", "Write a random-weight model with a real shape");
  gen_cmd->add_option("--preset", gen.preset,
                      "tiny, tiny-{qwen2,qwen3,qwen3moe,gemma2,gemma3,phi3,mixtral}, 125m, tinyllama-1.1b, qwen3-0.6b, qwen3-4b, "
                      "gemma3-1b, gemma2-2b, phi3-mini, qwen3-30b-a3b, mixtral-8x7b")
      ->capture_default_str();
  gen_cmd->add_option("--dtype", gen.dtype, "F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q3_K, Q3_K_M, Q4_K, Q4_K_M, Q5_K, Q5_K_M (llama.cpp's mixes, as quantize writes them), Q6_K, IQ4_NL, IQ4_XS")->capture_default_str();
  gen_cmd->add_option("-o,--output", gen.out, "Output GGUF path")->required();
  gen_cmd->add_option("--seed", gen.seed, "Weight seed")->capture_default_str();
  gen_cmd->add_option("--chat-template", gen.chat_template_file, "Jinja chat template file to embed");
  gen_cmd->add_option("-t,--threads", gen.threads, "Threads");
  gen_cmd->add_option("--layers", gen.layers, "Write only this many of the preset's blocks (a slice of a large model)");

  cli::QuantizeOptions quant;
  auto* quant_cmd = app.add_subcommand("quantize", "Convert a GGUF model's matrices to another type");
  quant_cmd->add_option("input", quant.in, "Input GGUF")->required();
  quant_cmd->add_option("output", quant.out, "Output GGUF")->required();
  quant_cmd->add_option("type", quant.type, "Q8_0, Q4_0, Q5_0, Q3_K, Q3_K_M, Q4_K, Q4_K_M, Q5_K, Q5_K_M, Q6_K, IQ4_NL, IQ4_XS, F16, BF16, F32")->required();
  quant_cmd->add_option("-t,--threads", quant.threads, "Threads");

  cli::PerplexityOptions ppl;
  auto* ppl_cmd = app.add_subcommand("perplexity",
                                     "Perplexity of a model on a text (llama.cpp's method), and KL divergence from a reference model");
  ppl_cmd->add_option("-m,--model", ppl.model, "GGUF model (the candidate in KL mode), or promptly-code-23m for the built-in one")->required();
  ppl_cmd->add_option("-f,--file", ppl.text_file, "Text to evaluate (tokenized whole, with BOS)");
  ppl_cmd->add_option("--ctx", ppl.ctx, "Tokens per chunk; the second half of each is scored")->capture_default_str();
  ppl_cmd->add_option("--batch", ppl.batch, "Tokens per forward pass (default: one chunk; a multiple of --ctx runs chunks side by side)");
  ppl_cmd->add_option("--chunks", ppl.chunks, "Chunks to evaluate (-1: all)")->capture_default_str();
  ppl_cmd->add_option("-t,--threads", ppl.threads, "Threads (default: all cores)");
  ppl_cmd->add_option("--kv-type", ppl.kv_type, "KV cache element type: f16 (llama.cpp's default), q8_0, f32")->capture_default_str();
  ppl_cmd->add_option("--kld-ref", ppl.kld_ref, "Reference model (e.g. the F16 file): evaluated on the same chunks, KL divergence reported");
  ppl_cmd->add_option("--save-logits", ppl.save_logits, "Store the reference's (or the model's) top-k log-probabilities in this file");
  ppl_cmd->add_option("--kld-base", ppl.kld_base, "Compare against a file written by --save-logits instead of loading the reference");
  ppl_cmd->add_option("--top-k", ppl.top_k, "Log-probabilities kept per position by --save-logits")->capture_default_str();
  ppl_cmd->add_flag("--json", ppl.json, "Print one JSON object");
  add_device_flag(ppl_cmd, ppl.device);

  cli::TokenizeOptions tokz;
  auto* tok_cmd = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  tok_cmd->add_option("-m,--model", tokz.model, "GGUF model or vocab file, or a tokenizer.json")->required();
  tok_cmd->add_option("text", tokz.text, "Text to tokenize")->required();
  tok_cmd->add_flag("--no-bos", tokz.no_bos, "Do not add BOS/EOS");
  tok_cmd->add_flag("--special", tokz.parse_special, "Parse control tokens written in the text");

  cli::TemplateOptions tmpl;
  auto* tmpl_cmd = app.add_subcommand("template", "Render a chat exactly as the model's chat template formats it");
  tmpl_cmd->add_option("-m,--model", tmpl.model, "GGUF model or vocab file, or a tokenizer.json (with tokenizer_config.json beside it)");
  tmpl_cmd->add_option("--chat-template", tmpl.template_file, "Jinja template file (overrides the model's)");
  tmpl_cmd->add_option("--bos-token", tmpl.bos_token, "bos_token as the template sees it");
  tmpl_cmd->add_option("--eos-token", tmpl.eos_token, "eos_token as the template sees it");
  tmpl_cmd->add_option("--messages", tmpl.messages_file, "JSON array of {\"role\", \"content\"} messages")->required();
  tmpl_cmd->add_flag("--add-generation-prompt", tmpl.add_generation_prompt, "End with the assistant turn's opening");

  auto* bench_cmd = app.add_subcommand("bench", "Measurement programs (median of repetitions; table or --json)");
  bench_cmd->require_subcommand(1);
  cli::BenchTokenizeOptions btok;
  auto* btok_cmd = bench_cmd->add_subcommand("tokenize", "Tokenizer encode/decode throughput");
  btok_cmd->add_option("-m,--model", btok.model, "GGUF model or vocab file, or a tokenizer.json")->required();
  btok_cmd->add_option("--file", btok.file, "Text file to tokenize (default: 1 MB of mixed text)");
  btok_cmd->add_option("-r,--repetitions", btok.repetitions, "Repetitions")->capture_default_str();
  btok_cmd->add_flag("--json", btok.json, "Print JSON");

  cli::BenchGrammarOptions bgram;
  auto* bgram_cmd = bench_cmd->add_subcommand("grammar", "Constrained decoding: token mask time per token over a real vocabulary");
  bgram_cmd->add_option("--vocab", bgram.vocab, "GGUF model or vocab file, or a tokenizer.json")->required();
  bgram_cmd->add_option("--schema", bgram.schema, "JSON Schema file");
  bgram_cmd->add_option("--grammar", bgram.grammar, "GBNF grammar file");
  bgram_cmd->add_option("--walks", bgram.walks, "Random walks through the grammar (the first starts with an empty cache)")->capture_default_str();
  bgram_cmd->add_option("--max-tokens", bgram.max_tokens, "Longest walk")->capture_default_str();
  bgram_cmd->add_option("--precompute", bgram.threads, "Precompute every position's mask on this many threads before the walks (0: lazily, as needed)")->capture_default_str();
  bgram_cmd->add_option("--samples", bgram.samples, "Write each finished walk's text to this file (one JSON string per line), e.g. to check them with a validator");
  bgram_cmd->add_option("--seed", bgram.seed, "Seed of the walks")->capture_default_str();
  bgram_cmd->add_flag("--json", bgram.json, "Print JSON");

  cli::BenchModelOptions bmod;
  auto* bmod_cmd = bench_cmd->add_subcommand("model", "Prompt processing and generation speed against this machine's floors");
  bmod_cmd->add_option("-m,--model", bmod.model, "GGUF model file, or promptly-code-23m for the built-in one")->required();
  bmod_cmd->add_option("-p,--n-prompt", bmod.n_prompt, "Prompt tokens (one batch)")->capture_default_str();
  bmod_cmd->add_option("-n,--n-gen", bmod.n_gen, "Generated tokens (one at a time)")->capture_default_str();
  bmod_cmd->add_option("-s,--streams", bmod.streams,
                       "Sequences generating at once, as continuous batching runs them: each step is a token of each, and the "
                       "generation speed counts them all")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  bmod_cmd->add_option("-d,--depth", bmod.depth, "Tokens already in the KV cache when prompt processing and generation start")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  bmod_cmd->add_option("-r,--repetitions", bmod.repetitions, "Repetitions")->capture_default_str();
  bmod_cmd->add_option("-t,--threads", bmod.threads, "Threads (default: all cores)");
  bmod_cmd->add_option("--int8-peak-tops", bmod.int8_peak_tops, "int8 peak of this machine, for the prefill fraction")->capture_default_str();
  bmod_cmd->add_option("--device-peak-tflops", bmod.device_peak_tflops,
                       "With --device cuda: the GPU's dense FP16/BF16 tensor peak, for the prefill fraction (H100/H200 SXM: 989)")
      ->capture_default_str();
  bmod_cmd->add_option("--tp", bmod.tp, "Tensor-parallel ranks: run under mpirun -n R (each rank gets --threads threads)")->capture_default_str();
  std::string draws_help;
  std::vector<std::string> draw_names;
  for (const cli::BenchDraw& d : cli::bench_model_draws()) {
    draws_help += "; " + d.name + ": " + d.what;
    draw_names.push_back(d.name);
  }
  bmod_cmd->add_flag("--sample{run}", bmod.sample,
                     "Generate drawing tokens as this request would instead of greedily, so that the generation speed includes the "
                     "sampler's time (--sample alone: run)" + draws_help)
      ->check(CLI::IsMember(draw_names));
  add_device_flag(bmod_cmd, bmod.device);
  bmod_cmd->add_flag("--json", bmod.json, "Print JSON");

  cli::BenchSpecOptions bspec;
  auto* bspec_cmd = bench_cmd->add_subcommand("spec", "Single-stream decode with and without speculative decoding, on the same prompts");
  bspec_cmd->add_option("-m,--model", bspec.model, "Target GGUF model, or promptly-code-23m for the built-in one")->required();
  add_spec_flags(bspec_cmd, bspec.spec);
  bspec_cmd->add_option("--modes", bspec.modes, "Modes to compare, comma-separated (none always runs: it is the baseline)")->capture_default_str();
  bspec_cmd->add_option("--prompts", bspec.prompts, "Text file the prompts are cut from, at line starts")->capture_default_str();
  bspec_cmd->add_option("--n-prompts", bspec.n_prompts, "Prompts")->capture_default_str();
  bspec_cmd->add_option("--prompt-bytes", bspec.prompt_bytes, "Bytes per prompt (about 3 per token on code)")->capture_default_str();
  bspec_cmd->add_flag("--repeat", bspec.repeat, "End each prompt with its own first lines again, so the continuation repeats the prompt");
  bspec_cmd->add_option("-n,--n-gen", bspec.n_gen, "Tokens generated per prompt (greedy, EOS ignored)")->capture_default_str();
  bspec_cmd->add_option("-r,--repetitions", bspec.repetitions, "Rounds; the modes alternate within each")->capture_default_str();
  bspec_cmd->add_option("-t,--threads", bspec.threads, "Threads (default: all cores)");
  bspec_cmd->add_flag("--json", bspec.json, "Print JSON");

  cli::BenchEngineOptions beng;
  auto* beng_cmd = bench_cmd->add_subcommand(
      "engine", "The serving engine in chat scenarios: multi-turn, cold sessions, shared prefix, bursts, head-of-line, throughput");
  beng_cmd->add_option("-m,--model", beng.model, "GGUF model file, or promptly-code-23m for the built-in one")->required();
  beng_cmd->add_option("--scenario", beng.scenario, "multiturn, sessions, shared-prefix, burst, head-of-line, throughput, spool or all")
      ->capture_default_str();
  add_engine_flags(beng_cmd, beng.engine);
  beng_cmd->add_option("--conversations", beng.conversations, "multiturn, sessions: concurrent conversations")->capture_default_str();
  beng_cmd->add_option("--history", beng.history, "multiturn: history length each conversation grows to")->capture_default_str();
  beng_cmd->add_option("--think-ms", beng.think_ms, "multiturn, sessions: mean think time between turns")->capture_default_str();
  beng_cmd->add_option("--turns", beng.turns, "sessions: turns per session")->check(CLI::Range(1, 1000))->capture_default_str();
  beng_cmd->add_option("--first-turn", beng.first_turn, "sessions: tokens of each session's first turn")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  beng_cmd->add_option("--system-tokens", beng.system_tokens, "burst: tokens of the shared system prompt")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  beng_cmd->add_option("--long-prompt", beng.long_prompt, "head-of-line: tokens of the long prompt")->capture_default_str();
  beng_cmd->add_option("--streams", beng.streams, "throughput: concurrent streams")->capture_default_str();
  beng_cmd->add_option("--gen-tokens", beng.gen_tokens, "throughput: tokens per stream")->capture_default_str();
  beng_cmd->add_option("--rounds", beng.rounds, "throughput, spool: alternating rounds (throughput: 1 stream and --streams streams; spool: without and with the spool), medians")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  beng_cmd->add_option("--spool-sessions", beng.spool_sessions, "spool: sessions, more than the KV memory holds")->capture_default_str();
  beng_cmd->add_option("--spool-history", beng.spool_history, "spool: tokens of each session's history")->capture_default_str();
  beng_cmd->add_option("--spool-in-ram", beng.spool_in_ram, "spool: histories the KV memory is sized to hold")->capture_default_str();
  beng_cmd->add_option("--restart-prompt", beng.restart_prompt, "spool: tokens of the prompt re-sent after a restart")->capture_default_str();
  beng_cmd->add_option("--seed", beng.seed, "Seed of the random prompts")->capture_default_str();
  beng_cmd->add_flag("--json", beng.json, "Print JSON");

  cli::BenchServeOptions bsrv;
  auto* bsrv_cmd = bench_cmd->add_subcommand(
      "serve", "A running OpenAI-compatible server (Promptly, llama-server, vLLM) under load: TTFT, TPOT, ITL, E2E latency, throughput, goodput");
  bsrv_cmd->add_option("--url", bsrv.url, "The server, http://HOST:PORT")->required();
  bsrv_cmd->add_option("--model", bsrv.model, "Model name sent with each request (default: the first the server lists)");
  bsrv_cmd->add_option("--api-key", bsrv.api_key, "Sent as 'Authorization: Bearer KEY'");
  bsrv_cmd->add_option("--api", bsrv.api, "chat (/v1/chat/completions) or completions (/v1/completions)")
      ->check(CLI::IsMember({"chat", "completions"}))
      ->capture_default_str();
  bsrv_cmd->add_option("--dataset", bsrv.dataset, "random, multiturn, shared-prefix, or a .jsonl/.json file of ShareGPT-style conversations")
      ->capture_default_str();
  bsrv_cmd->add_option("--num-prompts", bsrv.num_prompts, "Conversations to send (multiturn: each --turns requests)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{10000000}))
      ->capture_default_str();
  bsrv_cmd->add_option("--request-rate", bsrv.request_rate,
                       "Conversations started per second (inf: all at once); a comma-separated list sweeps the rates, e.g. 0.5,1,2,4")
      ->capture_default_str();
  bsrv_cmd->add_option("--burstiness", bsrv.burstiness, "Gamma shape of the arrival gaps: 1 Poisson, below 1 burstier, above 1 steadier")
      ->capture_default_str();
  bsrv_cmd->add_option("--max-concurrency", bsrv.max_concurrency, "Most requests in flight (0: no limit)")->capture_default_str();
  bsrv_cmd->add_option("--input-len", bsrv.input_len, "Words per user turn of the synthetic datasets (shared-prefix: of the shared system prompt)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{10000000}))
      ->capture_default_str();
  bsrv_cmd->add_option("--output-len", bsrv.output_len, "max_tokens of each request (default 128; a file's reference answer lengths)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{10000000}));
  bsrv_cmd->add_option("--turns", bsrv.turns, "Turns per conversation (default: 4 for multiturn, a file's every turn)");
  bsrv_cmd->add_option("--think-ms", bsrv.think_ms, "Mean of the exponential pause between a conversation's turns")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  bsrv_cmd->add_option("--slo-ttft-ms", bsrv.slo_ttft_ms, "Goodput counts requests with TTFT at most this")->check(CLI::PositiveNumber);
  bsrv_cmd->add_option("--slo-tpot-ms", bsrv.slo_tpot_ms, "Goodput counts requests with TPOT at most this")->check(CLI::PositiveNumber);
  bsrv_cmd->add_option("--slo-e2el-ms", bsrv.slo_e2el_ms, "Goodput counts requests with end-to-end latency at most this")->check(CLI::PositiveNumber);
  bsrv_cmd->add_flag("--ignore-eos", bsrv.ignore_eos, "Ask for exactly --output-len tokens (ignore_eos: llama.cpp, vLLM and Promptly accept it)");
  bsrv_cmd->add_option("--timeout", bsrv.timeout_s, "Seconds a request may wait for the server before it counts as failed")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  bsrv_cmd->add_option("--seed", bsrv.seed, "Seed of the prompts, arrivals and think times")->capture_default_str();
  bsrv_cmd->add_option("--json", bsrv.json_file, "Write the results (vLLM's field names, per-request lists) to this file");
  bsrv_cmd->add_option("--plot", bsrv.plot_file, "Write an SVG of TTFT p50/p99 and ITL p99 against the request rate");

  cli::ServeOptions srv;
  auto* serve_cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (chat/completions, completions, models, health, metrics)");
  serve_cmd->add_option("-m,--model", srv.model, "GGUF model file (default: the built-in promptly-code-23m)");
  serve_cmd->add_option("--host", srv.host, "Address to bind")->capture_default_str();
  add_spec_flags(serve_cmd, srv.spec);  // serve's default: --spec ngram for greedy requests (spec_flags.cpp)
  serve_cmd->add_option("--spec-max-streams", srv.spec_max_streams, "Speculate only while at most this many streams decode (and no prompt is prefilling)")
      ->capture_default_str();
  serve_cmd->add_option("--port", srv.port, "Port (0: any free port)")->capture_default_str();
  add_engine_flags(serve_cmd, srv.engine);
  serve_cmd->add_option("--tp", srv.tp,
                        "Tensor-parallel ranks: run under mpirun -n R; rank 0 serves HTTP and schedules, every rank holds 1/R of each layer "
                        "(and of the KV cache)")
      ->capture_default_str();
  add_device_flag(serve_cmd, srv.device);
  serve_cmd->add_option("-c,--ctx-size", srv.ctx_size, "Context per request (default: the model's)");
  serve_cmd->add_option("--max-running", srv.max_running, "Requests computed at once")->capture_default_str();
  serve_cmd->add_option("--max-queue", srv.max_queue, "Waiting requests beyond this get 429")->capture_default_str();
  serve_cmd->add_option("--api-key", srv.api_key, "Require 'Authorization: Bearer KEY' on /v1/*");
  serve_cmd->add_option("--alias", srv.alias, "Model name clients use (default: the file name)");
  serve_cmd->add_option("--chat-template", srv.chat_template_file, "Jinja chat template file (overrides the model's)");
  serve_cmd->add_flag("--no-webui", srv.no_webui, "Do not serve the browser chat UI at /");
  serve_cmd->add_option("--shutdown-grace", srv.shutdown_grace_s, "Seconds in-flight requests get on SIGINT/SIGTERM")->capture_default_str();
  serve_cmd->add_option("--drain-delay", srv.drain_delay_s,
                        "Seconds after SIGINT/SIGTERM that /health answers 503 while new requests are still served (behind a load balancer)")
      ->capture_default_str();

  std::string isa;
  app.add_option("--isa", isa, "Force a kernel path: scalar, avx2, avx512, amx (default: the best the CPU has; env PROMPTLY_ISA)");

  CLI11_PARSE(app, argc, argv);
  if (!isa.empty()) {
    try {
      kernels::set_isa(kernels::parse_isa(isa));
    } catch (const Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }

  try {
    if (*run_cmd) return cli::run(run);
    if (*info_cmd) return cli::info(info);
    if (*devices_cmd) return cli::devices();
    if (*gen_cmd) return cli::gen_model(gen);
    if (*quant_cmd) return cli::quantize(quant);
    if (*ppl_cmd) return cli::perplexity(ppl);
    if (*tok_cmd) return cli::tokenize(tokz);
    if (*tmpl_cmd) return cli::render_template(tmpl);
    if (*btok_cmd) return cli::bench_tokenize(btok);
    if (*bgram_cmd) return cli::bench_grammar(bgram);
    if (*bmod_cmd) return cli::bench_model(bmod);
    if (*bspec_cmd) return cli::bench_spec(bspec);
    if (*beng_cmd) return cli::bench_engine(beng);
    if (*bsrv_cmd) return cli::bench_serve(bsrv);
    if (*serve_cmd) return cli::serve(srv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    parallel::abort_world(1);  // with --tp: the other ranks must not wait for this one
    return 1;
  }
  return 0;
}
