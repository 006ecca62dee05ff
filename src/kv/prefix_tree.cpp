#include "kv/prefix_tree.h"

#include <algorithm>
#include <functional>

namespace promptly {

PrefixTree::PrefixTree(BlockPool& pool) : pool_(pool) {}

PrefixTree::~PrefixTree() {
  std::function<void(Node&)> release_all = [&](Node& n) {
    for (auto& [key, child] : n.children) {
      release_all(*child);
      pool_.release(child->block);
    }
  };
  release_all(root_);
}

std::size_t PrefixTree::match(const std::vector<std::int32_t>& tokens, std::vector<int>& blocks) {
  ++queries_;
  const std::size_t bt = pool_.block_tokens();
  Node* node = &root_;
  std::size_t matched = 0;
  std::vector<std::int32_t> key(bt);
  while (matched + bt <= tokens.size()) {
    std::copy_n(tokens.begin() + static_cast<long>(matched), bt, key.begin());
    auto it = node->children.find(key);
    if (it == node->children.end()) break;
    node = it->second.get();
    node->last_used = ++clock_;
    pool_.retain(node->block);
    blocks.push_back(node->block);
    matched += bt;
  }
  hit_tokens_ += matched;
  return matched;
}

void PrefixTree::insert(const std::vector<std::int32_t>& tokens, const std::vector<int>& blocks) {
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
      pool_.retain(blocks[i]);
      ++n_nodes_;
      it = node->children.emplace(std::move(key), std::move(child)).first;
    }
    node = it->second.get();
    node->last_used = ++clock_;
  }
}

std::size_t PrefixTree::evict(std::size_t n) {
  std::size_t freed = 0;
  while (freed < n) {
    // The least recently used leaf that nobody but the tree holds.
    Node* victim = nullptr;
    std::function<void(Node&)> scan = [&](Node& node) {
      for (auto& [key, child] : node.children) {
        if (child->children.empty()) {
          if (pool_.refs(child->block) == 1 && (!victim || child->last_used < victim->last_used)) victim = child.get();
        } else {
          scan(*child);
        }
      }
    };
    scan(root_);
    if (!victim) break;
    pool_.release(victim->block);
    Node* parent = victim->parent;
    parent->children.erase(victim->key);
    --n_nodes_;
    ++freed;
  }
  return freed;
}

}  // namespace promptly
