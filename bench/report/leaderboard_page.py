"""index.html of the leaderboard: one self-contained static page (no network, no server; data,
heatmaps and script inlined) with the ranked table sortable by any column and filterable by
family (design), method and metric, the heatmaps, and a link from every cell to the rows the rules
read for that series. Tested in headless Chromium (tests/bench/report/test_leaderboard_page.py)."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path

import numpy as np
import pandas as pd

from bench.findings.leaderboard import STATISTICS
from bench.findings.rows import col, passkey, window_nll

__all__ = ["series_rows", "write_page"]

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left}
th{cursor:pointer;background:#f3f3f3}
th.sorted-asc::after{content:" \\25B2"} th.sorted-desc::after{content:" \\25BC"}
tr.hidden,.metric-hidden{display:none}
#filters{margin:0.8em 0} #filters label{margin-right:1.2em}
img{max-width:100%;margin:0.5em 0;border:1px solid #ddd}
details{margin:0.3em 0} details table{font-size:12px}
"""

SCRIPT = """
(function(){
  const table = document.getElementById('board');
  const body = table.tBodies[0];
  const heads = Array.from(table.tHead.rows[0].cells);
  heads.forEach(function(th, col){
    th.addEventListener('click', function(){
      const asc = !th.classList.contains('sorted-asc');
      heads.forEach(function(h){ h.classList.remove('sorted-asc', 'sorted-desc'); });
      th.classList.add(asc ? 'sorted-asc' : 'sorted-desc');
      const numeric = th.dataset.type === 'num';
      const rows = Array.from(body.rows);
      rows.sort(function(a, b){
        let x = a.cells[col].dataset.value, y = b.cells[col].dataset.value;
        if (numeric) {
          x = x === '' ? Infinity : parseFloat(x); y = y === '' ? Infinity : parseFloat(y);
          return asc ? x - y : y - x;
        }
        return asc ? x.localeCompare(y) : y.localeCompare(x);
      });
      rows.forEach(function(r){ body.appendChild(r); });
    });
  });
  function apply(){
    const recipe = document.getElementById('f-recipe').value;
    const design = document.getElementById('f-design').value;
    const method = document.getElementById('f-method').value;
    const metric = document.getElementById('f-metric').value;
    Array.from(body.rows).forEach(function(r){
      const hide = (recipe && r.dataset.recipe !== recipe) || (design && r.dataset.design !== design)
        || (method && r.dataset.method !== method);
      r.classList.toggle('hidden', Boolean(hide));
    });
    document.querySelectorAll('[data-metric]').forEach(function(c){
      c.classList.toggle('metric-hidden', Boolean(metric) && c.dataset.metric !== metric);
    });
  }
  ['f-recipe', 'f-design', 'f-method', 'f-metric'].forEach(function(id){
    document.getElementById(id).addEventListener('change', apply);
  });
  function openTarget(){
    const id = decodeURIComponent(location.hash.slice(1));
    const target = id && document.getElementById(id);
    if (target && target.tagName === 'DETAILS') { target.open = true; }
  }
  window.addEventListener('hashchange', openTarget);
  openTarget();
})();
"""

#: columns of the display table sorted as numbers (by the underlying value, not the text)
NUMERIC = {"overall": "overall_rank_lo", "ppl at L": "ppl_at_L"}


def series_rows(labelled_rows: pd.DataFrame, series: str) -> pd.DataFrame:
    """The rows the leaderboard's rules read for one series: whole-window nll (as perplexity),
    LongPPL, passkey accuracy and the RULER tasks' exact scores, per seed and length."""
    rows = labelled_rows[labelled_rows["_series"] == series]
    nll = window_nll(rows).assign(value=lambda d: np.exp(d["value"]), metric="perplexity")
    longppl = rows[rows["metric"] == "longppl"].assign(metric="LongPPL")
    keys = passkey(rows).assign(metric="passkey accuracy")
    task = col(rows, "task")
    exact = rows[
        task.notna() & (rows["metric"] != "effective_length") & (col(rows, "axis") == "score")
        & (col(rows, "axis_value") == "exact")
    ]  # fmt: skip
    exact = exact.assign(metric="RULER exact: " + exact["task"].astype(str))
    parts = [p for p in (nll, longppl, keys, exact) if not p.empty]
    if not parts:
        return pd.DataFrame(columns=["metric", "seed", "eval_length", "value", "n", "run_id"])
    out = pd.concat(parts)[["metric", "seed", "eval_length", "value", "n", "run_id"]]
    return out.sort_values(["metric", "seed", "eval_length"]).reset_index(drop=True)


def _cell(text: str, value: object, metric: str | None, anchor: str) -> str:
    value = (
        "" if value is None or (isinstance(value, float) and not math.isfinite(value)) else value
    )
    attr = f' data-metric="{metric}"' if metric else ""
    return (
        f'<td data-value="{html.escape(str(value))}"{attr}>'
        f'<a href="#{anchor}">{html.escape(str(text))}</a></td>'
    )


