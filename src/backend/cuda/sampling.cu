// Sampling on the device (sampling.cuh): one block per row. The filters each keep a head of the
// order (logit descending, id ascending), so every cut is found as a key and a last id: a radix
// select over the logits' bits (four passes of one byte, weighing tokens by count for top-k and by
// probability for top-p), then, when several tokens share the key at the cut, the one where the
// cut falls among them by id. Nothing is sorted: a head may be most of a 150K vocabulary (top-p
// without top-k on a flat distribution).
#include "backend/cuda/sampling.cuh"

#include <cfloat>
#include <climits>
#include <cmath>

#include "backend/cuda/block_loops.cuh"

namespace promptly::backend::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarp = 32;
constexpr int kWarps = kThreads / kWarp;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kDigits = 256;
// Copies of the select histograms, a warp writing to one of them: the first byte of most logits is
// one of a few values, and a single copy would have every thread of the block add to one address.
constexpr int kHistCopies = 4;

// The passes over a row: each thread takes kRowAhead of its elements a turn, loading them all before
// it looks at the first. A thread's elements one at a time waited on L2 for each (the logits just
// written by the output GEMV: ~125 waits a pass over a 128K vocabulary with 1024 threads, an
// estimated 20-40 µs a pass; greedy is one pass, run's default draw about a dozen); now ~16. Eight:
// sample_kernel then holds 64 registers, the most 1024 threads a block may have, without spills.
// f(v, i, in) sees a thread's elements in id order, and every thread of a warp calls it at the
// same places (`in` false past the row), so f may hold warp-collective work.
constexpr int kRowAhead = 8;
template <class F>
__device__ __forceinline__ void for_row_elements(const float* row, int n, F&& f) {
  for_block_elements<kRowAhead>(n, [row](int i) { return row[i]; }, f);
}

// A float's bits as an unsigned number in the floats' order; NaN lowest of all (0), never kept.
__device__ __forceinline__ unsigned order_key(float v) {
  if (v != v) return 0;
  const unsigned bits = __float_as_uint(v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
__device__ __forceinline__ float key_value(unsigned key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// The tokens up to (key, last_id) in the order: a larger key, or the same key and an id at most
// last_id.
struct Head {
  unsigned key;
  int last_id;
  __device__ bool holds(unsigned k, int id) const { return k != 0 && (k > key || (k == key && id <= last_id)); }
};
constexpr Head kWholeRow{0, INT_MAX};

struct Shared {
  double hist[kHistCopies][kDigits];      // top-p's weights
  unsigned counts[kHistCopies][kDigits];  // top-k's counts
  double warp_totals[kWarps];
  float warp_best[kWarps];
  int warp_best_id[kWarps];
  unsigned prefix;
  double above, at;
  bool found;
  int id, claim, late_claim;
};

// The sum of v over the block, in every thread (each adds the warps' sums in the same order).
__device__ double block_sum(double v, Shared& sh) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(kFullMask, v, o);
  __syncthreads();  // warp_totals may still be read by a previous call
  if (threadIdx.x % kWarp == 0) sh.warp_totals[threadIdx.x / kWarp] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kWarps; ++w) total += sh.warp_totals[w];
  return total;
}

// The sum of v over the threads before this one, and over all of them in `total`.
__device__ double block_exclusive_scan(double v, Shared& sh, double& total) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  double inclusive = v;
  for (int d = 1; d < kWarp; d *= 2) {
    const double other = __shfl_up_sync(kFullMask, inclusive, d);
    if (lane >= d) inclusive += other;
  }
  const double before_in_warp = __shfl_up_sync(kFullMask, inclusive, 1);
  __syncthreads();
  if (lane == kWarp - 1) sh.warp_totals[warp] = inclusive;
  __syncthreads();
  double before = 0;
  total = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += sh.warp_totals[w];
    total += sh.warp_totals[w];
  }
  return before + (lane > 0 ? before_in_warp : 0.0);
}

// What a select weighs each token by: 1 (top-k counts tokens) or its probability's numerator
// e^(logit - max) (top-p).
struct ByCount {  // counted by count_digits
  static constexpr bool kCounts = true;
};
struct ByMass {
  static constexpr bool kCounts = false;
  float max_logit;
  __device__ double operator()(float v) const { return expf(v - max_logit); }
};

