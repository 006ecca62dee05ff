#pragma once
// Tensor-parallel ranks as threads of one test process (tests of model/tensor_parallel and of the
// GPU backend's split passes).
#include <algorithm>
#include <barrier>
#include <cstring>
#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace promptly::test {

// R ranks in one process: each collective is a rendezvous of R threads on a barrier. Sums run in
// rank order on every rank, so all ranks get the same bits (as the communicator promises).
class ThreadGroup {
 public:
  explicit ThreadGroup(int ranks) : ranks_(ranks), barrier_(ranks), slots_(static_cast<std::size_t>(ranks)) {}

  class Rank final : public parallel::Communicator {
   public:
    Rank(ThreadGroup& g, int rank) : g_(g), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return g_.ranks_; }
    void all_reduce_sum(float* data, std::size_t n) override {
      publish(data);
      std::vector<float> sum(n, 0.0f);
      for (const void* p : g_.slots_) {
        for (std::size_t i = 0; i < n; ++i) sum[i] += static_cast<const float*>(p)[i];
      }
      g_.barrier_.arrive_and_wait();  // everyone has read everyone's data
      std::copy(sum.begin(), sum.end(), data);
    }
    void broadcast(void* data, std::size_t bytes) override {
      publish(data);
      if (rank_ != 0) std::memcpy(data, g_.slots_[0], bytes);
      g_.barrier_.arrive_and_wait();
    }
    void gather(const float* send, std::size_t n, float* out, const std::size_t* counts, const std::size_t* offsets) override {
      publish(send);
      (void)n;
      if (rank_ == 0) {
        for (int r = 0; r < g_.ranks_; ++r) {
          std::memcpy(out + offsets[r], g_.slots_[static_cast<std::size_t>(r)], counts[r] * sizeof(float));
        }
      }
      g_.barrier_.arrive_and_wait();
    }
    void abandon() override {}
    void set_silence_limit(double) override {}
    Totals totals() const override { return {}; }

   private:
    void publish(const void* p) {
      g_.slots_[static_cast<std::size_t>(rank_)] = p;
      g_.barrier_.arrive_and_wait();
    }
    ThreadGroup& g_;
    int rank_;
  };

  std::shared_ptr<parallel::Communicator> rank(int r) { return std::make_shared<Rank>(*this, r); }

 private:
  int ranks_;
  std::barrier<> barrier_;
  std::vector<const void*> slots_;
};

}  // namespace promptly::test
