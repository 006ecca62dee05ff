#include "tokenizer/special_rules.h"

#include <gtest/gtest.h>

#include <fstream>

#include "../test_util.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace promptly {
namespace {

Vocab phi3_vocab() { return Vocab::from_gguf(*gguf::File::open(test::shared_model("vocab/ggml-vocab-phi-3.gguf"))); }

constexpr const char* kPhi3Turn = "<|user|>\nSYS\nHI<|end|>\n<|assistant|>\n";

// llama.cpp's ids for a Phi-3 turn: each marker swallows the newline after it, and "SYS" then takes
// the dummy-prefix space (▁S YS). The file is named "Phi3", which selects the family.
TEST(SpecialRules, Phi3MarkersSwallowTheWhitespaceAfterThem) {
  const Tokenizer tok(phi3_vocab());
  EXPECT_EQ(tok.encode(kPhi3Turn, true, true), (std::vector<std::int32_t>{1, 32010, 317, 21554, 13, 17628, 32007, 32001}));
  // Markers followed by spaces and tabs, and a turn that ends on a marker's newline.
  EXPECT_EQ(tok.encode("<|system|> \t\nHI<|end|>\n", false, true), (std::vector<std::int32_t>{32006, 379, 29902, 32007}));
}

TEST(SpecialRules, Phi3SequenceBoundariesKeepTheirWhitespace) {
  const Tokenizer tok(phi3_vocab());
  const Vocab& v = tok.vocab();
  for (const char* piece : {"<unk>", "<s>", "<|endoftext|>"}) EXPECT_EQ(v.strip_of(v.find(piece)), kStripNone) << piece;
  for (const char* piece : {"</s>", "<|end|>", "<|user|>", "<|placeholder1|>", "[PAD32011]"}) {
    EXPECT_EQ(v.strip_of(v.find(piece)), kStripRight) << piece;
  }
  // <|endoftext|> keeps the newline after it: ▁ (29871) and <0x0A> (13) before HI.
  EXPECT_EQ(tok.encode("<|endoftext|>\nHI", false, true), (std::vector<std::int32_t>{32000, 29871, 13, 17628}));
  // </s> is user-defined in this vocabulary, so it is split out (and strips) even without parse_special.
  EXPECT_EQ(tok.encode("HI</s>\nHI", false, false), (std::vector<std::int32_t>{379, 29902, 2, 379, 29902}));
}

// The same vocabulary under another name keeps every newline, as in llama.cpp: the rule follows
// general.name, and a name such as "Phi 3.5 Mini" does not select it there either.
TEST(SpecialRules, OtherNamesKeepWhitespace) {
  Vocab plain = phi3_vocab();
  plain.special_strip.clear();
  apply_family_special_rules(plain, "Phi 3.5 Mini Instruct");
  EXPECT_TRUE(plain.special_strip.empty());
  apply_family_special_rules(plain, "Llama 2 7B");
  EXPECT_TRUE(plain.special_strip.empty());
  const Tokenizer tok(plain);
  EXPECT_EQ(tok.encode(kPhi3Turn, true, true),
            (std::vector<std::int32_t>{1, 32010, 29871, 13, 14816, 29903, 13, 17628, 32007, 29871, 13, 32001, 29871, 13}));
  Vocab named = plain;
  apply_family_special_rules(named, "Phi-3-mini-4k-instruct");
  EXPECT_EQ(named.strip_of(named.find("<|assistant|>")), kStripRight);
  EXPECT_EQ(named.strip_of(named.find("<s>")), kStripNone);
}

// A tokenizer.json carries the flags itself: rstrip eats what follows, lstrip what precedes.
TEST(SpecialRules, TokenizerJsonStripFlags) {
  test::TempDir dir;
  const std::string path = dir.file("tokenizer.json");
  std::ofstream(path) << R"({
    "model": {"type": "BPE", "vocab": {"h": 0, "i": 1, "\u0120": 2, "\u010a": 3, "hi": 4, "<": 5, "|": 6, "u": 7, ">": 8}, "merges": ["h i"]},
    "added_tokens": [
      {"id": 9, "content": "<|u|>", "special": true, "rstrip": true},
      {"id": 10, "content": "<|a|>", "special": true, "lstrip": true},
      {"id": 11, "content": "<|p|>", "special": true}
    ]
  })";
  const Tokenizer tok = Tokenizer::from_file(path);
  EXPECT_EQ(tok.encode("<|u|>\n hi \n<|a|>", false, true), (std::vector<std::int32_t>{9, 4, 10}));
  EXPECT_EQ(tok.encode("<|p|>\n hi \n<|p|>", false, true), (std::vector<std::int32_t>{11, 3, 2, 4, 2, 3, 11}));
  // Stripping only happens where the token is parsed as a special.
  EXPECT_EQ(tok.decode(tok.encode("<|u|>\n hi", false, false)), "<|u|>\n hi");
}

}  // namespace
}  // namespace promptly
