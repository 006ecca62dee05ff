#include "chat/reasoning.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "../test_util.h"

namespace promptly {
namespace {

// Streaming in pieces of every size gives the same parts as one push, with tags split anywhere.
TEST(Reasoning, SplitsAtTagsWhateverThePieces) {
  const std::string text = "<think>\nLet me think: 2 < 3, and </thin is not a tag.\n</think>\n\nThe answer is <b>4</b>.";
  for (std::size_t piece = 1; piece <= text.size(); ++piece) {
    ReasoningSplitter s;
    std::string reasoning, content;
    for (std::size_t at = 0; at < text.size(); at += piece) {
      const auto d = s.push(std::string_view(text).substr(at, piece));
      reasoning += d.reasoning;
      content += d.content;
    }
    const auto d = s.finish();
    reasoning += d.reasoning;
    content += d.content;
    EXPECT_EQ(reasoning, "\nLet me think: 2 < 3, and </thin is not a tag.\n") << piece;
    EXPECT_EQ(content, "\n\nThe answer is <b>4</b>.") << piece;
  }
  const auto whole = ReasoningSplitter::split(text);
  EXPECT_EQ(whole.reasoning, "Let me think: 2 < 3, and </thin is not a tag.");
  EXPECT_EQ(whole.content, "The answer is <b>4</b>.");
}

TEST(Reasoning, PromptThatOpensTheBlockAndUnfinishedThinking) {
  EXPECT_EQ(ReasoningSplitter::split("step one\n</think>\nDone.", true).reasoning, "step one");
  EXPECT_EQ(ReasoningSplitter::split("step one\n</think>\nDone.", true).content, "Done.");
  // Cut off while thinking (max_tokens): all of it is reasoning, no answer.
  const auto cut = ReasoningSplitter::split("<think>still going", false);
  EXPECT_EQ(cut.reasoning, "still going");
  EXPECT_EQ(cut.content, "");
  // A model that does not think: untouched.
  EXPECT_EQ(ReasoningSplitter::split("Hello <thinking> world").content, "Hello <thinking> world");
  // An unfinished tag at the very end is text.
  ReasoningSplitter s;
  EXPECT_EQ(s.push("a <thi").content, "a ");
  EXPECT_EQ(s.finish().content, "<thi");
  EXPECT_TRUE(ReasoningSplitter::prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(ReasoningSplitter::prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}

// Qwen3's template writes think blocks; a template without them is left alone.
TEST(Reasoning, KnowsWhichTemplatesThink) {
  std::ifstream qwen3(test::shared_model("templates/Qwen-Qwen3-0.6B.jinja"));
  std::ifstream qwen25(test::shared_model("templates/Qwen-Qwen2.5-7B-Instruct.jinja"));
  ASSERT_TRUE(qwen3 && qwen25);
  std::stringstream a, b;
  a << qwen3.rdbuf();
  b << qwen25.rdbuf();
  EXPECT_TRUE(ReasoningSplitter::template_thinks(a.str()));
  EXPECT_FALSE(ReasoningSplitter::template_thinks(b.str()));
}

}  // namespace
}  // namespace promptly
