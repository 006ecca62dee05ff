// Gemma 2: embeddings scaled by sqrt(n_embd); GeGLU with tanh GELU; RMSNorm before and after both
// attention and FFN (post_attention_norm, post_ffw_norm); attention logits soft-capped
// (attn_logit_softcapping) and the final logits too (final_logit_softcapping); sliding-window
// attention on alternate layers (even layers local); query scale 1/sqrt(attention.key_length).
// The converter stores Gemma's RMSNorm weights already as 1 + w, so the norms are plain RMSNorm.
#include "model/arch/arch.h"

namespace promptly::arch {

Arch gemma2() {
  Arch a;
  a.name = "gemma2";
  a.rope_neox = true;
  a.post_norms = true;
  a.embed_scale = true;
  a.activation = Activation::GeluTanh;
  a.softcap = true;
  a.swa_pattern = 2;
  return a;
}

}  // namespace promptly::arch
