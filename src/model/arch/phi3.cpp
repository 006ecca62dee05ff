// Phi-3: q, k and v in one matrix (attn_qkv), gate and up in one (ffn_up, gate rows first), NeoX
// RoPE, sliding-window attention on every layer when the file gives attention.sliding_window.
#include "model/arch/arch.h"

namespace promptly::arch {

Arch phi3() {
  Arch a;
  a.name = "phi3";
  a.rope_neox = true;
  a.fused_qkv = true;
  a.fused_gate_up = true;
  a.swa_pattern = 1;
  return a;
}

}  // namespace promptly::arch
