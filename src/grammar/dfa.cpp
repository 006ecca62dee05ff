#include "grammar/dfa.h"

#include <algorithm>
#include <unordered_map>
#include <tuple>

namespace promptly::grammar {

namespace {

constexpr std::uint32_t kMaxCodePoint = 0x10FFFF;

struct Edge {
  std::uint8_t lo, hi;
  int to;
};

struct NfaState {
  std::vector<int> eps;
  std::vector<Edge> edges;
};

struct TooBig {};

// Thompson construction: each expression becomes a fragment with one entry and one exit state.
class NfaBuilder {
 public:
  NfaBuilder(const Grammar& g, std::size_t max_states) : grammar_(g), max_states_(max_states) {}
  std::vector<NfaState> states;

  int add() {
    if (states.size() >= max_states_) throw TooBig{};
    states.emplace_back();
    return static_cast<int>(states.size()) - 1;
  }

  std::pair<int, int> build(const Expr& e, int depth = 0) {
    if (depth > 200) throw TooBig{};
    switch (e.kind) {
      case Expr::Kind::Literal: {
        int in = add(), cur = in;
        for (unsigned char c : e.literal) {
          int nx = add();
          states[static_cast<std::size_t>(cur)].edges.push_back({c, c, nx});
          cur = nx;
        }
        return {in, cur};
      }
      case Expr::Kind::Class: return build_class(e);
      case Expr::Kind::Ref: return build(grammar_.rules[static_cast<std::size_t>(e.rule)].body, depth + 1);
      case Expr::Kind::Seq: {
        int in = add(), cur = in;
        for (const Expr& c : e.children) {
          auto [ci, co] = build(c, depth + 1);
          states[static_cast<std::size_t>(cur)].eps.push_back(ci);
          cur = co;
        }
        return {in, cur};
      }
      case Expr::Kind::Alt: {
        int in = add(), out = add();
        for (const Expr& c : e.children) {
          auto [ci, co] = build(c, depth + 1);
          states[static_cast<std::size_t>(in)].eps.push_back(ci);
          states[static_cast<std::size_t>(co)].eps.push_back(out);
        }
        return {in, out};
      }
      case Expr::Kind::Repeat: {
        const Expr& c = e.children.front();
        int in = add(), cur = in;
        for (int i = 0; i < e.min; ++i) {
          auto [ci, co] = build(c, depth + 1);
          states[static_cast<std::size_t>(cur)].eps.push_back(ci);
          cur = co;
        }
        if (e.max < 0) {
          auto [ci, co] = build(c, depth + 1);
          int out = add();
          states[static_cast<std::size_t>(cur)].eps.push_back(ci);
          states[static_cast<std::size_t>(cur)].eps.push_back(out);
          states[static_cast<std::size_t>(co)].eps.push_back(ci);
          states[static_cast<std::size_t>(co)].eps.push_back(out);
          return {in, out};
        }
        int out = add();
        for (int i = e.min; i < e.max; ++i) {
          auto [ci, co] = build(c, depth + 1);
          states[static_cast<std::size_t>(cur)].eps.push_back(ci);
          states[static_cast<std::size_t>(cur)].eps.push_back(out);
          cur = co;
        }
        states[static_cast<std::size_t>(cur)].eps.push_back(out);
        return {in, out};
      }
    }
    throw TooBig{};
  }

 private:
  std::pair<int, int> build_class(const Expr& e) {
    auto ranges = e.ranges;
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<std::uint32_t, std::uint32_t>> merged;
    for (auto r : ranges) {
      if (r.first > r.second) continue;
      if (!merged.empty() && r.first <= merged.back().second + 1)
        merged.back().second = std::max(merged.back().second, r.second);
      else
        merged.push_back(r);
    }
    if (e.negated) {
      std::vector<std::pair<std::uint32_t, std::uint32_t>> inverse;
      std::uint32_t next = 0;
      for (auto r : merged) {
        if (r.first > next) inverse.push_back({next, r.first - 1});
        next = r.second + 1;
      }
      if (next <= kMaxCodePoint) inverse.push_back({next, kMaxCodePoint});
      merged = std::move(inverse);
    }
    int in = add(), out = add();
    for (auto r : merged)
      for (const auto& sequence : utf8_sequences(r.first, std::min(r.second, kMaxCodePoint))) {
        int cur = in;
        for (std::size_t i = 0; i < sequence.size(); ++i) {
          int nx = i + 1 == sequence.size() ? out : add();
          states[static_cast<std::size_t>(cur)].edges.push_back({sequence[i].first, sequence[i].second, nx});
          cur = nx;
        }
      }
    return {in, out};
  }

