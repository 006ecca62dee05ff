#include "server/webui.h"

#include <cctype>
#include <charconv>
#include <cstdio>

namespace promptly::server {

// Defined in webui_assets.cpp (the embedded files).
std::span<const std::uint8_t> webui_index_html();
std::span<const std::uint8_t> webui_index_html_gz();

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

// Calls `each` with every comma-separated element of a header value, trimmed and non-empty.
template <class Fn>
void for_each_element(std::string_view list, Fn each) {
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    const std::string_view element = trim(list.substr(0, comma));
    if (!element.empty()) each(element);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
}

// The q-value of one Accept-Encoding element's parameters (";q=0.5"); 1 when absent, 0 when
// malformed, so a broken weight never turns a coding on.
double quality(std::string_view params) {
  double q = 1;
  while (!params.empty()) {
    const std::size_t semicolon = params.find(';');
    const std::string_view param = trim(params.substr(0, semicolon));
    if (param.size() >= 2 && (param[0] == 'q' || param[0] == 'Q') && param[1] == '=') {
      const std::string_view number = param.substr(2);
      const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), q);
      if (ec != std::errc() || end != number.data() + number.size() || q < 0 || q > 1) return 0;
    }
    if (semicolon == std::string_view::npos) break;
    params.remove_prefix(semicolon + 1);
  }
  return q;
}

WebAsset make_asset(std::string_view content_type, std::span<const std::uint8_t> plain, std::span<const std::uint8_t> gzipped) {
  return {content_type, plain, gzipped, make_etag(plain), make_etag(plain, "-gzip")};
}

}  // namespace

std::string make_etag(std::span<const std::uint8_t> bytes, std::string_view suffix) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (std::uint8_t b : bytes) {
    hash ^= b;
    hash *= 0x100000001b3ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return "\"" + std::string(hex) + std::string(suffix) + "\"";
}

const WebAsset* find_web_asset(std::string_view path) {
  static const WebAsset index = make_asset("text/html; charset=utf-8", webui_index_html(), webui_index_html_gz());
  if (path == "/" || path == "/index.html") return &index;
  return nullptr;
}

bool accepts_gzip(std::string_view accept_encoding) {
  double gzip = -1, any = -1;  // -1: not named
  for_each_element(accept_encoding, [&](std::string_view element) {
    const std::size_t semicolon = element.find(';');
    const std::string_view coding = trim(element.substr(0, semicolon));
    const double q = quality(semicolon == std::string_view::npos ? std::string_view{} : element.substr(semicolon + 1));
    if (iequals(coding, "gzip") || iequals(coding, "x-gzip")) gzip = q;
    if (coding == "*") any = q;
  });
  // A coding named explicitly overrides "*".
  return gzip >= 0 ? gzip > 0 : any > 0;
}

bool etag_matches(std::string_view if_none_match, std::string_view etag) {
  if (trim(if_none_match) == "*") return true;
  bool match = false;
  for_each_element(if_none_match, [&](std::string_view tag) {
    if (tag.size() > 2 && tag.substr(0, 2) == "W/") tag.remove_prefix(2);
    if (tag == etag) match = true;
  });
  return match;
}

}  // namespace promptly::server
