// The answer cache: a conversation's next turn gets back the ids the model generated for an answer,
// only where the prompt continues the answer's own prompt and spells exactly the answer's text.
#include "server/answer_cache.h"

#include <gtest/gtest.h>

#include "../test_util.h"

namespace promptly::server {
namespace {

const Tokenizer& stories() {
  static const Tokenizer t = Tokenizer::from_file(test::shared_model("stories260K.gguf"));
  return t;
}

// The text as byte tokens, one per byte: a valid spelling of it that no tokenizer would produce,
// as a sampled answer can be.
std::vector<std::int32_t> as_bytes(const std::string& text) {
  std::vector<std::int32_t> ids;
  for (unsigned char c : text) {
    bool found = false;
    for (std::size_t id = 0; id < stories().vocab().tokens.size() && !found; ++id) {
      if (stories().vocab().tokens[id] == std::string("<0x") + "0123456789ABCDEF"[c >> 4] + "0123456789ABCDEF"[c & 15] + ">") {
        ids.push_back(static_cast<std::int32_t>(id));
        found = true;
      }
    }
    EXPECT_TRUE(found) << "no byte token for " << int(c);
  }
  return ids;
}

std::vector<std::int32_t> concat(std::vector<std::int32_t> a, const std::vector<std::int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Turn {
  std::vector<std::int32_t> prompt;   // as the previous request tokenized it
  std::string answer = " there was a little cat";
  std::vector<std::int32_t> generated = as_bytes(answer);
  std::string rest = ". The cat liked to play.";
  // The next turn as a client sends it: the text again, tokenized from scratch.
  std::vector<std::int32_t> next = stories().encode("Once upon a time" + answer + rest);
  Turn() : prompt(stories().encode("Once upon a time")) {}
};

TEST(AnswerCache, PutsTheGeneratedIdsBackWhereTheTextContinuesTheirPrompt) {
  Turn t;
  ASSERT_TRUE(std::equal(t.prompt.begin(), t.prompt.end(), t.next.begin()));  // the test's premise
  ASSERT_NE(stories().encode(t.answer, false), t.generated);                  // and its point
  AnswerCache cache(stories(), 1 << 20);
  cache.remember(t.prompt, t.generated, t.answer);
  std::vector<std::int32_t> ids = t.next;
  EXPECT_EQ(cache.restore(ids), 1u);
  ASSERT_GT(ids.size(), t.prompt.size() + t.generated.size());
  EXPECT_EQ(std::vector<std::int32_t>(ids.begin(), ids.begin() + static_cast<long>(t.prompt.size() + t.generated.size())),
            concat(t.prompt, t.generated));
  // The same text: what follows the answer is still the tokenization of the rest.
  EXPECT_EQ(stories().decode(ids), stories().decode(t.next));
  const std::vector<std::int32_t> tail(ids.begin() + static_cast<long>(t.prompt.size() + t.generated.size()), ids.end());
  EXPECT_EQ(tail, std::vector<std::int32_t>(t.next.end() - static_cast<long>(tail.size()), t.next.end()));
}

TEST(AnswerCache, LeavesPromptsThatDoNotContinueTheAnswer) {
  Turn t;
  AnswerCache cache(stories(), 1 << 20);
  cache.remember(t.prompt, t.generated, t.answer);
  // Another conversation.
  std::vector<std::int32_t> other = stories().encode("One day a dog" + t.answer + t.rest);
  const auto before = other;
  EXPECT_EQ(cache.restore(other), 0u);
  EXPECT_EQ(other, before);
  // The client edited the answer.
  std::vector<std::int32_t> edited = stories().encode("Once upon a time there was a big cat" + t.rest);
  const auto edited_before = edited;
  EXPECT_EQ(cache.restore(edited), 0u);
  EXPECT_EQ(edited, edited_before);
  // The answer's text ends inside a token of the new prompt ("cat" -> "cats"): no boundary there.
  std::vector<std::int32_t> longer = stories().encode("Once upon a time" + t.answer + "s and dogs.");
  const auto longer_before = longer;
  cache.restore(longer);
  if (longer != longer_before) {
    // Only if the tokenizer does end a token after "cat" here; then the rest must spell the rest.
    EXPECT_EQ(stories().decode(longer), stories().decode(longer_before));
  }
}

TEST(AnswerCache, RemembersOnlyAnswersWhoseTextIsTheirIds) {
  Turn t;
  AnswerCache cache(stories(), 1 << 20);
  cache.remember(t.prompt, t.generated, t.answer.substr(0, 10));  // a stop string cut the text
  EXPECT_EQ(cache.size(), 0u);
  cache.remember(t.prompt, concat(t.generated, as_bytes("\xe2\x82")), t.answer + "\xef\xbf\xbd");  // half a character, shown as U+FFFD
  EXPECT_EQ(cache.size(), 0u);
  cache.remember(t.prompt, t.generated, t.answer);
  EXPECT_EQ(cache.size(), 1u);
}

TEST(AnswerCache, ControlTokensTheModelWroteComeBackToo) {
  // They show as nothing in the text; the model gets its own history, the cache all of it.
  Turn t;
  const std::vector<std::int32_t> generated = concat(concat({t.generated.begin(), t.generated.begin() + 4}, {stories().vocab().bos}),
                                                     {t.generated.begin() + 4, t.generated.end()});
  AnswerCache cache(stories(), 1 << 20);
  cache.remember(t.prompt, generated, t.answer);
  std::vector<std::int32_t> ids = t.next;
  EXPECT_EQ(cache.restore(ids), 1u);
  EXPECT_TRUE(std::equal(generated.begin(), generated.end(), ids.begin() + static_cast<long>(t.prompt.size())));
}

TEST(AnswerCache, RestoresEveryTurnOfAConversation) {
  Turn t;
  AnswerCache cache(stories(), 1 << 20);
  cache.remember(t.prompt, t.generated, t.answer);
  // Turn 2 ran on the restored ids and answered too.
  std::vector<std::int32_t> second_prompt = t.next;
  cache.restore(second_prompt);
  const std::string answer2 = " She was happy";
  cache.remember(second_prompt, as_bytes(answer2), answer2);
  // Turn 3 sends everything as text again: both answers come back.
  std::vector<std::int32_t> third = stories().encode("Once upon a time" + t.answer + t.rest + answer2 + " all day.");
  const auto text = stories().decode(third);
  EXPECT_EQ(cache.restore(third), 2u);
  EXPECT_TRUE(std::equal(second_prompt.begin(), second_prompt.end(), third.begin()));
  EXPECT_EQ(stories().decode(third), text);
}

TEST(AnswerCache, FindsTheAnswerAmongManyConversationsAndRegeneratedTurns) {
  Turn t;
  AnswerCache cache(stories(), 64 << 20);
  for (int i = 0; i < 300; ++i) {
    const std::string opening = "Once upon a time " + std::to_string(i);
    cache.remember(stories().encode(opening), as_bytes(t.answer), t.answer);
  }
  const std::string other = " a dog ran";
  cache.remember(t.prompt, as_bytes(other), other);  // the same turn answered twice: two texts
  cache.remember(t.prompt, t.generated, t.answer);
  cache.remember(t.prompt, as_bytes(" the end"), " the end");
  std::vector<std::int32_t> ids = t.next;
  EXPECT_EQ(cache.restore(ids), 1u);
  EXPECT_TRUE(std::equal(t.generated.begin(), t.generated.end(), ids.begin() + static_cast<long>(t.prompt.size())));
  EXPECT_EQ(stories().decode(ids), stories().decode(t.next));
}

TEST(AnswerCache, DropsTheLeastRecentlyUsedPastItsBudget) {
  Turn t;
  const std::size_t one = (t.prompt.size() + t.generated.size()) * 4 + t.answer.size();
  AnswerCache cache(stories(), 2 * one + one / 2);
  for (int i = 0; i < 5; ++i) cache.remember(t.prompt, t.generated, t.answer);
  EXPECT_EQ(cache.size(), 2u);
}

}  // namespace
}  // namespace promptly::server