  const Grammar& grammar_;
  std::size_t max_states_;
};

void encode(std::uint32_t cp, std::uint8_t* out, int n) {
  if (n == 1) { out[0] = static_cast<std::uint8_t>(cp); return; }
  for (int i = n - 1; i > 0; --i) {
    out[i] = static_cast<std::uint8_t>(0x80 | (cp & 0x3F));
    cp >>= 6;
  }
  static const std::uint8_t lead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
  out[0] = static_cast<std::uint8_t>(lead[n] | cp);
}

void split_same_length(std::uint32_t lo, std::uint32_t hi, int n,
                       std::vector<std::vector<std::pair<std::uint8_t, std::uint8_t>>>& out) {
  // Split until every continuation position spans its full 0x80-0xBF range or one value, so that
  // the byte ranges of lo and hi describe exactly the code points between them.
  for (int i = 1; i < n; ++i) {
    std::uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_same_length(lo, lo | m, n, out);
        split_same_length((lo | m) + 1, hi, n, out);
        return;
      }
      if ((hi & m) != m) {
        split_same_length(lo, (hi & ~m) - 1, n, out);
        split_same_length(hi & ~m, hi, n, out);
        return;
      }
    }
  }
  std::uint8_t a[4], b[4];
  encode(lo, a, n);
  encode(hi, b, n);
  std::vector<std::pair<std::uint8_t, std::uint8_t>> seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
  out.push_back(std::move(seq));
}

