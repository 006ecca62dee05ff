// End-to-end: the promptly binary as a user runs it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../test_util.h"
#include "backend/device.h"
#include "gguf/gguf.h"

namespace promptly {
namespace {

struct Result {
  int status;
  std::string out;
};

// Runs the binary with `args` (shell-quoted by the caller); stderr is folded into out when asked.
Result promptly(const std::string& args, bool with_stderr = false, const std::string& env = "") {
  const std::string cmd = env + " " + std::string(PROMPTLY_BINARY) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = ::popen(cmd.c_str(), "r");
  Result r{-1, {}};
  if (!p) return r;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string stories() { return test::shared_model("stories260K.gguf"); }

TEST(Cli, RunJsonReproducesTheGreedyReference) {
  const Result r = promptly("run -m " + stories() + " -p '' -n 200 --temp 0 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  std::vector<std::int32_t> ref;
  std::istringstream in(test::read_file(test::shared_model("testvectors/stories260K.greedy200.ids")));
  for (std::int32_t id; in >> id;) ref.push_back(id);
  EXPECT_EQ(j["prompt_ids"].get<std::vector<std::int32_t>>(), std::vector<std::int32_t>{1});
  EXPECT_EQ(j["ids"].get<std::vector<std::int32_t>>(), ref);
  EXPECT_EQ(j["text"].get<std::string>(), test::read_file(test::shared_model("testvectors/stories260K.greedy200.txt")));
  for (const char* key : {"load_ms", "ttft_ms", "prompt_tps", "gen_tps"}) {
    ASSERT_TRUE(j["timings"].contains(key)) << key;
    EXPECT_GT(j["timings"][key].get<double>(), 0.0) << key;
  }
}

TEST(Cli, RunStreamsTextAndReportsTimings) {
  const Result r = promptly("run -m " + stories() + " -p 'Once upon a time' -n 20 --temp 0", true);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.rfind("Once upon a time", 0), 0u) << r.out;
  for (const char* s : {"load:", "tokens/s", "time to first token"}) EXPECT_NE(r.out.find(s), std::string::npos) << s;
}

TEST(Cli, SampledRunIsReproducibleWithASeed) {
  const std::string args = "run -m " + stories() + " -p 'The dog' -n 30 --temp 0.9 --seed 11 --json";
  const auto a = nlohmann::json::parse(promptly(args).out), b = nlohmann::json::parse(promptly(args).out);
  EXPECT_EQ(a["ids"], b["ids"]);
  EXPECT_EQ(a["ids"].size(), 30u);
}

TEST(Cli, InfoDescribesTheModel) {
  const Result r = promptly("info " + stories());
  ASSERT_EQ(r.status, 0);
  for (const char* s : {"architecture:  llama", "5 layers, 64 wide, 8 heads (4 KV heads", "F32", "512 tokens"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  }
}

// llama-bench's -d: speeds measured with context already in the cache, as late in a conversation.
TEST(Cli, BenchModelMeasuresAtADepth) {
  const Result r = promptly("bench model -m " + stories() + " -p 16 -n 4 -d 100 -r 2 -t 2 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["depth"].get<int>(), 100);
  EXPECT_GT(j["pp_tps"]["median"].get<double>(), 0.0);
  EXPECT_GT(j["tg_tps"]["median"].get<double>(), 0.0);
  // Prefill's work: the layer matrices for each of the 16 tokens, the output matrix for the last.
  double layer_params = 0, output_params = 0;
  const auto file = gguf::File::open(stories());
  for (const auto& t : file->tensors()) {
    if (t.dims.size() >= 2 && t.name.rfind("blk.", 0) == 0) layer_params += static_cast<double>(t.n_elements);
    if (t.name == "output.weight") output_params = static_cast<double>(t.n_elements);
  }
  ASSERT_GT(output_params, 0.0);
  EXPECT_NEAR(j["pp_ops_per_s"].get<double>() / (2.0 * (layer_params + output_params / 16) * j["pp_tps"]["median"].get<double>()), 1.0, 1e-9);
  const Result table = promptly("bench model -m " + stories() + " -p 16 -n 4 -d 40 -r 1 -t 1");
  ASSERT_EQ(table.status, 0) << table.out;
  EXPECT_NE(table.out.find("| pp16 @ d40 t/s | tg4 @ d40 t/s |"), std::string::npos) << table.out;
  // stories260K's weights are 1 MB; its KV at a mean of 42.5 positions, 27 KB, is 2.6% of a step.
  EXPECT_NE(table.out.find("the floor counts the KV cache each stream's token reads besides the weights: 27.2 KB at the run's mean context of "
                           "42.5 positions, 3% of a step's bytes"),
            std::string::npos)
      << table.out;
  EXPECT_NE(promptly("bench model -m " + stories() + " -d -5").status, 0);
}

// Continuous batching's decode steps: each step a token of each stream, each stream at its own depth.
TEST(Cli, BenchModelGeneratesManyStreamsAtOnce) {
  const Result r = promptly("bench model -m " + stories() + " -p 8 -n 4 -s 3 -d 20 -r 2 -t 2 --sample --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["streams"].get<int>(), 3);
  EXPECT_EQ(j["draw"], "run");
  const double tg = j["tg_tps"]["median"].get<double>();
  ASSERT_GT(tg, 0.0);
  EXPECT_NEAR(j["tg_step_ms"].get<double>(), 1e3 * 3 / tg, 1e-9);
  // The weights are read once a step for all three streams' tokens, and each stream reads its own
  // KV cache: stories260K's 5 layers of 4 KV heads of 8, keys and values in F16, at the mean
  // context of the 4 steps (depth 20, then 21..24 positions seen: 22.5).
  EXPECT_DOUBLE_EQ(j["kv_bytes_per_token"].get<double>(), 22.5 * 5 * 2 * 32 * 2);
  const double step_bytes = j["weight_bytes_per_token"].get<double>() + 3 * j["kv_bytes_per_token"].get<double>();
  EXPECT_NEAR(j["tg_floor_tps"].get<double>() / (3 * j["read_bandwidth_gbs"].get<double>() * 1e9 / step_bytes), 1.0, 1e-9);
  const Result table = promptly("bench model -m " + stories() + " -p 8 -n 4 -s 2 -r 1 -t 1");
  ASSERT_EQ(table.status, 0) << table.out;
  EXPECT_NE(table.out.find("| tg4 x2 streams t/s |"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("2 streams: a generation step is 2 tokens"), std::string::npos) << table.out;
  EXPECT_NE(promptly("bench model -m " + stories() + " -s 0").status, 0);
}

// The decode floor counts the bytes the kernels stream: a Q5_0 matrix's as the Q8_0 it runs as
// (34 bytes a block, not the file's 22).
TEST(Cli, BenchModelFloorCountsWhatTheKernelsRead) {
  test::TempDir dir;
  const std::string q5 = dir.file("q5_0.gguf");
  ASSERT_EQ(promptly("quantize " + stories() + " " + q5 + " Q5_0 -t 1").status, 0);
  const Result r = promptly("bench model -m " + q5 + " -p 0 -n 2 -r 1 -t 1 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto file = gguf::File::open(q5);
  std::uint64_t want = 0, q5_blocks = 0;
  for (const auto& t : file->tensors()) {
    if (t.name == "token_embd.weight" && file->find_tensor("output.weight")) continue;
    want += t.type == DType::Q5_0 ? t.n_elements / 32 * 34 : t.n_bytes;
    q5_blocks += t.type == DType::Q5_0 ? t.n_elements / 32 : 0;
  }
  ASSERT_GT(q5_blocks, 0u);
  EXPECT_EQ(nlohmann::json::parse(r.out)["weight_bytes_per_token"].get<std::uint64_t>(), want);
}

// The draws a server's requests make most, by name: each is its own path through the sampler.
TEST(Cli, BenchModelSamplesAsNamedRequestsDo) {
  for (const std::string name : {"api", "top-p"}) {
    const Result r = promptly("bench model -m " + stories() + " -p 0 -n 4 -s 2 -r 1 -t 1 --json --sample=" + name);
    ASSERT_EQ(r.status, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_TRUE(j["sampled"].get<bool>());
    EXPECT_EQ(j["draw"], name);
    EXPECT_GT(j["tg_tps"]["median"].get<double>(), 0.0);
  }
  const Result greedy = promptly("bench model -m " + stories() + " -p 0 -n 2 -r 1 -t 1 --json");
  ASSERT_EQ(greedy.status, 0) << greedy.out;
  EXPECT_EQ(nlohmann::json::parse(greedy.out)["draw"], "greedy");
  const Result table = promptly("bench model -m " + stories() + " -p 0 -n 2 -r 1 -t 1 --sample=top-p");
  ASSERT_EQ(table.status, 0) << table.out;
  EXPECT_NE(table.out.find("| tg2 sampled (top-p) t/s |"), std::string::npos) << table.out;
  const Result unknown = promptly("bench model -m " + stories() + " -p 0 -n 2 --sample=nucleus", /*with_stderr=*/true);
  EXPECT_NE(unknown.status, 0);
  EXPECT_NE(unknown.out.find("nucleus"), std::string::npos) << unknown.out;
}

TEST(Cli, GenModelQuantizeRunRoundTrip) {
  test::TempDir dir;
  ASSERT_EQ(promptly("gen-model --preset tiny --dtype Q4_0 -o " + dir.file("t.gguf")).status, 0);
  ASSERT_EQ(promptly("quantize " + dir.file("t.gguf") + " " + dir.file("q.gguf") + " Q8_0").status, 0);
  const Result r = promptly("run -m " + dir.file("q.gguf") + " -p hello -n 5 --json --ignore-eos");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"].size(), 5u);
}

TEST(Cli, BadInputGivesAClearErrorAndExitCode) {
  test::TempDir dir;
  {
    std::FILE* f = std::fopen(dir.file("junk.gguf").c_str(), "wb");
    std::fputs("this is not a model", f);
    std::fclose(f);
  }
  Result r = promptly("run -m " + dir.file("junk.gguf") + " -p hi", true);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("not a GGUF file"), std::string::npos) << r.out;
  r = promptly("run -m /nonexistent.gguf", true);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("cannot open '/nonexistent.gguf'"), std::string::npos) << r.out;
  r = promptly("quantize " + stories() + " " + dir.file("x.gguf") + " Q2_K", true);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("supported: F32"), std::string::npos) << r.out;
  r = promptly("run -m " + stories() + " -n 5 -c 4 -p 'a long prompt that does not fit'", true);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("context holds 4"), std::string::npos) << r.out;
  r = promptly("frobnicate", true);
  EXPECT_NE(r.status, 0);
}

// llama-perplexity's -f drops one trailing newline before tokenizing; the counts must agree with it.
TEST(Cli, PerplexityTokenizesTheFileAsLlamaCppDoes) {
  test::TempDir dir;
  std::string text;
  for (int i = 0; i < 12; ++i) text += "Once upon a time there was a little girl. She liked to play.\n";
  {
    std::FILE* f = std::fopen(dir.file("t.txt").c_str(), "wb");
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  const Result r = promptly("perplexity -m " + stories() + " -f " + dir.file("t.txt") + " --ctx 32 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  text.pop_back();
  const Result ids = promptly("tokenize -m " + stories() + " '" + text + "'");
  ASSERT_EQ(ids.status, 0);
  EXPECT_EQ(nlohmann::json::parse(r.out)["text_tokens"].get<std::size_t>(), nlohmann::json::parse(ids.out).size());
}

TEST(Cli, RunWithADraftModelReportsSpeculationAndKeepsTheTokens) {
  const std::string code = test::shared_model("code/");
  const std::string args = "run -m " + code + "code-target-f16.gguf -p 'def fibonacci(n):' -n 40 --temp 0 --json";
  const Result plain = promptly(args);
  const Result fast = promptly(args + " --draft " + code + "code-draft-f16.gguf");
  ASSERT_EQ(plain.status, 0);
  ASSERT_EQ(fast.status, 0) << fast.out;
  const auto a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(fast.out);
  EXPECT_EQ(a["ids"], b["ids"]);
  EXPECT_EQ(b["timings"]["spec"], "draft");
  EXPECT_GT(b["timings"]["spec_accepted"].get<int>(), 0);
  EXPECT_LT(b["timings"]["spec_passes"].get<int>(), 39);
  EXPECT_GT(b["timings"]["accept_rate"].get<double>(), 0.0);
  EXPECT_GT(b["timings"]["spec_propose_ms"].get<double>(), 0.0);
  EXPECT_GT(b["timings"]["target_ms"].get<double>(), 0.0);
  EXPECT_LT(b["timings"]["spec_propose_ms"].get<double>() + b["timings"]["target_ms"].get<double>(), b["timings"]["gen_ms"].get<double>());
  EXPECT_FALSE(a["timings"].contains("spec_passes"));
  const Result ngram = promptly(args + " --spec ngram --spec-ngram 2");
  ASSERT_EQ(ngram.status, 0) << ngram.out;
  EXPECT_EQ(nlohmann::json::parse(ngram.out)["ids"], a["ids"]);
  const Result stored = promptly(args + " --draft " + code + "code-draft-f16.gguf --draft-weights stored");
  ASSERT_EQ(stored.status, 0) << stored.out;
  EXPECT_EQ(nlohmann::json::parse(stored.out)["ids"], a["ids"]);
  const Result tree = promptly(args + " --draft " + code + "code-draft-f16.gguf --spec tree --spec-tokens 5 --spec-tree-width 3 --spec-tree-nodes 10");
  ASSERT_EQ(tree.status, 0) << tree.out;
  const auto t = nlohmann::json::parse(tree.out);
  EXPECT_EQ(t["ids"], a["ids"]);
  EXPECT_EQ(t["timings"]["spec"], "tree");
  EXPECT_GT(t["timings"]["spec_accepted"].get<int>(), 0);
  EXPECT_LT(t["timings"]["spec_passes"].get<int>(), 39);
}

TEST(Cli, BadSpeculationFlagsAreClearErrors) {
  const std::string target = "run -m " + test::shared_model("code/code-target-f16.gguf") + " -p x -n 2 ";
  const std::pair<std::string, std::string> cases[] = {
      {"--draft " + stories(), "differs from the target's at id"},
      {"--draft " + test::shared_model("code/val.txt"), "not a GGUF file"},
      {"--draft /nonexistent.gguf", "cannot open"},
      {"--spec beam", "supported: none, ngram"},
      {"--spec draft", "needs a draft model"},
      {"--spec tree", "--spec tree needs a draft model"},
      {"--spec tree --spec-tree-width 1", "out of range: 2 to 16 children"},
      {"--spec tree --spec-tree-nodes 65", "out of range: 1 to 64 nodes"},
      {"--spec tree --spec-tree-min-p 2", "is a probability"},
      {"--spec ngram --spec-tokens 1000", "out of range: 1 to 64"},
      {"--spec ngram --spec-tokens 0", "out of range: 1 to 64"},
      {"--spec ngram --spec-ngram 0", "--spec-ngram must be between 1 and 64"},
      {"--spec none --draft " + test::shared_model("code/code-draft-f16.gguf"), "turns speculation off"},
      {"--draft " + test::shared_model("code/code-draft-f16.gguf") + " --draft-weights F16", "convert at load to Q8_0, Q4_0, Q4_K or Q6_K, not F16"},
      {"--draft " + test::shared_model("code/code-draft-f16.gguf") + " --draft-weights int3", "is not a type: Q8_0, Q4_0, Q4_K, Q6_K or stored"},
  };
  for (const auto& [flags, message] : cases) {
    const Result r = promptly(target + flags, true);
    EXPECT_EQ(r.status, 1) << flags;
    EXPECT_NE(r.out.find(message), std::string::npos) << flags << ": " << r.out;
  }
}

// Quick start's command: no -m, the built-in code model, and a continuation that is Python.
TEST(Cli, RunWithoutModelUsesTheBuiltinCodeModel) {
  const Result r = promptly("run -p 'def fibonacci(n):' -n 48 --temp 0 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  const std::string text = j["text"].get<std::string>();
  EXPECT_EQ(j["ids"].size(), 48u);
  EXPECT_EQ(text.rfind("\n    ", 0), 0u) << text;  // the body, indented
  EXPECT_NE(text.find("\"\"\""), std::string::npos) << text;  // a docstring, as the model learned
  // The same tokens as the model file the binary was built from.
  const Result from_file = promptly("run -m " + std::string(PROMPTLY_SOURCE_DIR) + "/models/promptly-code-23m-q8_0.gguf -p 'def fibonacci(n):' -n 48 --temp 0 --json");
  ASSERT_EQ(from_file.status, 0);
  EXPECT_EQ(nlohmann::json::parse(from_file.out)["ids"], j["ids"]);
  // Other commands take it by name.
  const Result info = promptly("info promptly-code-23m");
  ASSERT_EQ(info.status, 0);
  EXPECT_NE(info.out.find("Q8_0"), std::string::npos) << info.out;
}

// --device cuda on a machine without a usable GPU: the same command runs, on the CPU, with a warning.
TEST(Cli, DeviceCudaWithoutAGpuWarnsAndRunsOnTheCpu) {
  std::string why;
  if (backend::device_usable(backend::parse_device("cuda"), why)) GTEST_SKIP() << "this machine has a usable GPU";
  const std::string args = "run -m " + stories() + " -n 8 --temp 0 -p 'Once upon a time'";
  const Result cpu = promptly(args), cuda = promptly(args + " --device cuda");
  ASSERT_EQ(cpu.status, 0);
  ASSERT_EQ(cuda.status, 0) << cuda.out;
  EXPECT_EQ(cuda.out, cpu.out);
  const Result warned = promptly(args + " --device cuda", true);
  EXPECT_NE(warned.out.find("warning: --device cuda:0: " + why + "; running on the CPU\n"), std::string::npos) << warned.out;
  EXPECT_EQ(promptly(args, true).out.find("warning"), std::string::npos);
  // `promptly devices` says why there are none, and succeeds.
  const Result devices = promptly("devices");
  EXPECT_EQ(devices.status, 0);
  EXPECT_FALSE(devices.out.empty());
}

TEST(Cli, BadDeviceFlagsAreClearErrors) {
  Result r = promptly("run -m " + stories() + " -n 2 -p x --device tpu", true);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("error: --device 'tpu' is not a device: cpu, cuda or cuda:N"), std::string::npos) << r.out;
  r = promptly("bench model -m " + stories() + " --device cuda:x", true);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("'cuda:x' is not a device"), std::string::npos) << r.out;
  // --device with --tp is the ranks' GPUs: outside mpirun, the world's size is the error.
  r = promptly("run -m " + stories() + " -n 2 -p x --device cuda --tp 2", true);
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(r.out.find("--tp 2 but MPI started 1 rank: run it as mpirun -n 2") != std::string::npos ||
              r.out.find("--tp 2: this promptly was built without MPI") != std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace promptly

namespace promptly {
namespace {

TEST(CliText, TokenizePrintsIdsForGgufAndTokenizerJson) {
  Result r = promptly("tokenize -m " + test::shared_model("vocab/ggml-vocab-llama-spm.gguf") + " 'Hello world'");
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "[1,15043,3186]\n");
  r = promptly("tokenize --no-bos -m " + test::shared_model("tokenizers/llama3/tokenizer.json") + " 'Hello world'");
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "[9906,1917]\n");
  r = promptly("tokenize --no-bos --special -m " + test::shared_model("tokenizers/qwen3/tokenizer.json") + " '<|im_start|>user'");
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "[151644,872]\n");
}

TEST(CliText, TemplateRendersExactlyWithoutTrailingNewline) {
  test::TempDir dir;
  {
    std::FILE* f = std::fopen(dir.file("m.json").c_str(), "wb");
    std::fputs(R"([{"role":"user","content":"Hi"}])", f);
    std::fclose(f);
  }
  Result r = promptly("template --chat-template " + test::shared_model("templates/Qwen-Qwen2.5-7B-Instruct.jinja") + " --messages " +
                      dir.file("m.json") + " --add-generation-prompt");
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(r.out,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // The model's own template and special tokens (Phi-3's vocab GGUF carries one).
  r = promptly("template -m " + test::shared_model("vocab/ggml-vocab-phi-3.gguf") + " --messages " + dir.file("m.json"));
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(r.out.rfind("<s><|user|>\nHi<|end|>\n", 0), 0u) << r.out;  // bos_token from the vocab
  // No template anywhere: ChatML.
  r = promptly("template -m " + test::shared_model("stories260K.gguf") + " --messages " + dir.file("m.json"));
  EXPECT_EQ(r.out, "<|im_start|>user\nHi<|im_end|>\n");
  // A template's raise_exception is a clear error, not a crash.
  {
    std::FILE* f = std::fopen(dir.file("sys.json").c_str(), "wb");
    std::fputs(R"([{"role":"system","content":"S"},{"role":"user","content":"Hi"}])", f);
    std::fclose(f);
  }
  r = promptly("template --chat-template " + test::shared_model("templates/google-gemma-2-2b-it.jinja") + " --messages " +
                   dir.file("sys.json"),
               true);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("rejected the conversation: System role not supported"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace promptly
