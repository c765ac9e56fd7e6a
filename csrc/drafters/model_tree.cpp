// The draft model drafting trees (tree_drafter.h), in two shapes:
//
// - topk (EAGLE-2's dynamic tree, SGLang's --speculative-eagle-topk / -num-steps /
//   -num-draft-tokens): the root gets `topk` children; at each further depth the `topk` nodes of
//   the last depth with the largest cumulative draft probability (the product of q along the
//   path) are fed to the draft model, each gets `topk` children; after `depth` levels the
//   `budget` nodes of largest cumulative probability are verified (their ancestors always come
//   with them).
// - split (llama.cpp's examples/speculative): branches draft one token per step, all in one draft
//   batch; a branch splits when its further candidates' draft probabilities exceed p_split (each
//   consecutive one from the second, at most `branches` branches); a branch stops once the tree
//   holds `budget` nodes, and the draft stops after the step that reached it (or `budget` steps).
//
// At temperature 0 a node's children are its most probable tokens, ranked by the draft's
// softmax at temperature 1 (its cumulative probability; the split test). When sampling they are
// drawn without replacement from q (the draft's softmax at its temperature), and how many
// children a node keeps is decided before they are drawn (from q alone, and from nodes ranked
// above it), never from the children's own values: so the children are a draw from q without
// replacement that the recursive rejection rule verifies exactly (tree_acceptor.h). With topk
// that makes the budget select whole sibling groups in order of their parent's cumulative
// probability, a group's first siblings filling what room is left; at temperature 0 it takes the
// `budget` best nodes.
//
// Every branch of a sequence is a draft-cache sequence id (branch_id): every id holds the
// sequence's history; a frontier node is fed with its branch's id, a branch that splits copies its
// path to a free id first. After the round the id holding the longest part of the accepted path
// is kept, and every other id drops its own cells and takes a copy of that path.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "sampling.h"
#include "tree_drafter.h"

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

class ModelTreeDrafter final : public TreeDrafter {
public:
    ModelTreeDrafter(Engine::Context& d, const DraftPrefill& prefill, const GenerateParams& p, int target_vocab,
                     int n_seq)
        : d_(d), prefill_(prefill), p_(p), shape_(p.tree), vocab_(std::max(target_vocab, d.n_vocab)), n_seq_(n_seq),
          per_(p.tree.ids_per_seq()), work_(n_seq) {}

    int n_vocab() const override { return vocab_; }

    void begin(std::vector<Engine::Sequence>& seqs, int shared_prefix) override {
        for (Engine::Sequence& seq : seqs) seq.draft_todo = {seq.pending()};
        prefill_(seqs, shared_prefix);
        for (const Engine::Sequence& seq : seqs) {
            for (int j = 1; j < per_; ++j) {
                const int id = branch_id(seq.id, j, n_seq_, per_);
                llama_memory_seq_rm(d_.memory(), id, -1, -1);
                llama_memory_seq_cp(d_.memory(), seq.id, id, -1, -1);
            }
        }
    }

