// The tree shapes of tree_shaper.h: the round's draft loop, how a node's children are chosen, the
// topk and split expansions, and the verified tree's selection.
#include "tree_shaper.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace specnative {
namespace {

constexpr int kSplitCandidates = 8;  // llama.cpp's examples/speculative tries candidates 1..7

// The n largest values of w[0..n_vocab) as indices, largest first (ties: smaller index first).
void top_indices(const float* w, int n_vocab, int n, std::vector<int32_t>& out) {
    out.clear();
    auto worse = [&](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); };  // heap top: the worst
    for (int32_t i = 0; i < n_vocab; ++i) {
        if (static_cast<int>(out.size()) < n) {
            out.push_back(i);
            std::push_heap(out.begin(), out.end(), worse);
        } else if (worse(i, out.front())) {
            std::pop_heap(out.begin(), out.end(), worse);
            out.back() = i;
            std::push_heap(out.begin(), out.end(), worse);
        }
    }
    std::sort_heap(out.begin(), out.end(), worse);
}

}  // namespace

ShapedTreeDrafter::ShapedTreeDrafter(const GenerateParams& p, int target_vocab, int draft_vocab, int n_seq)
    : p_(p), shape_(p.tree), vocab_(std::max(target_vocab, draft_vocab)), n_seq_(n_seq),
      per_(p.tree.ids_per_seq()), work_(n_seq) {}

void ShapedTreeDrafter::draft(std::vector<Engine::Sequence>& seqs, const std::vector<int>& max_depth,
                              std::vector<DraftTree>& trees) {
    const int n_seq = static_cast<int>(seqs.size());
    // step 0: what each sequence's draft cache lacks, then its root under all its ids
    for (int s = 0; s < n_seq; ++s) {
        Work& w = work_[s];
        w.live = max_depth[s] >= 0;
        if (!w.live) continue;
        Engine::Sequence& seq = seqs[s];
        w.cap = max_depth[s];
        w.full.reset(seq.pending());
        w.cum.assign(1, 0.0);
        w.row.assign(1, -1);
        w.holds.assign(per_, 0);
        w.feed.clear();
        w.branches.assign(1, Branch{0, 0, true});
        const int row = start_round(seq, w);
        w.row[0] = row;
        w.feed.push_back(Fed{0, 0, row});
    }
    for (int step = 0;; ++step) {
        if (batch_empty()) break;
        decode_batch();
        for (int s = 0; s < n_seq; ++s) {
            Work& w = work_[s];
            if (!w.live || w.feed.empty()) continue;
            if (shape_.kind == TreeShape::Kind::topk) {
                expand_topk(seqs[s], w, step);
            } else {
                expand_split(seqs[s], w, step);
            }
        }
    }
    for (int s = 0; s < n_seq; ++s) {
        if (!work_[s].live) continue;
        select(work_[s], trees[s]);
    }
}

std::pair<int, int> ShapedTreeDrafter::best_slot(const Engine::Sequence& seq, const std::vector<int>& path) {
    const Work& w = work_[seq.id];
    // the accepted path in the full tree, and how much of it each id holds (fed nodes only)
    on_path_.assign(w.full.size(), 0);
    for (int i : path) on_path_[w.to_full[i]] = 1;
    int best_j = 0, best = -1;
    for (int j = 0; j < per_; ++j) {
        int v = w.holds[j];
        while (v > 0 && !on_path_[v]) v = w.full.parent[v];
        const int held = w.full.depth[v];
        if (held > best) {
            best = held;
            best_j = j;
        }
    }
    return {best_j, best};
}

void ShapedTreeDrafter::align_slots(const Engine::Sequence& seq, int keep_slot, int held) {
    const int32_t from = work_[seq.id].p0 + 1;
    const int keep_id = id_of(seq, keep_slot);
    for (int j = 0; j < per_; ++j) {
        if (j == keep_slot) continue;
        const int id = id_of(seq, j);
        remove_from(id, from);
        if (held > 0) copy_cells(keep_id, id, from, from + held);
    }
}

