// A draft tree as a round's proposal (round.h; GenerateParams::tree): per round the draft model or an
// EAGLE-3 head proposes one tree per sequence (drafters/model_tree.cpp, eagle3_tree.cpp), every
// node of every sequence's tree goes through the target in the round's one verify decode, the
// acceptance rule walks each tree from its root (tree_acceptor.h), and the KV caches keep the
// accepted path only.
//
// Branches are sequence ids (tree_drafter.h): the root (pending token) carries every id of its
// sequence, a node the ids of the leaves below it, so each leaf's id sees exactly its root-to-leaf
// path on top of the shared history. After the walk the id of a leaf below the deepest accepted
// node drops what lies past the accepted path, and every other id drops its own cells and takes a
// copy of the accepted ones: all ids hold the same history again.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "engine.h"
#include "engine_internal.h"
#include "round.h"
#include "tree_acceptor.h"
#include "tree_drafter.h"

namespace specnative {

namespace {

// By node: the branch slots (leaves) below it, ascending; the root's are all of them.
void leaf_slots(const DraftTree& tree, std::vector<std::vector<int>>& slots) {
    const int n = tree.size();
    slots.assign(n, {});
    int leaves = 0;
    for (int v = 0; v < n; ++v) {
        if (!tree.children[v].empty()) continue;
        for (int u = v; u >= 0; u = tree.parent[u]) slots[u].push_back(leaves);
        ++leaves;
    }
    for (auto& s : slots) std::sort(s.begin(), s.end());
}

// The rejection rule's evidence at one node of the walk (record_pit), computed apart from the
// rule in double precision: each sibling the correct walk tried, with pi = min(1, r(x) / q_i(x)),
// and where every sibling was rejected the correction's place in the final residual.
void node_decisions(const float* logits, int n_vocab, float temperature, const std::vector<float>& q,
                    const std::vector<int32_t>& children, int accepted_rank, int32_t correction, int64_t index,
                    std::vector<DecisionPoint>& out) {
    const double inv_t = 1.0 / static_cast<double>(temperature);
    double max_logit = -INFINITY;
    for (int v = 0; v < n_vocab; ++v) max_logit = std::max(max_logit, static_cast<double>(logits[v]));
    std::vector<double> r(std::max<size_t>(static_cast<size_t>(n_vocab), q.size()), 0.0);
    double sum = 0.0;
    for (int v = 0; v < n_vocab; ++v) sum += r[v] = std::exp((logits[v] - max_logit) * inv_t);
    for (int v = 0; v < n_vocab; ++v) r[v] /= sum;
    const int m = static_cast<int>(children.size());
    const int tried = accepted_rank >= 0 ? accepted_rank + 1 : m;
    double before = 0.0;
    for (int i = 0; i < tried; ++i) {
        const int32_t x = children[i];
        const double rest = 1.0 - before;
        const auto q_i = [&](size_t v) {
            for (int j = 0; j < i; ++j) {
                if (static_cast<size_t>(children[j]) == v) return 0.0;
            }
            return v < q.size() && rest > 0.0 ? static_cast<double>(q[v]) / rest : 0.0;
        };
        DecisionPoint d;
        d.index = index;
        const double qx = q_i(x), rx = r[x];
        d.accept_prob = qx > 0.0 ? std::min(1.0, rx / qx) : (rx > 0.0 ? 1.0 : 0.0);
        d.accepted = i == accepted_rank;
        if (!d.accepted) {
            double total = 0.0;
            for (size_t v = 0; v < r.size(); ++v) total += r[v] = std::max(0.0, r[v] - q_i(v));
            if (total > 0.0) {
                for (double& w : r) w /= total;
            }
            if (i == m - 1 && correction >= 0 && total > 0.0) {
                const size_t c = static_cast<size_t>(correction);
                const double r_c = c < r.size() ? r[c] : 0.0;
                double ahead = 0.0;
                for (size_t v = 0; v < r.size(); ++v) {
                    if (r[v] > r_c || (r[v] == r_c && v < c)) ahead += r[v];
                }
                d.residual_ahead = ahead;
                d.residual_prob = r_c;
            }
        }
        out.push_back(d);
        before += x < static_cast<int32_t>(q.size()) ? q[x] : 0.0f;
    }
}

}  // namespace

void Engine::validate_tree(const GenerateParams& p, int n_seq) const {
    const TreeShape& t = p.tree;
    if (p.drafter.type != "model" && p.drafter.type != "eagle3") {
        throw std::invalid_argument("draft trees are drafted by the draft model (drafter 'model') or an EAGLE-3 head "
                                    "(drafter 'eagle3'), not '" + p.drafter.type + "'");
    }
    if (!p.synthetic.empty()) {
        throw std::invalid_argument("synthetic acceptance applies to chains; a draft tree is judged by its rule");
    }
    if (p.draft_p_min > 0.0f) {
        throw std::invalid_argument("draft_p_min applies to chains; a tree's shape decides where its branches stop");
    }
    if (t.kind == TreeShape::Kind::topk) {
        if (t.topk < 1 || t.topk > 16) throw std::invalid_argument("tree topk must be in [1, 16]");
        if (t.depth < 1 || t.depth > 64) throw std::invalid_argument("tree depth must be in [1, 64]");
        if (t.budget < 1 || t.budget > 128) throw std::invalid_argument("tree budget must be in [1, 128]");
    } else {
        if (t.branches < 1 || t.branches > 16) throw std::invalid_argument("tree branches must be in [1, 16]");
        if (!(t.p_split >= 0.0f && t.p_split <= 1.0f)) throw std::invalid_argument("tree p_split must be in [0, 1]");
        if (t.budget < 1 || t.budget > 128) throw std::invalid_argument("tree budget must be in [1, 128]");
    }
    if (!params_.kv_unified) {
        throw std::invalid_argument("draft trees need kv_unified=True (a tree's branches share their history's KV cells)");
    }
    const int64_t ids = static_cast<int64_t>(n_seq) * t.ids_per_seq();
    if (ids > params_.n_seq_max) {
        throw std::invalid_argument("a tree of up to " + std::to_string(t.ids_per_seq()) + " branches for " +
                                    std::to_string(n_seq) + " sequences needs n_seq_max >= " + std::to_string(ids) +
                                    " (one sequence id per branch); this engine has n_seq_max=" +
                                    std::to_string(params_.n_seq_max));
    }
    const int64_t per_batch = static_cast<int64_t>(n_seq) * std::max(t.max_nodes() + 1, t.topk);
    if (per_batch > params_.n_batch) {
        throw std::invalid_argument("the tree is too large: " + std::to_string(n_seq) + " sequences x " +
                                    std::to_string(std::max(t.max_nodes() + 1, t.topk)) +
                                    " verify tokens exceed n_batch=" + std::to_string(params_.n_batch));
    }
    if (p.rule == AcceptRule::greedy && p.temperature > 0.0f) {
        throw std::invalid_argument("accept_rule 'greedy' needs temperature 0; use 'match' or 'rejection'");
    }
}


namespace {

class TreeProposals final : public Proposals {
public:
    TreeProposals(Engine::Context& target, const TreeAcceptor& rule, std::unique_ptr<TreeDrafter> drafter,
                  const GenerateParams& p, int n_seq)
        : t_(target), rule_(rule), drafter_(std::move(drafter)), p_(p), n_seq_(n_seq), per_(p.tree.ids_per_seq()),
          trees_(n_seq), rows_(n_seq) {}

