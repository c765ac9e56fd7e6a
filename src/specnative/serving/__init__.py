"""Serving under load (`specnative serve`): requests arrive at their own times and share a
continuous-batching loop in the C++ core. arrivals.py makes the request traces, loop.py replays
them through the engine, metrics.py defines TTFT/TPOT/ITL/goodput once, runner.py runs the load
sweep (spec off and on on the same traces per request rate), analysis/crossover.py finds where speculation
stops paying, report.py writes the serve run's figures and summary.
"""