    void draft(std::vector<Engine::Sequence>& seqs, const std::vector<int>& max_depth,
               std::vector<DraftTree>& trees) override {
        const int n_seq = static_cast<int>(seqs.size());
        // step 0: every sequence's catch-up tokens, carrying all its ids; the pending one's logits
        d_.clear_batch();
        for (int s = 0; s < n_seq; ++s) {
            Work& w = work_[s];
            w.live = max_depth[s] >= 0;
            if (!w.live) continue;
            Engine::Sequence& seq = seqs[s];
            w.cap = max_depth[s];
            w.full.reset(seq.pending());
            w.cum.assign(1, 0.0);
            w.fed.assign(1, 1);
            w.holds.assign(per_, 0);
            w.feed.clear();
            w.branches.assign(1, Branch{0, 0, true});
            w.p0 = seq.n_past_draft + static_cast<int32_t>(seq.draft_todo.size()) - 1;
            ids_.resize(per_);
            for (int j = 0; j < per_; ++j) ids_[j] = branch_id(seq.id, j, n_seq_, per_);
            for (size_t i = 0; i < seq.draft_todo.size(); ++i) {
                const bool last = i + 1 == seq.draft_todo.size();
                const int row = d_.add_shared(seq.draft_todo[i], seq.n_past_draft++, ids_.data(), per_, last);
                if (last) w.feed.push_back(Fed{0, 0, row});
            }
            seq.draft_todo.clear();
        }
        for (int step = 0;; ++step) {
            if (d_.batch.n_tokens == 0) break;
            d_.decode("tree draft");
            d_.clear_batch();
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

    void accept(Engine::Sequence& seq, const DraftTree& tree, const std::vector<int>& path,
                int32_t correction) override {
        Work& w = work_[seq.id];
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
        const int keep_id = branch_id(seq.id, best_j, n_seq_, per_);
        const int32_t from = w.p0 + 1;
        d_.remove_from(keep_id, from + best);
        for (int j = 0; j < per_; ++j) {
            if (j == best_j) continue;
            const int id = branch_id(seq.id, j, n_seq_, per_);
            d_.remove_from(id, from);
            if (best > 0) copy_path(keep_id, id, from, from + best);
        }
        seq.n_past_draft = from + best;
        seq.draft_todo.clear();
        for (size_t i = static_cast<size_t>(best); i < path.size(); ++i) seq.draft_todo.push_back(tree.token[path[i]]);
        if (correction >= 0) seq.draft_todo.push_back(correction);
    }

private:
    struct Fed {  // a node fed in the last draft batch, its branch slot and logits row
        int node, slot, row;
    };
    struct Branch {  // split shape: a branch's slot, its last node, whether it still drafts
        int slot, node;
        bool drafting;
    };
    struct Work {  // one sequence's draft in progress
        bool live = false;
        int cap = 0;      // the deepest the tree may go this round
        int32_t p0 = 0;   // the pending token's position
        DraftTree full;   // every node drafted (topk: candidates beyond the budget too)
        std::vector<double> cum;  // log cumulative draft probability by node
        std::vector<char> fed;    // the node's cell is in the draft cache (under some id)
        std::vector<int> holds;   // by slot: the node whose path the slot's id holds (0: the root)
        std::vector<Fed> feed;
        std::vector<Branch> branches;
        std::vector<int> to_full;  // the selected tree's node -> full tree's node
    };

    // The children a node gets from its logits: `n` of them (or fewer: q without mass left), at
    // temperature 0 the n most probable, else n draws without replacement from q (kept in the full
    // tree's q for the verifier). Returns their log probabilities (ranked probability, temperature 1
    // at greedy) in `logp`.
    void children_of(const Engine::Sequence& seq, Work& w, int node, const float* logits, int n,
                     std::vector<std::pair<int32_t, double>>& out) {
        out.clear();
        const int nv = d_.n_vocab;
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

    int add_node(Work& w, int parent, int32_t token, double logp) {
        const int i = w.full.add(parent, token);
        w.cum.push_back(w.cum[parent] + logp);
        w.fed.push_back(0);
        return i;
    }

    void feed_node(Engine::Sequence& seq, Work& w, int node, int slot) {
        const int id = branch_id(seq.id, slot, n_seq_, per_);
        const int row = d_.add(w.full.token[node], w.p0 + w.full.depth[node], id, true);
        w.fed[node] = 1;
        w.holds[slot] = node;
        w.feed.push_back(Fed{node, slot, row});
    }

    // Gives slot `to` a copy of slot `from`'s path (positions [p0 + 1, p0 + 1 + depth)).
    void branch_off(Engine::Sequence& seq, Work& w, int from, int to) {
        const int src = branch_id(seq.id, from, n_seq_, per_);
        const int dst = branch_id(seq.id, to, n_seq_, per_);
        d_.remove_from(dst, w.p0 + 1);
        const int depth = w.full.depth[w.holds[from]];
        if (depth > 0) copy_path(src, dst, w.p0 + 1, w.p0 + 1 + depth);
        w.holds[to] = w.holds[from];
    }

    void copy_path(int src, int dst, int32_t p0, int32_t p1) {
        const ScopedMs inside_llama(d_.llama_ms);
        const ScopedMs kv(d_.kv_removal_ms);
        llama_memory_seq_cp(d_.memory(), src, dst, p0, p1);
    }

    // topk: the fed nodes' children, then the next depth's frontier (fed in the next batch).
    void expand_topk(Engine::Sequence& seq, Work& w, int step) {
        const int depth = step + 1;  // of the children made now
        std::vector<Fed> fed;
        fed.swap(w.feed);
        if (depth > w.cap) return;
        std::vector<int> made;
        for (const Fed& f : fed) {
            children_of(seq, w, f.node, d_.logits(f.row), shape_.topk, kids_);
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
    void expand_split(Engine::Sequence& seq, Work& w, int step) {
        std::vector<Fed> fed;
        fed.swap(w.feed);
        const int depth = step + 1;
        if (depth > std::min(shape_.budget, w.cap)) return;
        const size_t n_before = w.branches.size();
        std::vector<int> row_of_slot(per_, -1);
        for (const Fed& f : fed) row_of_slot[f.slot] = f.row;
        std::vector<std::pair<int, int>> to_feed;  // (node, slot)
        for (size_t b = 0; b < n_before; ++b) {
            if (!w.branches[b].drafting || row_of_slot[w.branches[b].slot] < 0) continue;
            const int slot = w.branches[b].slot;
            const int par = w.branches[b].node;
            const float* logits = d_.logits(row_of_slot[slot]);
            // how many children: 1, and each next candidate whose probability exceeds p_split
            int n = 1;
            const int room = shape_.branches - static_cast<int>(w.branches.size());
            if (room > 0) {
                const float* probs = split_probs(w, par, logits);
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

    // The distribution the split test reads at `node`: q when sampling (children_of fills it
    // later from the same logits), else the draft's softmax at temperature 1.
    const float* split_probs(Work& w, int node, const float* logits) {
        const int nv = d_.n_vocab;
        const float t = p_.temperature <= 0.0f ? 1.0f
                                               : (p_.draft_temperature > 0.0f ? p_.draft_temperature : p_.temperature);
        softmax_norm(logits, nv, t, norm_);
        softmax(logits, nv, norm_, split_);
        split_.resize(vocab_, 0.0f);
        (void)w;
        (void)node;
        return split_.data();
    }

    // The verified tree from the full one (topk: the budget; split: all of it), in depth order.
    void select(Work& w, DraftTree& out) {
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

    Engine::Context& d_;
    DraftPrefill prefill_;
    const GenerateParams& p_;
    const TreeShape shape_;
    int vocab_;
    int n_seq_;
    int per_;
    std::vector<Work> work_;
    std::vector<int> ids_;
    std::vector<int32_t> top_;
    std::vector<std::pair<int32_t, double>> kids_;
    std::vector<float> weights_, split_;
    std::vector<char> on_path_;
    SoftmaxNorm norm_;
};

}  // namespace

std::unique_ptr<TreeDrafter> make_model_tree_drafter(Engine::Context& draft, const DraftPrefill& prefill,
                                                     const GenerateParams& p, int target_vocab, int n_seq) {
    return std::make_unique<ModelTreeDrafter>(draft, prefill, p, target_vocab, n_seq);
}

}  // namespace specnative
