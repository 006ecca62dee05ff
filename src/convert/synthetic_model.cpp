#include "convert/synthetic_model.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "convert/file_type.h"
#include "gguf/writer.h"
#include "model/arch/arch.h"
#include "tensor/quant.h"
#include "tokenizer/pretokenizer.h"
#include "util/error.h"

namespace promptly {
namespace {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [-a, a] with a = sqrt(3) * stddev; each row has its own stream, so rows can be
// generated in parallel and the file is the same for any thread count.
void random_row(float* out, std::size_t n, float stddev, std::uint64_t seed) {
  std::uint64_t state = seed;
  const float a = std::sqrt(3.0f) * stddev;
  for (std::size_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
    out[i] = static_cast<float>((2.0 * u - 1.0) * a);
  }
}

const char* const kWords[] = {
    "the", "and", "was", "to", "a", "he", "she", "it", "of", "in", "you", "that", "his", "her", "they", "with",
    "for", "on", "said", "day", "one", "time", "little", "big", "happy", "play", "friend", "friends", "upon",
    "once", "there", "girl", "boy", "named", "loved", "mom", "dad", "saw", "wanted", "went", "very", "not",
    "but", "so", "is", "are", "were", "be", "have", "had", "do", "did", "can", "could", "would", "will", "what",
    "when", "where", "who", "how", "why", "this", "these", "those", "from", "at", "by", "up", "down", "out",
    "all", "some", "more", "like", "good", "new", "first", "last", "long", "great", "old", "right", "people",
    "water", "world", "work", "know", "think", "make", "take", "see", "come", "look", "want", "give", "use",
    "find", "tell", "ask", "feel", "try", "leave", "call", "hello", "help", "thank", "thanks", "please", "yes",
    "no", "model", "answer", "question", "chat", "token", "server", "fast", "code", "data", "user", "system",
    "assistant", "function", "return", "value", "string", "number", "list", "file", "name", "about", "because",
};

bool moe_stack_name(const std::string& name) { return name.ends_with("_exps.weight"); }

// Each family's chat format, as short templates of our own (the shape of the turns, not the
// families' full templates: no tools). Qwen3's closes an empty think block when enable_thinking is
// false, as Qwen's does; Gemma has no system role (it speaks as the user).
const char* const kChatMlThinking =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}";
const char* const kChatMl =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
const char* const kGemmaChat =
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}\n"
    "{{ m.content }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}";
const char* const kPhi3Chat =
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}";
const char* const kMistralChat =
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'assistant' %}{{ m.content }}{{ eos_token }}"
    "{% else %}[INST] {{ m.content }} [/INST]{% endif %}{% endfor %}";

// The family's specials and template for a preset of architecture `arch` (test and real shapes alike).
void set_family_chat(SyntheticModelSpec& s, bool mixtral) {
  if (s.arch == "qwen3" || s.arch == "qwen3moe") {
    s.special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"};
    s.chat_template = kChatMlThinking;
  } else if (s.arch == "qwen2") {
    s.special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    s.chat_template = kChatMl;
  } else if (s.arch == "gemma2" || s.arch == "gemma3") {
    s.special_tokens = {"<start_of_turn>", "<end_of_turn>"};
    s.chat_template = kGemmaChat;
  } else if (s.arch == "phi3") {
    s.special_tokens = {"<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"};
    s.chat_template = kPhi3Chat;
  } else if (mixtral) {
    s.chat_template = kMistralChat;
  }
}

