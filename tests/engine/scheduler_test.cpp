// The scheduler's step plans, driven directly (no model): which tokens each step computes.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <memory>
#include <chrono>
#include <numeric>
#include <vector>

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


// Shortest remaining prefill first: the chunks go to the prompt closest to its first token.
SchedulerOptions shortest_first() {
  SchedulerOptions o{32, false};
  o.shortest_first = true;
  return o;
}

std::vector<std::uint64_t> chunk_ids(const StepPlan& plan) {
  std::vector<std::uint64_t> ids;
  for (const StepPlan::Chunk& c : plan.chunks) ids.push_back(c.seq->id);
  return ids;
}

TEST(Scheduler, ShortestRemainingPrefillGoesFirst) {
  Fixture f;
  SchedulerOptions o = shortest_first();
  o.short_prompt_tokens = 0;  // no short class: shortest first throughout
  Scheduler scheduler(f.cache, o);
  scheduler.add(sequence(1, 300));
  scheduler.add(sequence(2, 50));
  scheduler.add(sequence(3, 120));
  StepPlan plan = scheduler.plan(64);
  EXPECT_EQ(chunk_ids(plan), (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(plan.chunks[0].n_tokens, 50u);
  EXPECT_TRUE(plan.chunks[0].sample);
  EXPECT_EQ(plan.chunks[1].n_tokens, 14u);
  run(scheduler, plan);
  // Sequence 3 (106 left) stays ahead of sequence 1 (300), behind the new decode token.
  plan = scheduler.plan(64);
  EXPECT_EQ(chunk_ids(plan), (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(plan.n_decode, 1u);
}

TEST(Scheduler, EqualPromptsCompleteOneAfterAnother) {
  // A burst of equal prompts: by arrival, each finished before the next starts, instead of all
  // advancing together and finishing together.
  Fixture f;
  Scheduler scheduler(f.cache, shortest_first());
  for (std::uint64_t id = 1; id <= 4; ++id) scheduler.add(sequence(id, 100));
  std::vector<std::uint64_t> finished;
  for (int step = 0; step < 12 && finished.size() < 4; ++step) {
    const StepPlan plan = scheduler.plan(StepBudget{64});
    for (const StepPlan::Chunk& c : plan.chunks) {
      if (c.sample && c.seq->state == RequestState::Prefilling) finished.push_back(c.seq->id);
    }
    std::size_t started_unfinished = 0;  // prompts with computed tokens but not done, after this step
    run(scheduler, plan);
    for (Sequence* s : scheduler.all()) started_unfinished += s->state == RequestState::Prefilling && s->n_computed > 0;
    EXPECT_LE(started_unfinished, 1u) << "step " << step;
  }
  EXPECT_EQ(finished, (std::vector<std::uint64_t>{1, 2, 3, 4}));
}

TEST(Scheduler, ShortestFirstStillServesHigherPriorityFirst) {
  Fixture f;
  Scheduler scheduler(f.cache, shortest_first());
  scheduler.add(sequence(1, 300, /*priority=*/1));
  scheduler.add(sequence(2, 20));
  const StepPlan plan = scheduler.plan(64);
  EXPECT_EQ(chunk_ids(plan), (std::vector<std::uint64_t>{1}));
}

std::unique_ptr<Sequence> arrived(std::unique_ptr<Sequence> s, double seconds_ago) {
  s->times.arrival = SteadyClock::now() - std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(seconds_ago));
  return s;
}

TEST(Scheduler, AgingLetsAnOldLongPromptGoBeforeANewShorterOne) {
  SchedulerOptions o = shortest_first();
  o.aging = 0.1;
  // 1 ms a token: a second waited counts as 100 tokens done.
  const StepCostModel cost(0.001, 0.001, 0);
  const StepBudget budget{64, 0, &cost};
  Fixture f;
  Scheduler scheduler(f.cache, o);
  scheduler.add(arrived(sequence(1, 600), 1.0));  // 600 - 100: behind a fresh 400-token prompt
  scheduler.add(arrived(sequence(2, 400), 0.0));
  EXPECT_EQ(chunk_ids(scheduler.plan(budget)).front(), 2u);
  Fixture g;
  Scheduler aged(g.cache, o);
  aged.add(arrived(sequence(1, 600), 3.0));  // 600 - 300: ahead of it
  aged.add(arrived(sequence(2, 400), 0.0));
  EXPECT_EQ(chunk_ids(aged.plan(budget)).front(), 1u);
}

TEST(Scheduler, ShortPromptsGoBeforeAnAgedLongOne) {
  SchedulerOptions o = shortest_first();
  o.starvation_s = 1000;
  const StepCostModel cost(0.001, 0.001, 0);
  Fixture f;
  Scheduler scheduler(f.cache, o);
  scheduler.add(arrived(sequence(1, 600), 30.0));  // aged far below a short prompt's length
  scheduler.add(arrived(sequence(2, 200), 0.0));
  const StepPlan plan = scheduler.plan(StepBudget{64, 0, &cost});
  EXPECT_EQ(chunk_ids(plan), (std::vector<std::uint64_t>{2}));
}

TEST(Scheduler, ALongPromptShortOnesKeptWaitingGetsAStep) {
  SchedulerOptions o = shortest_first();
  o.starvation_s = 0.5;
  Fixture f;
  Scheduler scheduler(f.cache, o);
  scheduler.add(arrived(sequence(1, 600), 1.0));  // no chunk for a second
  scheduler.add(arrived(sequence(2, 200), 0.0));
  StepPlan plan = scheduler.plan(64);
  EXPECT_EQ(chunk_ids(plan), (std::vector<std::uint64_t>{1}));
  run(scheduler, plan);
  // It just had its chunk: the short prompt goes first again.
  plan = scheduler.plan(64);
  EXPECT_EQ(chunk_ids(plan), (std::vector<std::uint64_t>{2}));
}

TEST(Scheduler, TimeBudgetSizesTheChunks) {
  Fixture f;
  Scheduler scheduler(f.cache, shortest_first());
  const StepCostModel cost(0.010, 0.001, 0);  // 10 ms + 1 ms a token
  const StepBudget budget{512, 0.0505, &cost};  // 40 tokens' 50 ms and a rounding margin
  scheduler.add(sequence(1, 20));
  StepPlan plan = scheduler.plan(budget);
  EXPECT_EQ(plan.batch.size(), 20u);
  run(scheduler, plan);
  scheduler.add(sequence(2, 500));
  plan = scheduler.plan(budget);
  // 50 ms: 40 tokens, one of them the decode token.
  EXPECT_EQ(plan.n_decode, 1u);
  EXPECT_EQ(plan.batch.size(), 40u);
  EXPECT_LE(cost.predict(40, 0), budget.max_seconds);
}

TEST(Scheduler, TimeBudgetCountsAttention) {
  Fixture f;
  Scheduler scheduler(f.cache, shortest_first());
  const StepCostModel cost(0.010, 0.001, 1e-5);  // and 10 us per attended position
  const StepBudget budget{512, 0.050, &cost};
  scheduler.add(sequence(1, 900));
  StepPlan plan = scheduler.plan(budget);
  const std::size_t first = plan.batch.size();
  for (int i = 0; i < 10; ++i) {
    run(scheduler, plan);
    plan = scheduler.plan(budget);
  }
  // Deeper into the prompt each token attends to more positions: smaller chunks, still in budget.
  EXPECT_LT(plan.batch.size(), first);
  const std::size_t start = static_cast<std::size_t>(plan.batch.positions.front());
  EXPECT_LE(cost.predict(static_cast<double>(plan.batch.size()), StepCostModel::attended_by(start, plan.batch.size())), 0.050);
}

TEST(Scheduler, ManyDecodersStillLeavePrefillAsMuchTimeAsTheirs) {
  Fixture f;
  Scheduler scheduler(f.cache, shortest_first());
  const StepCostModel cost(0.0, 0.001, 0);
  for (std::uint64_t id = 1; id <= 30; ++id) scheduler.add(sequence(id, 10));
  run(scheduler, scheduler.plan(512));
  scheduler.add(sequence(31, 500));
  // 30 decode tokens take 30 ms, over the 20 ms asked for: the prompt still gets 30 ms.
  const StepPlan plan = scheduler.plan(StepBudget{512, 0.020, &cost});
  EXPECT_EQ(plan.n_decode, 30u);
  EXPECT_EQ(plan.batch.size(), 60u);
}

TEST(Scheduler, APromptAloneInItsStepGetsATokenWhateverTheBudget) {
  Fixture f;
  Scheduler scheduler(f.cache, shortest_first());
  const StepCostModel cost(0.5, 0.5, 0);  // one token: 1 s
  scheduler.add(sequence(1, 30));
  const StepPlan plan = scheduler.plan(StepBudget{512, 0.1, &cost});
  EXPECT_EQ(plan.batch.size(), 1u);
}

}  // namespace
}  // namespace promptly
