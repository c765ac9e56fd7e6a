#include "acceptor.h"

#include "engine_internal.h"

namespace specnative {

int32_t Acceptor::target_token(const TargetDraw& d) const {
    return sample_target(d.logits, d.n_vocab, d.p, d.key, d.index, d.margins, d.norm);
}

}  // namespace specnative
