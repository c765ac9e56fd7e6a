"""llama-bench's output formats for specnative bench's rows: md, csv, json, jsonl and sql, each as
llama-bench prints it (tools/llama-bench: csv_printer, json_printer, jsonl_printer,
markdown_printer, sql_printer), with the draft columns after llama-bench's on speculative rows.

csv: one header for all rows; the draft cells of a plain row are empty. json and jsonl: a plain
row has llama-bench's keys only. sql: the plain rows go into llama-bench's table `llama_bench`
(what scripts/compare-llama-bench.py reads), the speculative rows into `llama_bench_spec`, the same
columns and the draft columns after them: one table holds rows whose keys compare-llama-bench
would take for the same test."""
from __future__ import annotations

import json
import math

from specnative.bench_verb.fields import DRAFT_FIELDS, LLAMA_BENCH_FIELDS, any_type


def text_value(name: str, value) -> str:
    """A value as llama-bench's get_values() spells it (std::to_string: floats with 6 decimals)."""
    if value is None:
        return ""
    if any_type(name) == "FLOAT":
        return "nan" if isinstance(value, float) and math.isnan(value) else f"{float(value):.6f}"
    if isinstance(value, bool):
        return str(int(value))
    return str(value)


def json_value(name: str, value):
    kind = any_type(name)
    if kind == "STRING":
        return str(value)
    if kind == "BOOL":
        return bool(int(value))
    if kind == "FLOAT":
        value = float(value)
        return None if math.isnan(value) or math.isinf(value) else value
    return int(value)


def is_spec(row: dict) -> bool:
    return "spec_type" in row


def row_object(row: dict) -> dict:
    out = {f: json_value(f, row[f]) for f in LLAMA_BENCH_FIELDS}
    out["samples_ns"] = [int(v) for v in row["samples_ns"]]
    out["samples_ts"] = [float(v) for v in row["samples_ts"]]
    if is_spec(row):
        out.update({f: json_value(f, row[f]) for f in DRAFT_FIELDS})
    return out


