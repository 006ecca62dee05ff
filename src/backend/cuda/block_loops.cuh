#pragma once
// A block's strided pass over a row, its loads sent ahead of their use. Shared by the kernels whose
// passes sit on a lone decode stream's critical path (the norms, the sampler): a thread that loads an
// element, uses it, then loads the next waits a full memory latency per element, and these run as a
// few blocks or as a launch's last block, with nothing else to hide the wait behind.

namespace promptly::backend::cuda {

// Thread t of the block takes elements t, t + blockDim.x, t + 2 x blockDim.x, ... of [0, n), kAhead
// of them a turn: load(i) for all of a turn's elements first (a Value{} past the row), then
// use(value, i, in) for each in order, `in` false past the row. Every thread of a warp calls use at
// the same places, so use may hold warp-collective work (shuffles) and must mind `in` itself.
// kAhead trades registers (kAhead Values live at once) for waits (one a turn, not one an element).
template <int kAhead, class Load, class Use>
__device__ __forceinline__ void for_block_elements(int n, Load&& load, Use&& use) {
  using Value = decltype(load(0));
  const int step = static_cast<int>(blockDim.x), me = static_cast<int>(threadIdx.x);
  for (int base = 0; base < n; base += kAhead * step) {
    Value v[kAhead];
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      const int i = base + k * step + me;
      v[k] = i < n ? load(i) : Value{};
    }
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      const int i = base + k * step + me;
      use(v[k], i, i < n);
    }
  }
}

}  // namespace promptly::backend::cuda
