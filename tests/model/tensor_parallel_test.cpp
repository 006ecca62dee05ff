// Tensor parallelism: a model split over ranks computes what the whole model computes.
//
// The slicing and the step protocol are checked in one process, the ranks being threads joined by a
// shared-memory group (tests/parallel/thread_group.h, the same collectives as MPI's), on every architecture's
// tiny preset, in batches of several sequences, and under the engine (prefix-cache hits, whose block
// copies the other ranks must repeat). The real thing, `mpirun -n 2 promptly ... --tp 2`, runs at the
// end where this binary was built with MPI and mpirun is installed.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "../test_util.h"
#include "split_model.h"
#include "convert/synthetic_model.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "parallel/communicator.h"
#include "spec/draft_model.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace promptly {
namespace {

using test::SplitModel;
using test::ThreadGroup;

std::shared_ptr<const gguf::File> make_model(const test::TempDir& dir, const std::string& preset, DType type) {
  ThreadPool pool(2);
  const std::string path = dir.file(preset + "-" + std::string(dtype_name(type)) + ".gguf");
  write_synthetic_model(synthetic_preset(preset), type, 5, path, pool);
  return gguf::File::open(path);
}

// Logits of a fixed script of passes: two sequences prefilled in chunks side by side, then decoded
// together, a third joining midway.
std::vector<float> run_script(const Model& m) {
  ThreadPool pool(1);
  KvCache cache = m.make_cache(64, KvType::F32, 3);
  std::vector<float> all, out;
  const auto tok = [&](std::size_t i, int seq) { return static_cast<std::int32_t>((i * 37 + static_cast<std::size_t>(seq) * 101 + 3) % m.config().n_vocab); };
  Batch b;
  for (std::size_t i = 0; i < 12; ++i) b.add(tok(i, 0), static_cast<std::int32_t>(i), 0, i == 11);
  for (std::size_t i = 0; i < 7; ++i) b.add(tok(i, 1), static_cast<std::int32_t>(i), 1, true);
  m.forward(b, cache, pool, out);
  all.insert(all.end(), out.begin(), out.end());
  for (std::size_t step = 0; step < 6; ++step) {
    b.clear();
    b.add(tok(12 + step, 0), static_cast<std::int32_t>(12 + step), 0, true);
    b.add(tok(7 + step, 1), static_cast<std::int32_t>(7 + step), 1, true);
    if (step >= 3) b.add(tok(step, 2), static_cast<std::int32_t>(step - 3), 2, true);
    m.forward(b, cache, pool, out);
    all.insert(all.end(), out.begin(), out.end());
  }
  return all;
}

struct SplitCase {
  std::string preset;
  DType type;
  int ranks;
};
void PrintTo(const SplitCase& c, std::ostream* os) { *os << c.preset << "/" << dtype_name(c.type) << "/tp" << c.ranks; }

class SplitPreset : public ::testing::TestWithParam<SplitCase> {};

TEST_P(SplitPreset, LogitsMatchTheWholeModel) {
  const SplitCase& p = GetParam();
  test::TempDir dir;
  auto file = make_model(dir, p.preset, p.type);
  const std::vector<float> whole = run_script(Model(file));
  std::vector<float> split;
  {
    SplitModel sm(file, p.ranks);
    EXPECT_EQ(sm.model().config().n_head * static_cast<std::uint32_t>(p.ranks), sm.model().full_config().n_head);
    split = run_script(sm.model());
  }
  ASSERT_EQ(split.size(), whole.size());
  double max_diff = 0, max_abs = 0;
  for (std::size_t i = 0; i < whole.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(split[i] - whole[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::fabs(whole[i])));
  }
  // Only the order of the partial sums differs (and, quantized, the activations' blocks are the same).
  EXPECT_LT(max_diff, 2e-4 * std::max(1.0, max_abs)) << "largest logit " << max_abs;
}

INSTANTIATE_TEST_SUITE_P(Presets, SplitPreset,
                         ::testing::Values(SplitCase{"tiny", DType::F32, 2}, SplitCase{"tiny", DType::Q8_0, 2},
                                           SplitCase{"tiny", DType::F32, 4},  // 2 KV heads shared by 4 ranks
                                           SplitCase{"tiny-qwen2", DType::F32, 2}, SplitCase{"tiny-qwen3", DType::F32, 2},
                                           SplitCase{"tiny-qwen3moe", DType::F32, 2}, SplitCase{"tiny-gemma2", DType::F32, 2},
                                           SplitCase{"tiny-gemma3", DType::F32, 2}, SplitCase{"tiny-phi3", DType::F32, 2},
                                           SplitCase{"tiny-mixtral", DType::Q8_0, 2}),
                         [](const auto& info) {
                           std::string n = info.param.preset + "_" + std::string(dtype_name(info.param.type)) + "_tp" + std::to_string(info.param.ranks);
                           for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

// The engine on a split model: prompts that share a prefix ending inside a block make rank 0's
// prefix tree copy that block's rows, which the other ranks must repeat; the greedy answers are
// those of the whole model.
TEST(TensorParallel, EngineAnswersAsTheWholeModel) {
  test::TempDir dir;
  auto file = make_model(dir, "tiny", DType::F32);
  const auto whole = test::answers_with_shared_prefixes(Model(file));
  SplitModel sm(file, 2);
  EXPECT_EQ(test::answers_with_shared_prefixes(sm.model()), whole);
}

// A token tree in one pass on a split model: every rank's heads attend over the tree's context and
// add their ancestors (the step carries the nodes' slots, contexts and ancestor masks); the logits
// are the whole model's.
std::vector<float> run_tree(const Model& m) {
  ThreadPool pool(1);
  KvCache cache = m.make_cache(96, KvType::F32, 1);
  const auto V = m.config().n_vocab;
  std::vector<float> all, out;
  Batch b;
  constexpr std::int32_t C = 21;
  for (std::int32_t i = 0; i + 1 < C; ++i) b.add(static_cast<std::int32_t>((i * 37 + 3) % V), i, 0, false);
  m.forward(b, cache, pool, out);
  b.clear();
  b.add(static_cast<std::int32_t>(((C - 1) * 37 + 3) % V), C - 1, 0, true);
  // Parents by node index (-1: the context's last token): branches of different depths.
  const std::vector<int> parents = {-1, -1, -1, 0, 0, 1, 3, 3, 6};
  std::vector<std::uint64_t> ancestors(parents.size());
  std::vector<std::int32_t> depth(parents.size());
  for (std::size_t i = 0; i < parents.size(); ++i) {
    const int p = parents[i];
    ancestors[i] = (std::uint64_t{1} << i) | (p >= 0 ? ancestors[static_cast<std::size_t>(p)] : 0);
    depth[i] = p >= 0 ? depth[static_cast<std::size_t>(p)] + 1 : 1;
    b.add_tree_node(static_cast<std::int32_t>((7 * i + 5) % V), 0, C, static_cast<std::int32_t>(i), depth[i], ancestors[i], true);
  }
  m.forward(b, cache, pool, out);
  all.insert(all.end(), out.begin(), out.end());
  // The accepted path 0 -> 3 -> 6 moves into place (copies the other ranks repeat), then decoding
  // goes on from it.
  const std::size_t path[] = {0, 3, 6};
  for (std::size_t j = 0; j < 3; ++j) cache.move_position(0, C + path[j], C + j);
  cache.set_length(0, C + 3);
  b.clear();
  b.add(17, C + 3, 0, true);
  m.forward(b, cache, pool, out);
  all.insert(all.end(), out.begin(), out.end());
  return all;
}

TEST(TensorParallel, TokenTreeLogitsMatchTheWholeModel) {
  test::TempDir dir;
  for (const auto& [preset, type] : {std::pair{std::string("tiny"), DType::F32}, std::pair{std::string("tiny-qwen3"), DType::Q8_0}}) {
    auto file = make_model(dir, preset, type);
    const std::vector<float> whole = run_tree(Model(file));
    std::vector<float> split;
    {
      SplitModel sm(file, 2);
      split = run_tree(sm.model());
    }
    ASSERT_EQ(split.size(), whole.size()) << preset;
    double max_diff = 0, max_abs = 0;
    for (std::size_t i = 0; i < whole.size(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(split[i] - whole[i])));
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(whole[i])));
    }
    EXPECT_LT(max_diff, 2e-4 * std::max(1.0, max_abs)) << preset << ": largest logit " << max_abs;
  }
}