struct Selected {
  bool found;      // false: the head's whole weight is below the target
  unsigned key;    // the key where the running weight reaches the target
  double above;    // the weight of the head's tokens with larger keys
  double at;       // and of those with this key
};

// Top-k's counts of the keys of `within`'s tokens under `prefix` by their byte at `shift`. Most of
// a row's keys share their first byte or two: the lanes of a warp that fall in one bucket add to
// it once, by their number (__match_any_sync), where one add each would queue 32 adds to one
// address, and the counts are integers, which shared memory adds natively (a double's add is a
// compare-and-swap loop there).
__device__ void count_digits(const float* row, int n, Head within, unsigned prefix, unsigned mask, int shift, unsigned* counts) {
  const int lane = threadIdx.x % kWarp;
  for_row_elements(row, n, [&](float v, int i, bool in) {
    int digit = -1;  // none: past the row, or not in the head
    if (in) {
      const unsigned k = order_key(v);
      if ((k & mask) == prefix && within.holds(k, i)) digit = static_cast<int>((k >> shift) & 0xff);
    }
    const unsigned peers = __match_any_sync(kFullMask, digit);
    if (digit >= 0 && lane == __ffs(peers) - 1) atomicAdd(&counts[digit], static_cast<unsigned>(__popc(peers)));
  });
}

// Top-p's weights of the same tokens, by the same byte, into `masses`. A warp whose tokens fall in
// at most kGroupedBuckets buckets (the first byte's pass: a row's logits from -32 to 32 fall in
// about a dozen, a warp's in fewer) sums each bucket's weights over the warp and adds them once, by
// the bucket's first lane: a double's add to shared memory is a compare-and-swap loop, and the
// lanes of one bucket would queue on its address, ~4 deep on average at 8 buckets a warp. A warp
// spread over more buckets (the later bytes' passes) adds lane by lane, seldom to one address.
// (Eight: each bucket's sum is six shuffles, 48 at most, against ~4 serialized compare-and-swap
// rounds of a few dozen cycles each: an estimate, not measured.)
constexpr int kGroupedBuckets = 8;
__device__ void add_masses(const float* row, int n, Head within, unsigned prefix, unsigned mask, int shift, const ByMass& weight,
                           double* masses) {
  const int lane = threadIdx.x % kWarp;
  for_row_elements(row, n, [&](float v, int i, bool in) {
    int digit = -1;  // none: past the row, or not in the head
    double w = 0.0;
    if (in) {
      const unsigned k = order_key(v);
      if ((k & mask) == prefix && within.holds(k, i)) digit = static_cast<int>((k >> shift) & 0xff), w = weight(v);
    }
    const unsigned peers = __match_any_sync(kFullMask, digit);
    unsigned firsts = __ballot_sync(kFullMask, digit >= 0 && lane == __ffs(peers) - 1);  // one lane a bucket
    if (__popc(firsts) > kGroupedBuckets) {
      if (digit >= 0) atomicAdd(&masses[digit], w);
      return;
    }
    while (firsts) {  // the same turns in every lane: firsts is the warp's
      const int first = __ffs(firsts) - 1;
      firsts &= firsts - 1;
      const int d = __shfl_sync(kFullMask, digit, first);
      double sum = digit == d ? w : 0.0;
      for (int o = kWarp / 2; o > 0; o /= 2) sum += __shfl_xor_sync(kFullMask, sum, o);
      if (lane == first) atomicAdd(&masses[d], sum);
    }
  });
}

