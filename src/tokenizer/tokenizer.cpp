#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <queue>
#include <unordered_map>

#include "gguf/gguf.h"
#include "util/error.h"

namespace promptly {
namespace {

constexpr std::string_view kSpaceMarker = "\xe2\x96\x81";  // U+2581, SentencePiece's visible space

std::size_t utf8_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xe0) == 0xc0) return 2;
  if ((lead & 0xf0) == 0xe0) return 3;
  if ((lead & 0xf8) == 0xf0) return 4;
  return 1;  // stray continuation or invalid byte: a symbol of its own
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, from.size(), from) == 0) {
      out += to;
      i += from.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

// Adjacent-pair merging over a linked list of UTF-8 symbols, the loop both SentencePiece and BPE
// run: candidate pairs wait in a priority queue (higher priority first, leftmost on ties); a pair
// whose symbols changed after it was queued is stale and skipped. `priority(left, right)` returns
// nullopt when the pair is not a merge.
class SymbolMerger {
 public:
  struct Symbol {
    int prev, next;
    std::size_t start, n;  // n == 0: merged into its left neighbour
  };

  template <typename Priority>
  void run(std::string_view text, Priority priority) {
    text_ = text;
    for (std::size_t offs = 0; offs < text.size();) {
      const std::size_t n = std::min(utf8_len(static_cast<unsigned char>(text[offs])), text.size() - offs);
      const int index = static_cast<int>(symbols_.size());
      symbols_.push_back({index - 1, offs + n == text.size() ? -1 : index + 1, offs, n});
      offs += n;
    }
    auto try_add = [&](int left, int right) {
      if (left == -1 || right == -1) return;
      const auto p = priority(left, right);
      if (!p) return;
      queue_.push({left, right, *p, at(left).n + at(right).n});
    };
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) try_add(i - 1, i);
    while (!queue_.empty()) {
      const Pair b = queue_.top();
      queue_.pop();
      Symbol& left = at(b.left);
      Symbol& right = at(b.right);
      if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;  // stale entry
      left.n += right.n;
      right.n = 0;
      left.next = right.next;
      if (right.next >= 0) at(right.next).prev = b.left;
      try_add(left.prev, b.left);
      try_add(b.left, left.next);
    }
  }

  Symbol& at(int i) { return symbols_[static_cast<std::size_t>(i)]; }
  std::string_view text_of(const Symbol& s) const { return text_.substr(s.start, s.n); }
  std::string_view text_of(int left, int right) const {  // the two symbols joined
    return text_.substr(symbols_[static_cast<std::size_t>(left)].start,
                        symbols_[static_cast<std::size_t>(left)].n + symbols_[static_cast<std::size_t>(right)].n);
  }
  const std::vector<Symbol>& symbols() const { return symbols_; }

 private:
  struct Pair {
    int left, right;
    double priority;
    std::size_t size;
  };
  struct Order {
    bool operator()(const Pair& a, const Pair& b) const {
      return a.priority < b.priority || (a.priority == b.priority && a.left > b.left);
    }
  };
  std::string_view text_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Pair, std::vector<Pair>, Order> queue_;
};

