"""Side-by-side benchmarks of specnative against llama.cpp's own programs, one module per peer:

    common       paths, building llama.cpp's tools from the vendored tree, a quiet machine,
                 model sets, formatting and provenance shared by every table
    ours         specnative's side of every comparison (Engine runs reduced to plain dicts)
    llama_bench  llama-bench (baseline tokens/s)
    spec_simple  llama-speculative-simple (one sequence, speculative)
    server       llama-server (N slots over HTTP on loopback, speculative or not)
    tools_table  the table of ours vs llama-bench and llama-speculative-simple
    server_table the table of ours vs llama-server at concurrency 1, 4, 8
    serve_table  our serving loop vs llama-server under the same request traces (the command line
                 and report), with serve_parity (the interleaved runs of both sides) and
                 serve_paired (paired ratios with intervals)

The entry point is bench/peers.py.
"""
