#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <unordered_map>

#include "util/error.h"

namespace promptly {
namespace {

// The cascades llama.cpp uses per pre-tokenizer name (facts of the model families' tokenizers).
const std::string kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const std::string kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const std::string kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const std::string kTekken =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?"
    "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

}  // namespace

PreTokenizer pre_tokenizer_for(const std::string& pre, std::string& warning) {
  warning.clear();
  auto is = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (pre == n) return true;
    return false;
  };
  if (is({"llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"})) return {{kLlama3}, true};
  if (is({"qwen2", "qwen2.5", "qwen-2.5", "deepseek-r1-qwen", "stablelm2", "megrez"})) return {{kQwen2}, false};
  if (is({"gpt-2", "gpt2", "mpt", "olmo", "jais", "phi-2", "jina-es", "jina-de"})) return {{kGpt2}, false};
  if (is({"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva"})) return {{"\\p{N}", kGpt2}, false};
  if (pre == "falcon") return {{"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2, "[0-9][0-9][0-9]"}, false};
  if (pre == "deepseek-coder") {
    return {{"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9e\xbf]+",
             "\\p{N}"},
            false};
  }
  if (pre == "tekken") return {{kTekken}, false};
  if (pre != "default") warning = "unknown pre-tokenizer '" + pre + "'; using 'default' (text may tokenize differently from the model's training)";
  return {{"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"}, false};
}

struct RegexSplitter::Impl {
  std::vector<pcre2_code*> codes;
  ~Impl() {
    for (pcre2_code* c : codes) pcre2_code_free(c);
  }
};

RegexSplitter::RegexSplitter(const std::vector<std::string>& patterns) : impl_(std::make_unique<Impl>()) {
  for (const std::string& p : patterns) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error("pre-tokenizer regex does not compile at offset " + std::to_string(offset) + ": " +
                  reinterpret_cast<const char*>(msg) + " (pattern: " + p + ")");
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
    impl_->codes.push_back(code);
  }
}

RegexSplitter::~RegexSplitter() = default;
RegexSplitter::RegexSplitter(RegexSplitter&&) noexcept = default;
RegexSplitter& RegexSplitter::operator=(RegexSplitter&&) noexcept = default;

std::vector<std::string_view> RegexSplitter::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (!text.empty()) pieces.push_back(text);
  for (pcre2_code* code : impl_->codes) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
    std::vector<std::string_view> next;
    next.reserve(pieces.size() * 2);
    for (std::string_view piece : pieces) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      std::size_t pos = 0, gap_start = 0;
      while (pos < piece.size()) {
        const int rc = pcre2_match(code, subject, piece.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc < 0) break;  // no further match (or invalid UTF-8: the rest stays one piece)
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const std::size_t start = ov[0], end = ov[1];
        if (end == start) {  // empty match: step one code point so the scan always advances
          pos = start + 1;
          while (pos < piece.size() && (static_cast<unsigned char>(piece[pos]) & 0xc0) == 0x80) ++pos;
          continue;
        }
        if (start > gap_start) next.push_back(piece.substr(gap_start, start - gap_start));
        next.push_back(piece.substr(start, end - start));
        gap_start = pos = end;
      }
      if (gap_start < piece.size()) next.push_back(piece.substr(gap_start));
    }
    pcre2_match_data_free(md);
    pieces.swap(next);
  }
  return pieces;
}

namespace {

struct ByteMap {
  std::array<std::string, 256> to_unicode;
  std::unordered_map<char32_t, int> to_byte;
  ByteMap() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      std::string s;
      if (cp < 0x80) {
        s += static_cast<char>(cp);
      } else {
        s += static_cast<char>(0xc0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3f));
      }
      to_unicode[static_cast<std::size_t>(b)] = s;
      to_byte[cp] = b;
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

const std::string& byte_to_unicode(unsigned char b) { return byte_map().to_unicode[b]; }

int unicode_to_byte(char32_t cp) {
  const auto& m = byte_map().to_byte;
  auto it = m.find(cp);
  return it == m.end() ? -1 : it->second;
}

}  // namespace promptly
