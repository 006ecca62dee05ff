#include "server/prefix_key.h"

#include <array>

namespace promptly::server {
namespace {

constexpr std::array<std::uint32_t, 256> make_crc_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr std::array<std::uint32_t, 256> kCrcTable = make_crc_table();

// A message's text: its content string, or its text parts joined (HAProxy's json_query reads only
// strings, so for parts only a client that sends the header back keeps its replica).
std::optional<std::string> message_text(const nlohmann::ordered_json& message) {
  if (!message.is_object()) return std::nullopt;
  const auto it = message.find("content");
  if (it == message.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) return std::nullopt;
  std::string text;
  bool any = false;
  for (const auto& part : *it) {
    if (part.is_object() && part.value("type", "") == "text" && part.contains("text") && part["text"].is_string()) {
      text += part["text"].get<std::string>();
      any = true;
    }
  }
  return any ? std::optional<std::string>(std::move(text)) : std::nullopt;
}

}  // namespace

std::uint32_t crc32(std::string_view bytes) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) c = kCrcTable[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::optional<std::string> prefix_key(const nlohmann::ordered_json& messages) {
  if (!messages.is_array() || messages.empty()) return std::nullopt;
  std::optional<std::string> text = message_text(messages[0]);
  if (!text) return std::nullopt;
  const std::string role = messages[0].is_object() ? messages[0].value("role", "") : "";
  if ((role == "system" || role == "developer") && messages.size() > 1) {
    if (const std::optional<std::string> next = message_text(messages[1])) *text += *next;
  }
  return std::to_string(crc32(*text));
}

}  // namespace promptly::server
