#include "spec/rejection.h"

#include <emmintrin.h>

namespace promptly::spec {

namespace {

// Uniform in [0, 1) from the top 53 bits of one word, as Sampler draws (written out, not
// std::uniform_real_distribution, so a seed gives the same tokens with every standard library).
double uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

bool in_range(std::int32_t token, std::size_t n) { return token >= 0 && static_cast<std::size_t>(token) < n; }

// The weights the draws below walk over, four at a time in SSE2 (every x86-64 has it; the compiler
// leaves these loops scalar, and then a rejection at a 152K vocabulary took 2.7 times as long, three
// sibling rejections 7 times) or one at a time, with the same float operations so that both give the same values. Each
// difference is rounded to float once, an error of the order of the inputs' own; what adds up many
// of them (sum, walk) does so in double. _mm_max_ps with zero as its second operand also turns NaN
// into 0.
const __m128 kZero = _mm_setzero_ps();

// max(0, p * scale - q): the residual a rejection leaves (scale 1 where p is normalized).
struct Residual {
  const float* p;
  const float* q;
  float scale;
  __m128 four(std::size_t i) const {
    return _mm_max_ps(_mm_sub_ps(_mm_mul_ps(_mm_loadu_ps(p + i), _mm_set1_ps(scale)), _mm_loadu_ps(q + i)), kZero);
  }
  float one(std::size_t i) const {
    return _mm_cvtss_f32(_mm_max_ss(_mm_sub_ss(_mm_mul_ss(_mm_load_ss(p + i), _mm_set_ss(scale)), _mm_load_ss(q + i)), kZero));
  }
};

// max(0, p), with the token `skip` (none where skip >= n) weighing 0.
struct Target {
  const float* p;
  std::size_t skip;
  __m128 four(std::size_t i) const {
    const __m128 v = _mm_max_ps(_mm_loadu_ps(p + i), kZero);
    if (skip - i >= 4) return v;  // unsigned: also where skip < i
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, v);
    lanes[skip - i] = 0;
    return _mm_load_ps(lanes);
  }
  float one(std::size_t i) const { return i == skip ? 0.0f : _mm_cvtss_f32(_mm_max_ss(_mm_load_ss(p + i), kZero)); }
};

double horizontal_sum(__m128d v) { return _mm_cvtsd_f64(_mm_add_sd(v, _mm_unpackhi_pd(v, v))); }

// Adds four float weights to a pair of double sums.
__m128d add_four(__m128d acc, __m128 v) { return _mm_add_pd(acc, _mm_add_pd(_mm_cvtps_pd(v), _mm_cvtps_pd(_mm_movehl_ps(v, v)))); }

// The sum of the weights in double, in four independent sums.
template <class Weights>
double sum(std::size_t n, const Weights& w) {
  __m128d a = _mm_setzero_pd(), b = _mm_setzero_pd();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    a = add_four(a, w.four(i));
    b = add_four(b, w.four(i + 4));
  }
  double total = horizontal_sum(_mm_add_pd(a, b));
  for (; i < n; ++i) total += w.one(i);
  return total;
}

// The index where the running sum of the weights first passes u, 0 <= u < their sum: walked 16
// weights at a time, then one by one inside the chunk where the sum passes u (as Sampler's draw). A
// zero weight is never returned; where rounding leaves u at the very end, the last positive weight
// is; -1 when no weight is positive.
template <class Weights>
std::int64_t walk(std::size_t n, double u, const Weights& w) {
  double cum = 0;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const double chunk = horizontal_sum(add_four(add_four(add_four(add_four(_mm_setzero_pd(), w.four(i)), w.four(i + 4)), w.four(i + 8)), w.four(i + 12)));
    if (u < cum + chunk) break;
    cum += chunk;
  }
  for (; i < n; ++i) {
    cum += w.one(i);
    if (u < cum) return static_cast<std::int64_t>(i);
  }
  for (std::size_t k = n; k-- > 0;) {
    if (w.one(k) > 0) return static_cast<std::int64_t>(k);
  }
  return -1;
}

// A draw with probability w(i) / sum of w, using one uniform: two passes, the sum and the walk.
// -1 (and no uniform used) when no weight is positive.
template <class Weights>
std::int64_t draw(std::size_t n, const Weights& w, std::mt19937_64& rng) {
  const double total = sum(n, w);
  if (!(total > 0)) return -1;
  return walk(n, uniform(rng) * total, w);
}

// Whether some weight is positive; usually one of the first is.
template <class Weights>
bool any_positive(std::size_t n, const Weights& w) {
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    if (_mm_movemask_ps(_mm_cmpgt_ps(w.four(i), kZero)) != 0) return true;
  }
  for (; i < n; ++i) {
    if (w.one(i) > 0) return true;
  }
  return false;
}

// The replacement after a rejection: a draw from the residual, or from p where the residual is zero
// everywhere (p <= q in every place: equal distributions up to rounding, the only way a rejection
// leaves nothing), or token 0 where p has no mass either (not a distribution).
template <class Weights>
std::int32_t replacement(const float* p, std::size_t n, const Weights& residual, std::mt19937_64& rng) {
  std::int64_t token = draw(n, residual, rng);
  if (token < 0) token = draw(n, Target{p, n}, rng);
  return static_cast<std::int32_t>(token < 0 ? 0 : token);
}

