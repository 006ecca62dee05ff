#pragma once
// What the speculative-decoding tests share: a model file loaded with its tokenizer, and greedy
// generation settings.
#include <memory>
#include <string>

#include "engine/generate.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace promptly::test {

struct Loaded {
  std::shared_ptr<const gguf::File> file;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  explicit Loaded(const std::string& path)
      : file(gguf::File::open(path)), model(std::make_unique<Model>(file)), tokenizer(std::make_unique<Tokenizer>(Vocab::from_gguf(*file))) {}
};

// n tokens, greedy, past end-of-generation tokens.
inline GenerateOptions greedy(int n) {
  GenerateOptions g;
  g.max_tokens = n;
  g.sampling.temperature = 0;
  g.ignore_eos = true;
  return g;
}

}  // namespace promptly::test
