#pragma once
// A deliberately naive double-precision forward pass for every architecture the model loads
// (llama/mixtral, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3), used only by tests. It shares no
// code with src/model or src/kernels: what each architecture does is written out here again, from
// the metadata keys and tensor names llama.cpp's converter writes, so agreement checks the
// engine's descriptions and its one layer loop, not a copy of them.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tensor/quant.h"

namespace promptly::test {

class ArchReference {
 public:
  using Vec = std::vector<double>;

  explicit ArchReference(const gguf::File& f) : f_(f) {
    arch_ = *f.get_string("general.architecture");
    const std::string a = arch_ + ".";
    n_embd_ = static_cast<int>(*f.get_int(a + "embedding_length"));
    n_layer_ = static_cast<int>(*f.get_int(a + "block_count"));
    n_head_ = static_cast<int>(*f.get_int(a + "attention.head_count"));
    n_head_kv_ = static_cast<int>(f.get_int(a + "attention.head_count_kv").value_or(n_head_));
    head_dim_ = static_cast<int>(f.get_int(a + "attention.key_length").value_or(n_embd_ / n_head_));
    n_rot_ = static_cast<int>(f.get_int(a + "rope.dimension_count").value_or(head_dim_));
    eps_ = f.get_double(a + "attention.layer_norm_rms_epsilon").value_or(1e-5);
    base_ = f.get_double(a + "rope.freq_base").value_or(10000.0);
    if (f.get_string(a + "rope.scaling.type").value_or("") == "linear") pos_scale_ = 1.0 / *f.get_double(a + "rope.scaling.factor");
    window_ = static_cast<int>(f.get_int(a + "attention.sliding_window").value_or(0));
    attn_cap_ = f.get_double(a + "attn_logit_softcapping").value_or(0.0);
    final_cap_ = f.get_double(a + "final_logit_softcapping").value_or(0.0);
    n_expert_ = static_cast<int>(f.get_int(a + "expert_count").value_or(0));
    n_used_ = static_cast<int>(f.get_int(a + "expert_used_count").value_or(0));
    renorm_ = f.get_bool(a + "expert_weights_norm").value_or(true);
    gemma_ = arch_ == "gemma2" || arch_ == "gemma3";
    neox_ = arch_ != "llama";
    n_vocab_ = static_cast<int>(f.find_tensor("token_embd.weight")->dims[1]);
    // LongRoPE (phi3): short factors divide the frequencies, attn_factor scales cos and sin.
    if (f.find_tensor("rope_factors_short.weight")) factors_ = vec("rope_factors_short.weight");
    if (f.find_tensor("rope_factors_long.weight")) long_factors_ = vec("rope_factors_long.weight");
    orig_ctx_ = static_cast<int>(f.get_int(a + "rope.scaling.original_context_length").value_or(0));
    mscale_ = f.get_double(a + "rope.scaling.attn_factor").value_or(1.0);
  }

  // LongRoPE: a context longer than rope.scaling.original_context_length rotates with the long
  // factors (llama.cpp's rule, by the context size).
  void set_context(int n_ctx) {
    if (!long_factors_.empty() && orig_ctx_ > 0 && n_ctx > orig_ctx_) factors_ = long_factors_;
  }

  int n_vocab() const { return n_vocab_; }
  void set_window(int w) { window_ = w; }  // tests: what the logits would be without (or with another) window

  // Which layers attend within the window only.
  bool local(int il) const {
    if (window_ <= 0) return false;
    if (arch_ == "gemma2") return il % 2 == 0;
    if (arch_ == "gemma3") return il % 6 != 5;
    return arch_ == "phi3";
  }

  // The k experts a token runs and their weights, from its router logits.
  std::vector<std::pair<int, double>> route(const Vec& logits) const {
    std::vector<int> idx(logits.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return logits[a] > logits[b]; });  // ties: lower index
    double mx = logits[idx[0]], all = 0, chosen = 0;
    for (double l : logits) all += std::exp(l - mx);
    std::vector<std::pair<int, double>> out;
    for (int i = 0; i < n_used_; ++i) {
      out.emplace_back(idx[i], std::exp(logits[idx[i]] - mx));
      chosen += out.back().second;
    }
    // llama (Mixtral): softmax over the chosen logits; qwen3moe: softmax over all, renormalised.
    const double denominator = arch_ == "qwen3moe" && !renorm_ ? all : chosen;
    for (auto& [e, w] : out) w /= denominator;
    return out;
  }

