// The engine with a KV spool on the real stories260K model: a restarted engine reads a prompt's
// blocks back and answers exactly as it computed them; RAM eviction falls back to the spool;
// damaged blocks are recomputed; requests sharing a spooled prefix read it once; a process killed
// while it writes leaves a spool the next one can use.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <random>

#include "../test_util.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "gguf/gguf.h"

namespace promptly {
namespace {

namespace fs = std::filesystem;

struct Loaded {
  std::shared_ptr<const gguf::File> file;
  Model model;
  Loaded() : file(gguf::File::open(test::shared_model("stories260K.gguf"))), model(file) {}
};

const Loaded& stories() {
  static const Loaded m;
  return m;
}

std::vector<std::int32_t> random_prompt(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> p = {1};
  while (p.size() < n) p.push_back(static_cast<std::int32_t>(3 + rng() % 500));
  return p;
}

struct Answer {
  std::vector<std::int32_t> tokens;
  RequestUsage usage;
};

// Runs the prompts at once (greedy, 12 tokens each) and returns their answers in order.
std::vector<Answer> ask(Engine& engine, const std::vector<std::vector<std::int32_t>>& prompts) {
  // Shared with the callbacks: the engine thread may still be inside one (unlocking the mutex)
  // after the last promise is fulfilled and this function has returned.
  struct State {
    std::mutex mutex;
    std::vector<std::promise<Answer>> done;
    std::vector<Answer> partial;
  };
  auto state = std::make_shared<State>();
  state->done.resize(prompts.size());
  state->partial.resize(prompts.size());
  std::vector<std::future<Answer>> futures;
  for (auto& d : state->done) futures.push_back(d.get_future());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt = prompts[i];
    r.max_tokens = 12;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    r.on_event = [state, i](const EngineEvent& e) {
      std::lock_guard lock(state->mutex);
      if (e.kind == EngineEvent::Kind::Token) {
        state->partial[i].tokens.push_back(e.token);
      } else {
        state->partial[i].usage = e.usage;
        state->done[i].set_value(state->partial[i]);
      }
    };
    engine.submit(std::move(r));
  }
  std::vector<Answer> out;
  for (auto& f : futures) {
    EXPECT_EQ(f.wait_for(std::chrono::seconds(120)), std::future_status::ready);
    out.push_back(f.get());
  }
  return out;
}

EngineOptions spool_options(const std::string& dir) {
  EngineOptions o;
  o.threads = 2;
  o.kv_spool_dir = dir;
  o.itl_target_ms = 0;
  return o;
}

void flush(Engine& engine) { ASSERT_TRUE(engine.flush_spool(SteadyClock::now() + std::chrono::seconds(30))); }

TEST(EngineSpool, ARestartedEngineReadsThePromptBackAndAnswersTheSame) {
  test::TempDir tmp;
  const std::string dir = tmp.file("spool");
  const auto prompt = random_prompt(300, 1);
  Answer cold;
  {
    Engine engine(stories().model, nullptr, spool_options(dir));
    cold = ask(engine, {prompt})[0];
    EXPECT_EQ(cold.usage.cached_tokens, 0u);
    flush(engine);
    EXPECT_GE(engine.spool()->stats().written, 300u / 16);
  }
  Engine engine(stories().model, nullptr, spool_options(dir));
  const Answer warm = ask(engine, {prompt})[0];
  EXPECT_EQ(warm.tokens, cold.tokens);
  EXPECT_EQ(warm.usage.cached_tokens, 288u);  // whole blocks, never the last token
  EXPECT_EQ(engine.stats().spool_hit_blocks, 18u);
  // A follow-up that extends the prompt reuses it as well, now from RAM.
  auto longer = prompt;
  longer.insert(longer.end(), warm.tokens.begin(), warm.tokens.end());
  longer.push_back(42);
  const Answer follow = ask(engine, {longer})[0];
  EXPECT_GE(follow.usage.cached_tokens, 288u);
  EXPECT_EQ(engine.stats().spool_hit_blocks, 18u);
}

TEST(EngineSpool, BlocksEvictedFromRamComeBackFromTheSpool) {
  test::TempDir tmp;
  EngineOptions o = spool_options(tmp.file("spool"));
  // Room for a few hundred tokens: each new prompt evicts the previous ones' blocks.
  const ModelConfig& c = stories().model.config();
  o.kv_memory = 40 * BlockPool::block_bytes(c.n_layer, c.kv_dim(), 16, o.kv_type);
  o.ctx_size = 512;
  Engine engine(stories().model, nullptr, o);
  const auto first = random_prompt(300, 2);
  const Answer a = ask(engine, {first})[0];
  for (std::uint32_t seed = 3; seed < 6; ++seed) ask(engine, {random_prompt(300, seed)});
  EXPECT_GT(engine.stats().evicted_blocks, 0u);
  flush(engine);
  const Answer again = ask(engine, {first})[0];
  EXPECT_EQ(again.tokens, a.tokens);
  EXPECT_EQ(again.usage.cached_tokens, 288u);
  EXPECT_GT(engine.stats().spool_hit_blocks, 0u);
}

TEST(EngineSpool, DamagedBlocksAreRecomputedWithTheSameAnswer) {
  test::TempDir tmp;
  const std::string dir = tmp.file("spool");
  const auto prompt = random_prompt(200, 7);
  Answer cold;
  {
    Engine engine(stories().model, nullptr, spool_options(dir));
    cold = ask(engine, {prompt})[0];
    flush(engine);
  }
  // Flip a byte in the middle of every other block file's data.
  int i = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (i++ % 2) continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-64, std::ios::end);
    const char b = static_cast<char>(f.get());
    f.seekp(-64, std::ios::end);
    f.put(static_cast<char>(b ^ 1));
  }
  Engine engine(stories().model, nullptr, spool_options(dir));
  const Answer warm = ask(engine, {prompt})[0];
  EXPECT_EQ(warm.tokens, cold.tokens);
  EXPECT_LT(warm.usage.cached_tokens, 192u);
  EXPECT_GT(engine.spool()->stats().rejected[static_cast<std::size_t>(SpoolReject::Checksum)], 0u);
  // The recomputed blocks are spooled again: the next engine reads everything.
  flush(engine);
  Engine next(stories().model, nullptr, spool_options(dir));
  EXPECT_EQ(ask(next, {prompt})[0].usage.cached_tokens, 192u);
}

