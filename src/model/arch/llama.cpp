// Llama, Mistral, TinyLlama, Llama 3 (rope_freqs.weight), and Mixtral: a llama whose file has
// llama.expert_count, with ffn_gate_inp and ffn_{gate,up,down}_exps in place of the dense FFN; its
// router takes the top-k logits, then a softmax over those.
#include "model/arch/arch.h"

namespace promptly::arch {

Arch llama() {
  Arch a;
  a.name = "llama";
  a.router = Router::TopKThenSoftmax;
  return a;
}

}  // namespace promptly::arch
