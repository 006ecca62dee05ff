#pragma once
// The browser chat UI's assets, built from webui/ by tools/build-webui.sh and linked into the binary
// (webui_assets.cpp), and the HTTP caching and content-coding decisions for serving them.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace promptly::server {

struct WebAsset {
  std::string_view content_type;
  std::span<const std::uint8_t> plain;
  std::span<const std::uint8_t> gzipped;  // the same bytes, gzip-compressed
  // Strong validators, one per representation (RFC 9110 8.8.3): a cache must not answer a gzip
  // request with the plain body it validated, so the two differ.
  std::string etag_plain, etag_gzipped;
};

// The asset served at `path` ("/" is the chat page), or null.
const WebAsset* find_web_asset(std::string_view path);

// Whether an Accept-Encoding header value admits gzip: a "gzip" or "*" coding with a q-value above
// zero (RFC 9110 12.5.3). An absent header means any coding, but browsers always send one, and old
// tools that send none are better served plain.
bool accepts_gzip(std::string_view accept_encoding);

// Whether an If-None-Match header value names `etag` (weak comparison, RFC 9110 13.1.2): "*", or a
// comma-separated list of entity tags, W/ prefixes ignored.
bool etag_matches(std::string_view if_none_match, std::string_view etag);

// A quoted entity tag from the bytes' FNV-1a 64-bit hash (plus `suffix`): stable across builds of
// the same assets, so caches stay valid across restarts.
std::string make_etag(std::span<const std::uint8_t> bytes, std::string_view suffix = {});

}  // namespace promptly::server
