#!/usr/bin/env python3
"""specnative against llama.cpp's own programs, side by side.

    python bench/peers.py [options]          ours vs llama-bench and llama-speculative-simple
                                             (python bench/peers.py --help; bench/peerkit/tools_table.py);
                                             writes bench/results/peers-closed-loop/<sets>-<backend>.md
    python bench/peers.py server [options]   ours vs llama-server at concurrency 1, 4, 8 over HTTP on
                                             loopback (python bench/peers.py server --help;
                                             bench/peerkit/server_table.py);
                                             writes bench/results/server-peer/<sets>-<backend>.md
    python bench/peers.py serve [options]    specnative's serving loop vs llama-server on the same traces,
                                             interleaved trace by trace, open loop and streamed, paired
                                             ratios with intervals (`specnative serve`'s flags, or a serve
                                             RUN_DIR's traces and settings; bench/peerkit/serve_table.py);
                                             writes bench/results/serving-parity/<target>-<drafter>-<backend>/

llama.cpp's programs are built once from the vendored tree into bench/scratch/llama-build
(--build-only builds and stops; --tools-dir uses programs built elsewhere).

One module per peer lives in bench/peerkit/ (llama_bench, spec_simple, server), with what they
share in peerkit/common.py and our own side in peerkit/ours.py; the serving comparison is
serve_table (command line, report), serve_parity (the interleaved runs) and serve_paired (the
paired table).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "serve":
        from peerkit import serve_table
        return serve_table.main(argv[1:])
    if argv and argv[0] == "server":
        from peerkit import server_table
        return server_table.main(argv[1:])
    from peerkit import tools_table
    return tools_table.main(argv)


if __name__ == "__main__":
    sys.exit(main())