// Each family's tokenizer as its real GGUF files carry it: Qwen's byte-level BPE (no BOS, the
// end-of-turn token as EOS), Gemma's SentencePiece without the dummy-prefix space, and llama's
// SentencePiece for the rest (Phi-3 and Mistral included).
void write_family_tokenizer(gguf::Writer& w, const SyntheticModelSpec& s) {
  if (s.arch == "qwen2" || s.arch == "qwen3" || s.arch == "qwen3moe") {
    const SyntheticVocab vocab = synthetic_bpe_vocab(s.n_vocab, s.special_tokens);
    auto id_of = [&](const std::string& piece) {
      for (std::size_t i = 0; i < vocab.tokens.size(); ++i) {
        if (vocab.tokens[i] == piece) return static_cast<std::uint32_t>(i);
      }
      throw Error("synthetic BPE vocabulary lacks '" + piece + "'");
    };
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "qwen2");
    w.set_string_array("tokenizer.ggml.tokens", vocab.tokens);
    w.set_i32_array("tokenizer.ggml.token_type", vocab.types);
    w.set_string_array("tokenizer.ggml.merges", vocab.merges);
    const std::uint32_t end_of_text = id_of("<|endoftext|>");
    w.set_u32("tokenizer.ggml.bos_token_id", end_of_text);
    w.set_u32("tokenizer.ggml.padding_token_id", end_of_text);
    w.set_u32("tokenizer.ggml.eos_token_id", id_of("<|im_end|>"));
    w.set_bool("tokenizer.ggml.add_bos_token", false);
    return;
  }
  const SyntheticVocab vocab = synthetic_vocab(s.n_vocab, s.special_tokens);
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string("tokenizer.ggml.pre", "default");
  w.set_string_array("tokenizer.ggml.tokens", vocab.tokens);
  w.set_f32_array("tokenizer.ggml.scores", vocab.scores);
  w.set_i32_array("tokenizer.ggml.token_type", vocab.types);
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
  w.set_bool("tokenizer.ggml.add_space_prefix", s.arch != "gemma2" && s.arch != "gemma3");
}

}  // namespace

std::vector<std::string> synthetic_preset_names() {
  return {"tiny",          "tiny-qwen2", "tiny-qwen3", "tiny-qwen3moe", "tiny-gemma2", "tiny-gemma3", "tiny-phi3",
          "tiny-mixtral",  "125m",       "tinyllama-1.1b", "llama3-8b", "qwen3-0.6b", "qwen3-4b",  "gemma3-1b",  "gemma2-2b",
          "phi3-mini",     "qwen3-30b-a3b", "mixtral-8x7b"};
}

