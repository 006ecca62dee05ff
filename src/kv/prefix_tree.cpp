#include "kv/prefix_tree.h"

#include <algorithm>
#include <functional>
#include <queue>

namespace promptly {

namespace {
constexpr BlockPool::Hold kCached = BlockPool::Hold::Cached;  // the tree's own references
}  // namespace

PrefixTree::PrefixTree(BlockPool& pool, std::size_t window) : pool_(pool), window_(window) {}

PrefixTree::~PrefixTree() {
  std::function<void(Node&)> release_all = [&](Node& n) {
    for (auto& [key, child] : n.children) {
      release_all(*child);
      pool_.release(child->block, kCached);
    }
  };
  release_all(root_);
}

std::vector<const PrefixTree::Node*> PrefixTree::block_path(std::span<const std::int32_t> tokens) const {
  const std::size_t bt = pool_.block_tokens();
  std::vector<const Node*> path;
  const Node* node = &root_;
  std::vector<std::int32_t> key(bt);
  for (std::size_t at = 0; at + bt <= tokens.size(); at += bt) {
    std::copy_n(tokens.begin() + static_cast<long>(at), bt, key.begin());
    auto it = node->children.find(key);
    if (it == node->children.end()) break;
    node = it->second.get();
    path.push_back(node);
  }
  return path;
}

std::size_t PrefixTree::usable_blocks(const std::vector<const Node*>& path) const {
  if (window_ == 0) return path.size();
  const std::size_t bt = pool_.block_tokens();
  // The largest k whose match (k blocks: the first computed query at k * bt sees
  // (k * bt - window, k * bt]) sees no block without its local KV. Only the last such block before
  // k matters; k = 0 always works.
  std::size_t k = path.size();
  std::size_t missing = path.size();  // the last block before k without local KV (path.size(): none)
  for (std::size_t j = path.size(); j-- > 0;) {
    if (!pool_.has_local(path[j]->block)) {
      missing = j;
      break;
    }
  }
  while (missing < k && (missing + 1) * bt + window_ > k * bt + 1) {
    k = missing;  // stop before it, then check the blocks before
    while (missing > 0 && pool_.has_local(path[missing - 1]->block)) --missing;
    missing = missing > 0 ? missing - 1 : path.size();
  }
  return k;
}

std::size_t PrefixTree::match(const std::vector<std::int32_t>& tokens, std::vector<int>& blocks, std::size_t limit, bool count) {
  if (count) ++queries_;
  const std::size_t bt = pool_.block_tokens();
  const std::span<const std::int32_t> wanted = std::span<const std::int32_t>(tokens).first(std::min(limit, tokens.size()));
  std::vector<const Node*> path = block_path(wanted);
  const std::size_t usable = usable_blocks(path);
  const bool cut = usable < path.size();
  path.resize(usable);
  for (const Node* node : path) {
    node->last_used = ++clock_;
    pool_.retain(node->block);
    blocks.push_back(node->block);
  }
  std::size_t matched = path.size() * bt;
  if (matched < wanted.size() && !cut) {
    // Copy-on-read of the rows the rest of `tokens` shares with a child.
    const Node& last = path.empty() ? root_ : *path.back();
    const auto [source, shared] = most_shared_rows(last, wanted.subspan(matched, std::min(bt, wanted.size() - matched)));
    if (source && pool_.has_local(source->block)) {
      pool_.retain(source->block);  // whole while copied: allocate may hand out a segment nobody holds
      if (const int copy = pool_.allocate(); copy >= 0) {
        pool_.copy_rows(source->block, copy, shared);
        source->last_used = ++clock_;
        blocks.push_back(copy);
        matched += shared;
      }
      pool_.release(source->block);
    }
  }
  if (count) hit_tokens_ += matched;
  return matched;
}

std::size_t PrefixTree::cached_length(std::span<const std::int32_t> tokens) const {
  const std::size_t bt = pool_.block_tokens();
  std::vector<const Node*> path = block_path(tokens);
  const std::size_t usable = usable_blocks(path);
  if (usable < path.size()) return usable * bt;
  std::size_t matched = path.size() * bt;
  if (matched < tokens.size()) {
    const SharedRows shared = most_shared_rows(path.empty() ? root_ : *path.back(), tokens.subspan(matched, std::min(bt, tokens.size() - matched)));
    if (shared.node && pool_.has_local(shared.node->block)) matched += shared.rows;
  }
  return matched;
}

PrefixTree::SharedRows PrefixTree::most_shared_rows(const Node& node, std::span<const std::int32_t> rows) const {
  SharedRows best;
  for (auto it = node.children.lower_bound({rows[0]}); it != node.children.end() && it->first[0] == rows[0]; ++it) {
    const std::vector<std::int32_t>& key = it->first;
    const std::size_t limit = std::min(key.size(), rows.size());
    const auto common = static_cast<std::size_t>(std::mismatch(key.begin(), key.begin() + static_cast<long>(limit), rows.begin()).first - key.begin());
    if (common > best.rows) best = {it->second.get(), common};
  }
  return best;
}

PrefixTree::Node* PrefixTree::find_path(std::span<const std::int32_t> tokens) {
  const std::size_t bt = pool_.block_tokens();
  Node* node = &root_;
  for (std::size_t at = 0; at + bt <= tokens.size(); at += bt) {
    auto it = node->children.find(std::vector<std::int32_t>(tokens.begin() + static_cast<long>(at), tokens.begin() + static_cast<long>(at + bt)));
    if (it == node->children.end()) return nullptr;
    node = it->second.get();
  }
  return node;
}

void PrefixTree::drop_partials_covered_by(Node& node, std::span<const std::int32_t> key) {
  for (auto it = node.children.lower_bound({key[0]}); it != node.children.end() && it->first[0] == key[0];) {
    const std::vector<std::int32_t>& k = it->first;
    if (k.size() < key.size() && it->second->children.empty() && std::equal(k.begin(), k.end(), key.begin())) {
      pool_.release(it->second->block, kCached);
      it = node.children.erase(it);
      --n_nodes_;
    } else {
      ++it;
    }
  }
}

void PrefixTree::insert_partial(std::span<const std::int32_t> tokens, int block) {
  const std::size_t bt = pool_.block_tokens();
  const std::size_t full = tokens.size() / bt * bt;
  if (full == tokens.size()) return;
  Node* node = find_path(tokens.first(full));
  if (!node) return;
  const std::span<const std::int32_t> rows = tokens.subspan(full);
  if (const SharedRows cached = most_shared_rows(*node, rows); cached.rows == rows.size()) {
    cached.node->last_used = ++clock_;  // a cached block already holds these rows
    return;
  }
  drop_partials_covered_by(*node, rows);
  auto child = std::make_unique<Node>();
  child->block = block;
  child->parent = node;
  child->key.assign(rows.begin(), rows.end());
  child->last_used = ++clock_;
  pool_.retain(block, kCached);
  ++n_nodes_;
  std::vector<std::int32_t> key = child->key;
  node->children.emplace(std::move(key), std::move(child));
}

void PrefixTree::insert(std::span<const std::int32_t> tokens, const std::vector<int>& blocks) {
  const std::size_t bt = pool_.block_tokens();
  const std::size_t n_full = std::min(blocks.size(), tokens.size() / bt);
  Node* node = &root_;
  for (std::size_t i = 0; i < n_full; ++i) {
    std::vector<std::int32_t> key(tokens.begin() + static_cast<long>(i * bt), tokens.begin() + static_cast<long>((i + 1) * bt));
    auto it = node->children.find(key);
    if (it == node->children.end()) {
      auto child = std::make_unique<Node>();
      child->block = blocks[i];
      child->parent = node;
      child->key = key;
      pool_.retain(blocks[i], kCached);
      ++n_nodes_;
      drop_partials_covered_by(*node, key);
      it = node->children.emplace(std::move(key), std::move(child)).first;
    } else if (Node& cached = *it->second; !pool_.has_local(cached.block) && pool_.has_local(blocks[i])) {
      // The cached block gave up its local layers' KV; the offered one (recomputed) has it.
      pool_.retain(blocks[i], kCached);
      pool_.release(cached.block, kCached);
      cached.block = blocks[i];
    }
    node = it->second.get();
    node->last_used = ++clock_;
  }
}

std::size_t PrefixTree::evictable_blocks() const {
  std::size_t n = 0;
  std::vector<const Node*> stack = {&root_};
  while (!stack.empty()) {
    const Node* node = stack.back();
    stack.pop_back();
    for (const auto& [key, child] : node->children) {
      if (pool_.refs(child->block) == 1) ++n;
      stack.push_back(child.get());
    }
  }
  return n;
}

std::size_t PrefixTree::evict(std::size_t n) {
  // Candidates: leaves only the tree holds, oldest first. Evicting a leaf can make its parent such
  // a leaf; a parent was last used no later than its children, so it joins the same order.
  auto newer = [](const Node* a, const Node* b) { return a->last_used > b->last_used; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(newer)> candidates(newer);
  auto evictable_leaf = [&](const Node* node) {
    return node != &root_ && node->children.empty() && pool_.refs(node->block) == 1;
  };
  std::vector<Node*> stack = {&root_};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (auto& [key, child] : node->children) {
      if (evictable_leaf(child.get())) candidates.push(child.get());
      stack.push_back(child.get());
    }
  }
  std::size_t freed = 0;
  while (freed < n && !candidates.empty()) {
    Node* victim = candidates.top();
    candidates.pop();
    pool_.release(victim->block, kCached);
    Node* parent = victim->parent;
    parent->children.erase(victim->key);  // destroys victim
    --n_nodes_;
    ++freed;
    if (evictable_leaf(parent)) candidates.push(parent);
  }
  return freed;
}

}  // namespace promptly