// Greedy generation with a token-tree proposer on a split model: rank 0 moves each accepted path's
// K/V into place (KvCache::move_position -> BlockPool::copy_row), the other rank repeats those row
// copies from the step message, and the tokens are the whole model's (and plain decoding's).
TEST(TensorParallel, TokenTreeGenerationRepeatsTheMovesOnEveryRank) {
  test::TempDir dir;
  auto file = make_model(dir, "tiny", DType::F32);
  ThreadPool pool(1);
  const Model draft_model(file);  // the model drafts for itself: most guesses are accepted, off the first branch too
  const Tokenizer tokenizer(Vocab::from_gguf(*file));
  std::vector<std::int32_t> prompt;
  for (int i = 0; i < 30; ++i) prompt.push_back(3 + (i * 13) % 500);
  GenerateOptions g;
  g.max_tokens = 40;
  g.sampling.temperature = 0;
  g.ignore_eos = true;
  g.kv_type = KvType::F32;
  const auto run = [&](const Model& target, bool tree) {
    spec::DraftOptions d;
    d.sampling.temperature = 0;
    d.kv_type = KvType::F32;
    d.tree_width = 3;
    d.tree_depth = 4;
    d.tree_min_p = 0.0f;
    spec::DraftModelProposer proposer(draft_model, d, pool);
    GenerateOptions o = g;
    if (tree) {
      o.proposer = &proposer;
      o.spec_tokens = 12;
    }
    return generate(target, tokenizer, prompt, o, pool);
  };
  const GenerateResult plain = run(Model(file), false);
  const GenerateResult whole = run(Model(file), true);
  EXPECT_EQ(whole.ids, plain.ids);
  EXPECT_GT(whole.timings.spec_accepted, 10u);
  SplitModel sm(file, 2);
  const GenerateResult split = run(sm.model(), true);
  EXPECT_EQ(split.ids, whole.ids);
  EXPECT_EQ(split.timings.spec_accepted, whole.timings.spec_accepted);
}

