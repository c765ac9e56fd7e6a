// Planted faults for tests of the lossless verdicts (Engine::inject_fault; never used otherwise):
// each overrides one decision of the correct acceptance rule (acceptor.h) the way a real
// implementation has been broken, so a test can show that the verdict catches it.
#include <stdexcept>
#include <string>
#include <utility>

#include "acceptor.h"
#include "tree_acceptor.h"
#include "engine_internal.h"

namespace specnative {
namespace {

struct RollbackShort final : Acceptor {
    int stale_cells(int, int) const override { return -1; }  // the last kept token is lost
};

struct RollbackLong final : Acceptor {
    // keeps the first rejected draft where both caches hold it (positions stay consecutive)
    int stale_cells(int accepted, int drafted) const override { return accepted + 2 <= drafted ? 1 : 0; }
};

struct VerifyPosition final : Acceptor {
    int verify_row(int first_row, int i, int drafted) const override { return first_row + i + (i < drafted ? 1 : 0); }
};

struct SeedMixup final : Acceptor {
    int32_t target_token(const TargetDraw& d) const override {  // another seed's stream
        GenerateParams mixed_up = d.p;
        mixed_up.seed = d.p.seed + 1;
        return Acceptor::target_token(TargetDraw{d.logits, d.n_vocab, mixed_up, d.key, d.index, d.margins, d.norm});
    }
};

struct BonusFromQ final : Acceptor {
    // at temperature 0, q's choice: the last draft itself
    int32_t bonus(const TargetDraw& d, const std::vector<float>* q_last, int32_t last_draft) const override {
        if (q_last == nullptr) return Acceptor::target_token(d);
        if (d.p.temperature <= 0.0f || q_last->empty()) return last_draft;
        return sample_from_weights(q_last->data(), static_cast<int32_t>(q_last->size()),
                                   keyed_uniform(d.p.seed, d.key, d.index, Stream::target));
    }
};

struct SlowAccept final : Acceptor {
    void after_accept_phase(int sequences) const override { spin_for_ms(kSlowAcceptMs * sequences); }
};

struct ResidualFromP final : Acceptor {
    int32_t residual(const float* p_probs, const float*, int32_t vocab, double u, std::vector<float>&) const override {
        return sample_from_weights(p_probs, vocab, u);
    }
};

struct AcceptQOverP final : Acceptor {
    bool keep(double u, float p_x, float q_x) const override { return draft_accepted(u, q_x, p_x); }
};

struct QPrevPosition final : Acceptor {
    const std::vector<float>& q_of(const std::vector<std::vector<float>>& q, int i) const override {
        return q[i > 0 ? i - 1 : i];
    }
};

struct AcceptAlways final : Acceptor {
    bool keep(double, float, float) const override { return true; }
};

struct SkipDraftTrim final : Acceptor {
    bool trims_draft_cache() const override { return false; }
};

// ---- draft trees (tree_acceptor.h) ------------------------------------------------------------

struct TreeResidualStale final : TreeAcceptor {
    void update_residual(std::vector<float>&, const std::vector<float>&, double, const int32_t*, int) const override {}
};

struct TreeSiblingTwice final : TreeAcceptor {
    int sibling_at(int i) const override { return i > 0 ? i - 1 : 0; }
};

struct TreeBonusWrongNode final : TreeAcceptor {
    int bonus_node(int leaf, int parent) const override { return parent >= 0 ? parent : leaf; }
};

struct TreeBranchKvKept final : TreeAcceptor {
    bool drops_branch_cells() const override { return false; }
};

struct TreeSiblingsWithReplacement final : TreeAcceptor {
    // SpecInfer's rule for siblings drawn with replacement: q_i = q at every step
    float sibling_q(const std::vector<float>& q, int32_t x, double, bool) const override { return q[x]; }
    void update_residual(std::vector<float>& r, const std::vector<float>& q, double, const int32_t* drawn,
                         int) const override {
        TreeAcceptor::update_residual(r, q, 1.0, drawn, 0);
    }
};

struct TreeSiblingOneUniform final : TreeAcceptor {
    int uniform_step(int) const override { return 0; }
};

}  // namespace

std::unique_ptr<TreeAcceptor> make_tree_acceptor(Fault fault) {
    switch (fault) {
        case Fault::tree_residual_stale: return std::make_unique<TreeResidualStale>();
        case Fault::tree_sibling_twice: return std::make_unique<TreeSiblingTwice>();
        case Fault::tree_bonus_wrong_node: return std::make_unique<TreeBonusWrongNode>();
        case Fault::tree_branch_kv_kept: return std::make_unique<TreeBranchKvKept>();
        case Fault::tree_siblings_with_replacement: return std::make_unique<TreeSiblingsWithReplacement>();
        case Fault::tree_sibling_one_uniform: return std::make_unique<TreeSiblingOneUniform>();
        default: return std::make_unique<TreeAcceptor>();  // a chain's fault: trees judge correctly
    }
}

std::unique_ptr<Acceptor> make_acceptor(Fault fault) {
    switch (fault) {
        case Fault::none: return std::make_unique<Acceptor>();
        case Fault::rollback_short: return std::make_unique<RollbackShort>();
        case Fault::rollback_long: return std::make_unique<RollbackLong>();
        case Fault::verify_position: return std::make_unique<VerifyPosition>();
        case Fault::seed_mixup: return std::make_unique<SeedMixup>();
        case Fault::bonus_from_q: return std::make_unique<BonusFromQ>();
        case Fault::slow_accept: return std::make_unique<SlowAccept>();
        case Fault::residual_from_p: return std::make_unique<ResidualFromP>();
        case Fault::accept_q_over_p: return std::make_unique<AcceptQOverP>();
        case Fault::q_prev_position: return std::make_unique<QPrevPosition>();
        case Fault::accept_always: return std::make_unique<AcceptAlways>();
        case Fault::skip_draft_trim: return std::make_unique<SkipDraftTrim>();
        case Fault::tree_residual_stale:
        case Fault::tree_sibling_twice:
        case Fault::tree_bonus_wrong_node:
        case Fault::tree_branch_kv_kept:
        case Fault::tree_siblings_with_replacement:
        case Fault::tree_sibling_one_uniform:
            return std::make_unique<Acceptor>();  // a tree's fault: chains judge correctly
    }
    throw std::invalid_argument("unknown fault");
}

Fault fault_named(const std::string& name) {
    static const std::pair<const char*, Fault> faults[] = {
        {"none", Fault::none}, {"rollback_short", Fault::rollback_short}, {"rollback_long", Fault::rollback_long},
        {"verify_position", Fault::verify_position}, {"seed_mixup", Fault::seed_mixup},
        {"bonus_from_q", Fault::bonus_from_q}, {"slow_accept", Fault::slow_accept},
        {"residual_from_p", Fault::residual_from_p}, {"accept_q_over_p", Fault::accept_q_over_p},
        {"q_prev_position", Fault::q_prev_position}, {"accept_always", Fault::accept_always},
        {"skip_draft_trim", Fault::skip_draft_trim}, {"tree_residual_stale", Fault::tree_residual_stale},
        {"tree_sibling_twice", Fault::tree_sibling_twice}, {"tree_bonus_wrong_node", Fault::tree_bonus_wrong_node},
        {"tree_branch_kv_kept", Fault::tree_branch_kv_kept},
        {"tree_siblings_with_replacement", Fault::tree_siblings_with_replacement},
        {"tree_sibling_one_uniform", Fault::tree_sibling_one_uniform}};
    for (const auto& [fault_name, fault] : faults) {
        if (name == fault_name) return fault;
    }
    throw std::invalid_argument("unknown fault '" + name + "'");
}

}  // namespace specnative
