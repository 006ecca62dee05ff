#pragma once
// An independent, deliberately naive double-precision llama/qwen2 forward pass used only by tests:
// it shares no code with src/model or src/kernels (weights are dequantized through tensor/quant, the
// format ground truth), so agreement checks the real forward pass, not a copy of it.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tensor/quant.h"

namespace promptly::test {

class ReferenceModel {
 public:
  explicit ReferenceModel(const gguf::File& f) : f_(f) {
    arch_ = *f.get_string("general.architecture");
    const std::string a = arch_ + ".";
    n_embd_ = static_cast<int>(*f.get_int(a + "embedding_length"));
    n_layer_ = static_cast<int>(*f.get_int(a + "block_count"));
    n_head_ = static_cast<int>(*f.get_int(a + "attention.head_count"));
    n_head_kv_ = static_cast<int>(f.get_int(a + "attention.head_count_kv").value_or(n_head_));
    head_dim_ = n_embd_ / n_head_;
    n_rot_ = static_cast<int>(f.get_int(a + "rope.dimension_count").value_or(head_dim_));
    eps_ = f.get_double(a + "attention.layer_norm_rms_epsilon").value_or(1e-5);
    base_ = f.get_double(a + "rope.freq_base").value_or(10000.0);
    neox_ = arch_ == "qwen2";
    if (f.get_string(a + "rope.scaling.type").value_or("") == "linear") {
      pos_scale_ = 1.0 / f.get_double(a + "rope.scaling.factor").value_or(1.0);
    }
    if (const gguf::TensorInfo* t = f.find_tensor("rope_freqs.weight")) freq_factors_ = mat_1d(t);
    n_vocab_ = static_cast<int>(f.find_tensor("token_embd.weight")->dims[1]);
  }

  int n_vocab() const { return n_vocab_; }

  // Greedy continuation of `prompt`, recomputing the whole sequence each step (slow, obviously right).
  std::vector<int> greedy(std::vector<int> tokens, int n) const {
    std::vector<int> out;
    for (int i = 0; i < n; ++i) {
      const auto logits = run(tokens).back();
      const int next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(next);
      tokens.push_back(next);
    }
    return out;
  }

  // Logits for every position of `tokens` (one sequence from position 0).
  std::vector<std::vector<double>> run(const std::vector<int>& tokens) const {
    const int T = static_cast<int>(tokens.size()), HD = head_dim_;
    std::vector<std::vector<double>> x(T);
    const auto& embd = mat("token_embd.weight");
    for (int t = 0; t < T; ++t) x[t] = embd[tokens[t]];
    for (int l = 0; l < n_layer_; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      const auto &wq = mat(p + "attn_q.weight"), &wk = mat(p + "attn_k.weight"), &wv = mat(p + "attn_v.weight");
      const auto& wo = mat(p + "attn_output.weight");
      const auto bq = vec_or_zero(p + "attn_q.bias", n_head_ * HD), bk = vec_or_zero(p + "attn_k.bias", n_head_kv_ * HD),
                 bv = vec_or_zero(p + "attn_v.bias", n_head_kv_ * HD);
      std::vector<std::vector<double>> q(T), k(T), v(T);
      for (int t = 0; t < T; ++t) {
        const auto h = norm(x[t], vec(p + "attn_norm.weight"));
        q[t] = add(mul(wq, h), bq);
        k[t] = add(mul(wk, h), bk);
        v[t] = add(mul(wv, h), bv);
        for (int hh = 0; hh < n_head_; ++hh) rope(&q[t][hh * HD], t);
        for (int hh = 0; hh < n_head_kv_; ++hh) rope(&k[t][hh * HD], t);
      }
      for (int t = 0; t < T; ++t) {
        std::vector<double> att(n_head_ * HD, 0.0);
        for (int hh = 0; hh < n_head_; ++hh) {
          const int kvh = hh / (n_head_ / n_head_kv_);
          std::vector<double> s(t + 1);
          double mx = -1e300;
          for (int j = 0; j <= t; ++j) {
            double d = 0;
            for (int i = 0; i < HD; ++i) d += q[t][hh * HD + i] * k[j][kvh * HD + i];
            s[j] = d / std::sqrt(static_cast<double>(HD));
            mx = std::max(mx, s[j]);
          }
          double sum = 0;
          for (double& e : s) sum += e = std::exp(e - mx);
          for (int j = 0; j <= t; ++j)
            for (int i = 0; i < HD; ++i) att[hh * HD + i] += s[j] / sum * v[j][kvh * HD + i];
        }
        x[t] = add(x[t], mul(wo, att));
        const auto h = norm(x[t], vec(p + "ffn_norm.weight"));
        auto g = mul(mat(p + "ffn_gate.weight"), h);
        const auto u = mul(mat(p + "ffn_up.weight"), h);
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
        x[t] = add(x[t], mul(mat(p + "ffn_down.weight"), g));
      }
    }
    const auto& out = f_.find_tensor("output.weight") ? mat("output.weight") : mat("token_embd.weight");
    std::vector<std::vector<double>> logits(T);
    for (int t = 0; t < T; ++t) logits[t] = mul(out, norm(x[t], vec("output_norm.weight")));
    return logits;
  }