TEST(TensorParallel, StepMessageRoundTripsAndRejectsGarbage) {
  tensor_parallel::Step s;
  s.cache_id = 77;
  s.cache = {9, 100, 1, 16, 64};
  s.batch.add(5, 0, 3, false);
  s.batch.add(6, 1, 3, true);
  s.sequences.push_back({3, 0, {4, 8}});
  s.batch.add_tree_node(9, 3, 2, 0, 1, 0b1, true);
  s.batch.add_tree_node(10, 3, 2, 1, 2, (std::uint64_t{1} << 63) | 0b10, true);  // the top bit survives the int64 words
  s.copies.push_back({1, 0, 2, 0, 7});
  s.copies.push_back({4, 5, 8, 2, 1});
  const tensor_parallel::Step back = tensor_parallel::Step::decode(s.encode());
  EXPECT_EQ(back.cache_id, 77u);
  EXPECT_TRUE(back.cache == s.cache);
  EXPECT_EQ(back.batch.tokens, s.batch.tokens);
  EXPECT_EQ(back.batch.positions, s.batch.positions);
  EXPECT_EQ(back.batch.want_logits, s.batch.want_logits);
  EXPECT_EQ(back.batch.kv_slots, s.batch.kv_slots);
  EXPECT_EQ(back.batch.tree_context, s.batch.tree_context);
  EXPECT_EQ(back.batch.tree_ancestors, s.batch.tree_ancestors);
  ASSERT_EQ(back.sequences.size(), 1u);
  EXPECT_EQ(back.sequences[0].blocks, (std::vector<int>{4, 8}));
  ASSERT_EQ(back.copies.size(), 2u);
  EXPECT_EQ(back.copies[0].n_rows, 7u);
  EXPECT_EQ(back.copies[1].from, 4);
  EXPECT_EQ(back.copies[1].from_slot, 5u);
  EXPECT_EQ(back.copies[1].to, 8);
  EXPECT_EQ(back.copies[1].to_slot, 2u);
  EXPECT_EQ(back.copies[1].n_rows, 1u);
  std::vector<std::int64_t> words = s.encode();
  words.pop_back();
  EXPECT_THROW(tensor_parallel::Step::decode(words), Error);
  EXPECT_THROW(tensor_parallel::Step::decode({99}), Error);
}

TEST(TensorParallel, ModelsThatDoNotSplitSayWhy) {
  test::TempDir dir;
  auto file = make_model(dir, "tiny", DType::F32);  // 4 heads, 2 KV heads
  ThreadGroup three(3);
  try {
    Model m(file, three.rank(0));
    FAIL() << "4 heads split over 3 ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 attention heads"), std::string::npos) << e.what();
  }
  auto q4k = make_model(dir, "tiny", DType::Q4_K);  // 128 columns a rank of 256-element blocks
  ThreadGroup two(2);
  try {
    Model m(q4k, two.rank(0));
    FAIL() << "Q4_K columns split inside a block";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blocks"), std::string::npos) << e.what();
  }
}

// ---- The real thing: mpirun -n 2 ----------------------------------------------------------------

