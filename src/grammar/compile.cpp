#include "grammar/compile.h"

#include <algorithm>
#include <functional>
#include <map>

namespace promptly::grammar {

namespace {

class Compiler {
 public:
  Compiler(const Grammar& g, const CompileLimits& limits) : work_(g), limits_(limits) {}

  CompiledGrammar run() {
    if (work_.root < 0 || work_.root >= static_cast<int>(work_.rules.size())) throw GrammarError("grammar has no root rule");
    find_recursive_rules();
    out_.root = compiled_rule(work_.root);
    while (!pending_.empty()) {
      int source = pending_.back().first, target = pending_.back().second;
      pending_.pop_back();
      compile_body(source, target);
    }
    drop_unproductive();
    check_left_recursion();
    compute_follow();
    return std::move(out_);
  }

 private:
  // Rules that lie on a reference cycle, or reach one, cannot be a DFA.
  void find_recursive_rules() {
    const int n = static_cast<int>(work_.rules.size());
    std::vector<std::vector<int>> refs(static_cast<std::size_t>(n));
    std::function<void(const Expr&, std::vector<int>&)> collect = [&](const Expr& e, std::vector<int>& into) {
      if (e.kind == Expr::Kind::Ref) into.push_back(e.rule);
      for (const Expr& c : e.children) collect(c, into);
    };
    for (int r = 0; r < n; ++r) collect(work_.rules[static_cast<std::size_t>(r)].body, refs[static_cast<std::size_t>(r)]);
    // state: 0 unvisited, 1 on the DFS path, 2 done
    std::vector<int> state(static_cast<std::size_t>(n), 0);
    non_regular_.assign(static_cast<std::size_t>(n), false);
    std::function<void(int)> visit = [&](int r) {
      state[static_cast<std::size_t>(r)] = 1;
      for (int t : refs[static_cast<std::size_t>(r)]) {
        if (state[static_cast<std::size_t>(t)] == 1) non_regular_[static_cast<std::size_t>(t)] = true;
        if (state[static_cast<std::size_t>(t)] == 0) visit(t);
      }
      state[static_cast<std::size_t>(r)] = 2;
    };
    for (int r = 0; r < n; ++r)
      if (state[static_cast<std::size_t>(r)] == 0) visit(r);
    // Propagate: a rule referring to a non-regular rule is non-regular.
    for (bool changed = true; changed;) {
      changed = false;
      for (int r = 0; r < n; ++r) {
        if (non_regular_[static_cast<std::size_t>(r)]) continue;
        for (int t : refs[static_cast<std::size_t>(r)])
          if (non_regular_[static_cast<std::size_t>(t)]) {
            non_regular_[static_cast<std::size_t>(r)] = changed = true;
            break;
          }
      }
    }
  }

  bool regular(const Expr& e) const {
    if (e.kind == Expr::Kind::Ref) return !non_regular_[static_cast<std::size_t>(e.rule)];
    return std::all_of(e.children.begin(), e.children.end(), [&](const Expr& c) { return regular(c); });
  }

  int compiled_rule(int source) {
    auto it = compiled_.find(source);
    if (it != compiled_.end()) return it->second;
    int id = static_cast<int>(out_.rule_alts.size());
    out_.rule_alts.emplace_back();
    out_.rule_names.push_back(work_.rules[static_cast<std::size_t>(source)].name);
    compiled_[source] = id;
    pending_.push_back({source, id});
    return id;
  }

  int synthetic_rule(Expr body, const std::string& hint, bool recursive) {
    if (static_cast<int>(work_.rules.size()) >= limits_.max_rules)
      throw GrammarError("grammar too large: more than " + std::to_string(limits_.max_rules) + " rules (bounded repetitions of recursive parts make one rule per count)");
    work_.rules.push_back({hint + "-" + std::to_string(work_.rules.size()), std::move(body)});
    non_regular_.push_back(recursive);
    return static_cast<int>(work_.rules.size()) - 1;
  }

  int add_dfa(Dfa d) {
    total_states_ += d.size();
    if (total_states_ > limits_.max_total_states)
      throw GrammarError("grammar too large: more than " + std::to_string(limits_.max_total_states) + " automaton states");
    out_.dfas.push_back(std::move(d));
    return static_cast<int>(out_.dfas.size()) - 1;
  }

  bool try_terminal(const Expr& e, std::vector<Element>& into) {
    auto d = build_dfa(e, work_, limits_.max_dfa_states);
    if (!d) return false;
    into.push_back({Element::Kind::Terminal, add_dfa(std::move(*d))});
    return true;
  }