// The children a node gets from its logits: `n` of them (or fewer: q without mass left), at
// temperature 0 the n most probable, else n draws without replacement from q (kept in the full
// tree's q for the verifier). Returns their log probabilities (ranked probability, temperature 1
// at greedy) with them.
void ShapedTreeDrafter::children_of(const Engine::Sequence& seq, Work& w, int node, const float* logits, int n,
                                    std::vector<std::pair<int32_t, double>>& out) {
    out.clear();
    const int nv = draft_vocab();
    if (p_.temperature <= 0.0f) {
        top_indices(logits, nv, n, top_);
        softmax_norm(logits, nv, 1.0f, norm_);
        for (int32_t t : top_) out.emplace_back(t, std::log(std::max(1e-30f, softmax_prob(logits, norm_, t))));
        return;
    }
    std::vector<float>& q = w.full.q[node];
    softmax_norm(logits, nv, p_.draft_temperature > 0.0f ? p_.draft_temperature : p_.temperature, norm_);
    softmax(logits, nv, norm_, q);
    q.resize(vocab_, 0.0f);
    weights_ = q;
    double rest = 1.0;
    const int64_t index = seq.next_index() + w.full.depth[node];
    for (int i = 0; i < n && rest > 1e-9; ++i) {
        const uint64_t pos = static_cast<uint64_t>(index) + (static_cast<uint64_t>(node + 1) << 32) +
                             (static_cast<uint64_t>(i) << 56);
        const int32_t t = sample_from_weights(weights_.data(), vocab_, keyed_uniform(p_.seed, seq.key, pos, Stream::draft));
        if (!(weights_[t] > 0.0f)) break;
        out.emplace_back(t, std::log(static_cast<double>(q[t])));
        rest -= q[t];
        weights_[t] = 0.0f;
    }
}

int ShapedTreeDrafter::add_node(Work& w, int parent, int32_t token, double logp) {
    const int i = w.full.add(parent, token);
    w.cum.push_back(w.cum[parent] + logp);
    w.row.push_back(-1);
    return i;
}

void ShapedTreeDrafter::feed_node(Engine::Sequence& seq, Work& w, int node, int slot) {
    const int row = append_node(seq, w, node, slot);
    w.holds[slot] = node;
    w.feed.push_back(Fed{node, slot, row});
}

// Gives slot `to` a copy of slot `from`'s path (positions [p0 + 1, p0 + 1 + depth)).
void ShapedTreeDrafter::branch_off(Engine::Sequence& seq, Work& w, int from, int to) {
    const int src = id_of(seq, from);
    const int dst = id_of(seq, to);
    remove_from(dst, w.p0 + 1);
    const int depth = w.full.depth[w.holds[from]];
    if (depth > 0) copy_cells(src, dst, w.p0 + 1, w.p0 + 1 + depth);
    w.holds[to] = w.holds[from];
}

// topk: the fed nodes' children, then the next depth's frontier (fed in the next batch).
void ShapedTreeDrafter::expand_topk(Engine::Sequence& seq, Work& w, int step) {
    const int depth = step + 1;  // of the children made now
    std::vector<Fed> fed;
    fed.swap(w.feed);
    if (depth > w.cap) return;
    std::vector<int> made;
    for (const Fed& f : fed) {
        w.row[f.node] = f.row;
        children_of(seq, w, f.node, row_logits(f.row), shape_.topk, kids_);
        for (const auto& [t, lp] : kids_) made.push_back(add_node(w, f.node, t, lp));
    }
    if (depth >= std::min(shape_.depth, w.cap) || made.empty()) return;
    // the frontier: the topk made nodes of largest cumulative probability
    std::stable_sort(made.begin(), made.end(), [&](int a, int b) { return w.cum[a] > w.cum[b]; });
    if (static_cast<int>(made.size()) > shape_.topk) made.resize(shape_.topk);
    std::sort(made.begin(), made.end());
    // slots: a parent's first frontier child inherits its slot, the others take free ones
    std::vector<int> slot_of_parent(w.full.size(), -1);
    std::vector<char> busy(per_, 0);
    for (const Fed& f : fed) slot_of_parent[f.node] = f.slot;
    std::vector<int> slot(made.size(), -1);
    for (size_t i = 0; i < made.size(); ++i) {
        const int par = w.full.parent[made[i]];
        if (slot_of_parent[par] >= 0 && !busy[slot_of_parent[par]]) {
            slot[i] = slot_of_parent[par];
            busy[slot[i]] = 1;
        }
    }
    // the others copy their parent's path (still in its slot: nothing is fed before the next
    // batch) to a slot no frontier node inherited
    int next_free = 0;
    for (size_t i = 0; i < made.size(); ++i) {
        if (slot[i] >= 0) continue;
        while (busy[next_free]) ++next_free;
        slot[i] = next_free;
        busy[next_free] = 1;
        const int par = w.full.parent[made[i]];
        branch_off(seq, w, slot_of_parent[par], slot[i]);
    }
    for (size_t i = 0; i < made.size(); ++i) feed_node(seq, w, made[i], slot[i]);
}