 private:
  using Mat = std::vector<std::vector<double>>;
  const Mat& mat(const std::string& name) const {
    auto it = cache_.find(name);
    if (it != cache_.end()) return it->second;
    const gguf::TensorInfo* t = f_.find_tensor(name);
    const std::size_t cols = t->dims[0], rows = t->dims[1];
    Mat m(rows, std::vector<double>(cols));
    std::vector<float> row(cols);
    for (std::size_t r = 0; r < rows; ++r) {
      dequantize_row(t->type, t->data + r * row_bytes(t->type, cols), row.data(), cols);
      for (std::size_t c = 0; c < cols; ++c) m[r][c] = row[c];
    }
    return cache_[name] = std::move(m);
  }
  std::vector<double> vec(const std::string& name) const { return mat_1d(f_.find_tensor(name)); }
  std::vector<double> vec_or_zero(const std::string& name, int n) const {
    const gguf::TensorInfo* t = f_.find_tensor(name);
    return t ? mat_1d(t) : std::vector<double>(static_cast<std::size_t>(n), 0.0);
  }
  static std::vector<double> mat_1d(const gguf::TensorInfo* t) {
    std::vector<float> v(t->dims[0]);
    dequantize_row(t->type, t->data, v.data(), v.size());
    return {v.begin(), v.end()};
  }
  static std::vector<double> mul(const Mat& m, const std::vector<double>& x) {
    std::vector<double> y(m.size(), 0.0);
    for (std::size_t r = 0; r < m.size(); ++r)
      for (std::size_t c = 0; c < x.size(); ++c) y[r] += m[r][c] * x[c];
    return y;
  }
  static std::vector<double> add(std::vector<double> a, const std::vector<double>& b) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    return a;
  }
  std::vector<double> norm(const std::vector<double>& x, const std::vector<double>& w) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double s = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps_);
    std::vector<double> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w[i];
    return y;
  }
  void rope(double* v, int pos) const {
    for (int i = 0; i < n_rot_ / 2; ++i) {
      double theta = pos * pos_scale_ * std::pow(base_, -2.0 * i / n_rot_);
      if (!freq_factors_.empty()) theta /= freq_factors_[static_cast<std::size_t>(i)];
      const int a = neox_ ? i : 2 * i, b = neox_ ? i + n_rot_ / 2 : 2 * i + 1;
      const double x0 = v[a], x1 = v[b];
      v[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
      v[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
    }
  }

  const gguf::File& f_;
  mutable std::map<std::string, Mat> cache_;
  std::string arch_;
  int n_embd_, n_layer_, n_head_, n_head_kv_, head_dim_, n_rot_, n_vocab_;
  double eps_, base_;
  double pos_scale_ = 1.0;
  std::vector<double> freq_factors_;
  bool neox_;
};

}  // namespace promptly::test