    bool reads_target() const override { return drafter_->reads_target(); }
    void read_prefill(const llama_batch& batch) override { drafter_->after_target_decode(batch, 0); }
    void reset_counts(SeqCounts& counts) const override {
        specnative::reset_counts(counts, p_.tree.max_depth());
        counts.offered_rank.assign(p_.tree.max_siblings(), 0);
        counts.accepted_rank.assign(p_.tree.max_siblings(), 0);
    }
    // Every branch id of the sequence takes a copy of what the sequence's own id holds (its prompt).
    void prompt_ready(Engine::Sequence& seq) override {
        for (int j = 1; j < per_; ++j) {
            const int branch = branch_id(seq.id, j, n_seq_, per_);
            llama_memory_seq_rm(t_.memory(), branch, -1, -1);
            llama_memory_seq_cp(t_.memory(), seq.id, branch, -1, -1);
        }
    }
    void begin(std::vector<Engine::Sequence>& seqs, int shared_prefix) override {
        drafter_->begin(seqs, shared_prefix);
    }
    void admit(Engine::Sequence& seq) override { drafter_->admit(seq); }
    void release(const Engine::Sequence& seq) override {
        for (int j = 0; j < per_; ++j) t_.remove_from(branch_id(seq.id, j, n_seq_, per_), 0);
        drafter_->release(seq);
    }