  // Logits for every position of `tokens` (one sequence from position 0).
  std::vector<Vec> run(const std::vector<int>& tokens) const {
    const int T = static_cast<int>(tokens.size()), HD = head_dim_, QD = n_head_ * HD, KVD = n_head_kv_ * HD;
    std::vector<Vec> x(T);
    const Mat& embd = mat("token_embd.weight");
    for (int t = 0; t < T; ++t) {
      x[t] = embd[tokens[t]];
      if (gemma_) for (double& v : x[t]) v *= std::sqrt(static_cast<double>(n_embd_));
    }
    for (int l = 0; l < n_layer_; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      const bool is_local = local(l);
      // gemma3's local layers rotate with base 10000 and no scaling.
      const double base = arch_ == "gemma3" && is_local ? 10000.0 : base_;
      const double pscale = arch_ == "gemma3" && is_local ? 1.0 : pos_scale_;
      std::vector<Vec> q(T), k(T), v(T);
      for (int t = 0; t < T; ++t) {
        const Vec h = norm(x[t], vec(p + "attn_norm.weight"));
        if (has(p + "attn_qkv.weight")) {
          const Vec qkv = mul(mat(p + "attn_qkv.weight"), h);
          q[t] = Vec(qkv.begin(), qkv.begin() + QD);
          k[t] = Vec(qkv.begin() + QD, qkv.begin() + QD + KVD);
          v[t] = Vec(qkv.begin() + QD + KVD, qkv.end());
        } else {
          q[t] = mul(mat(p + "attn_q.weight"), h);
          k[t] = mul(mat(p + "attn_k.weight"), h);
          v[t] = mul(mat(p + "attn_v.weight"), h);
        }
        if (has(p + "attn_q.bias")) {
          q[t] = add(q[t], vec(p + "attn_q.bias"));
          k[t] = add(k[t], vec(p + "attn_k.bias"));
          v[t] = add(v[t], vec(p + "attn_v.bias"));
        }
        for (int hh = 0; hh < n_head_; ++hh) {
          if (has(p + "attn_q_norm.weight")) norm_head(&q[t][hh * HD], vec(p + "attn_q_norm.weight"));
          rope(&q[t][hh * HD], t, base, pscale);
        }
        for (int hh = 0; hh < n_head_kv_; ++hh) {
          if (has(p + "attn_k_norm.weight")) norm_head(&k[t][hh * HD], vec(p + "attn_k_norm.weight"));
          rope(&k[t][hh * HD], t, base, pscale);
        }
      }
      for (int t = 0; t < T; ++t) {
        Vec att(QD, 0.0);
        const int first = is_local ? std::max(0, t + 1 - window_) : 0;
        for (int hh = 0; hh < n_head_; ++hh) {
          const int kvh = hh / (n_head_ / n_head_kv_);
          Vec s(t + 1, -1e300);
          double mx = -1e300;
          for (int j = first; j <= t; ++j) {
            double d = 0;
            for (int i = 0; i < HD; ++i) d += q[t][hh * HD + i] * k[j][kvh * HD + i];
            s[j] = d / std::sqrt(static_cast<double>(HD));
            if (attn_cap_ > 0) s[j] = attn_cap_ * std::tanh(s[j] / attn_cap_);
            mx = std::max(mx, s[j]);
          }
          double sum = 0;
          for (int j = first; j <= t; ++j) sum += s[j] = std::exp(s[j] - mx);
          for (int j = first; j <= t; ++j)
            for (int i = 0; i < HD; ++i) att[hh * HD + i] += s[j] / sum * v[j][kvh * HD + i];
        }
        Vec o = mul(mat(p + "attn_output.weight"), att);
        if (has(p + "post_attention_norm.weight")) o = norm(o, vec(p + "post_attention_norm.weight"));
        x[t] = add(x[t], o);
        const Vec h = norm(x[t], vec(p + "ffn_norm.weight"));
        Vec f;
        if (n_expert_ > 0) {
          f.assign(n_embd_, 0.0);
          for (const auto& [e, w] : route(mul(mat(p + "ffn_gate_inp.weight"), h))) {
            const Vec y = ffn(slice(p + "ffn_gate_exps.weight", e), slice(p + "ffn_up_exps.weight", e),
                              slice(p + "ffn_down_exps.weight", e), h);
            for (int i = 0; i < n_embd_; ++i) f[i] += w * y[i];
          }
        } else if (!has(p + "ffn_gate.weight")) {  // phi3: gate rows, then up rows, in ffn_up
          const Mat& gu = mat(p + "ffn_up.weight");
          const Mat gate(gu.begin(), gu.begin() + gu.size() / 2), up(gu.begin() + gu.size() / 2, gu.end());
          f = ffn(gate, up, mat(p + "ffn_down.weight"), h);
        } else {
          f = ffn(mat(p + "ffn_gate.weight"), mat(p + "ffn_up.weight"), mat(p + "ffn_down.weight"), h);
        }
        if (has(p + "post_ffw_norm.weight")) f = norm(f, vec(p + "post_ffw_norm.weight"));
        x[t] = add(x[t], f);
      }
    }
    const Mat& out = has("output.weight") ? mat("output.weight") : mat("token_embd.weight");
    std::vector<Vec> logits(T);
    for (int t = 0; t < T; ++t) {
      logits[t] = mul(out, norm(x[t], vec("output_norm.weight")));
      if (final_cap_ > 0) for (double& z : logits[t]) z = final_cap_ * std::tanh(z / final_cap_);
    }
    return logits;
  }

