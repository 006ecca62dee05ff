#include "chat/reasoning.h"

namespace promptly {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

}  // namespace

ReasoningSplitter::Delta ReasoningSplitter::push(std::string_view text) {
  Delta out;
  held_.append(text);
  std::size_t at = 0;
  while (at < held_.size()) {
    const std::string_view tag = in_reasoning_ ? kClose : kOpen;
    std::string& sink = in_reasoning_ ? out.reasoning : out.content;
    const std::size_t found = held_.find(tag, at);
    if (found != std::string::npos) {
      sink.append(held_, at, found - at);
      at = found + tag.size();
      in_reasoning_ = !in_reasoning_;
      continue;
    }
    // No whole tag: everything goes out except a tail that could be the start of one.
    std::size_t keep = 0;
    for (std::size_t n = std::min(tag.size() - 1, held_.size() - at); n > 0; --n) {
      if (std::string_view(held_).substr(held_.size() - n) == tag.substr(0, n)) {
        keep = n;
        break;
      }
    }
    sink.append(held_, at, held_.size() - keep - at);
    at = held_.size() - keep;
    break;
  }
  held_.erase(0, at);
  return out;
}

ReasoningSplitter::Delta ReasoningSplitter::finish() {
  Delta out;
  (in_reasoning_ ? out.reasoning : out.content) = std::move(held_);
  held_.clear();
  return out;
}

ReasoningSplitter::Delta ReasoningSplitter::split(std::string_view text, bool in_reasoning) {
  ReasoningSplitter s(in_reasoning);
  Delta all = s.push(text);
  const Delta rest = s.finish();
  all.reasoning = std::string(trim(all.reasoning + rest.reasoning));
  all.content += rest.content;
  const auto first = all.content.find_first_not_of(" \t\r\n");
  all.content.erase(0, first == std::string::npos ? all.content.size() : first);
  return all;
}

bool ReasoningSplitter::template_thinks(std::string_view template_source) {
  return template_source.find(kOpen) != std::string_view::npos && template_source.find(kClose) != std::string_view::npos;
}

bool ReasoningSplitter::prompt_opens_reasoning(std::string_view prompt) {
  const std::string_view t = trim(prompt);
  return t.size() >= kOpen.size() && t.substr(t.size() - kOpen.size()) == kOpen;
}

}  // namespace promptly
