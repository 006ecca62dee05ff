#pragma once
// The prefix key: which conversation a chat request continues, from its first messages alone, so
// that every turn of a conversation (and every replica) gets the same key. The server returns it
// as the X-Promptly-Prefix-Key response header; a load balancer that hashes it sends a follow-up to
// the replica that holds the conversation's KV blocks (deploy/haproxy/haproxy.cfg computes the same
// key from the body with json_query and crc32 for clients that do not send it back).
//
// The key is the CRC-32 (zlib's, as decimal digits) of the first message's content, followed by the
// second message's content when the first is a system or developer message: a system prompt that
// many conversations share does not put them all on one replica.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace promptly::server {

inline constexpr char kPrefixKeyHeader[] = "X-Promptly-Prefix-Key";

// zlib's CRC-32 (reflected polynomial 0xEDB88320), as HAProxy's crc32 converter computes it.
std::uint32_t crc32(std::string_view bytes);

// The key of `messages` (a chat request's validated messages array); nullopt when the first
// message has no text (no messages, or content that is neither a string nor text parts).
std::optional<std::string> prefix_key(const nlohmann::ordered_json& messages);

}  // namespace promptly::server
