// The round loop with draft trees (GenerateParams::tree): per round the draft model or an EAGLE-3
// head proposes one tree per sequence (drafters/model_tree.cpp, eagle3_tree.cpp), every node of every sequence's tree goes through
// the target in ONE llama_decode, the acceptance rule walks each tree from its root
// (tree_acceptor.h), and the KV caches keep the accepted path only.
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
#include "tree_acceptor.h"
#include "tree_drafter.h"

namespace specnative {

namespace {

int active_count(const std::vector<Engine::Sequence>& seqs) {
    int n = 0;
    for (const auto& seq : seqs) n += seq.done ? 0 : 1;
    return n;
}

int64_t generated_count(const std::vector<Engine::Sequence>& seqs) {
    int64_t n = 0;
    for (const auto& seq : seqs) n += static_cast<int64_t>(seq.out.size());
    return n;
}

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

// The deepest a sequence's tree may go this round (its round's correction or bonus must still fit).
int Engine::tree_depth_cap(const Sequence& seq, const GenerateParams& p) {
    return std::min<int>(p.tree.max_depth(), seq.n_predict - static_cast<int>(seq.out.size()) - 1);
}

void Engine::reset_tree_counts(SeqCounts& counts, const TreeShape& shape) {
    reset_counts(counts, shape.max_depth());
    counts.offered_rank.assign(shape.max_siblings(), 0);
    counts.accepted_rank.assign(shape.max_siblings(), 0);
}

// Every branch id of sequence `id` takes a copy of what the sequence's own id holds (its prompt).
void Engine::share_with_branches(int id, int n_seq, int per) {
    Context& t = *target_;
    for (int j = 1; j < per; ++j) {
        const int branch = branch_id(id, j, n_seq, per);
        llama_memory_seq_rm(t.memory(), branch, -1, -1);
        llama_memory_seq_cp(t.memory(), id, branch, -1, -1);
    }
}

// Appends every node of `tree` (sequence `seq`) to the target batch, each carrying the ids of the
// branches through it; rows[v]: node v's row (its buffers reused round after round).
void Engine::add_tree_nodes(const Sequence& seq, const DraftTree& tree, int n_seq, int per, TreeRows& rows) {
    std::vector<std::vector<int>>& slots = rows.slots;
    std::vector<int>& ids = rows.ids;
    leaf_slots(tree, slots);
    rows.row.assign(tree.size(), -1);
    for (int v = 0; v < tree.size(); ++v) {
        ids.clear();
        if (v == 0) {  // the root carries every id: unused branches keep pace with the rest
            for (int j = 0; j < per; ++j) ids.push_back(branch_id(seq.id, j, n_seq, per));
        } else {
            for (int j : slots[v]) ids.push_back(branch_id(seq.id, j, n_seq, per));
        }
        rows.row[v] = target_->add_shared(tree.token[v], seq.n_past_target + tree.depth[v], ids.data(),
                                          static_cast<int>(ids.size()), true);
    }
}

// The tree drafter of a run: the draft model, or the engine's EAGLE-3 head.
std::unique_ptr<TreeDrafter> Engine::make_tree_drafter(const GenerateParams& p, int n_seq) {
    if (p.drafter.type == "eagle3") return make_eagle3_tree_drafter(*hidden_, *target_, p, n_seq);
    auto prefill_draft = [this, reuse = p.reuse_prompts](std::vector<Sequence>& ss, int shared) {
        prefill(*draft_, ss, shared, {}, {}, reuse);
    };
    return make_model_tree_drafter(*draft_, prefill_draft, p, target_->n_vocab, n_seq);
}

GenerateResult Engine::run_tree(std::vector<Sequence>& seqs, int shared_prefix, const GenerateParams& p,
                                const std::function<bool()>& should_stop) {
    GenerateResult r;
    r.speculative = true;
    PhaseClock clock;
    Context& t = *target_;
    const int n_seq = static_cast<int>(seqs.size());
    const int per = p.tree.ids_per_seq();
    std::unique_ptr<TreeDrafter> drafter = make_tree_drafter(p, n_seq);
    clock.charge(r.times.prefill_draft);
    // A drafter that reads the target's hidden states ingests every prefill chunk (its draft's prefill).
    double ingest_in_prefill = 0;
    const bool reads = drafter->reads_target();
    Engine::AfterDecode ingest;
    if (reads) {
        ingest = [&](const llama_batch& batch) {
            const ScopedMs timer(ingest_in_prefill);
            drafter->after_target_decode(batch, 0);
        };
    }
    prefill(t, seqs, shared_prefix, sample_first_token(p, t.n_vocab), ingest, p.reuse_prompts && !reads);
    if (reads) t.forget_prompts();  // cells made under the drafter's settings
    for (Sequence& seq : seqs) {
        share_with_branches(seq.id, n_seq, per);
        seq.done = finished(seq, p, t.vocab);
        reset_tree_counts(seq.counts, p.tree);
    }
    clock.charge(r.times.prefill_target);
    r.times.prefill_target -= ingest_in_prefill;
    r.times.prefill_draft += ingest_in_prefill;
    drafter->begin(seqs, shared_prefix);
    clock.charge(r.times.prefill_draft);
    const auto llama_now = [&] { return t.llama_ms + (draft_ ? draft_->llama_ms : 0.0) + drafter->library_ms(); };
    const double llama_before = llama_now();
    const auto removal_now = [&] { return t.kv_removal_ms + (draft_ ? draft_->kv_removal_ms : 0.0) + drafter->kv_ms(); };
    const double removal_before = removal_now();

    std::vector<int> cap(n_seq);
    std::vector<DraftTree> trees(n_seq);
    std::vector<TreeRows> rows(n_seq);
    AcceptScratch scratch;
    r.n_seq = n_seq;
    while (true) {
        if (should_stop && should_stop()) throw Interrupted();
        const int active_now = active_count(seqs);
        const int64_t tokens_before = generated_count(seqs);
        const double ms_before = r.times.draft + r.times.draft_ingest + r.times.verify + r.times.resample;
        bool any = false;
        for (int s = 0; s < n_seq; ++s) {
            cap[s] = seqs[s].done ? -1 : tree_depth_cap(seqs[s], p);
            any |= !seqs[s].done;
        }
        if (!any) break;

        // ---- draft: a tree per sequence ----------------------------------------------------
        drafter->draft(seqs, cap, trees);
        clock.charge(r.times.draft);

        // ---- verify: every node of every tree in one target decode ---------------------------
        t.clear_batch();
        for (int s = 0; s < n_seq; ++s) {
            if (!seqs[s].done) add_tree_nodes(seqs[s], trees[s], n_seq, per, rows[s]);
        }
        t.decode("tree verify");
        clock.charge(r.times.verify);

        // ---- accept, emit, keep the accepted path ---------------------------------------------
        for (int s = 0; s < n_seq; ++s) {
            if (!seqs[s].done) judge_tree(seqs[s], trees[s], rows[s].row, p, *drafter, scratch, n_seq);
        }
        clock.charge(r.times.resample);
        drafter->after_verify();  // a hidden-state head reads the accepted paths' features
        clock.charge(r.times.draft_ingest);
        count_iteration(r, active_now, generated_count(seqs) - tokens_before,
                        r.times.draft + r.times.draft_ingest + r.times.verify + r.times.resample - ms_before);
    }
    r.times.llama = llama_now() - llama_before;
    r.times.kv_removal = removal_now() - removal_before;
    r.times.total = clock.elapsed_ms();
    return r;
}

// Walks one sequence's tree from its root under the acceptance rule, counts, records the
// distributional evidence when asked, keeps the accepted path's cells under every id of the
// sequence (the rest are dropped), tells the drafter, and emits.
void Engine::judge_tree(Sequence& seq, const DraftTree& tree, const std::vector<int>& rows, const GenerateParams& p,
                        TreeDrafter& drafter, AcceptScratch& scratch, int n_seq) {
    Context& t = *target_;
    const TreeAcceptor& rule_of = *tree_acceptor_;
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
        record_tree_pit(seq, tree, rows, path, stopped_on_eog ? -1 : correction, p, scratch);
    }
    for (int d = 1; d <= tree.max_depth(); ++d) seq.counts.drafted_at[d - 1] += 1;
    seq.counts.drafted += tree.nodes();
    seq.counts.accepted += accepted;
    seq.counts.rounds += 1;
    seq.counts.accept_len_hist[accepted] += 1;
    seq.counts.emitted += accepted + (stopped_on_eog ? 0 : 1);

    // ---- the target's cache: the accepted path under every id, nothing else -------------------
    const int per = p.tree.ids_per_seq();
    std::vector<std::vector<int>> slots;
    leaf_slots(tree, slots);
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

// The tree's counterpart of record_pit: every token the round emitted placed in the p of the
// verify row of the node it was emitted at (its parent on the path; the leaf's own row for a
// bonus), under the q that node's children were drawn from, and every sibling the correct walk
// tried (node_decisions), computed apart from the rule.
void Engine::record_tree_pit(Sequence& seq, const DraftTree& tree, const std::vector<int>& rows,
                             const std::vector<int>& path, int32_t last, const GenerateParams& p,
                             AcceptScratch& scratch) {
    Context& t = *target_;
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

}  // namespace specnative
