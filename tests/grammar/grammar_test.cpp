#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "grammar/compile.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/token_bytes_of.h"
#include "../test_util.h"

namespace promptly::grammar {
namespace {

using json = nlohmann::ordered_json;

// A vocabulary of the 256 single bytes: matching text byte by byte.
std::shared_ptr<const TokenBytes> byte_vocab() {
  std::vector<std::string> pieces;
  for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, static_cast<char>(b)));
  pieces.push_back("<eos>");
  std::vector<bool> excluded(257, false);
  excluded[256] = true;
  return std::make_shared<TokenBytes>(pieces, excluded, std::vector<std::int32_t>{256});
}

std::shared_ptr<const GrammarIndex> index_of(const std::string& gbnf, std::shared_ptr<const TokenBytes> vocab = byte_vocab()) {
  return std::make_shared<GrammarIndex>(compile(parse_gbnf(gbnf)), std::move(vocab));
}

bool matches(const std::shared_ptr<const GrammarIndex>& index, const std::string& text) {
  Matcher m(index);
  for (unsigned char c : text)
    if (!m.accept(c)) return false;
  return m.can_end();
}

bool matches(const std::string& gbnf, const std::string& text) { return matches(index_of(gbnf), text); }

TEST(Gbnf, LiteralsClassesAndRepetition) {
  EXPECT_TRUE(matches(R"(root ::= "ab" [0-9]+ "c"?)", "ab12"));
  EXPECT_TRUE(matches(R"(root ::= "ab" [0-9]+ "c"?)", "ab1c"));
  EXPECT_FALSE(matches(R"(root ::= "ab" [0-9]+ "c"?)", "abc"));
  EXPECT_TRUE(matches(R"(root ::= [a-c]{2,3})", "abc"));
  EXPECT_FALSE(matches(R"(root ::= [a-c]{2,3})", "abca"));
  EXPECT_FALSE(matches(R"(root ::= [a-c]{2,3})", "a"));
  EXPECT_TRUE(matches(R"(root ::= [^x]* "x")", "héllo x"));
  EXPECT_TRUE(matches("root ::= x | y\nx ::= \"1\"\ny ::= \"2\" # comment\n", "2"));
  EXPECT_TRUE(matches(R"(root ::= "\u00e9" "\x41" "\n")", "\xc3\xa9" "A\n"));
  EXPECT_TRUE(matches(R"(root ::= . .)", "\xe2\x82\xac" "a"));
  EXPECT_FALSE(matches(R"(root ::= .)", "\xc3"));  // half a character never completes
}

TEST(Gbnf, LongBoundedRepetitionsStillCompile) {
  auto index = index_of("root ::= [a-z]{0,9000} \".\"");  // past one DFA's size: split into rules
  EXPECT_TRUE(matches(index, std::string(8999, 'q') + "."));
  EXPECT_FALSE(matches(index, std::string(9001, 'q') + "."));
}

TEST(Gbnf, RecursiveRules) {
  const std::string parens = "root ::= p\np ::= \"(\" p* \")\"\n";
  auto index = index_of(parens);
  EXPECT_TRUE(matches(index, "()"));
  EXPECT_TRUE(matches(index, "(()(()))"));
  EXPECT_FALSE(matches(index, "(()"));
  EXPECT_FALSE(matches(index, "())"));
}