// Walking down the keys of `within`'s tokens, largest first, adding each token's weight: the key
// at which the running weight first reaches `target` (weight above it < target <= weight above it
// and at it). Four passes, each fixing one more byte of the key.
template <class Weight>
__device__ Selected select_key(const float* row, int n, Head within, Weight weight, double target, Shared& sh) {
  unsigned prefix = 0, mask = 0;
  double above = 0;  // thread 0's
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kHistCopies * kDigits; i += blockDim.x) (&sh.hist[0][0])[i] = 0, (&sh.counts[0][0])[i] = 0;
    __syncthreads();
    const int copy = (threadIdx.x / kWarp) % kHistCopies;
    if constexpr (Weight::kCounts) {
      count_digits(row, n, within, prefix, mask, shift, sh.counts[copy]);
    } else {
      add_masses(row, n, within, prefix, mask, shift, weight, sh.hist[copy]);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int digit = -1, lowest = -1;
      double h = 0, lowest_h = 0;
      for (int d = kDigits - 1; d >= 0; --d) {
        h = 0;
        for (int c = 0; c < kHistCopies; ++c) h += sh.hist[c][d] + sh.counts[c][d];  // one of the two is 0
        if (h <= 0) continue;
        if (above + h >= target) {
          digit = d;
          break;
        }
        above += h;
        lowest = d, lowest_h = h;
      }
      if (digit < 0 && shift < 24 && lowest >= 0) {
        // The bucket chosen a byte ago reached the target, but its parts, added in another order,
        // fall short by a rounding: its last part.
        digit = lowest, h = lowest_h, above -= lowest_h;
      }
      sh.found = digit >= 0;
      sh.prefix = prefix | (static_cast<unsigned>(digit < 0 ? 0 : digit) << shift);
      sh.above = above;
      sh.at = h;
    }
    __syncthreads();
    if (!sh.found) return {false, 0, 0, 0};
    prefix = sh.prefix;
    mask |= 0xffu << shift;
  }
  return {true, prefix, sh.above, sh.at};
}

// Each thread's contiguous part of the row, for walks in id order.
struct Segment {
  int begin, end;
  __device__ explicit Segment(int n) {
    const int len = (n + kThreads - 1) / kThreads;
    begin = min(n, static_cast<int>(threadIdx.x) * len);
    end = min(n, begin + len);
  }
};

// The head of `within` that ends at its j-th token (from 1, by id) with key `key`: all of them when
// it has fewer.
__device__ Head head_through(const float* row, int n, Head within, unsigned key, double j, Shared& sh) {
  const Segment seg(n);
  int count = 0;
  for (int i = seg.begin; i < seg.end; ++i) {
    const unsigned k = order_key(row[i]);
    count += k == key && within.holds(k, i);
  }
  double total;
  const double before = block_exclusive_scan(count, sh, total);  // whole numbers: exact
  if (threadIdx.x == 0) sh.id = -1;
  __syncthreads();
  if (count > 0 && before < j && j <= before + count) {
    double seen = before;
    for (int i = seg.begin; i < seg.end; ++i) {
      const unsigned k = order_key(row[i]);
      if (k == key && within.holds(k, i) && ++seen >= j) {
        sh.id = i;
        break;
      }
    }
  }
  __syncthreads();
  if (sh.id >= 0) return {key, sh.id};
  return {key, key == within.key ? within.last_id : INT_MAX};
}

struct DrawWeights {
  Head head;
  float max_logit, inv_temperature, min_p;
  int best_id;
  // The token's weight in the draw: 0 unless kept by the cuts and min-p (relative to the best
  // token, which is always kept).
  __device__ float operator()(const float* row, int i) const {
    const float v = row[i];
    if (!head.holds(order_key(v), i)) return 0.0f;
    if (min_p > 0.0f && i != best_id && !(expf(v - max_logit) >= min_p)) return 0.0f;
    return expf((v - max_logit) * inv_temperature);
  }
};

