#pragma once
// A model split over tensor-parallel ranks that are threads of the test process.
#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "../parallel/thread_group.h"
#include "engine/engine.h"
#include "model/model.h"
#include "util/thread_pool.h"

namespace promptly::test {

// The model split over `ranks` threads: rank 0's Model in this thread, the others following it.
class SplitModel {
 public:
  using Load = std::function<std::unique_ptr<Model>(std::shared_ptr<const gguf::File>, std::shared_ptr<parallel::Communicator>)>;
  // `load`: how each rank loads its share (a CPU Model by default; the GPU tests place it on a device).
  SplitModel(std::shared_ptr<const gguf::File> file, int ranks, Load load = {}) : group_(ranks) {
    if (!load) load = [](auto f, auto comm) { return std::make_unique<Model>(std::move(f), std::move(comm)); };
    std::vector<std::promise<void>> loaded(static_cast<std::size_t>(ranks - 1));
    for (int r = 1; r < ranks; ++r) {
      followers_.emplace_back([this, file, r, &loaded, load] {
        std::unique_ptr<Model> m;
        try {
          m = load(file, group_.rank(r));
        } catch (...) {
          loaded[static_cast<std::size_t>(r - 1)].set_exception(std::current_exception());
          return;
        }
        loaded[static_cast<std::size_t>(r - 1)].set_value();
        ThreadPool pool(1);
        m->follow_steps(pool);
      });
    }
    for (auto& l : loaded) l.get_future().get();
    rank0_ = load(file, group_.rank(0));
  }
  ~SplitModel() {
    rank0_.reset();  // tells the others to stop
    for (std::thread& t : followers_) t.join();
  }
  const Model& model() const { return *rank0_; }

 private:
  ThreadGroup group_;
  std::vector<std::thread> followers_;
  std::unique_ptr<Model> rank0_;
};

// The engine's greedy answers to prompts that share a prefix ending inside a block, one at a time,
// so that each later one hits the cache and rank 0's prefix tree copies that block's rows (which a
// split model's other ranks must repeat).
inline std::vector<std::vector<std::int32_t>> answers_with_shared_prefixes(const Model& m) {
  std::vector<std::vector<std::int32_t>> prompts;
  for (int k = 0; k < 4; ++k) {
    std::vector<std::int32_t> p;
    for (int i = 0; i < 40; ++i) p.push_back(3 + (i * 13) % 1000);  // 2.5 blocks shared
    for (int i = 0; i < 5 + k; ++i) p.push_back(7 + (k * 31 + i * 17) % 1000);
    prompts.push_back(p);
  }
  EngineOptions o;
  o.threads = 1;
  o.ctx_size = 256;
  o.kv_memory = 4 << 20;
  Engine engine(m, nullptr, o);
  std::vector<std::vector<std::int32_t>> out(prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    std::promise<void> done;
    Request r;
    r.prompt = prompts[i];
    r.max_tokens = 12;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    r.on_event = [&, i](const EngineEvent& e) {
      if (e.kind == EngineEvent::Kind::Token) out[i].push_back(e.token);
      if (e.kind == EngineEvent::Kind::Finished) {
        EXPECT_TRUE(e.error.empty()) << e.error;
        if (i > 0) {
          EXPECT_GE(e.usage.cached_tokens, 32u);
        }
        done.set_value();
      }
    };
    engine.submit(std::move(r));
    done.get_future().get();
  }
  return out;
}

}  // namespace promptly::test
