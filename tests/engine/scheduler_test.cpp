// The scheduler's step plans, driven directly (no model): which tokens each step computes.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>

namespace promptly {
namespace {

std::unique_ptr<Sequence> sequence(std::uint64_t id, std::size_t prompt_tokens, int priority = 0) {
  Request r;
  r.prompt.resize(prompt_tokens);
  std::iota(r.prompt.begin(), r.prompt.end(), static_cast<std::int32_t>(100 * id));
  r.priority = priority;
  return std::make_unique<Sequence>(id, id, std::move(r));
}

// What the engine does after a step: the chunks advance, sampled ones get a token and decode.
void run(Scheduler& scheduler, const StepPlan& plan) {
  scheduler.commit(plan);
  for (const StepPlan::Chunk& c : plan.chunks) {
    if (!c.sample) continue;
    c.seq->tokens.push_back(7);
    c.seq->state = RequestState::Decoding;
  }
}

std::size_t decode_tokens(const StepPlan& plan) {
  std::size_t n = 0;
  for (const StepPlan::Chunk& c : plan.chunks) n += c.seq->state == RequestState::Decoding;
  return n;
}

// The plan computes one sequence's tokens and nothing else.
void expect_alone(const StepPlan& plan, std::uint64_t id, std::size_t n_tokens) {
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.chunks[0].seq->id, id);
  EXPECT_EQ(plan.batch.size(), n_tokens);
}

struct Fixture {
  KvCache cache = KvCache::with_blocks(1, 8, 64, 4096, KvType::F32);
};

TEST(Scheduler, ShortPromptRunsAloneOnceThenTheOthersGo) {
  Fixture f;
  Scheduler scheduler(f.cache, SchedulerOptions{32, false, 128});
  for (std::uint64_t id = 1; id <= 2; ++id) scheduler.add(sequence(id, 40));
  // Two short prompts at once: the first runs alone...
  StepPlan plan = scheduler.plan(512);
  ASSERT_NO_FATAL_FAILURE(expect_alone(plan, 1, 40));
  run(scheduler, plan);
  // ...then the second goes with the first one's decode token (never two such steps in a row).
  plan = scheduler.plan(512);
  EXPECT_EQ(plan.n_decode, 1u);
  EXPECT_EQ(plan.batch.size(), 41u);
  run(scheduler, plan);
  plan = scheduler.plan(512);
  ASSERT_EQ(decode_tokens(plan), 2u);
  run(scheduler, plan);

  // A short prompt arrives while two sequences decode: its step has only its own tokens...
  scheduler.add(sequence(3, 50));
  plan = scheduler.plan(512);
  EXPECT_EQ(plan.n_decode, 0u);
  ASSERT_NO_FATAL_FAILURE(expect_alone(plan, 3, 50));
  EXPECT_TRUE(plan.chunks[0].sample);
  run(scheduler, plan);
  // ...and the next step has every decoding sequence's token, even with another short prompt waiting.
  scheduler.add(sequence(4, 30));
  plan = scheduler.plan(512);
  EXPECT_EQ(plan.n_decode, 3u);
  EXPECT_EQ(plan.batch.size(), 3u + 30u);
  run(scheduler, plan);
}

TEST(Scheduler, ShortPromptGoesBeforeALongPromptsChunk) {
  Fixture f;
  Scheduler scheduler(f.cache, SchedulerOptions{32, false, 128});
  scheduler.add(sequence(1, 300));
  scheduler.add(sequence(2, 20));
  StepPlan plan = scheduler.plan(512);
  ASSERT_NO_FATAL_FAILURE(expect_alone(plan, 2, 20));
  run(scheduler, plan);
  // The long prompt keeps its place and goes on in the next step, with the short one's decode token.
  plan = scheduler.plan(512);
  EXPECT_EQ(plan.n_decode, 1u);
  EXPECT_EQ(plan.batch.size(), 301u);
}

TEST(Scheduler, ShortPromptArrivingDuringALongPrefillDoesNotWaitForIt) {
  Fixture f;
  Scheduler scheduler(f.cache, SchedulerOptions{32, false, 128});
  scheduler.add(sequence(1, 600));
  StepPlan plan = scheduler.plan(256);
  EXPECT_EQ(plan.batch.size(), 256u);
  run(scheduler, plan);
  // The long prompt's next chunk would take the whole budget: the short prompt goes first, alone.
  scheduler.add(sequence(2, 20));
  plan = scheduler.plan(256);
  ASSERT_NO_FATAL_FAILURE(expect_alone(plan, 2, 20));
  run(scheduler, plan);
  plan = scheduler.plan(256);
  EXPECT_EQ(plan.n_decode, 1u);
  EXPECT_EQ(plan.batch.size(), 256u);
  run(scheduler, plan);
}

TEST(Scheduler, ShortPromptDoesNotGoBeforeALongPromptOfHigherPriority) {
  Fixture f;
  Scheduler scheduler(f.cache, SchedulerOptions{32, false, 128});
  scheduler.add(sequence(1, 600, /*priority=*/5));
  run(scheduler, scheduler.plan(256));
  scheduler.add(sequence(2, 20, /*priority=*/0));
  const StepPlan plan = scheduler.plan(256);
  ASSERT_NO_FATAL_FAILURE(expect_alone(plan, 1, 256));
}

TEST(Scheduler, LongPromptsAndHigherPriorityDecodersKeepMixedSteps) {
  Fixture f;
  Scheduler scheduler(f.cache, SchedulerOptions{32, false, 128});
  scheduler.add(sequence(1, 20, /*priority=*/5));
  run(scheduler, scheduler.plan(512));
  // A prompt longer than the threshold: mixed with the decode token.
  scheduler.add(sequence(2, 300));
  StepPlan plan = scheduler.plan(512);
  EXPECT_EQ(plan.n_decode, 1u);
  EXPECT_EQ(plan.batch.size(), 301u);
  run(scheduler, plan);
  // A short prompt of lower priority than a decoding sequence: mixed too.
  scheduler.add(sequence(3, 10, /*priority=*/0));
  plan = scheduler.plan(512);
  EXPECT_EQ(plan.n_decode, 2u);
  EXPECT_EQ(plan.batch.size(), 12u);
}

TEST(Scheduler, ShortPromptFirstIsOffByDefault) {
  Fixture f;
  Scheduler scheduler(f.cache, SchedulerOptions{32, false});
  scheduler.add(sequence(1, 20));
  run(scheduler, scheduler.plan(512));
  scheduler.add(sequence(2, 10));
  const StepPlan plan = scheduler.plan(512);
  EXPECT_EQ(plan.n_decode, 1u);
  EXPECT_EQ(plan.batch.size(), 11u);
}

}  // namespace
}  // namespace promptly
