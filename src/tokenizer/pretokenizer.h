#pragma once
// Byte-level BPE pre-tokenization: a cascade of Unicode regexes (PCRE2 with UTF + UCP, JIT-compiled)
// that cut text into words before merges run. Each regex splits every piece the previous one made,
// keeping both the matches and the text between them, which is how llama.cpp's splitter and Hugging
// Face's "Isolated" Split behave.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace promptly {

class RegexSplitter {
 public:
  // Throws Error naming the pattern if one does not compile.
  explicit RegexSplitter(const std::vector<std::string>& patterns);
  ~RegexSplitter();
  RegexSplitter(RegexSplitter&&) noexcept;
  RegexSplitter& operator=(RegexSplitter&&) noexcept;

  // Non-empty pieces covering `text` in order.
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct PreTokenizer {
  std::vector<std::string> regexes;
  bool ignore_merges = false;  // a word that is already a vocabulary token is not re-merged (llama3)
};

// The regex cascade for a `tokenizer.ggml.pre` name. Unknown names fall back to "default" and set
// `warning` to say so.
PreTokenizer pre_tokenizer_for(const std::string& pre, std::string& warning);

// GPT-2's reversible byte <-> printable code point map: every byte becomes one UTF-8 character.
const std::string& byte_to_unicode(unsigned char b);
// Inverse of byte_to_unicode for one code point; -1 when it is not in the map.
int unicode_to_byte(char32_t cp);

}  // namespace promptly