TEST(Gbnf, ErrorsNameTheProblem) {
  auto message = [](const std::string& g) {
    try {
      compile(parse_gbnf(g));
    } catch (const GrammarError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message("root ::= x").find("'x' is used but never defined"), std::string::npos);
  EXPECT_NE(message("foo ::= \"a\"").find("no 'root' rule"), std::string::npos);
  EXPECT_NE(message("root ::= root \"a\" | \"b\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(message("root ::= \"a").find("unterminated"), std::string::npos);
  EXPECT_NE(message("root ::= a\na ::= \"x\" a").find("never finish"), std::string::npos);
  EXPECT_NE(message("root ::= [b-a]").find("out of order"), std::string::npos);
  // Hostile sizes end in a clear error, quickly, instead of exhausting memory.
  EXPECT_NE(message("root ::= ((\"a\" x){0,9000}){0,9000}\nx ::= \"b\" x | \"c\"").find("too large"), std::string::npos);
  EXPECT_NE(message("root ::= \"a\"{0,100000}").find("too large"), std::string::npos);
}

TEST(Utf8Sequences, CoverEveryCodePointOnce) {
  // Each encoded code point falls in exactly one sequence.
  auto seqs = utf8_sequences(0, 0x10FFFF);
  std::mt19937 rng(1);
  for (int i = 0; i < 2000; ++i) {
    std::uint32_t cp = rng() % 0x110000;
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    // encode
    if (cp < 0x80) s = std::string(1, static_cast<char>(cp));
    else if (cp < 0x800) s = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    else if (cp < 0x10000) s = {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
    else s = {static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
    int hits = 0;
    for (const auto& seq : seqs) {
      if (seq.size() != s.size()) continue;
      bool in = true;
      for (std::size_t k = 0; k < s.size(); ++k) in = in && seq[k].first <= static_cast<std::uint8_t>(s[k]) && static_cast<std::uint8_t>(s[k]) <= seq[k].second;
      hits += in;
    }
    EXPECT_EQ(hits, 1) << std::hex << cp;
  }
}

// The cached mask must equal stepping every token through the matcher, at every point of random
// walks, for grammars with recursion, nullable rules and rule ends inside tokens.
TEST(Matcher, CachedMaskEqualsBruteForceOnRandomWalks) {
  std::mt19937 rng(7);
  const std::string alphabet = "{}[],:\" ab1-\\";
  std::set<std::string> pieces_set;
  for (char c : alphabet) pieces_set.insert(std::string(1, c));
  while (pieces_set.size() < 400) {
    std::string p;
    int len = 2 + static_cast<int>(rng() % 5);
    for (int k = 0; k < len; ++k) p += alphabet[rng() % alphabet.size()];
    pieces_set.insert(p);
  }
  std::vector<std::string> pieces(pieces_set.begin(), pieces_set.end());
  pieces.push_back("");  // the end token
  const auto eos = static_cast<std::int32_t>(pieces.size() - 1);
  std::vector<bool> excluded(pieces.size(), false);
  excluded[static_cast<std::size_t>(eos)] = true;
  auto vocab = std::make_shared<TokenBytes>(pieces, excluded, std::vector<std::int32_t>{eos});

  const std::vector<std::string> grammars = {
      json_object_gbnf(),
      json_schema_to_gbnf(json::parse(R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer","minimum":-11,"maximum":111}},"b":{"type":"string","maxLength":4}},"required":["a"]})")),
      "root ::= item+\nitem ::= \"[\" item* \"]\" | \"a\" | \"b\" \"1\"?\n",
  };
  for (const auto& g : grammars) {
    auto index = std::make_shared<GrammarIndex>(compile(parse_gbnf(g)), vocab);
    for (int walk = 0; walk < 20; ++walk) {
      Matcher m(index);
      std::vector<std::uint32_t> mask(index->mask_words());
      for (int step = 0; step < 40; ++step) {
        m.fill_mask(mask.data());
        std::vector<std::int32_t> allowed;
        for (std::int32_t t = 0; t < static_cast<std::int32_t>(pieces.size()); ++t) {
          const bool in_mask = (mask[static_cast<std::size_t>(t) / 32] >> (t % 32)) & 1;
          bool brute;
          if (t == eos) {
            brute = m.can_end();
          } else {
            brute = m.accept(t);
            if (brute) m.rollback(1);
          }
          ASSERT_EQ(in_mask, brute) << "grammar " << g << "\ntoken '" << pieces[static_cast<std::size_t>(t)] << "' step " << step;
          if (in_mask) allowed.push_back(t);
        }
        ASSERT_FALSE(allowed.empty());
        std::int32_t pick = allowed[rng() % allowed.size()];
        if (pick == eos) break;
        ASSERT_TRUE(m.accept(pick));
      }
    }
  }
}

// Walks `index` choosing random allowed tokens, ending as soon as it may with probability
// `p_end`; returns the text produced, or nullopt if the walk did not end within `limit` tokens.
std::optional<std::string> random_walk(const std::shared_ptr<const GrammarIndex>& index, std::mt19937& rng, double p_end, int limit) {
  Matcher m(index);
  std::vector<std::uint32_t> mask(index->mask_words());
  std::string text;
  const auto& ends = index->vocab().end_ids();
  for (int step = 0; step < limit; ++step) {
    if (m.can_end() && std::uniform_real_distribution<double>(0, 1)(rng) < p_end) return text;
    m.fill_mask(mask.data());
    std::vector<std::int32_t> allowed;
    for (std::size_t t = 0; t < index->vocab().size(); ++t)
      if ((mask[t / 32] >> (t % 32)) & 1) allowed.push_back(static_cast<std::int32_t>(t));
    if (allowed.empty()) return std::nullopt;
    std::int32_t pick = allowed[rng() % allowed.size()];
    if (std::find(ends.begin(), ends.end(), pick) != ends.end()) return text;
    if (!m.accept(pick)) return std::nullopt;
    text += index->vocab().piece(pick);
  }
  return std::nullopt;
}

TEST(JsonSchema, IntegerRangesAreExact) {
  for (auto [lo, hi] : std::vector<std::pair<long long, long long>>{{0, 0}, {0, 9}, {3, 17}, {-25, 7}, {-130, -45}, {99, 1001}, {-1, 1}}) {
    auto index = index_of("root ::= " + integer_range_gbnf(lo, hi));
    for (long long v = lo - 30; v <= hi + 30; ++v)
      EXPECT_EQ(matches(index, std::to_string(v)), v >= lo && v <= hi) << v << " in [" << lo << "," << hi << "]";
    EXPECT_FALSE(matches(index, "-0"));
    if (lo <= 5 && 5 <= hi) {
      EXPECT_FALSE(matches(index, "05"));
    }
  }
}

TEST(JsonSchema, ObjectsFollowRequiredAndOrder) {
  auto index = index_of(json_schema_to_gbnf(json::parse(
      R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0},"tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2}},"required":["name"]})")));
  EXPECT_TRUE(matches(index, R"({"name": "x"})"));
  EXPECT_TRUE(matches(index, R"({"name":"x","age":3,"tags":["a","b"]})"));
  EXPECT_TRUE(matches(index, "{\n  \"name\": \"\\u00e9\",\n  \"tags\": []\n}"));
  EXPECT_FALSE(matches(index, R"({"age":3})"));                    // name is required
  EXPECT_FALSE(matches(index, R"({"name":"x","tags":["a","b","a"]})"));  // maxItems
  EXPECT_FALSE(matches(index, R"({"name":"x","age":-1})"));
  EXPECT_FALSE(matches(index, R"({"name":"x","other":1})"));        // no additional properties
  EXPECT_FALSE(matches(index, R"({"name":"x"          })"));        // whitespace is bounded
}

TEST(JsonSchema, StringsFormatsPatternsAndRefs) {
  auto check = [](const std::string& schema, const std::string& text) {
    return matches(json_schema_to_gbnf(json::parse(schema)), text);
  };
  EXPECT_TRUE(check(R"({"type":"string","minLength":2,"maxLength":3})", R"("ab")"));
  EXPECT_FALSE(check(R"({"type":"string","minLength":2,"maxLength":3})", R"("abcd")"));
  EXPECT_TRUE(check(R"({"type":"string","format":"date"})", R"("2026-12-05")"));
  EXPECT_FALSE(check(R"({"type":"string","format":"date"})", R"("2026-13-05")"));
  EXPECT_TRUE(check(R"({"type":"string","format":"date-time"})", R"("2026-12-05T10:11:12.5Z")"));
  EXPECT_TRUE(check(R"({"type":"string","format":"uuid"})", R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_TRUE(check(R"({"type":"string","format":"email"})", R"("a.b@example.com")"));
  EXPECT_TRUE(check(R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"})", R"("AB-123")"));
  EXPECT_FALSE(check(R"({"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"})", R"("AB-12")"));
  EXPECT_TRUE(check(R"({"type":["string","null"]})", "null"));
  EXPECT_TRUE(check(R"({"type":"integer","nullable":true})", "null"));
  const std::string tree = R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}}})";
  EXPECT_TRUE(check(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"));
  EXPECT_FALSE(check(tree, R"({"v":1,"kids":[{}]})"));
  EXPECT_TRUE(check(R"({"anyOf":[{"type":"integer"},{"type":"object","properties":{"x":{"const":true}},"required":["x"]}]})", R"({"x":true})"));
  EXPECT_TRUE(check(R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}]})", R"([1,"a"])"));
  EXPECT_FALSE(check(R"({"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}]})", R"([1,"a",2])"));
  EXPECT_TRUE(check(R"({"type":"number","minimum":0,"maximum":5})", "4.25"));
  EXPECT_TRUE(check(R"({"type":"number","minimum":0,"maximum":5})", "5.0"));
  EXPECT_FALSE(check(R"({"type":"number","minimum":0,"maximum":5})", "5.5"));
  EXPECT_FALSE(check(R"({"type":"number","minimum":0,"maximum":5})", "-0.5"));
  EXPECT_TRUE(check(R"({"type":"number","minimum":-2,"maximum":1})", "-1.75"));
  EXPECT_FALSE(check(R"({"type":"number","minimum":-2,"maximum":1})", "-2.5"));
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  auto keyword = [](const std::string& schema) {
    try {
      json_schema_to_gbnf(json::parse(schema));
    } catch (const SchemaError& e) {
      return e.keyword();
    }
    return std::string();
  };
  EXPECT_EQ(keyword(R"({"type":"object","patternProperties":{"a":{}}})"), "patternProperties");
  EXPECT_EQ(keyword(R"({"type":"string","format":"hostname"})"), "format");
  EXPECT_EQ(keyword(R"js({"type":"string","pattern":"(?=a)"})js"), "pattern");
  EXPECT_EQ(keyword(R"({"$ref":"http://example.com/x"})"), "$ref");
  EXPECT_EQ(keyword(R"({"type":"bogus"})"), "type");
  EXPECT_EQ(keyword(R"({"type":"object","properties":{"a":{"type":"integer"}},"title":"t","description":"d"})"), "");
}

// Bounded schemas end whatever the choices: random walks over the real Qwen3 vocabulary finish and
// parse as JSON matching the schema's shape.
TEST(JsonSchema, RandomWalksOverTheQwen3VocabularyFinishAndParse) {
  Tokenizer tok = Tokenizer::from_file(test::shared_model("tokenizers/qwen3/tokenizer.json"));
  auto vocab = token_bytes_of(tok);
  const json schema = json::parse(R"({"type":"object","properties":{
      "id":{"type":"integer","minimum":1,"maximum":999},
      "name":{"type":"string","maxLength":12},
      "ok":{"type":"boolean"},
      "tags":{"type":"array","items":{"type":"string","maxLength":5},"maxItems":3}},
      "required":["id","name","ok","tags"]})");
  auto index = std::make_shared<GrammarIndex>(compile(parse_gbnf(json_schema_to_gbnf(schema))), vocab);
  std::mt19937 rng(3);
  for (int i = 0; i < 10; ++i) {
    auto text = random_walk(index, rng, 0.5, 400);
    ASSERT_TRUE(text.has_value());
    json v = json::parse(*text);
    ASSERT_TRUE(v["id"].is_number_integer()) << *text;
    EXPECT_GE(v["id"].get<int>(), 1);
    EXPECT_LE(v["id"].get<int>(), 999);
    EXPECT_LE(v["tags"].size(), 3u);
    EXPECT_TRUE(v["ok"].is_boolean());
  }
}

}  // namespace
}  // namespace promptly::grammar
