#pragma once
// A model split over tensor-parallel ranks that are threads of the test process.
#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "../parallel/thread_group.h"
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

}  // namespace promptly::test