// Hopcroft's partition refinement (O(k n log n)): states with the same future become one, so the
// matcher has fewer positions to compute masks for (the nested 10-property schema: ~17000 -> ~6500
// states). The partial DFA is completed with a dead state, which ends up alone in its block.
Dfa minimize(const Dfa& d) {
  const int n = d.size() + 1, k = d.classes, dead = n - 1;
  auto target = [&](int s, int c) {
    if (s == dead) return dead;
    const int t = d.next[static_cast<std::size_t>(s) * static_cast<std::size_t>(k) + static_cast<std::size_t>(c)];
    return t < 0 ? dead : t;
  };
  // Sources of each (class, target): CSR arrays.
  std::vector<int> inv_begin(static_cast<std::size_t>(k) * static_cast<std::size_t>(n) + 1, 0), inv(static_cast<std::size_t>(k) * static_cast<std::size_t>(n));
  for (int c = 0; c < k; ++c)
    for (int s = 0; s < n; ++s) ++inv_begin[static_cast<std::size_t>(c) * static_cast<std::size_t>(n) + static_cast<std::size_t>(target(s, c)) + 1];
  for (std::size_t i = 1; i < inv_begin.size(); ++i) inv_begin[i] += inv_begin[i - 1];
  {
    std::vector<int> fill(inv_begin.begin(), inv_begin.end() - 1);
    for (int c = 0; c < k; ++c)
      for (int s = 0; s < n; ++s) inv[static_cast<std::size_t>(fill[static_cast<std::size_t>(c) * static_cast<std::size_t>(n) + static_cast<std::size_t>(target(s, c))]++)] = s;
  }
  // Blocks are ranges of `elems`; `pos` is each state's index there.
  std::vector<int> elems(static_cast<std::size_t>(n)), pos(static_cast<std::size_t>(n)), block_of(static_cast<std::size_t>(n));
  std::vector<int> first, past, marked;
  {
    int at = 0;
    for (int accepting = 1; accepting >= 0; --accepting) {
      const int begin = at;
      for (int s = 0; s < n; ++s) {
        const bool acc = s != dead && d.accepting[static_cast<std::size_t>(s)];
        if (acc == static_cast<bool>(accepting)) {
          elems[static_cast<std::size_t>(at)] = s;
          pos[static_cast<std::size_t>(s)] = at++;
          block_of[static_cast<std::size_t>(s)] = static_cast<int>(first.size());
        }
      }
      if (at > begin) {
        first.push_back(begin);
        past.push_back(at);
        marked.push_back(0);
      }
    }
  }
  std::vector<std::pair<int, int>> work;  // (block, class)
  std::vector<char> in_work;              // [block * k + class]
  auto ensure_flags = [&] { in_work.resize(first.size() * static_cast<std::size_t>(k), 0); };
  ensure_flags();
  for (int b = 0; b < static_cast<int>(first.size()); ++b)
    for (int c = 0; c < k; ++c) {
      work.push_back({b, c});
      in_work[static_cast<std::size_t>(b) * static_cast<std::size_t>(k) + static_cast<std::size_t>(c)] = 1;
    }
  std::vector<int> touched, splitter;
  while (!work.empty()) {
    const auto [a, c] = work.back();
    work.pop_back();
    in_work[static_cast<std::size_t>(a) * static_cast<std::size_t>(k) + static_cast<std::size_t>(c)] = 0;
    // The states that move into block a on class c (a's members may move while we mark: copy).
    splitter.assign(elems.begin() + first[static_cast<std::size_t>(a)], elems.begin() + past[static_cast<std::size_t>(a)]);
    touched.clear();
    for (int t : splitter) {
      const std::size_t row = static_cast<std::size_t>(c) * static_cast<std::size_t>(n) + static_cast<std::size_t>(t);
      for (int i = inv_begin[row]; i < inv_begin[row + 1]; ++i) {
        const int s = inv[static_cast<std::size_t>(i)];
        const int b = block_of[static_cast<std::size_t>(s)];
        const int mark_at = first[static_cast<std::size_t>(b)] + marked[static_cast<std::size_t>(b)];
        if (pos[static_cast<std::size_t>(s)] < mark_at) continue;  // already marked
        if (marked[static_cast<std::size_t>(b)] == 0) touched.push_back(b);
        // Swap s to the end of the block's marked prefix.
        const int other = elems[static_cast<std::size_t>(mark_at)];
        std::swap(elems[static_cast<std::size_t>(mark_at)], elems[static_cast<std::size_t>(pos[static_cast<std::size_t>(s)])]);
        pos[static_cast<std::size_t>(other)] = pos[static_cast<std::size_t>(s)];
        pos[static_cast<std::size_t>(s)] = mark_at;
        ++marked[static_cast<std::size_t>(b)];
      }
    }
    for (int b : touched) {
      const int size = past[static_cast<std::size_t>(b)] - first[static_cast<std::size_t>(b)];
      const int m = marked[static_cast<std::size_t>(b)];
      marked[static_cast<std::size_t>(b)] = 0;
      if (m == size) continue;
      // The marked prefix becomes a new block.
      const int nb = static_cast<int>(first.size());
      first.push_back(first[static_cast<std::size_t>(b)]);
      past.push_back(first[static_cast<std::size_t>(b)] + m);
      marked.push_back(0);
      first[static_cast<std::size_t>(b)] += m;
      for (int i = first[static_cast<std::size_t>(nb)]; i < past[static_cast<std::size_t>(nb)]; ++i) block_of[static_cast<std::size_t>(elems[static_cast<std::size_t>(i)])] = nb;
      ensure_flags();
      for (int cc = 0; cc < k; ++cc) {
        const std::size_t old_flag = static_cast<std::size_t>(b) * static_cast<std::size_t>(k) + static_cast<std::size_t>(cc);
        const std::size_t new_flag = static_cast<std::size_t>(nb) * static_cast<std::size_t>(k) + static_cast<std::size_t>(cc);
        if (in_work[old_flag]) {
          work.push_back({nb, cc});
          in_work[new_flag] = 1;
        } else {
          const int smaller = m <= size - m ? nb : b;
          work.push_back({smaller, cc});
          in_work[static_cast<std::size_t>(smaller) * static_cast<std::size_t>(k) + static_cast<std::size_t>(cc)] = 1;
        }
      }
    }
  }
  // One state per block but the dead one's, the start first, then in first-reached order.
  const int blocks = static_cast<int>(first.size());
  const int dead_block = block_of[static_cast<std::size_t>(dead)];
  std::vector<int> renumber(static_cast<std::size_t>(blocks), -1), order;
  renumber[static_cast<std::size_t>(block_of[static_cast<std::size_t>(d.start)])] = 0;
  order.push_back(d.start);
  for (std::size_t i = 0; i < order.size(); ++i)
    for (int c = 0; c < k; ++c) {
      const int t = target(order[i], c);
      const int b = block_of[static_cast<std::size_t>(t)];
      if (b == dead_block || renumber[static_cast<std::size_t>(b)] >= 0) continue;
      renumber[static_cast<std::size_t>(b)] = static_cast<int>(order.size());
      order.push_back(t);
    }
  Dfa m;
  m.byte_class = d.byte_class;
  m.classes = k;
  for (int s : order) {
    bool out = false;
    for (int c = 0; c < k; ++c) {
      const int b = block_of[static_cast<std::size_t>(target(s, c))];
      const int t = b == dead_block ? -1 : renumber[static_cast<std::size_t>(b)];
      m.next.push_back(t);
      out = out || t >= 0;
    }
    m.accepting.push_back(d.accepting[static_cast<std::size_t>(s)]);
    m.has_out.push_back(out ? 1 : 0);
  }
  return m;
}

}  // namespace