def _table_html(table: pd.DataFrame, shown: pd.DataFrame) -> str:
    metric_of = {STATISTICS[m].title: m for m in STATISTICS if STATISTICS[m].title in shown.columns}
    heads = []
    for name in shown.columns:
        numeric = name in NUMERIC or name in metric_of
        metric = f' data-metric="{metric_of[name]}"' if name in metric_of else ""
        heads.append(
            f'<th data-type="{"num" if numeric else "text"}"{metric}>{html.escape(name)}</th>'
        )
    body = []
    for i, (row, text) in enumerate(
        zip(table.itertuples(), shown.itertuples(index=False), strict=True)
    ):
        anchor = f"rows-{i}"
        cells = []
        for name, value in zip(shown.columns, text, strict=True):
            if name in metric_of:
                sort_value = _sort_value(row, metric_of[name])
                cells.append(_cell(value, sort_value, metric_of[name], anchor))
            else:
                sort_value = getattr(row, NUMERIC[name]) if name in NUMERIC else value
                cells.append(_cell(value, sort_value, None, anchor))
        body.append(
            f'<tr data-recipe="{html.escape(row.recipe_label)}" data-design="{html.escape(row.design)}" '
            f'data-method="{html.escape(row.method)}">'
            + "".join(cells) + "</tr>"
        )  # fmt: skip
    return (
        '<table id="board"><thead><tr>' + "".join(heads) + "</tr></thead><tbody>"
        + "\n".join(body) + "</tbody></table>"
    )  # fmt: skip


def _sort_value(row, stat: str) -> float:
    """A statistic's cell sorts by its mean, better first when ascending; a series not ranked on
    it (failing at L on some seed) sorts last."""
    value = getattr(row, f"{stat}_mean", math.nan)
    fails = getattr(row, f"{stat}_fails", 0)
    if value is None or not np.isfinite(value) or (fails == fails and fails):
        return math.nan
    return -value if STATISTICS[stat].higher_is_better else value


def _select(ident: str, label: str, values: list[tuple[str, str]]) -> str:
    options = "".join(
        f'<option value="{html.escape(v)}">{html.escape(t)}</option>' for v, t in values
    )
    return f'<label>{label} <select id="{ident}"><option value="">all</option>{options}</select></label>'


def _rows_html(table: pd.DataFrame, labelled_rows: pd.DataFrame) -> str:
    parts = []
    for i, row in enumerate(table.itertuples()):
        rows = series_rows(labelled_rows, row.series)
        title = f"{row.design} · {row.method} · fine-tune {row.finetune} · {row.recipe_label}"
        lines = "".join(
            f"<tr><td>{html.escape(str(r.metric))}</td><td>{int(r.seed)}</td>"
            f"<td>{int(r.eval_length)}</td><td>{r.value:.4g}</td><td>{int(r.n)}</td>"
            f"<td>{html.escape(str(r.run_id))}</td></tr>"
            for r in rows.itertuples()
        )
        parts.append(
            f'<details id="rows-{i}"><summary>{html.escape(title)}</summary><table><thead><tr>'
            "<th>metric</th><th>seed</th><th>eval length</th><th>value</th><th>n</th>"
            f"<th>run_id</th></tr></thead><tbody>{lines}</tbody></table></details>"
        )
    return "\n".join(parts)


def write_page(
    path: Path,
    table: pd.DataFrame,
    shown: pd.DataFrame,
    labelled_rows: pd.DataFrame,
    maps: list[str],
    heatmap_dir: Path,
    summary: list[str] | None = None,
    power: pd.DataFrame | None = None,
) -> None:
    """Write the self-contained page (module doc) for the leaderboard ``table``, shown as
    ``shown`` (:func:`bench.report.leaderboard_report.display_table`)."""
    recipes = [(r, r) for r in sorted(table["recipe_label"].unique())]
    designs = [(d, d) for d in sorted(table["design"].unique())]
    methods = [(m, m) for m in sorted(table["method"].unique())]
    metrics = [(m, STATISTICS[m].title) for m in STATISTICS
               if STATISTICS[m].title in shown.columns]  # fmt: skip
    summary_html = "".join(f"<p>{html.escape(p.replace('`', ''))}</p>" for p in summary or [])
    power_html = "" if power is None else power.to_html(index=False, border=0)
    images = "".join(
        f'<h3>{STATISTICS[m].title}</h3><img alt="{m} heatmap" src="data:image/png;base64,'
        + base64.b64encode((heatmap_dir / f"{m}.png").read_bytes()).decode("ascii") + '">'
        for m in maps
    )  # fmt: skip
    rules = "".join(
        f"<li>{STATISTICS[m].title}: {html.escape(STATISTICS[m].rule)}.</li>"
        for m in STATISTICS if STATISTICS[m].title in shown.columns
    )  # fmt: skip
    data = table.drop(columns=["series"]).to_json(orient="records")
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>lenbench leaderboard</title>
<style>{STYLE}</style></head><body>
<h1>lenbench leaderboard</h1>
<p>Every pair of series of a training recipe compared on each statistic (paired where they
share a trained model; a two-level bootstrap over seeds and documents or trials;
Benjamini-Hochberg at 5% over the recipe's pairs). A rank #a–b is the interval every order
consistent with the decided comparisons allows: two series whose intervals do not overlap have a
decided comparison, overlapping ones are not ordered. One block per training recipe, never ranked
together. Same numbers as report.md. Click a column to sort, a cell for its rows. "≥": every
seed passes at the longest length measured; "fails at L on k/n": not ranked on that statistic;
†: perplexity at L decidedly above 1.1 x the recipe's best (ranked below every series that is
not); ‡: the raw model of its design fails at L on some seed (the cell reflects its training
more than the method).</p>
<h2>Summary</h2>{summary_html}
<ul>{rules}</ul>
<div id="filters">{_select("f-recipe", "recipe", recipes)}{_select("f-design", "family", designs)}{_select("f-method", "method", methods)}{_select("f-metric", "metric", metrics)}</div>
{_table_html(table, shown)}
<h2>Power</h2>{power_html}
<h2>Heatmaps</h2>{images}
<h2>Rows</h2>{_rows_html(table, labelled_rows)}
<script type="application/json" id="data">{html.escape(data)}</script>
<script>{SCRIPT}</script>
</body></html>
"""
    path.write_text(page)
