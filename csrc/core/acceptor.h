// The acceptance rule's decisions for one round of one sequence, as the chain walk
// (chain_round.cpp) asks them: which verify row holds a draft's logits, which q weighs it,
// whether it is kept, what replaces a rejected draft, the bonus token, how many cells the
// rollback keeps.
//
// The engine always runs the correct rule (Acceptor itself). Tests of the lossless verdicts swap
// in one planted fault (planted_faults.cpp, through Engine::inject_fault): a subclass that
// overrides a single decision the way real implementations have been broken. Production code
// never builds one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine.h"
#include "sampling.h"

namespace specnative {

// Deliberate bugs for tests of the lossless verdict (never set in normal use): each breaks the
// speculative loop the way real implementations have been broken.
enum class Fault {
    none,
    rollback_short,   // the target cache rolls back one token too many (the last kept is lost)
    rollback_long,    // the target cache keeps the first rejected draft
    verify_position,  // each draft is judged by the target's logits one position late
    seed_mixup,       // the target's samples in a round use the draft's random stream
    bonus_from_q,     // the bonus token after a fully accepted round comes from the draft's q
    slow_accept,      // busy-waits kSlowAcceptMs per sequence per iteration in the accept phase
                      // (baseline: its sampling): engine's own time that llama.cpp never sees
    // The rejection rule's own mistakes (lossless only in distribution; the distributional
    // verdict must catch each):
    residual_from_p,  // after a rejection, draw from p instead of norm(max(0, p - q))
    accept_q_over_p,  // accept with probability min(1, q(x)/p(x)) instead of min(1, p(x)/q(x))
    q_prev_position,  // judge draft i with the draft distribution of position i - 1
    accept_always,    // accept every draft
    skip_draft_trim,  // a hidden-state drafter's cache keeps its draft cells after a draft (a
                      // drafter-quality bug: changes acceptance, never the output)
    // Draft trees' own mistakes (tree_acceptor.h; a chain runs the correct rule under them):
    tree_residual_stale,    // the residual is not updated after a rejected sibling (each sibling
                            // judged against p, the last draw from p)
    tree_sibling_twice,     // after a rejected sibling the walk tries the same one again, never the last
    tree_bonus_wrong_node,  // the bonus token after a fully accepted path comes from its parent's row
    tree_branch_kv_kept,    // after a round the other branches keep their own cells up to the
                            // accepted depth (a rejected branch's KV stays beside the accepted one)
    tree_siblings_with_replacement,  // siblings weighed against q itself, not q without the siblings
                                     // drawn before (the rule for siblings drawn with replacement)
    tree_sibling_one_uniform,        // every sibling of a node tested with the first sibling's uniform
};
constexpr double kSlowAcceptMs = 2.0;

// What a target draw needs (sample_target's arguments): the token at `index` of the sequence
// keyed `key`, sampled from `logits` under p's temperature and seed.
struct TargetDraw {
    const float* logits;
    int n_vocab;
    const GenerateParams& p;
    uint64_t key;
    int64_t index;
    std::vector<float>& margins;
    SoftmaxNorm& norm;
};

class Acceptor {
public:
    virtual ~Acceptor() = default;
    // The batch row with the target's logits for draft position i (i = drafted: the bonus row).
    virtual int verify_row(int first_row, int i, int /*drafted*/) const { return first_row + i; }
    // The draft distribution the rejection rule weighs draft i against.
    virtual const std::vector<float>& q_of(const std::vector<std::vector<float>>& q, int i) const { return q[i]; }
    // Whether the rejection rule keeps a draft x: u < min(1, p(x) / q(x)).
    virtual bool keep(double u, float p_x, float q_x) const { return draft_accepted(u, p_x, q_x); }
    // The rejection rule at a drafted position: x when kept (keep), else its replacement (residual),
    // from the position's verify-row logits and the q that weighs x; the accept and residual
    // uniforms are keyed by (p.seed, key, index). the chain walk's decision, and the rule tests'.
    int32_t judge_draft(const float* logits, int n_vocab, int vocab, const GenerateParams& p, uint64_t key,
                        int64_t index, const std::vector<float>& q_i, int32_t x, AcceptScratch& scratch) const;
    // A rejected draft's replacement, drawn from norm(max(0, p - q)).
    virtual int32_t residual(const float* p_probs, const float* q, int32_t vocab, double u,
                             std::vector<float>& scratch) const {
        return residual_sample(p_probs, q, vocab, u, scratch);
    }
    // The target's own token under greedy and match (and the bonus under every rule): from p.
    virtual int32_t target_token(const TargetDraw& d) const;
    // The bonus token after every draft was kept; q_last/last_draft: the last proposal (none: null).
    virtual int32_t bonus(const TargetDraw& d, const std::vector<float>* /*q_last*/, int32_t /*last_draft*/) const {
        return Acceptor::target_token(d);
    }
    // Cells the target's rollback keeps beyond pending + the accepted drafts.
    virtual int stale_cells(int /*accepted*/, int /*drafted*/) const { return 0; }
    // After the accept phase of an iteration in which `sequences` sequences took part.
    virtual void after_accept_phase(int /*sequences*/) const {}
    // Whether a hidden-state drafter drops its draft cells after each draft.
    virtual bool trims_draft_cache() const { return true; }
};

// The rule for `fault` (Fault::none: the correct one).
std::unique_ptr<Acceptor> make_acceptor(Fault fault);
// The fault spelled `name` (its enumerator's name, "none" included); invalid_argument otherwise.
Fault fault_named(const std::string& name);

}  // namespace specnative