std::vector<std::vector<std::pair<std::uint8_t, std::uint8_t>>> utf8_sequences(std::uint32_t lo, std::uint32_t hi) {
  std::vector<std::vector<std::pair<std::uint8_t, std::uint8_t>>> out;
  const std::uint32_t limits[4] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
  std::uint32_t start = 0;
  for (int n = 1; n <= 4; ++n) {
    std::uint32_t a = std::max(lo, start), b = std::min(hi, limits[n - 1]);
    start = limits[n - 1] + 1;
    if (a > b) continue;
    if (n == 3) {  // surrogates are not characters
      if (a < 0xD800) split_same_length(a, std::min(b, 0xD7FFu), n, out);
      if (b > 0xDFFF) split_same_length(std::max(a, 0xE000u), b, n, out);
      continue;
    }
    split_same_length(a, b, n, out);
  }
  return out;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  const int n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
  std::uint8_t bytes[4];
  encode(cp, bytes, n);
  out.append(reinterpret_cast<const char*>(bytes), static_cast<std::size_t>(n));
}

std::array<bool, 256> Dfa::first_bytes(int state) const {
  std::array<bool, 256> out{};
  for (int b = 0; b < 256; ++b) out[static_cast<std::size_t>(b)] = step(state, static_cast<std::uint8_t>(b)) >= 0;
  return out;
}

int refine_classes(const Dfa& d, const std::vector<std::int32_t>& cls, std::vector<std::int32_t>& next) {
  const int n = d.size(), k = d.classes;
  next.assign(static_cast<std::size_t>(n), -1);
  auto target_class = [&](int s, int c) {
    const int t = d.next[static_cast<std::size_t>(s) * static_cast<std::size_t>(k) + static_cast<std::size_t>(c)];
    return t < 0 ? -1 : cls[static_cast<std::size_t>(t)];
  };
  auto same = [&](int a, int b) {
    if (cls[static_cast<std::size_t>(a)] != cls[static_cast<std::size_t>(b)]) return false;
    for (int c = 0; c < k; ++c)
      if (target_class(a, c) != target_class(b, c)) return false;
    return true;
  };
  // Hash of the signature; equal hashes are confirmed against the first state seen with it.
  std::unordered_map<std::uint64_t, std::vector<int>> representatives;
  representatives.reserve(static_cast<std::size_t>(n));
  int fresh = 0;
  for (int s = 0; s < n; ++s) {
    std::uint64_t h = 1469598103934665603ull ^ static_cast<std::uint32_t>(cls[static_cast<std::size_t>(s)]);
    for (int c = 0; c < k; ++c) h = (h ^ static_cast<std::uint32_t>(target_class(s, c))) * 1099511628211ull;
    auto& reps = representatives[h];
    int found = -1;
    for (int r : reps)
      if (same(r, s)) { found = next[static_cast<std::size_t>(r)]; break; }
    if (found < 0) {
      found = fresh++;
      reps.push_back(s);
    }
    next[static_cast<std::size_t>(s)] = found;
  }
  return fresh;
}