std::string shell(const std::string& cmd) {
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

bool can_run_mpi() {
  return parallel::mpi_available() && std::system("command -v mpirun >/dev/null 2>&1") == 0;
}

// mpirun as root (CI) needs its consent; --oversubscribe lets 2 ranks start whatever slot count it
// sees; OpenMPI's own allocations are not ours to leak-check (the ASan build runs this too); containers
// may forbid the cross-process reads of its single-copy transfers, which these small messages do not need.
const char* kMpirun = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun --oversubscribe -n 2 ";

nlohmann::json json_line(const std::string& out) {
  const std::size_t at = out.find("{\"");
  if (at == std::string::npos) return nullptr;
  return nlohmann::json::parse(out.substr(at, out.find('\n', at) - at), nullptr, false);
}

TEST(TensorParallelMpi, TwoRanksAnswerAsOneAndHoldHalfTheWeightsEach) {
  if (!can_run_mpi()) GTEST_SKIP() << "needs a promptly built with MPI and mpirun (Debian: libopenmpi-dev openmpi-bin)";
  test::TempDir dir;
  // Big enough that the weights dominate each process's memory: 125m's shape in Q8_0 (~160 MB).
  const std::string model = dir.file("125m.gguf");
  {
    ThreadPool pool(2);
    write_synthetic_model(synthetic_preset("125m"), DType::Q8_0, 3, model, pool);
  }
  const auto run = [](const std::string& cmd) {
    const std::string out = shell(cmd);
    const nlohmann::json j = json_line(out);
    EXPECT_TRUE(j.is_object()) << out;
    return std::pair{j.is_object() ? j : nlohmann::json::object(), out};
  };
  // The same tokens: on the trained stories260K (random weights' logits are too flat: any change in
  // the order of a sum can flip their argmax).
  const std::string stories = std::string(" run -m ") + test::shared_model("stories260K.gguf") + " -p 'Once upon a time' -n 48 --temp 0 -t 1 --json";
  const auto [one, one_out] = run(std::string(PROMPTLY_BINARY) + stories + " 2>&1");
  const auto [two, two_out] = run(std::string(kMpirun) + PROMPTLY_BINARY + stories + " --tp 2 2>&1");
  ASSERT_TRUE(one.contains("ids") && two.contains("ids"));
  EXPECT_EQ(two["ids"], one["ids"]);
  EXPECT_EQ(two["timings"]["tp"], 2);
  // Each rank holds about half of the weights: what loading the model added to each process's
  // resident memory, rank 0 in its JSON and rank 1 in its last line.
  const std::string args = std::string(" run -m ") + model + " -p 'Once upon a time' -n 8 --temp 0 -t 1 --json";
  const auto [whole, whole_out] = run(std::string(PROMPTLY_BINARY) + args + " 2>&1");
  const auto [split, split_out] = run(std::string(kMpirun) + PROMPTLY_BINARY + args + " --tp 2 2>&1");
  ASSERT_TRUE(whole.contains("timings") && split.contains("timings"));
  const double whole_mb = whole["timings"]["model_rss_mb"], rank0_mb = split["timings"]["model_rss_mb"];
  const std::string mark = "rank 1 of 2 done: ";
  const std::size_t at = split_out.find(mark);
  ASSERT_NE(at, std::string::npos) << split_out;
  const std::size_t model_at = split_out.find("model ", at);
  ASSERT_NE(model_at, std::string::npos) << split_out;
  const double rank1_mb = std::stod(split_out.substr(model_at + 6));
  for (const double rank_mb : {rank0_mb, rank1_mb}) {
    EXPECT_LT(rank_mb, 0.65 * whole_mb) << "whole model " << whole_mb << " MB\n" << split_out;
    EXPECT_GT(rank_mb, 0.35 * whole_mb) << "whole model " << whole_mb << " MB\n" << split_out;
  }
}

TEST(TensorParallelMpi, AWorldOfTheWrongSizeIsAClearError) {
  if (!can_run_mpi()) GTEST_SKIP() << "needs a promptly built with MPI and mpirun";
  const std::string out = shell(std::string(kMpirun) + PROMPTLY_BINARY + " run -m " + test::shared_model("stories260K.gguf") +
                                " -n 2 --tp 3 2>&1; echo exit=$?");
  EXPECT_NE(out.find("--tp 3 but MPI started 2 ranks"), std::string::npos) << out;
  EXPECT_EQ(out.find("exit=0"), std::string::npos) << out;
}

}  // namespace
}  // namespace promptly