SyntheticModelSpec synthetic_preset(const std::string& name) {
  SyntheticModelSpec s;
  s.preset = name;
  if (name == "tiny") {
    s.n_layer = 2; s.n_embd = 256; s.n_head = 4; s.n_head_kv = 2; s.n_ff = 768; s.n_vocab = 1024; s.n_ctx = 2048;
  } else if (name == "tiny-qwen2") {
    s.arch = "qwen2";
    s.n_layer = 2; s.n_embd = 256; s.n_head = 4; s.n_head_kv = 2; s.n_ff = 768; s.n_vocab = 1024; s.n_ctx = 4096;
    s.rope_freq_base = 1000000.0f;
  } else if (name == "tiny-qwen3") {
    s.arch = "qwen3";  // head size 32 while n_embd / n_head is 16, as in the real models
    s.n_layer = 2; s.n_embd = 64; s.n_head = 4; s.n_head_kv = 2; s.head_dim = 32; s.n_ff = 192; s.n_vocab = 512;
    s.n_ctx = 4096; s.rope_freq_base = 1000000.0f; s.rms_eps = 1e-6f; s.tied_output = true;
  } else if (name == "tiny-qwen3moe") {
    s.arch = "qwen3moe";
    s.n_layer = 2; s.n_embd = 64; s.n_head = 4; s.n_head_kv = 2; s.head_dim = 32; s.n_ff = 192; s.n_vocab = 512;
    s.n_ctx = 4096; s.rope_freq_base = 1000000.0f; s.rms_eps = 1e-6f;
    s.n_expert = 8; s.n_expert_used = 2; s.n_ff_expert = 64;
  } else if (name == "tiny-gemma2") {
    s.arch = "gemma2";
    s.n_layer = 2; s.n_embd = 64; s.n_head = 4; s.n_head_kv = 2; s.head_dim = 32; s.n_ff = 192; s.n_vocab = 512;
    s.n_ctx = 8192; s.rms_eps = 1e-6f; s.tied_output = true;
    s.sliding_window = 4; s.attn_softcap = 50.0f; s.final_softcap = 30.0f;
  } else if (name == "tiny-gemma3") {
    s.arch = "gemma3";  // six layers: five local, one global
    s.n_layer = 6; s.n_embd = 64; s.n_head = 4; s.n_head_kv = 1; s.head_dim = 32; s.n_ff = 192; s.n_vocab = 512;
    s.n_ctx = 32768; s.rope_freq_base = 1000000.0f; s.rms_eps = 1e-6f; s.tied_output = true; s.sliding_window = 4;
  } else if (name == "tiny-phi3") {
    s.arch = "phi3";
    s.n_layer = 2; s.n_embd = 64; s.n_head = 4; s.n_head_kv = 4; s.n_ff = 192; s.n_vocab = 512; s.n_ctx = 4096;
    s.sliding_window = 4;
  } else if (name == "tiny-mixtral") {
    s.n_layer = 2; s.n_embd = 64; s.n_head = 4; s.n_head_kv = 2; s.n_ff = 128; s.n_vocab = 512; s.n_ctx = 32768;
    s.rope_freq_base = 1000000.0f; s.n_expert = 4; s.n_expert_used = 2; s.n_ff_expert = 128;
  } else if (name == "qwen3-0.6b") {
    s.arch = "qwen3";
    s.n_layer = 28; s.n_embd = 1024; s.n_head = 16; s.n_head_kv = 8; s.head_dim = 128; s.n_ff = 3072; s.n_vocab = 151936;
    s.n_ctx = 40960; s.rope_freq_base = 1000000.0f; s.rms_eps = 1e-6f; s.tied_output = true;
  } else if (name == "qwen3-4b") {
    s.arch = "qwen3";
    s.n_layer = 36; s.n_embd = 2560; s.n_head = 32; s.n_head_kv = 8; s.head_dim = 128; s.n_ff = 9728; s.n_vocab = 151936;
    s.n_ctx = 40960; s.rope_freq_base = 1000000.0f; s.rms_eps = 1e-6f; s.tied_output = true;
  } else if (name == "gemma3-1b") {
    s.arch = "gemma3";
    s.n_layer = 26; s.n_embd = 1152; s.n_head = 4; s.n_head_kv = 1; s.head_dim = 256; s.n_ff = 6912; s.n_vocab = 262144;
    s.n_ctx = 32768; s.rope_freq_base = 1000000.0f; s.rms_eps = 1e-6f; s.tied_output = true; s.sliding_window = 512;
  } else if (name == "gemma2-2b") {
    s.arch = "gemma2";
    s.n_layer = 26; s.n_embd = 2304; s.n_head = 8; s.n_head_kv = 4; s.head_dim = 256; s.n_ff = 9216; s.n_vocab = 256000;
    s.n_ctx = 8192; s.rms_eps = 1e-6f; s.tied_output = true; s.sliding_window = 4096; s.attn_softcap = 50.0f;
    s.final_softcap = 30.0f;
  } else if (name == "phi3-mini") {
    s.arch = "phi3";
    s.n_layer = 32; s.n_embd = 3072; s.n_head = 32; s.n_head_kv = 32; s.n_ff = 8192; s.n_vocab = 32064; s.n_ctx = 4096;
    s.sliding_window = 2047;
  } else if (name == "qwen3-30b-a3b") {
    s.arch = "qwen3moe";
    s.n_layer = 48; s.n_embd = 2048; s.n_head = 32; s.n_head_kv = 4; s.head_dim = 128; s.n_ff = 6144; s.n_vocab = 151936;
    s.n_ctx = 40960; s.rope_freq_base = 1000000.0f; s.rms_eps = 1e-6f; s.n_expert = 128; s.n_expert_used = 8;
    s.n_ff_expert = 768;
  } else if (name == "mixtral-8x7b") {
    s.n_layer = 32; s.n_embd = 4096; s.n_head = 32; s.n_head_kv = 8; s.n_ff = 14336; s.n_vocab = 32000; s.n_ctx = 32768;
    s.rope_freq_base = 1000000.0f; s.n_expert = 8; s.n_expert_used = 2; s.n_ff_expert = 14336;
  } else if (name == "125m") {
    s.n_layer = 12; s.n_embd = 768; s.n_head = 12; s.n_head_kv = 12; s.n_ff = 2048; s.n_vocab = 32000; s.n_ctx = 2048;
  } else if (name == "tinyllama-1.1b") {
    s.n_layer = 22; s.n_embd = 2048; s.n_head = 32; s.n_head_kv = 4; s.n_ff = 5632; s.n_vocab = 32000; s.n_ctx = 8192;
  } else if (name == "llama3-8b") {  // Llama-3-8B's shape: the GPU targets are stated at it (issue 30)
    s.n_layer = 32; s.n_embd = 4096; s.n_head = 32; s.n_head_kv = 8; s.n_ff = 14336; s.n_vocab = 128256; s.n_ctx = 8192;
    s.rope_freq_base = 500000.0f;
  } else {
    std::string names;
    for (const auto& n : synthetic_preset_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error("unknown preset '" + name + "'; available: " + names);
  }
  set_family_chat(s, s.n_expert > 0);
  return s;
}

SyntheticVocab synthetic_vocab(std::uint32_t n_vocab, const std::vector<std::string>& special_tokens) {
  SyntheticVocab v;
  std::set<std::string> seen;
  auto add = [&](const std::string& piece, std::int32_t type) {
    if (v.tokens.size() >= n_vocab || !seen.insert(piece).second) return;
    v.scores.push_back(type == 1 ? -static_cast<float>(v.tokens.size()) : 0.0f);
    v.tokens.push_back(piece);
    v.types.push_back(type);
  };
  const std::string sp = "\xe2\x96\x81";
  add("<unk>", 2);
  add("<s>", 3);
  add("</s>", 3);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    add(name, 6);
  }
  if (v.tokens.size() < 259) throw Error("a synthetic vocabulary needs at least 259 tokens");
  for (const std::string& special : special_tokens) add(special, 3);
  add(sp, 1);
  for (char c = 32; c < 127; ++c) {
    if (c != ' ') add(std::string(1, c), 1);
  }
  for (char c = 'a'; c <= 'z'; ++c) add(sp + c, 1);
  for (char c = 'A'; c <= 'Z'; ++c) add(sp + c, 1);
  for (const char* w : kWords) {  // every prefix, so SentencePiece merges can reach the whole word
    const std::string word = w;
    for (std::size_t len = 2; len <= word.size(); ++len) add(sp + word.substr(0, len), 1);
    std::string cap = word;
    cap[0] = static_cast<char>(cap[0] - 'a' + 'A');
    for (std::size_t len = 2; len <= cap.size(); ++len) add(sp + cap.substr(0, len), 1);
  }
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) add(std::string{a, b}, 1);
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) add(sp + std::string{a, b}, 1);
  for (char a = 'a'; a <= 'z' && v.tokens.size() < n_vocab; ++a)
    for (char b = 'a'; b <= 'z'; ++b)
      for (char c = 'a'; c <= 'z'; ++c) add(std::string{a, b, c}, 1);
  for (std::uint32_t i = 0; v.tokens.size() < n_vocab; ++i) add("<unused" + std::to_string(i) + ">", 5);
  return v;
}