// SentencePiece BPE over scored pieces: merge the pair whose concatenation is the highest-scoring
// vocabulary piece; then each final symbol is a vocabulary piece (every merge made one) or a single
// character the vocabulary lacks, which falls back to its byte tokens.
void encode_spm_text(const Vocab& vocab, std::string_view text, std::vector<std::int32_t>& out) {
  SymbolMerger merger;
  merger.run(text, [&](int left, int right) -> std::optional<double> {
    const std::int32_t id = vocab.find(merger.text_of(left, right));
    if (id < 0) return std::nullopt;
    return vocab.scores[static_cast<std::size_t>(id)];
  });
  for (int i = merger.symbols().empty() ? -1 : 0; i != -1; i = merger.at(i).next) {
    const std::string_view piece = merger.text_of(merger.at(i));
    if (const std::int32_t id = vocab.find(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    for (unsigned char c : piece) out.push_back(vocab.byte_tokens[c] >= 0 ? vocab.byte_tokens[c] : vocab.unk);
  }
}

// Byte-level BPE on one pre-tokenized word (already mapped to GPT-2's printable code points): the
// pair with the lowest merge rank merges first. A final piece without a token falls back to one
// token per encoded byte character.
void encode_bpe_word(const Vocab& vocab, const std::string& word, std::vector<std::int32_t>& out) {
  if (vocab.ignore_merges) {
    if (const std::int32_t id = vocab.find(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  SymbolMerger merger;
  std::string key;
  merger.run(word, [&](int left, int right) -> std::optional<double> {
    key.assign(merger.text_of(merger.at(left)));
    key += ' ';
    key += merger.text_of(merger.at(right));
    auto it = vocab.merge_ranks.find(key);
    if (it == vocab.merge_ranks.end()) return std::nullopt;
    return -static_cast<double>(it->second);  // lower rank = higher priority
  });
  for (int i = merger.symbols().empty() ? -1 : 0; i != -1; i = merger.at(i).next) {
    const std::string_view piece = merger.text_of(merger.at(i));
    if (const std::int32_t id = vocab.find(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    for (std::size_t k = 0; k < piece.size();) {
      const std::size_t n = std::min(utf8_len(static_cast<unsigned char>(piece[k])), piece.size() - k);
      if (const std::int32_t byte_id = vocab.find(piece.substr(k, n)); byte_id >= 0) out.push_back(byte_id);
      k += n;
    }
  }
}

// The ASCII whitespace a stripping special token swallows (C's isspace in the "C" locale).
bool is_c_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

// Decodes one UTF-8 code point at s[i]; advances i. Invalid bytes decode as themselves.
char32_t next_code_point(std::string_view s, std::size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const std::size_t n = std::min(utf8_len(c), s.size() - i);
  char32_t cp = n == 1 ? c : c & (0xff >> (n + 1));
  for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  i += n;
  return cp;
}

}  // namespace

Tokenizer::Tokenizer(Vocab vocab) : vocab_(std::move(vocab)) {
  if (vocab_.kind == VocabKind::Bpe) splitter_ = std::make_unique<RegexSplitter>(vocab_.pre_regexes);
  for (std::size_t i = 0; i < vocab_.size(); ++i) {
    const TokenType t = vocab_.types[i];
    const bool special = t == TokenType::UserDefined || t == TokenType::Control || t == TokenType::Unknown;
    if (vocab_.tokens[i].empty() || !special) continue;
    all_specials_.push_back(static_cast<std::int32_t>(i));
    if (t == TokenType::UserDefined) user_specials_.push_back(static_cast<std::int32_t>(i));
    special_first_byte_[static_cast<unsigned char>(vocab_.tokens[i][0])] = true;
  }
  auto longest_first = [&](std::int32_t a, std::int32_t b) {
    const auto la = vocab_.tokens[static_cast<std::size_t>(a)].size(), lb = vocab_.tokens[static_cast<std::size_t>(b)].size();
    return la != lb ? la > lb : a < b;
  };
  std::sort(all_specials_.begin(), all_specials_.end(), longest_first);
  std::sort(user_specials_.begin(), user_specials_.end(), longest_first);
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open '" + path + "'");
  char magic[4] = {};
  in.read(magic, 4);
  if (in.gcount() == 4 && std::string_view(magic, 4) == "GGUF") return Tokenizer(Vocab::from_gguf(*gguf::File::open(path)));
  return Tokenizer(Vocab::from_tokenizer_json(path));
}

void Tokenizer::encode_bpe(std::string_view text, std::vector<std::int32_t>& out) const {
  std::string word;
  for (std::string_view piece : splitter_->split(text)) {
    word.clear();
    for (unsigned char c : piece) word += byte_to_unicode(c);
    encode_bpe_word(vocab_, word, out);
  }
}

void Tokenizer::encode_spm(std::string_view text, std::vector<std::int32_t>& out) const { encode_spm_text(vocab_, text, out); }

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<std::int32_t> out;
  if (add_special && vocab_.add_bos && vocab_.bos >= 0) out.push_back(vocab_.bos);

  // Split out special tokens: user-defined pieces always, control and unknown tokens only when asked.
  // Longest match first so that e.g. "<|im_start|>" wins over any shorter special it contains.
  const std::vector<std::int32_t>& specials = parse_special ? all_specials_ : user_specials_;

  bool prev_special = true;  // the dummy prefix goes before text that starts the input or follows a special token
  auto emit_text = [&](std::string_view fragment) {
    if (fragment.empty()) return;
    if (vocab_.kind == VocabKind::Bpe) {
      encode_bpe(fragment, out);
    } else {
      std::string s;
      if (vocab_.add_space_prefix && prev_special) s += ' ';
      s += fragment;
      encode_spm(replace_all(s, " ", kSpaceMarker), out);
    }
    prev_special = false;
  };

  std::size_t start = 0, i = 0;
  while (i < text.size()) {
    std::int32_t match = -1;
    if (!special_first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    for (std::int32_t id : specials) {
      const std::string& piece = vocab_.tokens[static_cast<std::size_t>(id)];
      if (text.compare(i, piece.size(), piece) == 0) {
        match = id;
        break;
      }
    }
    if (match < 0) {
      ++i;
      continue;
    }
    const std::uint8_t strip = vocab_.strip_of(match);
    std::size_t before_end = i;
    if (strip & kStripLeft) {
      while (before_end > start && is_c_space(text[before_end - 1])) --before_end;
    }
    emit_text(text.substr(start, before_end - start));
    out.push_back(match);
    prev_special = true;
    i += vocab_.tokens[static_cast<std::size_t>(match)].size();
    if (strip & kStripRight) {
      while (i < text.size() && is_c_space(text[i])) ++i;
    }
    start = i;
  }
  emit_text(text.substr(start));

  if (add_special && vocab_.add_eos && vocab_.eos >= 0) out.push_back(vocab_.eos);
  return out;
}

std::string Tokenizer::piece(std::int32_t id, bool render_special) const {
  if (id < 0 || static_cast<std::size_t>(id) >= vocab_.size()) return {};
  const std::string& text = vocab_.tokens[static_cast<std::size_t>(id)];
  switch (vocab_.types[static_cast<std::size_t>(id)]) {
    case TokenType::Control:
      return render_special ? text : std::string();
    case TokenType::Unused:
      return {};
    case TokenType::Unknown:
      return "\xe2\x96\x85";  // U+2585, the visible stand-in SentencePiece prints for <unk>
    case TokenType::UserDefined:
      return text;
    case TokenType::Byte:
      if (text.size() == 6 && text.starts_with("<0x")) {
        return std::string(1, static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16)));
      }
      return text;
    default:
      break;
  }
  if (vocab_.kind == VocabKind::Spm) return replace_all(text, kSpaceMarker, " ");
  std::string bytes;  // byte-level BPE: each code point stands for one byte
  for (std::size_t i = 0; i < text.size();) {
    const char32_t cp = next_code_point(text, i);
    const int b = unicode_to_byte(cp);
    if (b >= 0) bytes += static_cast<char>(b);
  }
  return bytes;
}

std::string Tokenizer::decode(const std::vector<std::int32_t>& ids, bool render_special) const {
  std::string out;
  bool at_start = true;
  for (std::int32_t id : ids) {
    std::string p = piece(id, render_special);
    if (at_start && !p.empty()) {
      if (vocab_.add_space_prefix && p[0] == ' ') p.erase(0, 1);
      at_start = false;
    }
    out += p;
  }
  return out;
}

std::size_t take_valid_utf8(std::string_view s, std::string& out) {
  static constexpr std::string_view kReplacement = "\xef\xbf\xbd";
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    std::size_t need = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // allowed range of the second byte (rules out overlongs and surrogates)
    if (c >= 0xc2 && c <= 0xdf) {
      need = 1;
    } else if (c >= 0xe0 && c <= 0xef) {
      need = 2;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      need = 3;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    }
    if (need == 0) {  // stray continuation or a byte that never starts a character
      out += kReplacement;
      ++i;
      continue;
    }
    std::size_t k = 1;
    bool bad = false;
    for (; k <= need && i + k < s.size(); ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      const bool ok = k == 1 ? (cc >= lo && cc <= hi) : (cc & 0xc0) == 0x80;
      if (!ok) {
        bad = true;
        break;
      }
    }
    if (bad) {  // the sequence was cut short by another character: the lead byte alone is invalid
      out += kReplacement;
      ++i;
      continue;
    }
    if (k <= need) return i;  // incomplete at the end: hold it for the next token
    out.append(s.substr(i, need + 1));
    i += need + 1;
  }
  return i;
}

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, const std::vector<std::int32_t>& context)
    : tokenizer_(tokenizer) {
  for (std::int32_t id : context) {
    if (!tokenizer_.piece(id).empty()) {
      at_start_ = false;
      break;
    }
  }
}

std::string StreamingDetokenizer::push(std::int32_t id) {
  std::string p = tokenizer_.piece(id);
  if (at_start_ && !p.empty()) {
    if (tokenizer_.vocab().add_space_prefix && p[0] == ' ') p.erase(0, 1);
    at_start_ = false;
  }
  pending_ += p;
  std::string out;
  pending_.erase(0, take_valid_utf8(pending_, out));
  return out;
}

std::string StreamingDetokenizer::flush() {
  std::string out;
  for (std::size_t i = 0; i < pending_.size(); ++i) out += "\xef\xbf\xbd";
  pending_.clear();
  return out;
}

}  // namespace promptly
