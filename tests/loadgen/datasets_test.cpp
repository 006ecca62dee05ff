#include "loadgen/datasets.h"

#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "../test_util.h"
#include "util/error.h"

namespace promptly::loadgen {
namespace {

std::size_t words_in(const std::string& s) {
  std::istringstream in(s);
  std::size_t n = 0;
  for (std::string w; in >> w;) ++n;
  return n;
}

DatasetOptions options(const std::string& name) {
  DatasetOptions o;
  o.name = name;
  o.num_prompts = 6;
  o.input_len = 40;
  o.seed = 3;
  return o;
}

TEST(Datasets, RandomPromptsHaveTheAskedLengthsAndDiffer) {
  const auto sessions = make_dataset(options("random"));
  ASSERT_EQ(sessions.size(), 6u);
  std::set<std::string> distinct;
  for (const Session& s : sessions) {
    EXPECT_TRUE(s.system.empty());
    ASSERT_EQ(s.turns.size(), 1u);
    EXPECT_EQ(words_in(s.turns[0].user), 40u);
    EXPECT_EQ(s.turns[0].max_tokens, kDefaultOutputLen);
    distinct.insert(s.turns[0].user);
  }
  EXPECT_EQ(distinct.size(), 6u);
  DatasetOptions o = options("random");
  o.output_len = 7;
  EXPECT_EQ(make_dataset(o)[0].turns[0].max_tokens, 7u);
  EXPECT_EQ(make_dataset(options("random"))[2].turns[0].user, sessions[2].turns[0].user);  // the seed decides
  o.seed = 4;
  EXPECT_NE(make_dataset(o)[2].turns[0].user, sessions[2].turns[0].user);
}

TEST(Datasets, MultiturnHasFourTurnsUnlessAsked) {
  auto sessions = make_dataset(options("multiturn"));
  ASSERT_EQ(sessions.size(), 6u);
  EXPECT_EQ(sessions[0].turns.size(), 4u);
  EXPECT_NE(sessions[0].turns[0].user, sessions[0].turns[1].user);
  DatasetOptions o = options("multiturn");
  o.turns = 2;
  EXPECT_EQ(make_dataset(o)[5].turns.size(), 2u);
}

TEST(Datasets, SharedPrefixSharesOneSystemPrompt) {
  const auto sessions = make_dataset(options("shared-prefix"));
  ASSERT_EQ(sessions.size(), 6u);
  EXPECT_EQ(words_in(sessions[0].system), 40u);
  for (const Session& s : sessions) EXPECT_EQ(s.system, sessions[0].system);
  EXPECT_NE(sessions[0].turns[0].user, sessions[1].turns[0].user);
}

TEST(Datasets, UnknownNameSaysWhatIsAccepted) {
  try {
    make_dataset(options("sharegpt"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("random, multiturn, shared-prefix"), std::string::npos) << e.what();
  }
  DatasetOptions o = options("random");
  o.num_prompts = 0;
  EXPECT_THROW(make_dataset(o), Error);
}

TEST(Conversations, ShareGptTurnsTakeTheirLengthFromTheReferenceAnswers) {
  const std::string text =
      R"({"id": "a", "conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"},)"
      R"( {"from": "gpt", "value": "0123456789012345678901234567890123456789"}, {"from": "human", "value": "More?"}, {"from": "gpt", "value": "ok"}]})"
      "\n\n"
      R"({"conversations": [{"from": "gpt", "value": "an answer with no question"}]})"
      "\n"
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "part two"}]}]})"
      "\n";
  const auto sessions = parse_conversations(text, "chats.jsonl", std::nullopt, 0);
  ASSERT_EQ(sessions.size(), 2u);  // the record without a human turn is skipped
  EXPECT_EQ(sessions[0].system, "Be brief.");
  ASSERT_EQ(sessions[0].turns.size(), 2u);
  EXPECT_EQ(sessions[0].turns[0].user, "Hi");
  EXPECT_EQ(sessions[0].turns[0].max_tokens, 10u);  // 40 bytes at 4 a token
  EXPECT_EQ(sessions[0].turns[1].max_tokens, 1u);
  EXPECT_EQ(sessions[1].turns[0].user, "part one, part two");
  EXPECT_EQ(sessions[1].turns[0].max_tokens, kDefaultOutputLen);  // no reference answer

  const auto fixed = parse_conversations(text, "chats.jsonl", 5, 1);
  ASSERT_EQ(fixed[0].turns.size(), 1u);
  EXPECT_EQ(fixed[0].turns[0].max_tokens, 5u);
}

TEST(Conversations, AcceptsOneJsonArray) {
  const auto sessions = parse_conversations(R"([{"conversations": [{"from": "human", "value": "a"}]}, {"messages": [{"role": "user", "content": "b"}]}])",
                                            "sharegpt.json", std::nullopt, 0);
  ASSERT_EQ(sessions.size(), 2u);
  EXPECT_EQ(sessions[1].turns[0].user, "b");
}

TEST(Conversations, BadInputNamesTheLine) {
  auto error_of = [](const std::string& text) {
    try {
      parse_conversations(text, "x.jsonl", std::nullopt, 0);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n{not json\n").find("x.jsonl:2"), std::string::npos);
  EXPECT_NE(error_of("{\"conversations\": 3}\n").find("x.jsonl:1"), std::string::npos);
  EXPECT_NE(error_of("{\"conversations\": [{\"value\": \"no speaker\"}]}\n").find("\"from\""), std::string::npos);
  EXPECT_NE(error_of("\n\n").find("no conversation with a user turn"), std::string::npos);
  EXPECT_NE(error_of("[1, 2").find("not valid JSON"), std::string::npos);
}

TEST(Conversations, FileDatasetIsASeededSampleOfNumPrompts) {
  test::TempDir dir;
  const std::string path = dir.file("chats.jsonl");
  {
    std::ofstream out(path);
    for (int i = 0; i < 20; ++i) out << R"({"conversations": [{"from": "human", "value": "question )" << i << R"("}]})" << "\n";
  }
  DatasetOptions o = options(path);
  o.num_prompts = 5;
  const auto a = make_dataset(o), b = make_dataset(o);
  ASSERT_EQ(a.size(), 5u);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].turns[0].user, b[i].turns[0].user);
  o.name = dir.file("missing.jsonl");
  EXPECT_THROW(make_dataset(o), Error);
}

}  // namespace
}  // namespace promptly::loadgen
