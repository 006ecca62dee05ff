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

// Sequence 1 (a 20-token prompt) run through its prompt: the plan of its first decode step.
StepPlan next_decode_step(Scheduler& scheduler) {
  scheduler.add(sequence(1, 20));
  run(scheduler, scheduler.plan(512));
  return scheduler.plan(512);
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

TEST(Scheduler, AStepGivesWayToAFollowUpAtMostEveryOtherStep) {
  Fixture f;
  Scheduler scheduler(f.cache, SchedulerOptions{32, /*prefix_cache=*/true, 128});
  scheduler.add(sequence(1, 300));
  run(scheduler, scheduler.plan(512));
  scheduler.add(sequence(2, 20));
  StepPlan plan = scheduler.plan(512);
  ASSERT_NO_FATAL_FAILURE(expect_alone(plan, 2, 20));
  EXPECT_FALSE(plan.may_give_way);  // a step that runs a short prompt alone does not give way itself
  run(scheduler, plan);
  plan = scheduler.plan(512);
  ASSERT_EQ(decode_tokens(plan), 2u);
  EXPECT_FALSE(plan.may_give_way);  // nor does the step after it: the decoders waited once already
  run(scheduler, plan);

  // A step of decode tokens only gives way to a short prompt...
  plan = scheduler.plan(512);
  ASSERT_EQ(decode_tokens(plan), 2u);
  EXPECT_TRUE(plan.may_give_way);
  EXPECT_TRUE(scheduler.gives_way(plan, *sequence(6, 40)));
  EXPECT_FALSE(scheduler.gives_way(plan, *sequence(5, 200)));
  EXPECT_FALSE(scheduler.gives_way(plan, *sequence(7, 40, /*priority=*/-1)));
  // ...which a follow-up turn is, over its cached history: sequence 1's 300-token prompt is in the
  // prefix cache (every full block it computed was offered).
  std::unique_ptr<Sequence> follow_up = sequence(8, 0);
  follow_up->tokens = scheduler.find(1)->tokens;
  for (std::int32_t t = 0; t < 40; ++t) follow_up->tokens.push_back(9000 + t);
  EXPECT_TRUE(scheduler.gives_way(plan, *follow_up));
  follow_up->tokens.insert(follow_up->tokens.begin(), 1);  // the same tokens, shifted: nothing cached
  EXPECT_FALSE(scheduler.gives_way(plan, *follow_up));

  // Stopped: nothing committed; the next plan runs the newcomer alone and gives way to nobody, nor
  // does the one after it.
  scheduler.interrupted();
  scheduler.add(sequence(6, 40));
  plan = scheduler.plan(512);
  ASSERT_NO_FATAL_FAILURE(expect_alone(plan, 6, 40));
  EXPECT_FALSE(plan.may_give_way);
  run(scheduler, plan);
  plan = scheduler.plan(512);
  ASSERT_EQ(decode_tokens(plan), 3u);
  EXPECT_FALSE(plan.may_give_way);
  run(scheduler, plan);
  // A step that finishes a prompt (someone's first token) does not give way.
  scheduler.add(sequence(5, 200));
  plan = scheduler.plan(512);
  EXPECT_EQ(plan.batch.size(), 3u + 200u);
  EXPECT_FALSE(plan.may_give_way);
  run(scheduler, plan);
  // Stopped with no one to run alone: the next step still does not give way.
  plan = scheduler.plan(512);
  EXPECT_TRUE(plan.may_give_way);
  scheduler.interrupted();
  plan = scheduler.plan(512);
  EXPECT_EQ(decode_tokens(plan), 4u);
  EXPECT_FALSE(plan.may_give_way);
  run(scheduler, plan);
  EXPECT_TRUE(scheduler.plan(512).may_give_way);
}

TEST(Scheduler, AStepGivesWayOnlyToWhatTheNextPlanAdmits) {
  {  // No free running slot.
    Fixture f;
    Scheduler scheduler(f.cache, SchedulerOptions{1, false, 128});
    const StepPlan plan = next_decode_step(scheduler);
    ASSERT_TRUE(plan.may_give_way);
    EXPECT_FALSE(scheduler.gives_way(plan, *sequence(2, 10)));
  }
  Fixture f;
  Scheduler scheduler(f.cache, SchedulerOptions{32, false, 128});
  const StepPlan plan = next_decode_step(scheduler);
  ASSERT_TRUE(plan.may_give_way);
  EXPECT_TRUE(scheduler.gives_way(plan, *sequence(3, 10)));
  // Someone already waiting would be admitted first, unless the newcomer outranks it.
  scheduler.add(sequence(2, 500));
  EXPECT_FALSE(scheduler.gives_way(plan, *sequence(3, 10)));
  EXPECT_TRUE(scheduler.gives_way(plan, *sequence(4, 10, /*priority=*/1)));
}

TEST(Scheduler, NoStepGivesWayWithoutShortPromptsFirst) {
  Fixture f;
  Scheduler scheduler(f.cache, SchedulerOptions{32, false});
  const StepPlan plan = next_decode_step(scheduler);
  EXPECT_FALSE(plan.may_give_way);
  EXPECT_FALSE(scheduler.gives_way(plan, *sequence(2, 10)));
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
