#pragma once
// What an engine step costs on this machine, for this model: the seconds a forward pass takes as a
// function of what is in it, learned from the passes themselves.
//
// Why a model and not a constant: the same binary runs a 1B model on a 2-core VM and a 7B model on a
// workstation, and a host's speed drifts by tens of percent within minutes. A step budget in tokens
// (512 everywhere) is a 0.1 s step on one and a 4 s stall on another; a budget in seconds, turned
// into tokens by what steps have been measured to cost, is the same promise to the user on both.
//
//   seconds = fixed + per_token * tokens + per_attended * attended
//
// `tokens` is the batch size (every token goes through every weight: prefill is compute-bound, and a
// decode batch's weights stream once, which is what `fixed` mostly is), `attended` the attention
// work: the sum over the batch's tokens of the positions each one attends to (a prompt token at
// position 2000 reads 2000 keys and values). The coefficients start from a calibration (two passes
// at start-up, see Engine) and follow every step's measured time through a Kalman filter with a
// random walk on them, so that they track the host's phases and correct a wrong prior (the
// attention term starts from the FLOP ratio).
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace promptly {

class StepCostModel {
 public:
  StepCostModel(double fixed_s, double per_token_s, double per_attended_s);

  // Predicted seconds of a forward pass over `tokens` tokens with `attended` attention work.
  double predict(double tokens, double attended) const;
  // A forward pass took `seconds`: the coefficients move toward explaining it.
  void observe(double tokens, double attended, double seconds);
  // The most prompt tokens, up to `max_tokens`, that a chunk starting at position `start` can add to
  // a step already holding `tokens` tokens and `attended` work without its prediction passing
  // `seconds` (0 when not even one fits).
  std::size_t tokens_within(double seconds, double tokens, double attended, std::size_t start, std::size_t max_tokens) const;
  // The attention work of a run of `n` tokens at positions [start, start + n): each attends to its
  // own position and every one before it.
  static double attended_by(std::size_t start, std::size_t n);
  // The same for a batch's tokens, whatever their positions.
  static double attended_by(const std::vector<std::int32_t>& positions);

  double fixed_s() const { return theta_[0]; }
  double per_token_s() const { return theta_[1]; }
  double per_attended_s() const { return theta_[2]; }

 private:
  // Uncertainties are relative to the prior (the calibration), so that one filter serves a 260K and
  // a 7B model, whose coefficients differ by orders of magnitude.
  std::array<double, 3> prior_{};
  std::array<double, 3> theta_{};
  std::array<std::array<double, 3>, 3> cov_{};
};

// How far above their prediction this machine's steps run: the 99th percentile of actual /
// predicted time over the latest steps that the limit shaped (a step predicted at a good part of its
// limit). Steps are sized to limit / this, so that their 99th percentile, not their mean, stays
// within the ITL target however noisy the host (a quiet machine: ~1.05-1.1; a shared one in a bad
// minute: 1.5 and more).
class StepOverrun {
 public:
  void observe(double predicted_s, double actual_s);
  // 1.2 until enough steps have been seen for a 99th percentile to mean something.
  double p99() const { return p99_; }

 private:
  static constexpr std::size_t kWindow = 1000, kMinSamples = 100;
  std::vector<float> ratios_;  // a ring of the latest kWindow
  std::vector<float> scratch_;  // for the percentile, kept so that a step allocates nothing
  std::size_t next_ = 0;
  double p99_ = 1.2;
};

}  // namespace promptly