def _csv_cell(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def sql_type(name: str) -> str:
    return {"STRING": "TEXT", "BOOL": "INTEGER", "INT": "INTEGER", "FLOAT": "REAL"}[any_type(name)]


def _sql_quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class Printer:
    """Streams rows in one format: header(), row(r) for each, footer()."""

    def __init__(self, fmt: str, out, spec_run: bool, md_columns: list[str] | None = None):
        self.fmt, self.out, self.spec_run = fmt, out, spec_run
        self.md_columns = md_columns or []
        self.first = True
        self.tables: set = set()

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def header(self) -> None:
        if self.fmt == "csv":
            self.write(",".join(list(LLAMA_BENCH_FIELDS) + (list(DRAFT_FIELDS) if self.spec_run else [])) + "\n")
        elif self.fmt == "json":
            self.write("[\n")
        elif self.fmt == "md":
            self.write(md_header(self.md_columns, self.spec_run))
        elif self.fmt == "sql":
            self.write(create_table("llama_bench", list(LLAMA_BENCH_FIELDS)))
            if self.spec_run:
                self.write(create_table("llama_bench_spec", list(LLAMA_BENCH_FIELDS) + list(DRAFT_FIELDS)))

    def row(self, row: dict) -> None:
        if self.fmt == "csv":
            fields = list(LLAMA_BENCH_FIELDS) + (list(DRAFT_FIELDS) if self.spec_run else [])
            cells = [text_value(f, row.get(f)) if f in row else "" for f in fields]
            self.write(",".join(_csv_cell(c) for c in cells) + "\n")
        elif self.fmt == "json":
            body = json.dumps(row_object(row), indent=4)
            self.write(("" if self.first else ",\n") + "\n".join("  " + line for line in body.splitlines()))
        elif self.fmt == "jsonl":
            self.write(json.dumps(row_object(row)) + "\n")
        elif self.fmt == "md":
            self.write(md_row(row, self.md_columns, self.spec_run))
        elif self.fmt == "sql":
            fields = list(LLAMA_BENCH_FIELDS) + (list(DRAFT_FIELDS) if is_spec(row) else [])
            table = "llama_bench_spec" if is_spec(row) else "llama_bench"
            values = ", ".join(_sql_quote(text_value(f, row[f])) for f in fields)
            self.write(f"INSERT INTO {table} ({', '.join(fields)}) VALUES ({values});\n")
        self.first = False

    def footer(self, build_commit: str = "", build_number: int = 0) -> None:
        if self.fmt == "json":
            self.write("\n]\n")
        elif self.fmt == "md":
            self.write(f"\nbuild: {build_commit} ({build_number})\n")


def create_table(name: str, fields: list[str]) -> str:
    lines = [f"  {f} {sql_type(f)}{',' if i < len(fields) - 1 else ''}" for i, f in enumerate(fields)]
    return f"CREATE TABLE IF NOT EXISTS {name} (\n" + "\n".join(lines) + "\n);\n\n"


# --- markdown: llama-bench's table (model, size, params, backend, the settings that vary or were
# given, test, t/s), then the draft columns on a speculative run
MD_NAMES = {"n_gpu_layers": "ngl", "n_threads": "threads", "flash_attn": "fa"}
MD_WIDTHS = {"model": -30, "size": 10, "params": 10, "backend": -10, "n_gpu_layers": 3, "n_threads": 7,
             "n_batch": 7, "n_ubatch": 8, "flash_attn": 3, "test": 15, "t/s": 20, "spec_type": -12, "n_draft": 7,
             "accept_rate": 11, "mean_accept_len": 15, "speedup": 20, "lossless": -8}
SPEC_MD = ["spec_type", "n_draft", "accept_rate", "mean_accept_len", "speedup", "lossless"]


def md_columns(flags: dict, backend: str) -> list[str]:
    cols = ["model", "size", "params", "backend"]
    if backend != "CPU" or flags.get("n_gpu_layers"):
        cols.append("n_gpu_layers")
    cols.append("n_threads")
    cols += [c for c in ("n_batch", "n_ubatch", "flash_attn") if flags.get(c)]
    return cols + ["test", "t/s"]


def _md_line(cells: list[tuple[str, int]]) -> str:
    return "|" + "".join(f" {text:>{w}} |" if w > 0 else f" {text:<{-w}} |" for text, w in cells) + "\n"


def md_header(columns: list[str], spec_run: bool) -> str:
    cols = columns + (SPEC_MD if spec_run else [])
    widths = [MD_WIDTHS.get(c, 10) for c in cols]
    head = _md_line([(MD_NAMES.get(c, c), w) for c, w in zip(cols, widths)])
    rule = "|" + "".join(f" {'-' * (abs(w) - 1)}{':' if w > 0 else '-'} |" for w in widths) + "\n"
    return head + rule


def md_row(row: dict, columns: list[str], spec_run: bool) -> str:
    def value(c):
        if c == "model":
            return row["model_type"]
        if c == "size":
            size = row["model_size"]
            return f"{size / 1024**2:.2f} MiB" if size < 1024**3 else f"{size / 1024**3:.2f} GiB"
        if c == "params":
            n = row["model_n_params"]
            return f"{n / 1e6:.2f} M" if n < 1e9 else f"{n / 1e9:.2f} B"
        if c == "backend":
            return row["backends"]
        if c == "test":
            p, g = row["n_prompt"], row["n_gen"]
            return f"pp{p}" if g == 0 else (f"tg{g}" if p == 0 else f"pp{p}+tg{g}")
        if c == "t/s":
            return f"{row['avg_ts']:.2f} ± {row['stddev_ts']:.2f}"
        if c == "speedup":
            if not is_spec(row):
                return ""
            low, high = row["speedup_low"], row["speedup_high"]
            band = "" if math.isnan(low) else f" [{low:.2f}, {high:.2f}]"
            return f"{row['speedup']:.2f}{band}"
        if c in SPEC_MD:
            if not is_spec(row):
                return "none" if c == "spec_type" else ""
            v = row[c]
            return f"{v:.3f}" if isinstance(v, float) else str(v)
        return text_value(c, row[c])

    cols = columns + (SPEC_MD if spec_run else [])
    return _md_line([(value(c), MD_WIDTHS.get(c, 10) + (1 if c == "t/s" else 0)) for c in cols])
