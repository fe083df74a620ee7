"""One command per results page: its tables, paired CSVs, declared families, figures and extras
regenerated from its sweep's output, then its words checked against the new rows (issue 52).

    python scripts/make_page.py fairness_synthetic [--out outputs/sweeps/fairness-synthetic]
    python scripts/make_page.py --list

A page (``docs/results/<page>/report.md``) is hand-written around generated blocks::

    <!-- generated: result -->            the report's tables, the declared selection (validation mean, the
    ...                                   page's declared iterate: the paper's)
    <!-- /generated: result -->

and ``result-worst10`` (the worst-10 % selection), ``result-<iterate>`` / ``result-worst10-<iterate>``
(the other iterate), ``paired`` (the paired tables, Holm over each declared family:
``report --restat --sweep``). The recipe of each page (:data:`PAGES`) names its sweep file, baselines,
selections and extras. The steps, each the published command's code:

1. ``python -m fedpcd_app.report OUT [--objective o] [--iterate i]`` for every selection (``report*.csv``,
   the tables), then ``--baseline b`` for each baseline (``report_paired[_worst10][_<iterate>]_vs_<b>.csv``);
2. ``python -m fedpcd_app.report --restat PAGE --sweep SWEEP`` (the declared primary family and the
   exploratory one, the TOST corrected alike);
3. ``python -m fedpcd_app.figures PAGE --page [--frontier]`` (per setting, validation only) and, for pages
   with per-run figures, ``python -m fedpcd_app.figures OUT --out PAGE --baseline b``;
4. extras: ``scripts/synthetic_tables.py OUT --csv PAGE/stats.csv --curves PAGE/curves.png``,
   ``scripts/federage_supplement.py OUT > PAGE/supplement.md``;
5. ``python -m fedpcd_app.report --check-wording PAGE/report.md``: the page's sentences against the new
   rows (exit 1 when one no longer holds: its prose is then to be rewritten from the rows).

A page gaining methods (issue 54: four fairness baselines) reruns its sweep (``python -m fedpcd_app.sweep
SWEEP --out OUT``: the finished runs are kept) and this one command.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "docs" / "results"


@dataclasses.dataclass(frozen=True)
class Recipe:
    sweep: str  # run_configs/sweeps/<file>
    out: str  # the sweep's default output folder
    baselines: tuple[str, ...]
    objectives: tuple[str, ...] = ("mean",)
    iterates: tuple[str, ...] = ("",)  # the first is the declared one ("": each run's own)
    frontier: bool = False
    stats: bool = False  # stats.csv and curves.png (scripts/synthetic_tables.py)
    supplement: bool = False  # supplement.md (scripts/federage_supplement.py)
    run_figures: str = ""  # the baseline of the per-run figures (<setting>_*.png), "" = none


PAGES = {
    "fairness_synthetic": Recipe("fairness_synthetic.toml", "outputs/sweeps/fairness-synthetic",
                                 ("fedavg-uniform", "fedavg-data-size", "fedpcd"), ("mean", "worst10"),
                                 ("last", "averaged"), frontier=True, stats=True),
    "federage_synthetic": Recipe("federage_synthetic.toml", "outputs/sweeps/federage-synthetic",
                                 ("fedavg", "federage"), ("mean",), ("averaged", "last"), stats=True),
    "federage_table1_digits": Recipe("federage_table1_digits.toml", "outputs/sweeps/federage-table1-digits",
                                     ("fedavg", "federage"), ("mean",), ("averaged", "last"), supplement=True,
                                     run_figures="fedavg"),
    "fedpcd_ablation_digits": Recipe("fedpcd_ablation_digits.toml", "outputs/sweeps/fedpcd-ablation-digits",
                                     ("fedavg-data-size", "fedavg-uniform", "fedpcd"), ("mean",), ("last",),
                                     run_figures="fedavg-data-size"),
}


def block(text: str, name: str, content: str) -> str:
    """``text`` with its generated block ``name`` replaced by ``content`` (ValueError when absent)."""
    pat = re.compile(rf"(<!-- generated: {re.escape(name)} -->\n).*?(<!-- /generated: {re.escape(name)} -->)", re.S)
    if not pat.search(text):
        raise ValueError(f"the page has no block <!-- generated: {name} --> ... <!-- /generated: {name} -->")
    return pat.sub(lambda m: m.group(1) + content.strip("\n") + "\n" + m.group(2), text)


def _tables(md: str) -> str:
    """A report.md's tables as a page block: its title line dropped, its headings one level down."""
    lines = md.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join(("#" + line) if line.startswith("## ") else line for line in lines).strip()


