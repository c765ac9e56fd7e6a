// The speculative round, written once (round_loop.cpp) for every shape a proposal takes. What a
// shape decides sits behind Proposals: how a sequence's proposal is drafted and placed in the
// verify batch, how the acceptance walk goes through it, what the KV caches keep. A chain of up
// to k tokens (chain_round.cpp), a draft tree (tree_round.cpp), or no proposal at all (serving's
// baseline step: the pending token alone, round_loop.cpp). Not part of the public API.
#pragma once

#include <memory>
#include <vector>

#include "engine.h"
#include "engine_internal.h"

namespace specnative {

class Acceptor;      // acceptor.h
class TreeAcceptor;  // tree_acceptor.h
class Drafter;       // drafter.h
class TreeDrafter;   // tree_drafter.h

class Proposals {
public:
    virtual ~Proposals() = default;

    // ---- before the first round (generate) and at admissions (serve) ----------------------------
    // Whether the drafter reads the target's features from every target decode, the prefill's
    // chunks included (read_prefill; a hidden-state drafter): the prompts' cells are then made
    // under its settings and never reused.
    virtual bool reads_target() const { return false; }
    virtual void read_prefill(const llama_batch& /*batch*/) {}
    // A sequence's counts before its first round.
    virtual void reset_counts(SeqCounts& counts) const = 0;
    // The target holds the sequence's prompt now (its first token pending): a tree copies it to
    // the sequence's branch ids.
    virtual void prompt_ready(Engine::Sequence& /*seq*/) {}
    // The drafter takes in every prompt (generate), or one slot's (serve's admit).
    virtual void begin(std::vector<Engine::Sequence>& /*seqs*/, int /*shared_prefix*/) {}
    virtual void admit(Engine::Sequence& /*seq*/) {}
    // Serving with the prefix cache (Drafter::share_prefix).
    virtual void share_prefix(int /*length*/, int /*holder*/) {}
    // The slot's request finished: its target cells under every id it used go, and the drafter's state.
    virtual void release(const Engine::Sequence& seq) = 0;

    // ---- one round ----------------------------------------------------------------------------
    // The most sequence `seq` may propose this round (draft tokens, or tree depth): its
    // correction or bonus token must still fit in its n_predict.
    virtual int budget(const Engine::Sequence& seq) const = 0;
    // Proposals for every sequence s with budget[s] >= 0 (-1: done or not decoding).
    virtual void draft(std::vector<Engine::Sequence>& /*seqs*/, const std::vector<int>& /*budget*/) {}
    // Appends sequence `seq` (index s) to the target's verify batch: its pending token and proposal.
    virtual void place(const Engine::Sequence& seq, int s) = 0;
    // After the target decoded the batch, before any accept: a drafter that reads the target takes
    // the batch's features (serving: prompt chunks from first_prompt_row on ride along).
    virtual void read_verify(const llama_batch& /*batch*/, int /*first_prompt_row*/) {}
    // Walks sequence s's proposal under the acceptance rule, counts, rolls the target's cache back
    // to what was accepted, tells the drafter, emits the accepted tokens and the correction or bonus.
    virtual void accept(Engine::Sequence& seq, int s) = 0;
    // After every sequence's accept of the round (a tree drafter that reads the target ingests
    // the accepted paths here).
    virtual void after_accept() {}

    // Milliseconds inside llama.cpp on contexts the engine does not time (Drafter::library_ms,
    // TreeDrafter::library_ms), and the part of them that removed or copied cache cells.
    virtual double library_ms() const { return 0; }
    virtual double kv_ms() const { return 0; }
    // The part of the draft phase that was a draft model's catch-up (Drafter::catch_up_ms).
    virtual double catch_up_ms() const { return 0; }
};

// A chain of up to k drafted tokens per sequence, verified as consecutive rows (chain_round.cpp).
std::unique_ptr<Proposals> make_chain_proposals(Engine::Context& target, const Acceptor& rule,
                                                std::unique_ptr<Drafter> drafter, const GenerateParams& p, int n_seq,
                                                bool reads_target);
// A draft tree per sequence, its branches on sequence ids of their own (tree_round.cpp).
std::unique_ptr<Proposals> make_tree_proposals(Engine::Context& target, const TreeAcceptor& rule,
                                               std::unique_ptr<TreeDrafter> drafter, const GenerateParams& p,
                                               int n_seq);
// No proposal: the pending token alone, its next token sampled (serving's baseline).
std::unique_ptr<Proposals> make_step_proposals(Engine::Context& target, const Acceptor& rule,
                                               const GenerateParams& p, int n_seq);

// One baseline step of one sequence: samples its next token from the logits of its pending one.
void step_baseline(Engine::Sequence& seq, const float* logits, const Engine::Context& target,
                   const GenerateParams& p, SoftmaxNorm& norm, const Acceptor& rule);

}  // namespace specnative