TEST(EngineSpool, RequestsSharingASpooledPrefixReadItOnce) {
  test::TempDir tmp;
  const std::string dir = tmp.file("spool");
  const auto shared = random_prompt(256, 8);
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::int32_t tail = 0; tail < 4; ++tail) {
    auto p = shared;
    for (int k = 0; k < 5; ++k) p.push_back(100 + tail * 7 + k);
    prompts.push_back(p);
  }
  std::vector<Answer> cold;
  {
    Engine engine(stories().model, nullptr, spool_options(dir));
    for (const auto& p : prompts) cold.push_back(ask(engine, {p})[0]);
    flush(engine);
  }
  Engine engine(stories().model, nullptr, spool_options(dir));
  const std::vector<Answer> warm = ask(engine, prompts);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(warm[i].tokens, cold[i].tokens) << i;
    EXPECT_EQ(warm[i].usage.cached_tokens, 256u) << i;
  }
  EXPECT_EQ(engine.spool()->stats().read_blocks, 16u);  // 256 tokens: 16 blocks, each read once
}

TEST(EngineSpool, RunReadsThePromptBackAcrossProcesses) {
  test::TempDir tmp;
  GenerateOptions g;
  g.max_tokens = 10;
  g.sampling.temperature = 0;
  g.ignore_eos = true;
  g.kv_type = KvType::F16;
  const auto prompt = random_prompt(150, 9);
  ThreadPool pool(2);
  const Tokenizer tokenizer(Vocab::from_gguf(*stories().file));
  const GenerateResult plain = generate(stories().model, tokenizer, prompt, g, pool);
  g.kv_spool_dir = tmp.file("spool");
  const GenerateResult first = generate(stories().model, tokenizer, prompt, g, pool);
  const GenerateResult second = generate(stories().model, tokenizer, prompt, g, pool);
  EXPECT_EQ(first.timings.n_spooled, 0u);
  EXPECT_EQ(second.timings.n_spooled, 144u);
  EXPECT_EQ(first.ids, plain.ids);
  EXPECT_EQ(second.ids, plain.ids);
}

// kill -9 at random moments of a `promptly run` that spools a long prompt: whatever the spool
// holds afterwards, the next run answers as without it.
TEST(EngineSpool, AProcessKilledWhileWritingLeavesAUsableSpool) {
  test::TempDir tmp;
  const std::string dir = tmp.file("spool");
  const std::string prompt_file = tmp.file("prompt.txt");
  {
    std::ofstream f(prompt_file);
    for (int i = 0; i < 18; ++i) f << "Once upon a time there was a little girl named Lily. She liked to play outside. ";
  }
  auto run = [&](bool spool) {
    std::string cmd = std::string(PROMPTLY_BINARY) + " run -m " + test::shared_model("stories260K.gguf") + " -f " + prompt_file +
                      " -n 12 --temp 0 --kv-type f16 -t 1 --json" + (spool ? " --kv-spool " + dir : "") + " 2>/dev/null";
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    ::pclose(p);
    return out;
  };
  const std::string reference = run(false);
  ASSERT_NE(reference.find("\"ids\""), std::string::npos);
  std::mt19937 rng(10);
  for (int attempt = 0; attempt < 6; ++attempt) {
    const pid_t child = ::fork();
    if (child == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      ::execl(PROMPTLY_BINARY, PROMPTLY_BINARY, "run", "-m", test::shared_model("stories260K.gguf").c_str(), "-f", prompt_file.c_str(), "-n",
              "150", "--temp", "0", "--ignore-eos", "--kv-type", "f16", "-t", "1", "--kv-spool", dir.c_str(), "--json",
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 200));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
  }
  const std::string after = run(true);
  const auto ids = [](const std::string& json_line) { return json_line.substr(json_line.find("\"ids\""), json_line.find("\"prompt_ids\"") - json_line.find("\"ids\"")); };
  ASSERT_NE(after.find("\"ids\""), std::string::npos) << after;
  EXPECT_EQ(ids(after), ids(reference));
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << e.path();
}

}  // namespace
}  // namespace promptly