def make(page: str, out: Path | None = None, check: bool = True, dest: Path | None = None,
         recipe: Recipe | None = None) -> list[str]:
    """Regenerate ``docs/results/<page>`` (or ``dest``) from its sweep output (see the module doc); the
    problems the claim checker finds in its report.md afterwards."""
    from fedpcd_app.analysis import claims, figures, report

    recipe = recipe or PAGES[page]
    out = Path(out or ROOT / recipe.out)
    dest = Path(dest or RESULTS / page)
    sweep = Path(recipe.sweep) if Path(recipe.sweep).is_absolute() else ROOT / "run_configs" / "sweeps" / recipe.sweep
    text = (dest / "report.md").read_text()
    for old in dest.glob("report*.csv"):
        old.unlink()
    declared = recipe.iterates[0]
    for objective in recipe.objectives:
        for iterate in recipe.iterates:
            suffix = ("" if objective == "mean" else f"_{objective}") + (f"_{iterate}" if iterate != declared else "")
            md, csv_path = report.report(out, objective=objective, iterate=iterate or None)
            shutil.copy(csv_path, dest / f"report{suffix}.csv")
            name = "result" + ("" if objective == "mean" else f"-{objective}") + (
                f"-{iterate}" if iterate != declared else "")
            if f"<!-- generated: {name} -->" in text:
                text = block(text, name, _tables(md.read_text()))
            for baseline in recipe.baselines:
                report.report(out, baseline=baseline, objective=objective, iterate=iterate or None)
                shutil.copy(out / f"report_paired{suffix}.csv", dest / f"report_paired{suffix}_vs_{baseline}.csv")
    report.restat(dest, sweep=sweep)
    text = block(text, "paired", report.render_paired(dest))
    (dest / "report.md").write_text(text)
    for old in list(dest.glob("forest*.png")) + list(dest.glob("pareto*.png")) + list(dest.glob("frontier*.png")):
        old.unlink()
    figures.page_figures(dest, frontier=recipe.frontier)
    if recipe.run_figures:
        figures.make_figures(out, dest, recipe.run_figures)
        for extra in ("forest.png", "pareto.png"):  # make_figures adds the page figures of `out`: not these
            (dest / extra).unlink(missing_ok=True)
        figures.page_figures(dest, frontier=recipe.frontier)
    if recipe.stats:
        sys.path.insert(0, str(ROOT / "scripts"))
        import synthetic_tables as tables

        every, _, _ = tables.build(out)
        tables.write_csv(every, dest / "stats.csv")
        tables.curves_figure([r for r in every if r["chosen"]], dest / "curves.png", out.name)
    if recipe.supplement:
        sys.path.insert(0, str(ROOT / "scripts"))
        import federage_supplement

        body = federage_supplement.main(str(out))
        (dest / "supplement.md").write_text(f"# {report.title_of(out)}: supplement\n\nMade by `python "
                                            f"scripts/make_page.py {page}` (scripts/federage_supplement.py) from "
                                            f"the same runs as report.md.\n\n{body}\n")
    if not check:
        return []
    problems, _ = claims.check_page(dest / "report.md")
    return [f"{dest / 'report.md'}:{p.line}: {p.why}: {p.sentence}" for p in problems]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page", nargs="?", help="a page folder of docs/results (--list names them)")
    ap.add_argument("--out", default=None, help="the sweep's output folder (default: the recipe's)")
    ap.add_argument("--list", action="store_true", help="the pages this script makes, with their sweep files")
    ap.add_argument("--no-check", action="store_true", help="skip the claim check at the end")
    args = ap.parse_args(argv)
    if args.list or not args.page:
        for name, r in PAGES.items():
            print(f"{name}: run_configs/sweeps/{r.sweep} -> {r.out}")
        return 0 if args.list else 2
    if args.page not in PAGES:
        print(f"error: no recipe for {args.page!r} (pages: {', '.join(PAGES)})", file=sys.stderr)
        return 2
    problems = make(args.page, Path(args.out) if args.out else None, not args.no_check)
    print("\n".join(problems) if problems else f"docs/results/{args.page}: regenerated; every claim holds")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