// split: every drafting branch takes its next token(s); new branches copy the path first.
void ShapedTreeDrafter::expand_split(Engine::Sequence& seq, Work& w, int step) {
    std::vector<Fed> fed;
    fed.swap(w.feed);
    const int depth = step + 1;
    if (depth > std::min(shape_.budget, w.cap)) return;
    const size_t n_before = w.branches.size();
    std::vector<int> row_of_slot(per_, -1);
    for (const Fed& f : fed) {
        row_of_slot[f.slot] = f.row;
        w.row[f.node] = f.row;
    }
    std::vector<std::pair<int, int>> to_feed;  // (node, slot)
    for (size_t b = 0; b < n_before; ++b) {
        if (!w.branches[b].drafting || row_of_slot[w.branches[b].slot] < 0) continue;
        const int slot = w.branches[b].slot;
        const int par = w.branches[b].node;
        const float* logits = row_logits(row_of_slot[slot]);
        // how many children: 1, and each next candidate whose probability exceeds p_split
        int n = 1;
        const int room = shape_.branches - static_cast<int>(w.branches.size());
        if (room > 0) {
            const float* probs = split_probs(logits);
            top_indices(probs, vocab_, kSplitCandidates, top_);
            for (int f = 1; f < static_cast<int>(top_.size()) && n - 1 < room; ++f) {
                if (probs[top_[f]] > shape_.p_split) {
                    ++n;
                } else {
                    break;
                }
            }
        }
        children_of(seq, w, par, logits, n, kids_);
        for (size_t c = 0; c < kids_.size(); ++c) {
            const int node = add_node(w, par, kids_[c].first, kids_[c].second);
            int use = slot;
            if (c == 0) {
                w.branches[b].node = node;
            } else {
                use = static_cast<int>(w.branches.size());
                branch_off(seq, w, slot, use);
                w.branches.push_back(Branch{use, node, true});
            }
            if (w.full.nodes() + 1 > shape_.budget) w.branches[c == 0 ? b : w.branches.size() - 1].drafting = false;
            to_feed.emplace_back(node, use);
        }
    }
    if (w.full.nodes() + 1 > shape_.budget) {
        for (Branch& br : w.branches) br.drafting = false;
    }
    for (const auto& [node, slot] : to_feed) feed_node(seq, w, node, slot);
}

// The distribution the split test reads: q when sampling (children_of fills it later from the
// same logits), else the draft's softmax at temperature 1.
const float* ShapedTreeDrafter::split_probs(const float* logits) {
    const int nv = draft_vocab();
    const float t = p_.temperature <= 0.0f ? 1.0f
                                           : (p_.draft_temperature > 0.0f ? p_.draft_temperature : p_.temperature);
    softmax_norm(logits, nv, t, norm_);
    softmax(logits, nv, norm_, split_);
    split_.resize(vocab_, 0.0f);
    return split_.data();
}

// The verified tree from the full one (topk: the budget; split: all of it), in depth order.
void ShapedTreeDrafter::select(Work& w, DraftTree& out) {
    const int n = w.full.size();
    std::vector<char> keep(n, 0);
    keep[0] = 1;
    if (shape_.kind == TreeShape::Kind::split) {
        std::fill(keep.begin(), keep.end(), 1);
    } else if (p_.temperature <= 0.0f) {
        std::vector<int> order(n - 1);
        std::iota(order.begin(), order.end(), 1);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
            return w.cum[a] > w.cum[b] || (w.cum[a] == w.cum[b] && w.full.depth[a] < w.full.depth[b]);
        });
        int room = shape_.budget;
        for (int v : order) {
            if (room == 0) break;
            if (!keep[w.full.parent[v]]) continue;
            keep[v] = 1;
            --room;
        }
    } else {  // whole sibling groups by their parent's rank, the first siblings filling the room
        std::vector<int> parents;
        for (int v = 0; v < n; ++v) {
            if (!w.full.children[v].empty()) parents.push_back(v);
        }
        std::stable_sort(parents.begin(), parents.end(), [&](int a, int b) {
            return w.cum[a] > w.cum[b] || (w.cum[a] == w.cum[b] && w.full.depth[a] < w.full.depth[b]);
        });
        int room = shape_.budget;
        for (int v : parents) {
            if (room == 0) break;
            if (!keep[v]) continue;
            for (int c : w.full.children[v]) {
                if (room == 0) break;
                keep[c] = 1;
                --room;
            }
        }
    }
    out.reset(w.full.token[0]);
    w.to_full.assign(1, 0);
    std::vector<int> new_of(n, -1);
    new_of[0] = 0;
    out.q[0] = std::move(w.full.q[0]);
    for (int v = 1; v < n; ++v) {  // the full tree is in depth order already
        if (!keep[v]) continue;
        new_of[v] = out.add(new_of[w.full.parent[v]], w.full.token[v]);
        w.to_full.push_back(v);
    }
    for (int v = 1; v < n; ++v) {
        if (new_of[v] > 0 && !out.children[new_of[v]].empty()) out.q[new_of[v]] = std::move(w.full.q[v]);
    }
    if (out.children[0].empty()) out.q[0].clear();
}

}  // namespace specnative
