// Gemma 3 (text): Gemma 2's layout without soft-capping, plus RMSNorm per query and key head; five
// local (sliding-window) layers to each global one (layer il is global when il % 6 == 5); local
// layers rotate with base 10000 and no scaling, global ones with rope.freq_base (and the file's
// linear scaling, if any).
#include "model/arch/arch.h"

namespace promptly::arch {

Arch gemma3() {
  Arch a;
  a.name = "gemma3";
  a.rope_neox = true;
  a.qk_norm = true;
  a.post_norms = true;
  a.embed_scale = true;
  a.activation = Activation::GeluTanh;
  a.swa_pattern = 6;
  a.swa_rope_base = 10000.0f;
  return a;
}

}  // namespace promptly::arch