  void compile_body(int source, int target) {
    const Expr body = work_.rules[static_cast<std::size_t>(source)].body;  // copy: work_ grows
    const std::string name = work_.rules[static_cast<std::size_t>(source)].name;
    std::vector<std::vector<Element>> alternatives;
    std::vector<Element> whole;
    if (regular(body) && try_terminal(body, whole)) {
      alternatives.push_back(std::move(whole));
    } else if (body.kind == Expr::Kind::Alt) {
      for (const Expr& a : body.children) alternatives.push_back(compile_sequence(a, name));
    } else {
      alternatives.push_back(compile_sequence(body, name));
    }
    for (auto& a : alternatives) {
      out_.rule_alts[static_cast<std::size_t>(target)].push_back(static_cast<int>(out_.alts.size()));
      out_.alts.push_back(std::move(a));
      out_.alt_rule.push_back(target);
    }
  }

  std::vector<Element> compile_sequence(const Expr& e, const std::string& name) {
    std::vector<const Expr*> items;
    if (e.kind == Expr::Kind::Seq)
      for (const Expr& c : e.children) items.push_back(&c);
    else
      items.push_back(&e);
    std::vector<Element> out;
    std::size_t i = 0;
    while (i < items.size()) {
      if (regular(*items[i])) {
        std::size_t j = i;
        std::vector<Expr> run;
        while (j < items.size() && regular(*items[j])) run.push_back(*items[j++]);
        if (!try_terminal(Expr::seq(run), out))
          for (const Expr& item : run)
            if (!try_terminal(item, out)) out.push_back(structural(item, name));
        i = j;
      } else {
        out.push_back(structural(*items[i++], name));
      }
    }
    return out;
  }

  // A reference to a rule holding `e` (rules repeat through recursion rather than a DFA loop).
  Element structural(const Expr& e, const std::string& name) {
    switch (e.kind) {
      case Expr::Kind::Ref: return {Element::Kind::Ref, compiled_rule(e.rule)};
      case Expr::Kind::Repeat: {
        const Expr& item = e.children.front();
        int tail;
        if (e.max < 0) {  // star ::= item star | ""
          tail = synthetic_rule(Expr{}, name + "-star", true);
          work_.rules[static_cast<std::size_t>(tail)].body = Expr::alt({Expr::seq({item, Expr::ref(tail)}), Expr::seq({})});
        } else {  // optional_k ::= item optional_{k-1} | ""
          tail = synthetic_rule(Expr::seq({}), name + "-opt", true);
          for (int k = e.min; k < e.max; ++k) {
            Expr next = Expr::alt({Expr::seq({item, Expr::ref(tail)}), Expr::seq({})});
            tail = synthetic_rule(std::move(next), name + "-opt", true);
          }
        }
        std::vector<Expr> parts(static_cast<std::size_t>(e.min), item);
        parts.push_back(Expr::ref(tail));
        return {Element::Kind::Ref, compiled_rule(synthetic_rule(Expr::seq(std::move(parts)), name + "-rep", true))};
      }
      default: return {Element::Kind::Ref, compiled_rule(synthetic_rule(e, name + "-group", true))};
    }
  }

  bool terminal_productive(const Element& el) const {
    const Dfa& d = out_.dfas[static_cast<std::size_t>(el.index)];
    return d.accepting[static_cast<std::size_t>(d.start)] || d.has_out[static_cast<std::size_t>(d.start)];
  }

  void drop_unproductive() {
    const std::size_t n = out_.rule_alts.size();
    std::vector<bool> productive(n, false);
    auto alt_ok = [&](int a) {
      for (const Element& el : out_.alts[static_cast<std::size_t>(a)])
        if (el.kind == Element::Kind::Terminal ? !terminal_productive(el) : !productive[static_cast<std::size_t>(el.index)]) return false;
      return true;
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (std::size_t r = 0; r < n; ++r)
        if (!productive[r])
          for (int a : out_.rule_alts[r])
            if (alt_ok(a)) { productive[r] = changed = true; break; }
    }
    if (!productive[static_cast<std::size_t>(out_.root)]) throw GrammarError("the grammar's root rule can never finish");
    for (std::size_t r = 0; r < n; ++r) {
      if (!productive[r]) continue;
      auto& list = out_.rule_alts[r];
      list.erase(std::remove_if(list.begin(), list.end(), [&](int a) { return !alt_ok(a); }), list.end());
    }
  }

