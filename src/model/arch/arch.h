#pragma once
// An architecture as data: which tensors a block has, where its norms go, which attention and FFN
// variants it uses, how RoPE and the embedding are scaled. Model loads and runs every architecture
// from one of these; adding one is a file here (returning its Arch), a line in arch.cpp and a test.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace promptly::arch {

enum class Activation {
  Silu,      // SwiGLU: silu(gate) * up
  GeluTanh,  // GeGLU: gelu_tanh(gate) * up (Gemma)
};

// How a mixture-of-experts router turns its logits into the chosen experts' weights (used when the
// file has `<arch>.expert_count`).
enum class Router {
  TopKThenSoftmax,  // Mixtral: the k largest logits, softmax over those k
  SoftmaxThenTopK,  // Qwen3-MoE: softmax over all, the k largest, renormalised if expert_weights_norm
};

struct Arch {
  std::string name;             // general.architecture
  bool rope_neox = false;       // NeoX pairing (x[i], x[i + n_rot/2]) instead of adjacent pairs
  bool qkv_bias = false;        // blk.N.attn_{q,k,v}.bias, used when present
  bool fused_qkv = false;       // blk.N.attn_qkv: the q, k and v rows stacked in one matrix
  bool fused_gate_up = false;   // blk.N.ffn_up holds the gate rows then the up rows (2 x n_ff)
  bool qk_norm = false;         // blk.N.attn_q_norm / attn_k_norm: RMSNorm per head before RoPE
  bool post_norms = false;      // blk.N.post_attention_norm / post_ffw_norm on each sublayer's output
  bool embed_scale = false;     // embeddings multiplied by sqrt(n_embd)
  Activation activation = Activation::Silu;
  Router router = Router::TopKThenSoftmax;
  bool experts_required = false;  // an MoE architecture: expert_count must be present
  bool softcap = false;           // reads attn_logit_softcapping and final_logit_softcapping
  // Sliding-window attention, when the file gives `<arch>.attention.sliding_window`:
  // 0 never; 1 every layer; n > 1: layer il is local when il % n < n - 1 (Gemma 2: 2, Gemma 3: 6).
  std::uint32_t swa_pattern = 0;
  // RoPE base of local (sliding-window) layers; 0: the global base. Local layers use no scaling.
  float swa_rope_base = 0.0f;
};

// The description of `name`, or null when it is not supported.
const Arch* find(std::string_view name);
// "gemma2, gemma3, ..." for error messages.
std::string supported_list();

// One function per file in this directory.
Arch llama();
Arch qwen2();
Arch qwen3();
Arch qwen3moe();
Arch gemma2();
Arch gemma3();
Arch phi3();

}  // namespace promptly::arch