    // The deepest the sequence's tree may go this round.
    int budget(const Engine::Sequence& seq) const override {
        return std::min<int>(p_.tree.max_depth(), seq.n_predict - static_cast<int>(seq.out.size()) - 1);
    }
    void draft(std::vector<Engine::Sequence>& seqs, const std::vector<int>& budget) override {
        drafter_->draft(seqs, budget, trees_);
    }
    // Every node of the sequence's tree, each carrying the ids of the branches through it.
    void place(const Engine::Sequence& seq, int s) override {
        const DraftTree& tree = trees_[s];
        TreeRows& rows = rows_[s];  // buffers reused round after round
        leaf_slots(tree, rows.slots);
        rows.row.assign(tree.size(), -1);
        for (int v = 0; v < tree.size(); ++v) {
            rows.ids.clear();
            if (v == 0) {  // the root carries every id: unused branches keep pace with the rest
                for (int j = 0; j < per_; ++j) rows.ids.push_back(branch_id(seq.id, j, n_seq_, per_));
            } else {
                for (int j : rows.slots[v]) rows.ids.push_back(branch_id(seq.id, j, n_seq_, per_));
            }
            rows.row[v] = t_.add_shared(tree.token[v], seq.n_past_target + tree.depth[v], rows.ids.data(),
                                        static_cast<int>(rows.ids.size()), true);
        }
    }
    // Serving's prompt chunks (the rows from first_prompt_row on); the verify rows' features are
    // read after the accept, the accepted paths' only (after_accept).
    void read_verify(const llama_batch& batch, int first_prompt_row) override {
        drafter_->after_target_decode(batch, first_prompt_row);
    }
    void accept(Engine::Sequence& seq, int s) override { judge(seq, trees_[s], rows_[s]); }
    void after_accept() override { drafter_->after_verify(); }
    double library_ms() const override { return drafter_->library_ms(); }
    double kv_ms() const override { return drafter_->kv_ms(); }

private:
    struct TreeRows {  // a tree's rows in the verify batch, and the scratch that places them
        std::vector<int> row;                    // by node
        std::vector<std::vector<int>> slots;     // by node: the branch slots (leaves) below it
        std::vector<int> ids;
    };
    void judge(Engine::Sequence& seq, const DraftTree& tree, const TreeRows& rows);
    void record_pit(Engine::Sequence& seq, const DraftTree& tree, const std::vector<int>& rows,
                    const std::vector<int>& path, int32_t last);

