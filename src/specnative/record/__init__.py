"""What a run leaves behind and where its numbers came from: the traces.csv schema (defined once in
schema.py), provenance.json, the run folder kept whole (lock, resume, torn rows), shards and their
merge, and the results database derived from run folders.
"""
