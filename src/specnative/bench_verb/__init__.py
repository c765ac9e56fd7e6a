"""`specnative bench`: llama-bench with speculation (cli, grid, measure, output, fields)."""
