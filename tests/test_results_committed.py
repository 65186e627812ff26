"""The generated files committed under results/ are what today's code renders from the committed data.

Nothing is measured or simulated: each report is rendered again from the data it was made from (a fidelity
report's JSON; the leaderboard's and the papers' result rows, rebuilt from results/leaderboard.csv since the
store behind them, runs/full, is not committed) and compared byte for byte, so a rendering change that the
committed files lag behind fails here. `python tests/test_results_committed.py` (from the repository root)
re-renders every file these tests compare (no number changes: only the rendering); PNGs are binary and only
checked to exist.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from suite import fidelity, graph_io, paper, report, zoo

RESULTS = Path(__file__).resolve().parents[1] / "results"
FIDELITY = RESULTS / "fidelity"
GRAPHS = RESULTS / "graphs"
REGENERATE = "python tests/test_results_committed.py"  # re-renders the stale files (see `rerender`)
FIDELITY_JSONS = sorted(FIDELITY.glob("*.json"))
PAPERS = sorted(p.stem for p in (RESULTS / "papers").glob("*.md"))
_RUN_LINE = re.compile(r"^Run \S+ \(spec .*$", re.M)  # report.provenance: from the store's manifest
_WARNING = re.compile(r"^\*\*Warning: .*\*\*$", re.M)  # the CLI's notes on the store


def fidelity_result(path: Path) -> fidelity.FidelityResult:
    """A fidelity report as `run_fidelity` returned it, from its JSON (`FidelityResult.to_dict`): the row
    fields that are properties (rel_error, rel_error_raw) are left to be computed again."""
    d = json.loads(path.read_text(encoding="utf-8"))
    fields = {f.name for f in dataclasses.fields(fidelity.Row)}
    rows = [fidelity.Row(**{k: v for k, v in r.items() if k in fields}) for r in d["rows"]]
    return fidelity.FidelityResult(d["workload"], d["workload_hash"], d["cluster"], d["backend"], d["device_map"],
                                   rows, d["profiles"], d["info"])


def leaderboard_rows() -> list[dict[str, Any]]:
    """Per-seed result rows that give results/leaderboard.csv's cells: each cell's ok seeds at its median
    step time, the rest failed; methodology, evaluator, budget and seeds from leaderboard.md's header. The
    CSV does not say how a seed of an ok cell failed: such a seed is taken as OOM (the failures table and the
    summaries' "failed" column would show another). A failed cell's ok seed gets a placeholder time, which no
    table shows (the cell's median is infinite)."""
    md = (RESULTS / "leaderboard.md").read_text(encoding="utf-8")
    head = re.search(r"^Methodology: ([^;]+); evaluator: ([^;]+); search budget per cell: (\d+) evaluations / "
                     r"(\S+) s; seeds: ([\d, ]+)\.", md, re.M)
    assert head, "results/leaderboard.md: no 'Methodology: ...' line to read the rows' setup from"
    methodology, evaluator, evaluations, seconds, seed_text = head.groups()
    seeds = [int(s) for s in seed_text.split(", ")]
    run = re.search(r"^Run (\S+) \(", md, re.M)
    rows = []
    with open(RESULTS / "leaderboard.csv", encoding="utf-8", newline="") as f:
        for cell in csv.DictReader(f):
            n, n_ok = int(cell["seeds"]), int(cell["ok_seeds"])
            failure = "oom" if cell["status"] == "ok" else cell["status"]
            t = float(cell["step_time_s"]) if cell["step_time_s"] else 1.0
            for i, seed in enumerate(seeds[:n]):
                status = "ok" if i < n_ok else failure
                rows.append({"cluster": cell["cluster"], "workload": cell["workload"], "placer": cell["placer"],
                             "seed": seed, "status": status, "step_time_s": t if status == "ok" else None,
                             "methodology": methodology, "evaluator": evaluator,
                             "budget_evaluations": int(evaluations), "budget_seconds": float(seconds),
                             "run_id": run.group(1) if run else None})
    return rows


def _store_notes(committed: str) -> tuple[str, str]:
    """The committed report's lines that come from the store behind it, not from its rows: the runs'
    provenance (one line per run) and the warnings, as paper_markdown's `provenance` and `note` take them."""
    return "\n".join(_RUN_LINE.findall(committed)), "\n\n".join(_WARNING.findall(committed))


def rendered_leaderboard(rows: list[dict[str, Any]]) -> dict[str, str]:
    committed = (RESULTS / "leaderboard.md").read_text(encoding="utf-8")
    # with no runs given, the note takes the place of the provenance lines (both paragraphs before the tables)
    note = "\n\n".join(x for x in _store_notes(committed) if x)
    source = re.match(r"<!-- .* \((.*)\) -->\n", committed)
    return {"leaderboard.md": report.leaderboard_markdown(rows, source=source.group(1) if source else "", note=note),
            "leaderboard.csv": report.render(rows, "csv")}


def rendered_paper(name: str, rows: list[dict[str, Any]]) -> dict[str, str]:
    committed = (RESULTS / "papers" / f"{name}.md").read_text(encoding="utf-8")
    provenance, note = _store_notes(committed)
    source = re.match(r"<!-- .* \((.*)\) -->\n", committed)
    comp = paper.Comparison.from_rows(paper.load_paper(name), rows)
    return {f"{name}.md": paper.paper_markdown(comp, source.group(1) if source else "", provenance, note),
            f"{name}.csv": report.to_csv(paper.long_table(comp))}


def _same(path: Path, text: str) -> None:
    committed = path.read_text(encoding="utf-8")
    if committed != text:
        lines = [(i + 1, a, b) for i, (a, b) in enumerate(zip(committed.splitlines(), text.splitlines(),
                                                                strict=False)) if a != b][:1]
        first = f"first difference, line {lines[0][0]}:\n  committed: {lines[0][1]}\n  rendered:  {lines[0][2]}" \
            if lines else f"{len(committed.splitlines())} lines committed, {len(text.splitlines())} rendered"
        pytest.fail(f"{path.relative_to(RESULTS.parent)} is not what the code renders from its data ({first}); "
                    f"if the code is right, re-render it with `{REGENERATE}`")


@pytest.mark.parametrize("path", FIDELITY_JSONS, ids=lambda p: p.stem)
def test_fidelity_report_renders_from_its_json(path):
    result = fidelity_result(path)
    _same(path.with_suffix(".md"), fidelity.markdown(result))
    assert path.with_suffix(".png").is_file(), f"{path.with_suffix('.png')} is missing"
    # summary.md reads the stored statistics: they are those of the stored rows
    stored = json.loads(path.read_text(encoding="utf-8"))
    assert stored["stats"] == result.stats()
    assert [(r["rel_error"], r["rel_error_raw"]) for r in stored["rows"]] == \
        [(r.rel_error, r.rel_error_raw) for r in result.rows]


def test_fidelity_reports_are_there():
    assert len(FIDELITY_JSONS) >= 19  # a glob that found nothing would pass the test above
    assert sorted(p.stem for p in FIDELITY.glob("*.md") if p.name != "summary.md") == [p.stem for p in FIDELITY_JSONS]


def test_fidelity_summary_renders_from_the_reports(tmp_path):
    for path in FIDELITY_JSONS:
        shutil.copy(path, tmp_path)
    _same(FIDELITY / "summary.md", fidelity.write_summary(tmp_path).read_text(encoding="utf-8"))


def test_leaderboard_renders_from_its_rows():
    rows = leaderboard_rows()
    assert len(rows) >= 2000  # every cell of runs/full: 5 clusters x 10 workloads x 15 placers x 3 seeds
    for name, text in rendered_leaderboard(rows).items():
        _same(RESULTS / name, text)
    assert (RESULTS / "leaderboard.png").is_file()


def test_leaderboard_rows_rebuilt_from_csv_give_its_tables():
    """The comparison is not vacuous: the first cell twice as slow in every seed changes the rendered CSV."""
    rows = leaderboard_rows()
    first = ("cluster", "workload", "placer")
    rows = [{**r, "step_time_s": r["step_time_s"] * 2} if all(r[k] == rows[0][k] for k in first) else r
            for r in rows]
    assert rendered_leaderboard(rows)["leaderboard.csv"] != (RESULTS / "leaderboard.csv").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", PAPERS)
def test_paper_renders_from_the_leaderboard_rows(name):
    for file, text in rendered_paper(name, leaderboard_rows()).items():
        _same(RESULTS / "papers" / file, text)


def test_papers_are_there():
    assert set(PAPERS) == set(paper.paper_names())
    assert sorted(p.stem for p in (RESULTS / "papers").glob("*.csv")) == PAPERS


def test_graph_index_matches_the_graph_files():
    """Each committed graph is the one its index entry describes (hash, counts, mode) and is current: its
    source hash is that of today's model code, so `zoo.load` uses it rather than tracing again. The file's
    bytes are what `zoo.graph_bytes` writes for it. No model is traced."""
    index = json.loads((GRAPHS / "index.json").read_text(encoding="utf-8"))
    entries = index["workloads"]
    assert sorted(entries) == zoo.names(), "results/graphs/index.json does not list every zoo workload"
    assert sorted(e["file"] for e in entries.values()) == sorted(p.name for p in GRAPHS.glob("*.json.gz"))
    for name, e in entries.items():
        path = GRAPHS / e["file"]
        graph = graph_io.load(path)  # checks the hash recorded in the file
        again = f"`python -c \"from suite import zoo; zoo.load('{name}')\"` captures it again into {GRAPHS}"
        assert (graph.name, graph.content_hash, graph.num_ops, graph.num_edges, graph.metadata.get("mode")) == \
            (name, e["content_hash"], e["num_ops"], e["num_edges"], e["mode"]), f"{path} vs its index entry"
        assert zoo.source_hash(name) == e["source_hash"], (
            f"{path} was captured from other model code (zoo.load would trace it again): {again}")
        assert zoo.graph_bytes(graph) == path.read_bytes(), f"{path} is not the bytes zoo.graph_bytes writes"


def rerender() -> list[Path]:
    """Write every text file the tests above compare, rendered from the committed data (the fidelity JSONs,
    the rows rebuilt from results/leaderboard.csv); the lines that come from the store (runs, warnings) are
    kept as committed. Returns the files that changed."""
    files: dict[Path, str] = {p.with_suffix(".md"): fidelity.markdown(fidelity_result(p)) for p in FIDELITY_JSONS}
    rows = leaderboard_rows()
    files.update({RESULTS / name: text for name, text in rendered_leaderboard(rows).items()})
    for name in PAPERS:
        files.update({RESULTS / "papers" / f: text for f, text in rendered_paper(name, rows).items()})
    changed = []
    for path, text in files.items():
        if path.read_text(encoding="utf-8") != text:
            path.write_bytes(text.encode("utf-8"))
            changed.append(path)
    before = (FIDELITY / "summary.md").read_bytes()
    if fidelity.write_summary(FIDELITY).read_bytes() != before:
        changed.append(FIDELITY / "summary.md")
    return changed


if __name__ == "__main__":
    changed = rerender()
    print("\n".join(f"re-rendered {p.relative_to(RESULTS.parent)}" for p in changed) or "nothing to re-render")
    sys.exit(0)