    Engine::Context& t_;
    const TreeAcceptor& rule_;
    std::unique_ptr<TreeDrafter> drafter_;
    const GenerateParams& p_;
    const int n_seq_, per_;
    std::vector<DraftTree> trees_;
    std::vector<TreeRows> rows_;
    AcceptScratch scratch_;
};

// Walks one sequence's tree from its root under the acceptance rule, counts, records the
// distributional evidence when asked, keeps the accepted path's cells under every id of the
// sequence (the rest are dropped), tells the drafter, and emits.
void TreeProposals::judge(Engine::Sequence& seq, const DraftTree& tree, const TreeRows& tree_rows) {
    Engine::Context& t = t_;
    const TreeAcceptor& rule_of = rule_;
    const GenerateParams& p = p_;
    TreeDrafter& drafter = *drafter_;
    AcceptScratch& scratch = scratch_;
    const std::vector<int>& rows = tree_rows.row;
    const AcceptRule rule = p.temperature > 0.0f ? p.rule : AcceptRule::greedy;
    const int vocab = drafter.n_vocab();
    const int64_t base_index = seq.next_index();
    const int32_t pos0 = seq.n_past_target;
    TreeScratch ts;
    std::swap(ts.r, scratch.residual);  // reuse the buffer
    std::vector<int> path;
    std::vector<int> ranks;
    int32_t correction = -1;
    bool stopped_on_eog = false;
    std::vector<int32_t> child_tokens;
    int node = 0;
    while (true) {
        const std::vector<int>& kids = tree.children[node];
        child_tokens.clear();
        for (int c : kids) child_tokens.push_back(tree.token[c]);
        const bool leaf = kids.empty();
        const int row = leaf ? rows[rule_of.bonus_node(node, tree.parent[node])] : rows[node];
        const std::vector<float>* q = leaf || tree.q[node].empty() ? nullptr : &tree.q[node];
        const NodeVerdict v = rule_of.judge(NodeToJudge{t.logits(row), child_tokens, q, base_index + tree.depth[node]},
                                            t.n_vocab, vocab, p, rule, seq.key, seq.margins, ts);
        for (size_t j = 0; j < kids.size() && j < seq.counts.offered_rank.size(); ++j) seq.counts.offered_rank[j] += 1;
        if (v.rank < 0) {
            correction = v.token;
            if (!leaf) seq.counts.rejected += 1;
            break;
        }
        node = kids[v.rank];
        path.push_back(node);
        ranks.push_back(v.rank);
        if (static_cast<size_t>(v.rank) < seq.counts.accepted_rank.size()) seq.counts.accepted_rank[v.rank] += 1;
        seq.counts.accepted_at[tree.depth[node] - 1] += 1;
        seq.out.push_back(v.token);
        if (finished(seq, p, t.vocab)) {
            stopped_on_eog = true;
            break;
        }
    }
    std::swap(ts.r, scratch.residual);
    const int accepted = static_cast<int>(path.size());
    if (p.record_pit && rule == AcceptRule::rejection) {
        record_pit(seq, tree, rows, path, stopped_on_eog ? -1 : correction);
    }
    for (int d = 1; d <= tree.max_depth(); ++d) seq.counts.drafted_at[d - 1] += 1;
    seq.counts.drafted += tree.nodes();
    seq.counts.accepted += accepted;
    seq.counts.rounds += 1;
    seq.counts.accept_len_hist[accepted] += 1;
    seq.counts.emitted += accepted + (stopped_on_eog ? 0 : 1);

    // ---- the target's cache: the accepted path under every id, nothing else -------------------
    const int per = per_;
    const int n_seq = n_seq_;
    const std::vector<std::vector<int>>& slots = tree_rows.slots;  // the tree's leaves below each node
    const int deepest = accepted > 0 ? path.back() : 0;
    const int keep_slot = slots[deepest].empty() ? 0 : slots[deepest].front();
    const int keep_id = branch_id(seq.id, keep_slot, n_seq, per);
    const int32_t n_keep = pos0 + 1 + accepted;
    t.remove_from(keep_id, n_keep);
    for (int j = 0; j < per; ++j) {
        if (j == keep_slot) continue;
        const int id = branch_id(seq.id, j, n_seq, per);
        t.remove_from(id, rule_of.drops_branch_cells() ? pos0 + 1 : n_keep);
        if (accepted > 0) {
            const ScopedMs inside_llama(t.llama_ms);
            const ScopedMs kv(t.kv_removal_ms);
            llama_memory_seq_cp(t.memory(), keep_id, id, pos0 + 1, n_keep);
        }
    }
    seq.n_past_target = n_keep;
    drafter.accept(seq, tree, rows, path, stopped_on_eog ? -1 : correction);
    if (stopped_on_eog) {
        seq.done = true;
        return;
    }
    seq.out.push_back(correction);
    seq.done = finished(seq, p, t.vocab);
}

// The tree's counterpart of the chain's record_pit: every token the round emitted placed in the p of the
// verify row of the node it was emitted at (its parent on the path; the leaf's own row for a
// bonus), under the q that node's children were drawn from, and every sibling the correct walk
// tried (node_decisions), computed apart from the rule.
void TreeProposals::record_pit(Engine::Sequence& seq, const DraftTree& tree, const std::vector<int>& rows,
                               const std::vector<int>& path, int32_t last) {
    Engine::Context& t = t_;
    const GenerateParams& p = p_;
    AcceptScratch& scratch = scratch_;
    const int64_t base_index = seq.next_index() - static_cast<int64_t>(path.size());
    int node = 0;
    for (size_t i = 0; i <= path.size(); ++i) {
        const int32_t x = i < path.size() ? tree.token[path[i]] : last;
        if (x < 0) break;
        const float* logits = t.logits(rows[node]);
        const std::vector<int>& kids = tree.children[node];
        const bool proposed = !kids.empty() && !tree.q[node].empty();
        softmax_norm(logits, t.n_vocab, p.temperature, scratch.norm);
        softmax(logits, t.n_vocab, scratch.norm, scratch.pit_probs);
        PitPoint pit = pit_point(logits, scratch.pit_probs, t.n_vocab, p.temperature, x,
                                 proposed ? tree.q[node].data() : nullptr,
                                 proposed ? static_cast<int32_t>(tree.q[node].size()) : 0);
        pit.index = base_index + tree.depth[node];
        seq.pit.push_back(pit);
        if (proposed) {
            std::vector<int32_t> child_tokens;
            for (int c : kids) child_tokens.push_back(tree.token[c]);
            const int rank = i < path.size() ? tree.rank[path[i]] : -1;
            node_decisions(logits, t.n_vocab, p.temperature, tree.q[node], child_tokens, rank,
                           i < path.size() ? -1 : last, base_index + tree.depth[node], seq.decisions);
        }
        if (i < path.size()) node = path[i];
    }
}


}  // namespace

std::unique_ptr<Proposals> make_tree_proposals(Engine::Context& target, const TreeAcceptor& rule,
                                               std::unique_ptr<TreeDrafter> drafter, const GenerateParams& p,
                                               int n_seq) {
    return std::make_unique<TreeProposals>(target, rule, std::move(drafter), p, n_seq);
}

}  // namespace specnative
