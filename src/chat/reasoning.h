#pragma once
// Reasoning ("thinking") text of models that write it between <think> and </think> (Qwen3,
// DeepSeek-R1 distills): split from the answer so that the API returns it as `reasoning_content`.
#include <string>
#include <string_view>

namespace promptly {

class ReasoningSplitter {
 public:
  struct Delta {
    std::string reasoning;
    std::string content;
  };

  // `in_reasoning`: the prompt already opened the block (its generation prompt ends with <think>).
  explicit ReasoningSplitter(bool in_reasoning = false) : in_reasoning_(in_reasoning) {}

  // Text as it streams, in pieces of any size: a tag split between pieces is held until it is whole
  // (or turns out not to be a tag). Tags themselves appear in neither part.
  Delta push(std::string_view text);
  // Whatever was held back (an unfinished tag at the end is text).
  Delta finish();

  bool in_reasoning() const { return in_reasoning_; }

  // The whole of a finished text: reasoning and answer, each without the whitespace around it.
  static Delta split(std::string_view text, bool in_reasoning = false);

  // Whether a template writes reasoning blocks, and whether a rendered prompt opens one.
  static bool template_thinks(std::string_view template_source);
  static bool prompt_opens_reasoning(std::string_view prompt);

 private:
  bool in_reasoning_;
  std::string held_;
};

}  // namespace promptly
