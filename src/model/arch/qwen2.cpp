// Qwen 2 / 2.5: llama with biases on q, k and v and NeoX RoPE.
#include "model/arch/arch.h"

namespace promptly::arch {

Arch qwen2() {
  Arch a;
  a.name = "qwen2";
  a.rope_neox = true;
  a.qkv_bias = true;
  return a;
}

}  // namespace promptly::arch