 private:
  using Mat = std::vector<Vec>;
  bool has(const std::string& name) const { return f_.find_tensor(name) != nullptr; }
  // All rows of a tensor (an expert stack: every expert's rows, one after another).
  const Mat& mat(const std::string& name) const {
    auto it = cache_.find(name);
    if (it != cache_.end()) return it->second;
    const gguf::TensorInfo* t = f_.find_tensor(name);
    const std::size_t cols = t->dims[0], rows = t->rows();
    Mat m(rows, Vec(cols));
    std::vector<float> row(cols);
    for (std::size_t r = 0; r < rows; ++r) {
      dequantize_row(t->type, t->data + r * row_bytes(t->type, cols), row.data(), cols);
      for (std::size_t c = 0; c < cols; ++c) m[r][c] = row[c];
    }
    return cache_[name] = std::move(m);
  }
  Mat slice(const std::string& name, int e) const {
    const Mat& all = mat(name);
    const std::size_t rows = f_.find_tensor(name)->dims[1];
    return Mat(all.begin() + static_cast<std::ptrdiff_t>(e * rows), all.begin() + static_cast<std::ptrdiff_t>((e + 1) * rows));
  }
  Vec vec(const std::string& name) const {
    const gguf::TensorInfo* t = f_.find_tensor(name);
    std::vector<float> v(t->dims[0]);
    dequantize_row(t->type, t->data, v.data(), v.size());
    return {v.begin(), v.end()};
  }
  Vec ffn(const Mat& gate, const Mat& up, const Mat& down, const Vec& h) const {
    Vec g = mul(gate, h);
    const Vec u = mul(up, h);
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double a = g[i];
      g[i] = gemma_ ? 0.5 * a * (1 + std::tanh(std::sqrt(2 / M_PI) * (a + 0.044715 * a * a * a))) * u[i] : a / (1 + std::exp(-a)) * u[i];
    }
    return mul(down, g);
  }
  static Vec mul(const Mat& m, const Vec& x) {
    Vec y(m.size(), 0.0);
    for (std::size_t r = 0; r < m.size(); ++r)
      for (std::size_t c = 0; c < x.size(); ++c) y[r] += m[r][c] * x[c];
    return y;
  }
  static Vec add(Vec a, const Vec& b) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    return a;
  }
  Vec norm(const Vec& x, const Vec& w) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double s = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps_);
    Vec y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w[i];
    return y;
  }
  void norm_head(double* x, const Vec& w) const {
    const Vec y = norm(Vec(x, x + head_dim_), w);
    std::copy(y.begin(), y.end(), x);
  }
  void rope(double* v, int pos, double base, double pscale) const {
    for (int i = 0; i < n_rot_ / 2; ++i) {
      double theta = pos * pscale * std::pow(base, -2.0 * i / n_rot_);
      if (!factors_.empty()) theta /= factors_[static_cast<std::size_t>(i)];
      const int a = neox_ ? i : 2 * i, b = neox_ ? i + n_rot_ / 2 : 2 * i + 1;
      const double x0 = v[a], x1 = v[b], c = std::cos(theta) * mscale_, s = std::sin(theta) * mscale_;
      v[a] = x0 * c - x1 * s;
      v[b] = x0 * s + x1 * c;
    }
  }

  const gguf::File& f_;
  mutable std::map<std::string, Mat> cache_;
  std::string arch_;
  int n_embd_, n_layer_, n_head_, n_head_kv_, head_dim_, n_rot_, n_vocab_, window_, n_expert_, n_used_;
  double eps_, base_, attn_cap_, final_cap_;
  double pos_scale_ = 1.0, mscale_ = 1.0;
  Vec factors_, long_factors_;
  int orig_ctx_ = 0;
  bool renorm_, gemma_, neox_;
};

}  // namespace promptly::test
