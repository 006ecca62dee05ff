// Import of Hugging Face tokenizer.json files (byte-level BPE models such as Llama 3 and Qwen).
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/pretokenizer.h"
#include "tokenizer/vocab.h"
#include "util/error.h"

namespace promptly {
namespace {

using nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open '" + path + "'");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw Error("'" + path + "' is not valid JSON: " + e.what());
  }
}

// Split pre-tokenizers carry their regex; ByteLevel with use_regex means GPT-2's.
void collect_regexes(const json& pt, std::vector<std::string>& out, const std::string& path) {
  if (pt.is_null()) return;
  const std::string type = pt.value("type", "");
  if (type == "Sequence") {
    for (const auto& p : pt.at("pretokenizers")) collect_regexes(p, out, path);
  } else if (type == "Split") {
    const auto& pattern = pt.at("pattern");
    if (!pattern.contains("Regex")) throw Error("'" + path + "': Split pre-tokenizer without a Regex pattern is not supported");
    if (pt.value("invert", false)) throw Error("'" + path + "': inverted Split pre-tokenizers are not supported");
    out.push_back(pattern.at("Regex").get<std::string>());
  } else if (type == "ByteLevel") {
    if (pt.value("use_regex", true)) {
      std::string warning;
      for (auto& r : pre_tokenizer_for("gpt-2", warning).regexes) out.push_back(r);
    }
  } else {
    throw Error("'" + path + "': pre-tokenizer type '" + type + "' is not supported (supported: Sequence, Split, ByteLevel)");
  }
}

std::string token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content")) return j.at("content").get<std::string>();
  return {};
}

}  // namespace

Vocab Vocab::from_tokenizer_json(const std::string& path) {
  const json root = read_json(path);
  Vocab v;
  v.kind = VocabKind::Bpe;
  v.model_name = "gpt2";
  v.pre = "tokenizer.json";
  v.add_bos = false;
  v.add_space_prefix = false;
  try {
    const json& model = root.at("model");
    if (model.value("type", "") != "BPE") throw Error("'" + path + "': only BPE tokenizer.json models are supported");
    const json& vocab = model.at("vocab");
    std::size_t n = vocab.size();
    for (const auto& t : root.value("added_tokens", json::array())) n = std::max<std::size_t>(n, t.at("id").get<std::size_t>() + 1);
    if (n > (1u << 24)) throw Error("'" + path + "': vocabulary of " + std::to_string(n) + " entries is too large");
    v.tokens.assign(n, "");
    v.types.assign(n, TokenType::Unused);
    v.scores.assign(n, 0.0f);
    for (const auto& [piece, id] : vocab.items()) {
      const auto i = id.get<std::size_t>();
      if (i >= n) throw Error("'" + path + "': token id " + std::to_string(i) + " out of range");
      v.tokens[i] = piece;
      v.types[i] = TokenType::Normal;
    }
    for (const auto& t : root.value("added_tokens", json::array())) {
      const auto i = t.at("id").get<std::size_t>();
      v.tokens[i] = t.at("content").get<std::string>();
      v.types[i] = t.value("special", false) ? TokenType::Control : TokenType::UserDefined;
      // Here, unlike in GGUF, the file says which added tokens swallow the whitespace beside them.
      const auto flags = static_cast<std::uint8_t>((t.value("lstrip", false) ? kStripLeft : kStripNone) |
                                                   (t.value("rstrip", false) ? kStripRight : kStripNone));
      v.set_strip(static_cast<std::int32_t>(i), flags);
    }
    const json& merges = model.at("merges");
    v.merge_ranks.reserve(merges.size());
    std::int32_t rank = 0;
    for (const auto& m : merges) {
      // Older files write "a b", newer ones ["a", "b"].
      const std::string key = m.is_string() ? m.get<std::string>() : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>();
      v.merge_ranks.emplace(key, rank++);
    }
    v.ignore_merges = model.value("ignore_merges", false);
    collect_regexes(root.value("pre_tokenizer", json()), v.pre_regexes, path);
    if (const auto& norm = root.value("normalizer", json()); !norm.is_null()) {
      v.warnings.push_back("tokenizer.json normalizer '" + norm.value("type", std::string("?")) +
                           "' is not applied (text that is already normalized tokenizes identically)");
    }
  } catch (const json::exception& e) {
    throw Error("'" + path + "' is not a tokenizer.json Promptly understands: " + e.what());
  }
  v.finalize();

  auto id_of = [&](const std::string& content) { return content.empty() ? -1 : v.find(content); };
  // bos/eos and the chat template live in tokenizer_config.json beside it.
  const std::filesystem::path config = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config)) {
    const json c = read_json(config.string());
    v.bos = id_of(token_content(c.value("bos_token", json())));
    v.eos = id_of(token_content(c.value("eos_token", json())));
    v.pad = id_of(token_content(c.value("pad_token", json())));
    v.add_bos = c.contains("add_bos_token") ? c.at("add_bos_token").get<bool>() : v.bos >= 0;
    v.add_eos = c.value("add_eos_token", false);
    if (c.contains("chat_template") && c.at("chat_template").is_string()) v.chat_template = c.at("chat_template").get<std::string>();
  }
  return v;
}

}  // namespace promptly