SyntheticVocab synthetic_bpe_vocab(std::uint32_t n_vocab, const std::vector<std::string>& special_tokens) {
  if (n_vocab < 256 + special_tokens.size()) throw Error("a synthetic BPE vocabulary needs room for 256 byte tokens and its specials");
  SyntheticVocab v;
  std::set<std::string> seen;
  const std::size_t merged_limit = n_vocab - special_tokens.size();
  auto add = [&](const std::string& piece, std::int32_t type) {
    if (!seen.insert(piece).second) return false;
    v.tokens.push_back(piece);
    v.types.push_back(type);
    return true;
  };
  for (int b = 0; b < 256; ++b) add(byte_to_unicode(static_cast<unsigned char>(b)), 1);
  // Merges join a word's symbols left to right, so every merge's result is a token and any text
  // tokenizes; words with their leading space come first, as the more frequent form.
  auto add_word = [&](const std::vector<std::string>& symbols) {
    std::string left = symbols[0];
    for (std::size_t k = 1; k < symbols.size() && v.tokens.size() < merged_limit; ++k) {
      const std::string joined = left + symbols[k];
      if (add(joined, 1)) v.merges.push_back(left + " " + symbols[k]);
      left = joined;
    }
  };
  const std::string space = byte_to_unicode(' ');
  auto letters = [](const std::string& word) {
    std::vector<std::string> out;
    for (char c : word) out.emplace_back(1, c);
    return out;
  };
  for (const char* w : kWords) {
    std::vector<std::string> symbols = letters(w);
    symbols.insert(symbols.begin(), space);
    add_word(symbols);
  }
  for (const char* w : kWords) add_word(letters(w));
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) add_word({std::string(1, a), std::string(1, b)});
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) add_word({space, std::string{a, b}});
  for (const std::string& special : special_tokens) add(special, 3);
  for (std::uint32_t i = 0; v.tokens.size() < n_vocab; ++i) add("[PAD" + std::to_string(i) + "]", 5);
  return v;
}

