#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "../test_util.h"
#include "gguf/gguf.h"
#include "util/error.h"

namespace promptly {
namespace {

Tokenizer load_tokenizer(const std::string& rel) {
  auto f = gguf::File::open(test::shared_model(rel));
  return Tokenizer(Vocab::from_gguf(*f));
}

std::vector<std::int32_t> parse_ids(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::int32_t> ids;
  for (std::int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

TEST(Tokenizer, StoriesVocabDecodesTheReferenceText) {
  const Tokenizer tok = load_tokenizer("stories260K.gguf");
  EXPECT_EQ(tok.vocab().size(), 512u);
  EXPECT_EQ(tok.vocab().bos, 1);
  std::vector<std::int32_t> ids = parse_ids(test::read_file(test::shared_model("testvectors/stories260K.greedy200.ids")));
  ASSERT_EQ(ids.size(), 200u);
  ids.insert(ids.begin(), 1);  // BOS renders as nothing
  EXPECT_EQ(tok.decode(ids), test::read_file(test::shared_model("testvectors/stories260K.greedy200.txt")));
}

TEST(Tokenizer, StoriesEncodeRoundTripsAndAddsBos) {
  const Tokenizer tok = load_tokenizer("stories260K.gguf");
  for (const std::string text : {"Once upon a time, there was a little girl named Lily.", "Hello  world\n\tx",
                                 "caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80", ""}) {
    const auto ids = tok.encode(text);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], 1);
    EXPECT_EQ(tok.decode(ids), text);
  }
  EXPECT_EQ(tok.encode("", true), (std::vector<std::int32_t>{1}));
  EXPECT_TRUE(tok.encode("", false).empty());
}

// llama.cpp's tokenizer test vectors (no BOS; SentencePiece vocabularies get the dummy-prefix
// space). llama-bpe and qwen2 run through the Hugging Face tokenizer.json of Llama 3 and Qwen3.
struct VectorCase {
  std::string name;
  std::string tokenizer;  // relative to shared/models
};
void PrintTo(const VectorCase& c, std::ostream* os) { *os << c.name; }

class Vectors : public ::testing::TestWithParam<VectorCase> {};

TEST_P(Vectors, MatchReferenceIdsAndRoundTrip) {
  const std::string name = GetParam().name;
  const Tokenizer tok = Tokenizer::from_file(test::shared_model(GetParam().tokenizer));
  const std::string inp = test::read_file(test::shared_model("vocab/ggml-vocab-" + name + ".gguf.inp"));
  const std::string out = test::read_file(test::shared_model("vocab/ggml-vocab-" + name + ".gguf.out"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (std::size_t pos = 0, next; (next = inp.find(sep, pos)) != std::string::npos; pos = next + sep.size()) {
    texts.push_back(inp.substr(pos, next - pos));
  }
  std::vector<std::string> lines;
  std::istringstream os(out);
  for (std::string line; std::getline(os, line);) lines.push_back(line);
  ASSERT_EQ(texts.size(), lines.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const auto ids = tok.encode(texts[i], false);
    EXPECT_EQ(ids, parse_ids(lines[i])) << name << " text #" << i << ": '" << texts[i] << "'";
    EXPECT_EQ(tok.decode(ids), texts[i]) << name << " text #" << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Vocabs, Vectors,
    ::testing::Values(VectorCase{"llama-spm", "vocab/ggml-vocab-llama-spm.gguf"}, VectorCase{"phi-3", "vocab/ggml-vocab-phi-3.gguf"},
                      VectorCase{"gpt-2", "vocab/ggml-vocab-gpt-2.gguf"},
                      VectorCase{"deepseek-coder", "vocab/ggml-vocab-deepseek-coder.gguf"},
                      VectorCase{"starcoder", "vocab/ggml-vocab-starcoder.gguf"}, VectorCase{"falcon", "vocab/ggml-vocab-falcon.gguf"},
                      VectorCase{"llama-bpe", "tokenizers/llama3/tokenizer.json"},
                      VectorCase{"qwen2", "tokenizers/qwen3/tokenizer.json"}),
    [](const auto& info) {
      std::string n = info.param.name;
      for (char& c : n) if (c == '-') c = '_';
      return n;
    });

TEST(Detokenizer, HoldsIncompleteUtf8) {
  const Tokenizer tok = load_tokenizer("stories260K.gguf");
  const std::int32_t c3 = tok.vocab().byte_tokens[0xc3], a9 = tok.vocab().byte_tokens[0xa9];
  ASSERT_GE(c3, 0);
  StreamingDetokenizer d(tok, {1, 400});
  EXPECT_EQ(d.push(c3), "");
  EXPECT_EQ(d.push(a9), "\xc3\xa9");
  EXPECT_EQ(d.push(c3), "");
  EXPECT_EQ(d.flush(), "\xef\xbf\xbd");  // a dangling lead byte becomes U+FFFD at the end
}

TEST(Detokenizer, DropsDummyPrefixOnlyAtStart) {
  const Tokenizer tok = load_tokenizer("stories260K.gguf");
  const auto ids = tok.encode("Once upon", false);
  StreamingDetokenizer fresh(tok, {1});
  std::string s;
  for (auto id : ids) s += fresh.push(id);
  EXPECT_EQ(s, "Once upon");
  StreamingDetokenizer continuing(tok, tok.encode("Hi"));
  s.clear();
  for (auto id : ids) s += continuing.push(id);
  EXPECT_EQ(s, " Once upon");
}

TEST(Utf8, TakeValidReplacesBrokenSequencesAndHoldsTheTail) {
  auto take = [](std::string_view s, std::size_t expect_consumed) {
    std::string out;
    EXPECT_EQ(take_valid_utf8(s, out), expect_consumed) << s;
    return out;
  };
  EXPECT_EQ(take("abc", 3), "abc");
  EXPECT_EQ(take("\xc3z", 2), "\xef\xbf\xbdz");          // lead byte interrupted by ASCII
  EXPECT_EQ(take("\x80x", 2), "\xef\xbf\xbdx");          // stray continuation
  EXPECT_EQ(take("\xc0\xaf", 2), "\xef\xbf\xbd\xef\xbf\xbd");  // overlong encoding
  EXPECT_EQ(take("\xed\xa0\x80", 3), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // UTF-16 surrogate
  EXPECT_EQ(take("ok\xe2\x9c", 2), "ok");                  // incomplete tail held back
  EXPECT_EQ(take("\xf0\x9f\x98\x80", 4), "\xf0\x9f\x98\x80");
}

TEST(Detokenizer, NeverEmitsInvalidUtf8) {
  const Tokenizer tok = load_tokenizer("stories260K.gguf");
  StreamingDetokenizer d(tok, {1, 400});
  std::string all;
  for (int b : {0xc3, 0xe2, 0x9c, 0x93, 0xff, 0xa9}) all += d.push(tok.vocab().byte_tokens[b]);
  all += d.push(400);
  all += d.flush();
  std::string check;
  EXPECT_EQ(take_valid_utf8(all, check), all.size());
  EXPECT_EQ(check, all);  // already valid: nothing replaced on a second pass
  EXPECT_EQ(all.substr(0, 6), "\xef\xbf\xbd\xe2\x9c\x93");
}

TEST(Tokenizer, SpecialTokensParsedOnlyWhenAsked) {
  const Tokenizer tok = Tokenizer::from_file(test::shared_model("tokenizers/qwen3/tokenizer.json"));
  const std::int32_t im_start = tok.vocab().find("<|im_start|>");
  ASSERT_GE(im_start, 0);
  const auto parsed = tok.encode("<|im_start|>user\nhi", false, true);
  EXPECT_EQ(parsed.front(), im_start);
  const auto literal = tok.encode("<|im_start|>user\nhi", false, false);
  EXPECT_EQ(std::count(literal.begin(), literal.end(), im_start), 0);
  EXPECT_EQ(tok.decode(literal), "<|im_start|>user\nhi");
  EXPECT_EQ(tok.decode(parsed), "user\nhi");  // control tokens render as nothing ...
  EXPECT_EQ(tok.decode(parsed, true), "<|im_start|>user\nhi");  // ... unless asked
  EXPECT_EQ(tok.vocab().eos, tok.vocab().find("<|im_end|>"));  // from tokenizer_config.json
  EXPECT_FALSE(tok.vocab().add_bos);
  const Tokenizer llama3 = Tokenizer::from_file(test::shared_model("tokenizers/llama3/tokenizer.json"));
  EXPECT_EQ(llama3.encode("hi").front(), 128000);  // <|begin_of_text|>
  const auto eog = llama3.vocab().end_of_generation_ids();
  EXPECT_NE(std::find(eog.begin(), eog.end(), llama3.vocab().find("<|eot_id|>")), eog.end());
}

TEST(Tokenizer, UnknownPreTokenizerWarnsAndFallsBack) {
  std::string warning;
  const PreTokenizer pt = pre_tokenizer_for("brand-new-model", warning);
  EXPECT_NE(warning.find("brand-new-model"), std::string::npos);
  EXPECT_FALSE(pt.regexes.empty());
  pre_tokenizer_for("qwen2", warning);
  EXPECT_TRUE(warning.empty());
}

TEST(RegexSplitter, KeepsMatchesAndGaps) {
  RegexSplitter s({"\\p{N}+"});
  const auto pieces = s.split("ab12cd345");
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"ab", "12", "cd", "345"}));
  EXPECT_THROW(RegexSplitter({"("}), Error);
}

}  // namespace
}  // namespace promptly
