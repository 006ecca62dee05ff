// libFuzzer target: the OpenAI request parser/validator. Any body must either parse into a request
// or raise ApiError with a 4xx status: no crash, no hang, no other exception.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/api.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool chat = data[0] & 1;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    const auto r = promptly::server::parse_api_request(body, chat);
    if (chat && r.messages.empty()) std::abort();
    if (!chat && r.prompts.empty()) std::abort();
  } catch (const promptly::server::ApiError& e) {
    if (e.status() < 400 || e.status() >= 500) std::abort();
    (void)e.body();
  }
  return 0;
}