void write_synthetic_model(const SyntheticModelSpec& s, DType dtype, std::uint64_t seed, const std::string& path,
                           ThreadPool& pool, const std::string& chat_template, bool m_mix) {
  if (!can_quantize_to(dtype)) throw Error("gen-model cannot write " + std::string(dtype_name(dtype)));
  if (m_mix && dtype != DType::Q3_K && dtype != DType::Q4_K && dtype != DType::Q5_K) {
    throw Error("internal: the _M mixes are over Q3_K, Q4_K or Q5_K");
  }
  const arch::Arch* desc = arch::find(s.arch);
  if (!desc) throw Error("gen-model: unsupported architecture '" + s.arch + "'; supported: " + arch::supported_list());
  const bool moe = s.n_expert > 0;
  const std::uint32_t head_dim = s.head_dim ? s.head_dim : s.n_embd / s.n_head;
  gguf::Writer w;
  const std::string a = s.arch + ".";
  w.set_string("general.architecture", s.arch);
  w.set_string("general.name", "promptly-synthetic-" + s.preset);
  w.set_u32("general.file_type", file_type_for(dtype, m_mix));
  w.set_u32("general.quantization_version", 2);
  w.set_u32(a + "context_length", s.n_ctx);
  w.set_u32(a + "embedding_length", s.n_embd);
  w.set_u32(a + "block_count", s.n_layer);
  w.set_u32(a + "feed_forward_length", s.n_ff);
  w.set_u32(a + "attention.head_count", s.n_head);
  w.set_u32(a + "attention.head_count_kv", s.n_head_kv);
  w.set_f32(a + "attention.layer_norm_rms_epsilon", s.rms_eps);
  if (s.arch != "gemma2") w.set_f32(a + "rope.freq_base", s.rope_freq_base);  // gemma2 files leave the default
  w.set_u32(a + "rope.dimension_count", head_dim);
  if (s.head_dim) {
    w.set_u32(a + "attention.key_length", head_dim);
    w.set_u32(a + "attention.value_length", head_dim);
  }
  if (s.arch == "phi3") w.set_u32(a + "rope.scaling.original_context_length", s.n_ctx);
  if (s.rope_linear_factor > 0) {
    w.set_string(a + "rope.scaling.type", "linear");
    w.set_f32(a + "rope.scaling.factor", s.rope_linear_factor);
  }
  if (s.sliding_window) w.set_u32(a + "attention.sliding_window", s.sliding_window);
  if (s.attn_softcap > 0) w.set_f32(a + "attn_logit_softcapping", s.attn_softcap);
  if (s.final_softcap > 0) w.set_f32(a + "final_logit_softcapping", s.final_softcap);
  if (moe) {
    w.set_u32(a + "expert_count", s.n_expert);
    w.set_u32(a + "expert_used_count", s.n_expert_used);
    if (s.arch == "qwen3moe") w.set_u32(a + "expert_feed_forward_length", s.n_ff_expert);
  }

  write_family_tokenizer(w, s);
  if (!chat_template.empty() || !s.chat_template.empty()) {
    w.set_string("tokenizer.chat_template", chat_template.empty() ? s.chat_template : chat_template);
  }

  std::uint64_t tensor_index = 0;
  // n stacked matrices of rows x cols (n = 1: a plain 2-D matrix).
  auto stacked = [&](const std::string& name, std::uint32_t cols, std::uint32_t rows, std::uint32_t n, float stddev, DType type) {
    if (m_mix && type == dtype) type = quantized_matrix_type(dtype, true, name, cols, static_cast<int>(s.n_layer), !s.tied_output);
    const std::uint64_t tensor_seed = seed * 0x100000001b3ull + (++tensor_index) * 0x9e3779b97f4a7c15ull;
    std::vector<std::uint64_t> dims = {cols, rows};
    if (n > 1 || moe_stack_name(name)) dims.push_back(n);
    const std::size_t total_rows = static_cast<std::size_t>(rows) * n;
    w.add_tensor(name, dims, type, [=, &pool](std::uint8_t* out) {
      const std::size_t stride = row_bytes(type, cols);
      pool.parallel_for(total_rows, 64, [&](std::size_t begin, std::size_t end, int) {
        std::vector<float> row(cols);
        for (std::size_t r = begin; r < end; ++r) {
          random_row(row.data(), cols, stddev, tensor_seed ^ (r * 0xd1b54a32d192ed03ull));
          quantize_row(type, row.data(), out + r * stride, cols);
        }
      });
    });
  };
  auto matrix = [&](const std::string& name, std::uint32_t cols, std::uint32_t rows, float stddev, DType type) {
    stacked(name, cols, rows, 1, stddev, type);
  };
  auto vector = [&](const std::string& name, std::uint32_t n, float value, float jitter) {
    const std::uint64_t tensor_seed = seed + (++tensor_index) * 0x9e3779b97f4a7c15ull;
    w.add_tensor(name, {n}, DType::F32, [=](std::uint8_t* out) {
      std::vector<float> v(n);
      random_row(v.data(), n, jitter, tensor_seed);
      for (float& x : v) x += value;
      std::memcpy(out, v.data(), n * sizeof(float));
    });
  };

  const std::uint32_t q_dim = s.n_head * head_dim, kv_dim = s.n_head_kv * head_dim;
  const float in_embd = 1.0f / std::sqrt(static_cast<float>(s.n_embd));
  const float residual = 1.0f / std::sqrt(2.0f * s.n_layer);  // keeps the residual stream's variance bounded
  // Scaled embeddings (gemma) are stored small, so that embedding * sqrt(n_embd) is O(1); a tied
  // output then gives logits of a useful spread, as output.weight does.
  matrix("token_embd.weight", s.n_embd, s.n_vocab, desc->embed_scale || s.tied_output ? 3.0f * in_embd : 1.0f, dtype);
  vector("output_norm.weight", s.n_embd, 1.0f, 0.0f);
  if (!s.tied_output) matrix("output.weight", s.n_embd, s.n_vocab, 3.0f * in_embd, dtype);
  const std::uint32_t ff = moe ? s.n_ff_expert : s.n_ff;
  const float down_scale = residual / std::sqrt(static_cast<float>(ff)) * 2.0f;
  for (std::uint32_t i = 0; i < s.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    vector(p + "attn_norm.weight", s.n_embd, 1.0f, 0.0f);
    if (desc->fused_qkv) {
      matrix(p + "attn_qkv.weight", s.n_embd, q_dim + 2 * kv_dim, in_embd, dtype);
    } else {
      matrix(p + "attn_q.weight", s.n_embd, q_dim, in_embd, dtype);
      matrix(p + "attn_k.weight", s.n_embd, kv_dim, in_embd, dtype);
      matrix(p + "attn_v.weight", s.n_embd, kv_dim, in_embd, dtype);
    }
    if (desc->qkv_bias) {
      vector(p + "attn_q.bias", q_dim, 0.0f, 0.1f);
      vector(p + "attn_k.bias", kv_dim, 0.0f, 0.1f);
      vector(p + "attn_v.bias", kv_dim, 0.0f, 0.1f);
    }
    if (desc->qk_norm) {
      vector(p + "attn_q_norm.weight", head_dim, 1.0f, 0.2f);
      vector(p + "attn_k_norm.weight", head_dim, 1.0f, 0.2f);
    }
    matrix(p + "attn_output.weight", q_dim, s.n_embd, residual / std::sqrt(static_cast<float>(q_dim)), dtype);
    if (desc->post_norms) vector(p + "post_attention_norm.weight", s.n_embd, 1.0f, 0.2f);
    vector(p + "ffn_norm.weight", s.n_embd, 1.0f, 0.0f);
    if (moe) {
      matrix(p + "ffn_gate_inp.weight", s.n_embd, s.n_expert, in_embd, DType::F32);  // routers stay F32, as llama.cpp keeps them
      stacked(p + "ffn_gate_exps.weight", s.n_embd, ff, s.n_expert, in_embd, dtype);
      stacked(p + "ffn_up_exps.weight", s.n_embd, ff, s.n_expert, in_embd, dtype);
      stacked(p + "ffn_down_exps.weight", ff, s.n_embd, s.n_expert, down_scale, dtype);
    } else if (desc->fused_gate_up) {
      matrix(p + "ffn_up.weight", s.n_embd, 2 * ff, in_embd, dtype);
      matrix(p + "ffn_down.weight", ff, s.n_embd, down_scale, dtype);
    } else {
      matrix(p + "ffn_gate.weight", s.n_embd, ff, in_embd, dtype);
      matrix(p + "ffn_up.weight", s.n_embd, ff, in_embd, dtype);
      matrix(p + "ffn_down.weight", ff, s.n_embd, down_scale, dtype);
    }
    if (desc->post_norms) vector(p + "post_ffw_norm.weight", s.n_embd, 1.0f, 0.2f);
  }
  w.write(path);
}

}  // namespace promptly
