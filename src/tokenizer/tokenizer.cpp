#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
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

// SentencePiece BPE over scored pieces: repeatedly merge the adjacent pair whose concatenation is the
// highest-scoring vocabulary piece (leftmost on ties), then map each final symbol to its id, falling
// back to the merges that built it and finally to byte tokens.
class SpmSession {
 public:
  SpmSession(const Vocab& vocab, std::string_view text) : vocab_(vocab), text_(text) {}

  void run(std::vector<std::int32_t>& out) {
    std::size_t offs = 0;
    while (offs < text_.size()) {
      const std::size_t n = std::min(utf8_len(static_cast<unsigned char>(text_[offs])), text_.size() - offs);
      const int index = static_cast<int>(symbols_.size());
      symbols_.push_back({index - 1, offs + n == text_.size() ? -1 : index + 1, offs, n});
      offs += n;
    }
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) try_add_bigram(i - 1, i);
    while (!queue_.empty()) {
      const Bigram b = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[static_cast<std::size_t>(b.left)];
      Symbol& right = symbols_[static_cast<std::size_t>(b.right)];
      if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;  // stale entry
      left.n += right.n;
      right.n = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[static_cast<std::size_t>(right.next)].prev = b.left;
      try_add_bigram(left.prev, b.left);
      try_add_bigram(b.left, left.next);
    }
    for (int i = symbols_.empty() ? -1 : 0; i != -1; i = symbols_[static_cast<std::size_t>(i)].next) {
      resegment(symbols_[static_cast<std::size_t>(i)], out);
    }
  }

 private:
  struct Symbol {
    int prev, next;
    std::size_t start, n;
  };
  struct Bigram {
    int left, right;
    float score;
    std::size_t size;
  };
  struct Order {
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };

  std::string_view text_of(const Symbol& s) const { return text_.substr(s.start, s.n); }

  void try_add_bigram(int left, int right) {
    if (left == -1 || right == -1) return;
    const Symbol& l = symbols_[static_cast<std::size_t>(left)];
    const Symbol& r = symbols_[static_cast<std::size_t>(right)];
    const std::string_view merged = text_.substr(l.start, l.n + r.n);
    const std::int32_t id = vocab_.find(merged);
    if (id < 0) return;
    queue_.push({left, right, vocab_.scores[static_cast<std::size_t>(id)], merged.size()});
    rev_merge_[std::string(merged)] = {left, right};
  }

  void resegment(const Symbol& s, std::vector<std::int32_t>& out) {
    const std::string_view text = text_of(s);
    const std::int32_t id = vocab_.find(text);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
    auto it = rev_merge_.find(std::string(text));
    if (it == rev_merge_.end()) {
      for (unsigned char c : text) {
        const std::int32_t byte_id = vocab_.byte_tokens[c];
        out.push_back(byte_id >= 0 ? byte_id : vocab_.unk);
      }
      return;
    }
    resegment(symbols_[static_cast<std::size_t>(it->second.first)], out);
    resegment(symbols_[static_cast<std::size_t>(it->second.second)], out);
  }

  const Vocab& vocab_;
  std::string_view text_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, Order> queue_;
  std::unordered_map<std::string, std::pair<int, int>> rev_merge_;
};


// Byte-level BPE on one pre-tokenized word: bytes become GPT-2's printable code points, then the
// adjacent pair with the lowest merge rank merges first (leftmost on ties) until no pair is a merge.
class BpeSession {
 public:
  BpeSession(const Vocab& vocab, const std::string& word) : vocab_(vocab), word_(word) {}

  void run(std::vector<std::int32_t>& out) {
    if (vocab_.ignore_merges) {
      const std::int32_t id = vocab_.find(word_);
      if (id >= 0) {
        out.push_back(id);
        return;
      }
    }
    for (std::size_t offs = 0; offs < word_.size();) {
      const std::size_t n = std::min(utf8_len(static_cast<unsigned char>(word_[offs])), word_.size() - offs);
      const int index = static_cast<int>(symbols_.size());
      symbols_.push_back({index - 1, offs + n == word_.size() ? -1 : index + 1, offs, n});
      offs += n;
    }
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) try_add(i - 1, i);
    while (!queue_.empty()) {
      const Bigram b = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[static_cast<std::size_t>(b.left)];
      Symbol& right = symbols_[static_cast<std::size_t>(b.right)];
      if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;  // stale entry
      left.n += right.n;
      right.n = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[static_cast<std::size_t>(right.next)].prev = b.left;
      try_add(left.prev, b.left);
      try_add(b.left, left.next);
    }
    for (const Symbol& sym : symbols_) {
      if (sym.n == 0) continue;
      const std::string_view piece = std::string_view(word_).substr(sym.start, sym.n);
      const std::int32_t id = vocab_.find(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      // No token for the merged piece: fall back to one token per encoded byte character.
      for (std::size_t k = 0; k < piece.size();) {
        const std::size_t n = std::min(utf8_len(static_cast<unsigned char>(piece[k])), piece.size() - k);
        const std::int32_t byte_id = vocab_.find(piece.substr(k, n));
        if (byte_id >= 0) out.push_back(byte_id);
        k += n;
      }
    }
  }

 private:
  struct Symbol {
    int prev, next;
    std::size_t start, n;
  };
  struct Bigram {
    int left, right;
    std::int32_t rank;
    std::size_t size;
  };
  struct Order {
    bool operator()(const Bigram& a, const Bigram& b) const { return a.rank > b.rank || (a.rank == b.rank && a.left > b.left); }
  };

  void try_add(int left, int right) {
    if (left == -1 || right == -1) return;
    const Symbol& l = symbols_[static_cast<std::size_t>(left)];
    const Symbol& r = symbols_[static_cast<std::size_t>(right)];
    key_.assign(word_, l.start, l.n);
    key_ += ' ';
    key_.append(word_, r.start, r.n);
    auto it = vocab_.merge_ranks.find(key_);
    if (it == vocab_.merge_ranks.end()) return;
    queue_.push({left, right, it->second, l.n + r.n});
  }

  const Vocab& vocab_;
  const std::string& word_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, Order> queue_;
  std::string key_;
};

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
    if (vocab_.tokens[i].empty() || (t != TokenType::UserDefined && t != TokenType::Control)) continue;
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
    BpeSession(vocab_, word).run(out);
  }
}

void Tokenizer::encode_spm(std::string_view text, std::vector<std::int32_t>& out) const {
  SpmSession(vocab_, text).run(out);
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<std::int32_t> out;
  if (add_special && vocab_.add_bos && vocab_.bos >= 0) out.push_back(vocab_.bos);

  // Split out special tokens: user-defined pieces always, control tokens only when asked. Longest
  // match first so that e.g. "<|im_start|>" wins over any shorter special it contains.
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
    emit_text(text.substr(start, i - start));
    out.push_back(match);
    prev_special = true;
    i += vocab_.tokens[static_cast<std::size_t>(match)].size();
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