__global__ void __launch_bounds__(kThreads, 1) sample_kernel(const float* logits, int n, const DeviceDraw* draws, std::int32_t* out) {
  __shared__ Shared sh;
  const DeviceDraw draw = draws[blockIdx.x];
  const float* row = logits + static_cast<std::size_t>(draw.row) * n;

  // The first largest logit (Sampler's argmax: NaN never wins; a row of -inf gives token 0).
  float best = -INFINITY;
  int best_id = INT_MAX;
  for_row_elements(row, n, [&](float v, int i, bool in) {
    if (in && (v > best || (v == best && i < best_id))) best = v, best_id = i;
  });
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float other = __shfl_xor_sync(kFullMask, best, o);
    const int other_id = __shfl_xor_sync(kFullMask, best_id, o);
    if (other > best || (other == best && other_id < best_id)) best = other, best_id = other_id;
  }
  if (threadIdx.x % kWarp == 0) sh.warp_best[threadIdx.x / kWarp] = best, sh.warp_best_id[threadIdx.x / kWarp] = best_id;
  __syncthreads();
  for (int w = 0; w < kWarps; ++w) {
    if (sh.warp_best[w] > best || (sh.warp_best[w] == best && sh.warp_best_id[w] < best_id)) best = sh.warp_best[w], best_id = sh.warp_best_id[w];
  }
  if (best_id == INT_MAX) best_id = 0;
  if (draw.temperature <= 0.0f || !(best > -INFINITY)) {
    if (threadIdx.x == 0) out[blockIdx.x] = best_id;
    return;
  }

  // The cuts, in the host's order: top-k, then top-p over what top-k kept (probabilities at
  // temperature 1 over that head), then min-p (DrawWeights).
  Head head = kWholeRow;
  if (draw.top_k > 0 && draw.top_k < n) {
    const Selected s = select_key(row, n, kWholeRow, ByCount{}, draw.top_k, sh);
    if (s.found) head = head_through(row, n, kWholeRow, s.key, draw.top_k - s.above, sh);
  }
  if (draw.top_p < 1.0f) {
    double mass = 0;
    for_row_elements(row, n, [&](float v, int i, bool in) {
      if (in && head.holds(order_key(v), i)) mass += expf(v - best);
    });
    const double target = static_cast<double>(draw.top_p) * block_sum(mass, sh);
    const Selected s = select_key(row, n, head, ByMass{best}, target, sh);
    if (s.found) {
      // Tokens sharing the key weigh the same: as many as bring the running weight to the target.
      const double each = expf(key_value(s.key) - best);
      const double needed = each > 0 ? ceil((target - s.above) / each) : 1.0;
      head = head_through(row, n, head, s.key, fmin(fmax(needed, 1.0), 2.0 * n), sh);
    }
  }

  // The draw: the kept weights walked in id order, each thread its own stretch of the row, up to
  // uniform x their sum.
  const DrawWeights weight{head, best, 1.0f / draw.temperature, draw.min_p, best_id};
  const Segment seg(n);
  double mine = 0;
  for (int i = seg.begin; i < seg.end; ++i) mine += weight(row, i);
  double total;
  const double before = block_exclusive_scan(mine, sh, total);
  const double target = draw.uniform * total;
  if (threadIdx.x == 0) sh.claim = INT_MAX, sh.late_claim = -1;
  __syncthreads();
  if (mine > 0 && before <= target && target < before + mine) atomicMin(&sh.claim, static_cast<int>(threadIdx.x));
  __syncthreads();
  // Sums added in another order can leave the target between two stretches by a rounding: the
  // last stretch with weight that starts at or before it takes it.
  if (sh.claim == INT_MAX && mine > 0 && before <= target) atomicMax(&sh.late_claim, static_cast<int>(threadIdx.x));
  __syncthreads();
  const int chooser = sh.claim != INT_MAX ? sh.claim : sh.late_claim;
  if (chooser < 0) {
    if (threadIdx.x == 0) out[blockIdx.x] = best_id;
    return;
  }
  if (static_cast<int>(threadIdx.x) != chooser) return;
  // Summed from 0 as `mine` was, so that a target inside this stretch is passed within it.
  const double rest = target - before;
  double running = 0;
  int last = best_id;
  for (int i = seg.begin; i < seg.end; ++i) {
    const float w = weight(row, i);
    if (w <= 0.0f) continue;
    last = i;
    running += w;
    if (rest < running) break;
  }
  out[blockIdx.x] = last;
}

}  // namespace

void sample_rows(const float* logits, int n_vocab, const DeviceDraw* draws, int n, std::int32_t* out, cudaStream_t stream) {
  if (n > 0) sample_kernel<<<n, kThreads, 0, stream>>>(logits, n_vocab, draws, out);
}

}  // namespace promptly::backend::cuda
