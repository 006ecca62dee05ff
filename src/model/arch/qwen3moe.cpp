// Qwen 3 MoE (Qwen3-30B-A3B, 235B-A22B): qwen3's attention; every block's FFN is a mixture of
// experts of expert_feed_forward_length, routed by a softmax over all experts, then the top
// expert_used_count, renormalised to sum 1 (expert_weights_norm, true when the file does not say).
#include "model/arch/arch.h"

namespace promptly::arch {

Arch qwen3moe() {
  Arch a;
  a.name = "qwen3moe";
  a.rope_neox = true;
  a.qk_norm = true;
  a.router = Router::SoftmaxThenTopK;
  a.experts_required = true;
  return a;
}

}  // namespace promptly::arch
