// Qwen 3 (dense): no biases, RMSNorm of each query and key head (attn_q_norm, attn_k_norm) before
// NeoX RoPE; head size from attention.key_length (128 while n_embd / n_head may differ).
#include "model/arch/arch.h"

namespace promptly::arch {

Arch qwen3() {
  Arch a;
  a.name = "qwen3";
  a.rope_neox = true;
  a.qk_norm = true;
  return a;
}

}  // namespace promptly::arch