  std::vector<bool> nullable_rules() const {
    std::vector<bool> nullable(out_.rule_alts.size(), false);
    for (bool changed = true; changed;) {
      changed = false;
      for (std::size_t r = 0; r < nullable.size(); ++r) {
        if (nullable[r]) continue;
        for (int a : out_.rule_alts[r]) {
          bool all = true;
          for (const Element& el : out_.alts[static_cast<std::size_t>(a)]) all = all && element_nullable(el, nullable);
          if (all) { nullable[r] = changed = true; break; }
        }
      }
    }
    return nullable;
  }

  bool element_nullable(const Element& el, const std::vector<bool>& nullable) const {
    if (el.kind == Element::Kind::Ref) return nullable[static_cast<std::size_t>(el.index)];
    const Dfa& d = out_.dfas[static_cast<std::size_t>(el.index)];
    return d.accepting[static_cast<std::size_t>(d.start)];
  }

  void check_left_recursion() {
    const auto nullable = nullable_rules();
    const std::size_t n = out_.rule_alts.size();
    std::vector<std::vector<int>> leading(n);
    for (std::size_t r = 0; r < n; ++r)
      for (int a : out_.rule_alts[r])
        for (const Element& el : out_.alts[static_cast<std::size_t>(a)]) {
          if (el.kind == Element::Kind::Ref) leading[r].push_back(el.index);
          if (!element_nullable(el, nullable)) break;
        }
    std::vector<int> state(n, 0);
    std::function<void(int)> visit = [&](int r) {
      state[static_cast<std::size_t>(r)] = 1;
      for (int t : leading[static_cast<std::size_t>(r)]) {
        if (state[static_cast<std::size_t>(t)] == 1)
          throw GrammarError("rule '" + out_.rule_names[static_cast<std::size_t>(t)] +
                             "' is left-recursive (it can reach itself before matching any character)");
        if (state[static_cast<std::size_t>(t)] == 0) visit(t);
      }
      state[static_cast<std::size_t>(r)] = 2;
    };
    for (std::size_t r = 0; r < n; ++r)
      if (state[r] == 0) visit(static_cast<int>(r));
  }

  void compute_follow() {
    const auto nullable = nullable_rules();
    const std::size_t n = out_.rule_alts.size();
    std::vector<std::bitset<256>> first(n);
    auto element_first = [&](const Element& el) {
      if (el.kind == Element::Kind::Ref) return first[static_cast<std::size_t>(el.index)];
      const Dfa& d = out_.dfas[static_cast<std::size_t>(el.index)];
      std::bitset<256> bits;
      for (int b = 0; b < 256; ++b)
        if (d.step(d.start, static_cast<std::uint8_t>(b)) >= 0) bits.set(static_cast<std::size_t>(b));
      return bits;
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (std::size_t r = 0; r < n; ++r)
        for (int a : out_.rule_alts[r])
          for (const Element& el : out_.alts[static_cast<std::size_t>(a)]) {
            auto before = first[r];
            first[r] |= element_first(el);
            changed = changed || before != first[r];
            if (!element_nullable(el, nullable)) break;
          }
    }
    out_.follow.assign(n, {});
    for (bool changed = true; changed;) {
      changed = false;
      for (std::size_t r = 0; r < n; ++r)
        for (int a : out_.rule_alts[r]) {
          const auto& els = out_.alts[static_cast<std::size_t>(a)];
          // Walk backwards carrying what may follow the current position.
          std::bitset<256> after = out_.follow[r];
          for (std::size_t i = els.size(); i-- > 0;) {
            const Element& el = els[i];
            if (el.kind == Element::Kind::Ref) {
              auto& f = out_.follow[static_cast<std::size_t>(el.index)];
              auto before = f;
              f |= after;
              changed = changed || before != f;
            }
            after = element_nullable(el, nullable) ? (after | element_first(el)) : element_first(el);
          }
        }
    }
  }

  Grammar work_;
  CompileLimits limits_;
  std::vector<bool> non_regular_;
  std::map<int, int> compiled_;
  std::vector<std::pair<int, int>> pending_;
  CompiledGrammar out_;
  long long total_states_ = 0;
};

}  // namespace

CompiledGrammar compile(const Grammar& g, const CompileLimits& limits) { return Compiler(g, limits).run(); }

}  // namespace promptly::grammar