// The verdict for a token drawn from a residual: a candidate's acceptance where it equals one (see
// verify_siblings), else a replacement.
template <class Token>
MultiVerdict verdict_for(std::int64_t drawn, std::size_t count, const Token& candidate) {
  const auto token = static_cast<std::int32_t>(drawn < 0 ? 0 : drawn);
  for (std::size_t i = 0; i < count; ++i) {
    if (candidate(i) == token) return {static_cast<int>(i), token};
  }
  return {-1, token};
}

}  // namespace

Verdict verify_draft_token(const float* p, const float* q, std::size_t n, std::int32_t draft, std::mt19937_64& rng) {
  const double u = uniform(rng);
  const bool valid = in_range(draft, n);
  const double pd = valid ? p[draft] : 0.0, qd = valid ? q[draft] : 0.0;
  // u < p/q as u q < p: no division, no infinity where q is 0 (such a guess is rejected: it cannot
  // have been drawn from q), and a sure acceptance whenever p >= q, since u < 1. A rejection means
  // p <= u q < q, so the guess's own residual, max(0, p - q), is exactly 0: it cannot come back as
  // its own replacement.
  if (qd > 0 && u * qd < pd) return {true, draft};
  const std::int32_t token = replacement(p, n, Residual{p, q, 1.0f}, rng);
  return {token == draft, token};
}

Verdict verify_point_proposal(const float* p, std::size_t n, std::int32_t draft, std::mt19937_64& rng) {
  // verify_draft_token with q one-hot on the guess, step for step: u q[draft] < p[draft] is
  // u < p[draft], and the residual max(0, p - q) is p with the guess's entry zeroed.
  const double u = uniform(rng);
  const bool valid = in_range(draft, n);
  if (valid && u < static_cast<double>(p[draft])) return {true, draft};
  const std::int32_t token = replacement(p, n, Target{p, valid ? static_cast<std::size_t>(draft) : n}, rng);
  return {token == draft, token};
}

MultiVerdict verify_siblings(std::vector<float>& p, const std::vector<std::pair<std::int32_t, const float*>>& candidates, std::size_t n,
                             std::mt19937_64& rng) {
  const auto candidate = [&](std::size_t i) { return candidates[i].first; };
  // The current target p_i is p * scale: p is normalized on entry, and each residual is stored
  // unnormalized, with its exact sum `total`, which saves a pass over the vocabulary per step.
  float scale = 1.0f;
  double total = 0.0;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const auto [x, q] = candidates[i];
    const double u = uniform(rng);
    const bool valid = in_range(x, n);
    // p_i(x) as Residual computes it, so a rejection leaves x a residual of exactly 0 (see
    // verify_draft_token).
    const double px = valid ? p[x] * scale : 0.0f, qx = valid ? q[x] : 0.0;
    if (qx > 0 && u * qx < px) return {static_cast<int>(i), x};
    const Residual residual{p.data(), q, scale};
    // Overwriting p only once the residual is known to have mass keeps p_i for the fallback.
    if (!any_positive(n, residual)) return verdict_for(draw(n, Target{p.data(), n}, rng), candidates.size(), candidate);
    // p_{i+1} = max(0, p_i - q_i), stored in place (each entry is read before it is written).
    __m128d a = _mm_setzero_pd();
    std::size_t y = 0;
    for (; y + 4 <= n; y += 4) {
      const __m128 r = residual.four(y);
      _mm_storeu_ps(p.data() + y, r);
      a = add_four(a, r);
    }
    total = horizontal_sum(a);
    for (; y < n; ++y) total += p[y] = residual.one(y);
    // In float, as Residual multiplies: its rounding (under 6e-8) scales every entry of p_{i+1}
    // alike, so the ratios between tokens stay as they are.
    scale = static_cast<float>(1.0 / total);
  }
  // Every candidate rejected: draw from the last residual, whose sum is known when one was stored.
  const Target last{p.data(), n};
  return verdict_for(total > 0 ? walk(n, uniform(rng) * total, last) : draw(n, last, rng), candidates.size(), candidate);
}

MultiVerdict verify_point_siblings(std::vector<float>& p, const std::vector<std::int32_t>& tokens, std::size_t n, std::mt19937_64& rng) {
  const Target weights{p.data(), n};
  // The current target p_i is p / mass: p is normalized on entry; after the first removal, mass is
  // p's exact sum, then kept by subtracting what each further rejection removes (O(1) instead of a
  // pass), recomputed where that subtraction would cancel most of it.
  double mass = 1.0;
  bool exact = false;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::int32_t x = tokens[i];
    const double u = uniform(rng);
    const bool valid = in_range(x, n);
    if (valid && u * mass < static_cast<double>(p[x])) return {static_cast<int>(i), x};
    if (!valid || !(p[x] > 0)) continue;  // nothing to remove
    const double removed = p[x];
    p[x] = 0;
    if (exact && mass - removed >= 1e-6 * mass) {
      mass -= removed;
    } else {
      mass = sum(n, weights);
      exact = true;
    }
    // p_i was all on x: the draw from it (the fallback for an empty residual) gives x.
    if (!(mass > 0)) return {static_cast<int>(i), x};
  }
  return verdict_for(exact ? walk(n, uniform(rng) * mass, weights) : draw(n, weights, rng), tokens.size(), [&tokens](std::size_t i) { return tokens[i]; });
}

}  // namespace promptly::spec