std::optional<Dfa> build_dfa(const Expr& e, const Grammar& g, int max_states) {
  NfaBuilder nfa(g, static_cast<std::size_t>(max_states) * 64 + 4096);
  int nfa_in, nfa_out;
  try {
    std::tie(nfa_in, nfa_out) = nfa.build(e);
  } catch (const TooBig&) {
    return std::nullopt;
  }
  const auto& S = nfa.states;

  Dfa d;
  std::array<bool, 257> cut{};
  cut[0] = true;
  for (const auto& s : S)
    for (const Edge& ed : s.edges) {
      cut[ed.lo] = true;
      cut[static_cast<std::size_t>(ed.hi) + 1] = true;
    }
  std::vector<std::uint8_t> representative;
  int cls = -1;
  for (int b = 0; b < 256; ++b) {
    if (cut[static_cast<std::size_t>(b)]) {
      ++cls;
      representative.push_back(static_cast<std::uint8_t>(b));
    }
    d.byte_class[static_cast<std::size_t>(b)] = static_cast<std::uint16_t>(cls);
  }
  d.classes = cls + 1;

  // Generation stamps instead of clearing a visited array per closure: the NFA can be large.
  std::vector<std::uint32_t> seen(S.size(), 0);
  std::uint32_t generation = 0;
  std::vector<int> todo;
  auto closure = [&](std::vector<int> set) {
    ++generation;
    todo = set;
    for (int s : set) seen[static_cast<std::size_t>(s)] = generation;
    while (!todo.empty()) {
      int s = todo.back();
      todo.pop_back();
      for (int t : S[static_cast<std::size_t>(s)].eps)
        if (seen[static_cast<std::size_t>(t)] != generation) {
          seen[static_cast<std::size_t>(t)] = generation;
          set.push_back(t);
          todo.push_back(t);
        }
    }
    // Only states with byte edges or the exit matter for identity.
    std::vector<int> kept;
    for (int s : set)
      if (!S[static_cast<std::size_t>(s)].edges.empty() || s == nfa_out) kept.push_back(s);
    std::sort(kept.begin(), kept.end());
    return kept;
  };

  struct VectorHash {
    std::size_t operator()(const std::vector<int>& v) const {
      std::uint64_t h = 1469598103934665603ull;
      for (int x : v) h = (h ^ static_cast<std::uint32_t>(x)) * 1099511628211ull;
      return static_cast<std::size_t>(h);
    }
  };
  std::unordered_map<std::vector<int>, int, VectorHash> ids;
  std::vector<std::vector<int>> sets;
  auto intern = [&](std::vector<int> set) -> int {
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    const int id = static_cast<int>(sets.size());
    sets.push_back(set);
    ids.emplace(std::move(set), id);
    return id;
  };
  intern(closure({nfa_in}));
  std::vector<std::vector<int>> targets(static_cast<std::size_t>(d.classes));
  for (std::size_t i = 0; i < sets.size(); ++i) {
    if (static_cast<int>(sets.size()) > max_states) return std::nullopt;
    std::vector<int> row(static_cast<std::size_t>(d.classes), -1);
    for (auto& t : targets) t.clear();
    for (int s : sets[i])
      for (const Edge& ed : S[static_cast<std::size_t>(s)].edges)
        for (int c = d.byte_class[ed.lo]; c <= d.byte_class[ed.hi]; ++c) targets[static_cast<std::size_t>(c)].push_back(ed.to);
    for (int c = 0; c < d.classes; ++c) {
      std::vector<int>& target = targets[static_cast<std::size_t>(c)];
      if (target.empty()) continue;
      std::sort(target.begin(), target.end());
      target.erase(std::unique(target.begin(), target.end()), target.end());
      row[static_cast<std::size_t>(c)] = intern(closure(target));
    }
    d.next.insert(d.next.end(), row.begin(), row.end());
    d.accepting.push_back(std::binary_search(sets[i].begin(), sets[i].end(), nfa_out) ? 1 : 0);
  }
  if (d.size() > max_states) return std::nullopt;

  return minimize(d);
}

}  // namespace promptly::grammar
