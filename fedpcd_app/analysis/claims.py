"""The claim checker of a results page (issue 52): every sentence that states a direction, a
magnitude, a significance, an equivalence or a p-value is parsed into claims — which methods,
which metric and setting, which direction, which number — and each claim is checked against that
pair's row of the page's paired CSVs (or, for an absolute accuracy, the method's rows of the page's
other CSVs; for a number quoted from a paper, the paper's text: :func:`papers_dir`).

    python -m fedpcd_app.report --check-wording PAGE.md      # exit 1 on a claim its rows do not support

What a page's words are checked against (:func:`page_context`): every CSV beside the page (and in
the folders of the pages it links, for the results index, section by section), read as rows; a
paired CSV (``mean_difference`` column) gives the comparisons, with its selection (objective and
iterate: its ``objective`` / ``iterate`` columns, else the file's name) and its corrected p-values
(``p_holm_family`` / ``tost_p_holm_family`` of ``report --restat``, else ``p_holm_page``, else
``p_holm``).

Sentences (:func:`fedpcd_app.analysis.stats.sentences`: code, indented blocks and tables skipped;
headings skipped too). A sentence is a *claim sentence* when it holds a difference in pp, a p-value
(``p_holm``, ``TOST p``, ``p = …``, a sign test), a count of seeds (``9/10 seeds``, ``every seed``),
a verdict word (significant, equivalent, tie, on par, inconclusive, exploratory), a strong
comparative (beats, outperforms, leads, trails, superior, inferior, "the best method"), or a
direction word (above, below, higher, lower, better, worse, …) or an accuracy in % beside a method.
Each is parsed:

* **Methods** by their entry names (as the CSVs name them, in backticks or not) and aliases
  (``data-size FedAvg`` for ``fedavg-data-size``, ``FedeRage`` for ``federage``, ...; a page adds its
  own with ``<!-- claim-aliases: q = 1 = qffl-q1; q = 0 = fedavg-q0 -->``). A method name the page has
  no rows for (SCAFFOLD on a page without it) fails the sentence, except where it quotes a paper.
* **Comparisons**: ``A − B``, ``A against / vs / versus / compared with / relative to B``, ``A
  above / below / higher than / lower than / better than / worse than / ahead of / behind B``;
  a clause opening with ``− B`` or ``against B`` keeps the previous comparison's ``A``. Each
  comparison's scope runs to the next one; a number, a p-value, a verdict or a direction word in it
  belongs to it.
* **Metric** (ā / mean accuracy / average, W₁₀ / worst 10 %, σ_c / spread, B₁₀, variance, Jain,
  central): the one next to each number, else the scope's, else the sentence's; a comparison of
  more than one metric with one p-value must hold for each.
* **Setting**: a setting name of the CSVs (or a page alias, ``<!-- claim-settings: Synthetic(1,1)
  skewed = s11-skewed -->``) in the scope, the sentence, or the section heading above; a page of one
  setting needs none. A sentence whose numbers cannot be given one setting fails.
* **Selection**: the declared one (validation mean, the page's declared iterate) unless the sentence
  says "worst-10 % selection" / "selection on (the validation) worst-10 %" or "averaged iterate" /
  "last iterate".

Checks (:func:`check`), each against the one row found, in the comparison's orientation (A − B is
−(B − A)): the difference in pp (to the decimals cited), its 95 % interval ``[lo, hi]``, ``p_holm``
(the row's corrected p), ``TOST p`` (raw) and ``TOST p_holm`` (corrected), a t-test / raw p, the
sign-test p, ``d_z``, a seed count (``higher on 9/10 seeds``, ``lower on …``, ``better on …``, or,
without a word, in the direction of the difference); a verdict word must be the row's verdict
(``significant`` only for a significant row, ``inconclusive`` only for an inconclusive one,
``equivalent`` / ``tie`` / ``on par`` only when the corrected TOST is below 0.05, ``exploratory``
only for a row of the exploratory family or of fewer than five seeds), a negated one (not, no,
never, none, nor, without, no longer; ``insignificant``, ``non-significant``) its opposite; a
direction word must have the difference's sign, and a strong comparative (beats, outperforms,
leads, trails, superior, inferior) also needs a significant row: no qualifier excuses it. An
absolute accuracy beside a method must be one of that method's numbers in the page's CSVs (to the
decimals cited). A sentence that quotes a paper (``paper``, ``quoted``) must cite its table or
figure, and every decimal number in it that is not one of ours must be in that paper's text; so must
every decimal of a table column headed ``paper`` (a cell saying its numbers are "not checked", quoted by
a secondary source, must still cite its table).

A page's generated blocks (``<!-- generated: name -->`` … ``<!-- /generated: name -->``: the report's
tables and their boilerplate, written by ``scripts/make_page.py`` from the CSVs) are not prose and are
skipped. A claim sentence that cannot be parsed into claims that all hold — a number without its pair, an
unlabelled ``p = x``, "the best method" — fails, unless it carries an explicit exemption right
after it, ``<!-- claim-exempt: why -->``: the checker counts those (:func:`check_text` returns
them; ``tests/test_claims.py`` pins each page's count). A sentence of definitions (a threshold
``p < 0.05`` or ``below 0.05`` with no method named) states no claim.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from fedcore.config import APP
from fedpcd_app.analysis import stats

ALPHA = stats.ALPHA

# -- vocabulary ------------------------------------------------------------------------------------
# Display names of registered methods (and of methods a page may quote from a paper): a name here that
# a page has no rows for is "a method the page lacks".
DISPLAY = {
    "fedavg": ["FedAvg"], "fedprox": ["FedProx"], "scaffold": ["SCAFFOLD", "Scaffold"], "federage": ["FedeRage"],
    "fedpcd": ["FedPCD"], "craft": ["CRAFT"], "qffl": ["q-FFL", "q-FedAvg", "qffl"], "afl": ["AFL"],
    "ditto": ["Ditto"], "fedmgda": ["FedMGDA+", "FedMGDA"], "fedfv": ["FedFV"], "fedlf": ["FedLF"],
    "fedheal": ["FedHEAL"], "fedpw": ["FedPW"], "fednova": ["FedNova"], "fedavgm": ["FedAvgM"],
    "fedadam": ["FedAdam"], "fedadagrad": ["FedAdagrad", "FedAdaGrad"], "fedyogi": ["FedYogi"],
    "config": ["ConFIG"], "term": ["TERM"], "propfair": ["PropFair"], "fedfa": ["FedFa"], "adafed": ["AdaFed"],
    "fedmdfg": ["FedMDFG"], "dqnfed": ["DQN-Fed"], "fedmc": ["FedMC+"], "fedmedian": ["FedMedian"],
    "krum": ["Krum"], "feddisco": ["FedDisco"],
}
WEIGHTING_WORDS = tuple(APP["fedavg-weighting"].choices)  # the words naming a weighting: data-size, uniform

METRICS = {  # metric key → patterns (regex) naming it
    "mean_acc": [r"ā", r"mean (?:client )?accuracy", r"\baverage\b", r"global accuracy"],
    "worst10_acc": [r"W₁₀", r"\bW10\b", r"worst[- ]10\s?%"],
    "std_acc": [r"σ_c", r"σ", r"client spread", r"\bspread\b", r"\bstd\b"],
    "best10_acc": [r"B₁₀", r"best[- ]10\s?%"],
    "variance": [r"\bvariance\b"],
    "jain": [r"\bJain"],
    "central_acc": [r"\bcentral\b"],
}
HIGHER_IS_BETTER = {"std_acc": False, "variance": False}

# selection context: which of a page's paired tables a sentence speaks of
WORST10_SELECTION = re.compile(r"worst-10\s?% selection|selection on (?:the )?(?:validation )?worst-10|"
                               r"selecting on (?:the )?(?:validation )?worst-10|objective worst10", re.I)
AVERAGED = re.compile(r"averaged iterate|θ̄", re.I)
LAST = re.compile(r"last iterate|last model|θ_T\b", re.I)

NUM = r"(\d+(?:\.\d+)?(?:e-?\d+)?)"
SIGNED = r"([+−-])\s?(\d+(?:\.\d+)?)"
PP = re.compile(SIGNED + r"\s*pp\b")
UNSIGNED_PP = re.compile(r"(?<![+−\-\d.])(\d+\.\d+)\s*pp\b")
CI = re.compile(r"\[\s*" + SIGNED + r"(?:\s*pp)?\s*,\s*" + SIGNED + r"(?:\s*pp)?\s*\]")
P_HOLM = re.compile(r"p_?\{?holm\}?\s*(=|<|≤|>|≥)\s*" + NUM + r"((?:\s*(?:,|and|/)\s*" + NUM + r")*)", re.I)
TOST_HOLM = re.compile(r"(?:TOST p_?holm|p_tost_holm|TOST,? p_holm)\s*(=|<|≤)\s*" + NUM + r"((?:\s*(?:,|and|/)\s*"
                       + NUM + r")*)", re.I)
TOST_RAW = re.compile(r"(?:TOST p(?!_)|p_tost(?!_)|TOST,? p(?!_))\s*(=|<|≤)\s*" + NUM + r"((?:\s*(?:,|and|/)\s*"
                      + NUM + r")*)", re.I)
SIGN_P = re.compile(r"sign[- ]test p\s*=\s*" + NUM + r"|p\s*=\s*" + NUM + r",?\s*(?:a\s+)?sign[- ]test", re.I)
T_P = re.compile(r"(?:t-test|raw|uncorrected) p\s*=\s*" + NUM, re.I)
BARE_P = re.compile(r"(?<![\w_])p\s*(=|<|≤)\s*" + NUM)
DZ = re.compile(r"d_z\s*=\s*" + SIGNED.replace(r"([+−-])", r"([+−-]?)"))
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}
_N = r"(\d+|two|three|four|five|six|seven|eight|nine|ten)"
SEEDS = re.compile(r"(?:(higher|lower|better|worse|above|below)\s+(?:on\s+)?)?"
                   rf"(?:(\d+)\s*/\s*(\d+)|(\d+) of (?:the )?(\d+)|every one of the {_N}|all (?:the )?{_N}|"
                   r"(?:on )?(every|each))\s+(?:paired\s+)?(?:seeds?|re-splits)\b", re.I)
PERCENT = re.compile(r"(?<![\w.+−-])(\d+\.\d+)(?:\s*±\s*(\d+\.\d+))?\s*%(?!²)")

VERDICTS = {
    "significant": re.compile(r"\b(?:in|non-?)?significan(?:t|tly|ce)\b", re.I),
    "equivalent": re.compile(r"\b(?:equivalent|equivalence|on par|ties|tied|a tie)\b(?!-)", re.I),
    "inconclusive": re.compile(r"\binconclusive\b", re.I),
    "exploratory": re.compile(r"\bexploratory\b", re.I),
}
STRONG_UP = re.compile(r"\b(?:beats?|beating|outperform(?:s|ed|ing)?|leads?|leading|superior|ahead of)\b", re.I)
STRONG_DOWN = re.compile(r"\b(?:trails?|trailing|inferior|behind)\b", re.I)
UP = re.compile(r"\b(?:above|higher|raises?|lifts?|exceeds?|gains?|improves?|better)\b", re.I)
DOWN = re.compile(r"\b(?:below|lower|lowers|falls?|drops?|worse|deficit|costs?|loses)\b", re.I)
IMPROVE_WORDS = {"better", "improves", "improve", "gain", "gains", "beats", "beat", "beating", "outperforms",
                 "outperform", "outperformed", "outperforming", "leads", "lead", "leading", "superior", "ahead of",
                 "worse", "costs", "cost", "deficit", "loses", "trails", "trail", "trailing", "inferior", "behind"}
NEGATION = re.compile(r"\b(?:not|no|never|none|nor|neither|without|cannot|isn't|aren't|doesn't|don't|no longer)\b|"
                      r"n't\b", re.I)
BEST = re.compile(r"\bthe best (?:method|rule|algorithm|aggregator)\b|\bbest overall\b", re.I)
PAPER = re.compile(r"\bpaper\b|\bquoted\b", re.I)
PAPER_REF = re.compile(r"\b(?:Table|Tables|Fig\.?|Figure|Figs\.?)\s*[IVX\d]+", re.I)
PAIR_WORDS = r"(?:\s[−–]\s|^[−–]\s|\s[−–]$|\s-\s|\bminus\b|\bagainst\b|\bvs\.?|\bversus\b|\bcompared with\b|" \
             r"\brelative to\b|" \
             r"\bover\b|\babove\b|\bbelow\b|\bhigher than\b|\blower than\b|\bbetter than\b|\bworse than\b|" \
             r"\bahead of\b|\bbehind\b|\bbeats?\b|\boutperforms?\b|\btrails?\b|\bleads?\b|\bexceeds?\b|" \
             r"\bwithin [±\d. pp]+ (?:of|by)\b|^\s*(?:and|,)\s*$)"
EXEMPT = re.compile(r"<!--\s*claim-exempt:\s*(.*?)\s*-->", re.S)
ALIASES = re.compile(r"<!--\s*claim-aliases:\s*(.*?)\s*-->", re.S)
SETTING_ALIASES = re.compile(r"<!--\s*claim-settings:\s*(.*?)\s*-->", re.S)
OWN_CSV = re.compile(r"<!--\s*claim-csv:\s*(.*?)\s*-->", re.S)  # a page whose rows are these CSVs of its folder
DEFINITION = re.compile(r"(?:<|below|under)\s*0\.05|means|is called|only when|needs|must|requires", re.I)


# -- the page's rows ---------------------------------------------------------------------------------
@dataclasses.dataclass
class Context:
    """What a page's sentences are checked against: its paired rows (each with ``objective`` and
    ``iterate``), every other CSV row (for absolute numbers), its method entries and settings, the
    page's own aliases, the declared selection (objective, iterate) and the papers' texts."""

    paired: list[dict[str, str]]
    other: list[dict[str, str]]
    methods: set[str]
    settings: list[str]
    aliases: dict[str, str] = dataclasses.field(default_factory=dict)
    setting_aliases: dict[str, str] = dataclasses.field(default_factory=dict)
    iterate: str = ""
    papers: dict[str, str] = dataclasses.field(default_factory=dict)


def _paired_selection(path: Path, row: dict[str, str]) -> tuple[str, str]:
    objective = row.get("objective") or ("worst10" if path.name.startswith("report_paired_worst10") else "mean")
    iterate = row.get("iterate") or next((it for it in ("last", "averaged") if f"_{it}" in path.stem), "")
    return objective, iterate


def read_folder(folder: Path, only: Sequence[str] = ()) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(paired rows, other rows) of every CSV in ``folder`` (``only``: of these file names alone)."""
    paired, other = [], []
    for path in sorted(folder.glob("*.csv")):
        if only and path.name not in only:
            continue
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            rows = list(reader)
        if "mean_difference" in (reader.fieldnames or []):
            for r in rows:
                objective, iterate = _paired_selection(path, r)
                paired.append({**r, "_objective": objective, "_iterate": iterate, "_file": path.name})
        else:
            other += [{**r, "_file": path.name} for r in rows]
    return paired, other


def papers_dir() -> Path | None:
    """The folder of the papers' texts this project was given (``000_*.txt`` … ``003_*.txt``, outside
    the repository): ``$FEDPCD_PAPERS``, else the ``papers`` folder of the ``shared`` folder beside the
    checkout (or beside its parent, for a worktree), else None (the paper checks then say so)."""
    if os.environ.get("FEDPCD_PAPERS"):
        return Path(os.environ["FEDPCD_PAPERS"])
    root = Path(__file__).resolve().parents[2]
    for up in (root.parent, root.parent.parent):
        cand = up.joinpath("shared", "papers")
        if cand.is_dir():
            return cand
    return None


def read_papers() -> dict[str, str]:
    """Paper id (``000`` … ``003``) → its text, with the README's names."""
    folder = papers_dir()
    if folder is None:
        return {}
    return {p.name[:3]: p.read_text(errors="replace") for p in sorted(folder.glob("[0-9][0-9][0-9]_*.txt"))}


PAPER_IDS = {"fedpcd": ("000", "001"), "craft": ("002",), "federage": ("003",)}


def _parse_pairs(text: str) -> dict[str, str]:
    """``alias = entry; ...`` (the last `` = `` with spaces around separates them: ``τ = 0 = tau=0``)."""
    out = {}
    for body in text:
        for item in body.split(";"):
            alias, sep, entry = item.rpartition(" = ")
            if not sep:
                alias, sep, entry = item.rpartition("=")
            if sep and alias.strip() and entry.strip():
                out[alias.strip()] = entry.strip()
    return out


def declared_iterate(paired: Sequence[dict[str, str]]) -> str:
    """The iterate a page declared (the one its unqualified sentences speak of): that of its paired CSVs
    named without an iterate (``scripts/make_page.py`` writes the declared iterate's
    ``report_paired[_worst10]_vs_<b>.csv`` and another iterate's ``report_paired[_worst10]_<iterate>_vs_<b>.csv``:
    a FedeRage page declares the averaged iterate and keeps the last beside it); without such files, the
    last iterate where the page has it, else the averaged one where it is all the page has."""
    plain = {r["_iterate"] for r in paired if r["_iterate"] and not any(
        f"_{it}" in Path(r.get("_file", "")).stem.split("_vs_")[0] for it in ("last", "averaged"))}
    if len(plain) == 1:
        return plain.pop()
    found = {r["_iterate"] for r in paired if r["_iterate"]}
    return "last" if "last" in found else ("averaged" if found == {"averaged"} else "")


def page_context(page: Path, text: str, folders: Iterable[Path] | None = None, iterate: str | None = None) -> Context:
    """The context of ``page`` (its text ``text``): the CSVs of ``folders`` (default: the page's own
    folder, and the folder of the same name beside it: ``robustness_digits.md`` → ``robustness_digits/``)."""
    only = [x.strip() for m in OWN_CSV.findall(text) for x in m.split(",") if x.strip()]
    if folders is None:
        folders = [page.parent] + ([page.with_suffix("")] if page.with_suffix("").is_dir() else [])
    else:
        only = []
    paired, other = [], []
    for folder in folders:
        p, o = read_folder(Path(folder), only)
        paired += p
        other += o
    methods = {r[k] for r in paired for k in ("method", "baseline") if r.get(k)}
    methods |= {r["method"] for r in other if r.get("method")}
    settings = list(dict.fromkeys(r.get("setting", "") for r in paired + other if r.get("setting")))
    if iterate is None:
        iterate = declared_iterate(paired)
    return Context(paired, other, methods, settings, _parse_pairs(ALIASES.findall(text)),
                   _parse_pairs(SETTING_ALIASES.findall(text)), iterate, read_papers())


# -- names -----------------------------------------------------------------------------------------------
def alias_table(ctx: Context) -> list[tuple[re.Pattern, list[str]]]:
    """(pattern, entries) of every way the page may name a method entry, longest first; an alias
    naming several entries (``FedAvg`` on a page of two FedAvg entries) is ambiguous."""
    names: dict[str, set[str]] = {}

    def add(alias: str, entry: str) -> None:
        names.setdefault(alias, set()).add(entry)

    for entry in ctx.methods:
        add(entry, entry)
        base, _, rest = entry.partition("-")
        for key, shown in DISPLAY.items():
            if entry == key:
                for d in shown:
                    add(d, entry)
            if base == key and rest:
                for d in shown:
                    add(f"{rest} {d}", entry)
                    add(f"{d} ({rest})", entry)
                    if rest in WEIGHTING_WORDS:
                        add(f"{d} {rest}", entry)
    for fam, shown in DISPLAY.items():  # a display name alone: its entry, or every entry of it (ambiguous)
        entries = [e for e in ctx.methods if e == fam or e.startswith(fam + "-")]
        if len(entries) > 1 and fam not in entries:
            for d in shown:
                names.setdefault(d, set()).update(entries)
    for alias, entry in ctx.aliases.items():
        names[alias] = {entry}
    for alias in list(names):  # a sentence may start with it: "Uniform FedAvg"
        if alias[:1].islower():
            names.setdefault(alias[0].upper() + alias[1:], set()).update(names[alias])
    out = []
    for alias in sorted(names, key=len, reverse=True):
        esc = re.escape(alias)
        pat = re.compile(rf"`{esc}`|(?<![\w`+-]){esc}(?![\w`+]|-(?!\s))")
        out.append((pat, sorted(names[alias])))
    return out


def foreign_methods(sentence: str, ctx: Context) -> list[str]:
    """Known method names the sentence uses that the page has no rows for."""
    out = []
    clean = sentence
    for pat, _ in alias_table(ctx):
        clean = pat.sub(" ", clean)
    for key, shown in DISPLAY.items():
        if any(e == key or e.startswith(key + "-") for e in ctx.methods):
            continue
        for d in shown:
            if re.search(rf"(?<![\w-]){re.escape(d)}(?![\w+])", clean):
                out.append(d)
    return out


@dataclasses.dataclass
class Mention:
    start: int
    end: int
    entries: list[str]


def mentions(sentence: str, ctx: Context) -> list[Mention]:
    """Method mentions in order, longest alias first, none overlapping."""
    taken: list[tuple[int, int]] = []
    out = []
    for pat, entries in alias_table(ctx):
        for m in pat.finditer(sentence):
            if any(m.start() < b and a < m.end() for a, b in taken):
                continue
            taken.append((m.start(), m.end()))
            out.append(Mention(m.start(), m.end(), entries))
    return sorted(out, key=lambda m: m.start)


def metric_spans(sentence: str) -> list[tuple[int, str]]:
    """(position, metric key) of every metric named (not the worst-10 % *selection*)."""
    blank = WORST10_SELECTION.sub(lambda m: " " * len(m.group()), sentence)
    blank = re.sub(r"worst-10\s?% (?:objective|selection)", lambda m: " " * len(m.group()), blank)
    out, taken = [], []
    for key, pats in METRICS.items():
        for pat in pats:
            for m in re.finditer(pat, blank, re.I if pat[0] != "σ" else 0):
                if any(m.start() < b and a < m.end() for a, b in taken):
                    continue
                taken.append((m.start(), m.end()))
                out.append((m.start(), key))
    return sorted(out)


def setting_spans(sentence: str, ctx: Context) -> list[tuple[int, str]]:
    out = []
    names = {s: s for s in ctx.settings}
    names.update(ctx.setting_aliases)
    for alias in sorted(names, key=len, reverse=True):
        if alias == "default":
            continue
        for m in re.finditer(rf"`{re.escape(alias)}`|(?<![\w-]){re.escape(alias)}(?![\w-])", sentence):
            if not any(a <= m.start() < a + len(al) for a, al in ((p, q) for p, q in out)):
                out.append((m.start(), names[alias]))
    return sorted(set(out))


# -- one sentence --------------------------------------------------------------------------------------
@dataclasses.dataclass
class Pair:
    a: list[str]
    b: list[str]
    start: int  # where its scope starts
    end: int = 10 ** 9


def pairs(sentence: str, ms: list[Mention], inherit: list[str] | None) -> list[Pair]:
    """The comparisons of a sentence in order (see the module doc)."""
    out: list[Pair] = []
    i = 0
    while i < len(ms):
        m = ms[i]
        if i + 1 < len(ms):
            gap = sentence[m.end:ms[i + 1].start]
            if len(gap) <= 60 and re.search(PAIR_WORDS, gap) and not re.search(r"[;:]", gap.strip(" ,")[:-1] or ""):
                if re.fullmatch(r"\s*(?:and|,)\s*", gap):  # "A and B are equivalent": a pair; "A, B and C": a list
                    listed = i + 2 < len(ms) and re.fullmatch(r"\s*(?:and|,)\s*",
                                                              sentence[ms[i + 1].end:ms[i + 2].start])
                    tie = VERDICTS["equivalent"].search(sentence, ms[i + 1].end) or re.search(
                        r"\bwithin\b", sentence[ms[i + 1].end:])
                    if listed or not tie:
                        i += 1
                        continue
                out.append(Pair(m.entries, ms[i + 1].entries, m.start))
                i += 2
                continue
        before = sentence[max(0, m.start - 12):m.start]
        subject = out[-1].a if out else inherit
        if subject and re.search(r"(?:(?:^|\s)[−–]|\bagainst|\bvs\.?|\bversus|\bover)\s*$", before):
            out.append(Pair(subject, m.entries, m.start - len(before)))
        i += 1
    for j, p in enumerate(out):
        p.end = out[j + 1].start if j + 1 < len(out) else len(sentence)
    if out:
        out[0].start = 0
    return out


def _negated(sentence: str, pos: int) -> bool:
    """A negation among the four words before ``pos`` (in the same clause)."""
    head = re.split(r"[;,:(]", sentence[:pos])[-1]
    words = head.split()[-5:]
    return bool(NEGATION.search(" ".join(words)))


def _close(cited: str, value: float, op: str = "=") -> bool:
    return stats._close(cited, value, op)


def _num(row: dict, key: str) -> float:
    try:
        return float(row.get(key, "") or "nan")
    except ValueError:
        return math.nan


def p_adjusted(row: dict) -> float:
    for key in ("p_holm_family", "p_holm_page", "p_holm"):
        if key in row and row[key] != "":
            return _num(row, key)
    return math.nan


def tost_adjusted(row: dict) -> float:
    for key in ("tost_p_holm_family", "tost_p_holm"):
        if key in row and row[key] != "":
            return _num(row, key)
    return math.nan


def verdict_of(row: dict) -> str:
    n = int(_num(row, "num_seeds")) if not math.isnan(_num(row, "num_seeds")) else 0
    return stats.verdict(n, p_adjusted(row), tost_adjusted(row))


@dataclasses.dataclass
class Found:
    row: dict
    sign: int  # +1: the row is A − B; −1: it is B − A


def find_rows(ctx: Context, a: list[str], b: list[str], metric: str, setting: str | None,
              objective: str, iterate: str) -> list[Found]:
    out = []
    for r in ctx.paired:
        if r.get("metric") != metric or r["_objective"] != objective:
            continue
        if (r["_iterate"] or "") != (iterate or "") and r["_iterate"]:
            continue
        if setting is not None and r.get("setting") != setting:
            continue
        if r.get("method") in a and r.get("baseline") in b:
            out.append(Found(r, 1))
        elif r.get("method") in b and r.get("baseline") in a:
            out.append(Found(r, -1))
    seen, uniq = set(), []
    for f in out:  # one comparison appears in several CSVs (each baseline's)
        key = (f.row.get("setting"), frozenset((f.row.get("method"), f.row.get("baseline"))), f.row.get("metric"))
        if key not in seen:
            seen.add(key)
            uniq.append(f)
    return uniq


def _percent(metric: str) -> float:
    return 1.0 if metric == "variance" else 100.0


def _values(m: re.Match, first: int, rest: int) -> list[str]:
    return [m.group(first)] + re.findall(NUM, m.group(rest) or "")


@dataclasses.dataclass
class Item:
    """A claim found in a sentence: what it is, where, and its text."""

    kind: str
    pos: int
    text: str
    data: tuple = ()


def items(sentence: str) -> list[Item]:
    out: list[Item] = []
    for m in CI.finditer(sentence):
        out.append(Item("ci", m.start(), m.group(), (m.group(1), m.group(2), m.group(3), m.group(4))))
    ci_spans = [(i.pos, i.pos + len(i.text)) for i in out]
    for m in PP.finditer(sentence):
        if any(a <= m.start() < b for a, b in ci_spans):
            continue
        out.append(Item("pp", m.start(), m.group(), (m.group(1), m.group(2), m.end())))
    for m in UNSIGNED_PP.finditer(sentence):
        if any(a <= m.start() < b for a, b in ci_spans):
            continue
        out.append(Item("pp_abs", m.start(), m.group(), (m.group(1), m.end())))
    for m in TOST_HOLM.finditer(sentence):
        out.append(Item("tost_holm", m.start(), m.group(), (m.group(1), *_values(m, 2, 3))))
    tost_spans = [(i.pos, i.pos + len(i.text)) for i in out if i.kind == "tost_holm"]
    for m in TOST_RAW.finditer(sentence):
        if not any(a <= m.start() < b for a, b in tost_spans):
            out.append(Item("tost", m.start(), m.group(), (m.group(1), *_values(m, 2, 3))))
    for m in P_HOLM.finditer(sentence):
        if any(a <= m.start() < b for a, b in tost_spans) or sentence[max(0, m.start() - 5):m.start()].lower() \
                .endswith(("tost ", "tost, ")):
            continue
        out.append(Item("p_holm", m.start(), m.group(), (m.group(1), *_values(m, 2, 3))))
    for m in SIGN_P.finditer(sentence):
        out.append(Item("sign_p", m.start(), m.group(), (m.group(1) or m.group(2),)))
    for m in T_P.finditer(sentence):
        out.append(Item("t_p", m.start(), m.group(), (m.group(1),)))
    labelled = [(i.pos, i.pos + len(i.text)) for i in out if i.kind in ("sign_p", "t_p", "tost", "tost_holm")]
    for m in BARE_P.finditer(sentence):
        if any(a <= m.start() < b for a, b in labelled):
            continue
        out.append(Item("bare_p", m.start(), m.group(), (m.group(1), m.group(2))))
    for m in DZ.finditer(sentence):
        out.append(Item("dz", m.start(), m.group(), (m.group(1), m.group(2))))
    for m in SEEDS.finditer(sentence):
        word = (m.group(1) or "").lower()
        if m.group(2):
            k, n = int(m.group(2)), int(m.group(3))
        elif m.group(4):
            k, n = int(m.group(4)), int(m.group(5))
        elif m.group(6) or m.group(7):
            word_n = (m.group(6) or m.group(7)).lower()
            k = n = WORDS.get(word_n) or int(word_n)
        else:
            k = n = -1  # every seed: n from the row
        if not word:  # "higher on 9/10 seeds" with the word before "on"
            pre = re.search(r"(higher|lower|better|worse|above|below)\s+(?:on\s+)?(?:\S+\s+){0,2}$",
                            sentence[max(0, m.start() - 30):m.start()], re.I)
            word = pre.group(1).lower() if pre else ""
        out.append(Item("seeds", m.start(), m.group(), (word, k, n)))
    for m in PERCENT.finditer(sentence):
        out.append(Item("percent", m.start(), m.group(), (m.group(1), m.group(2))))
    for name, pat in VERDICTS.items():
        for m in pat.finditer(sentence):
            word = m.group().lower()
            neg = _negated(sentence, m.start()) != word.startswith(("insignifican", "nonsignifican", "non-signifi"))
            out.append(Item("verdict", m.start(), m.group(), (name, neg)))
    for pat, strong, up in ((STRONG_UP, True, True), (STRONG_DOWN, True, False), (UP, False, True),
                            (DOWN, False, False)):
        for m in pat.finditer(sentence):
            if strong is False and any(i.kind == "direction" and i.pos == m.start() for i in out):
                continue
            if m.group().lower() in ("above", "below") and (
                    re.match(r"\s*(?:[).:;,]|$)", sentence[m.end():])
                    or re.search(r"(?:table|figure|section|see|shown|listed|as|the|\()\s*$", sentence[:m.start()],
                                 re.I)):
                continue  # "the table above", "(below)": a place on the page, not a direction
            word = m.group().lower()
            out.append(Item("direction", m.start(), m.group(),
                            (up, strong, _negated(sentence, m.start()), word in IMPROVE_WORDS)))
    return sorted(out, key=lambda i: i.pos)


CLAIM_KINDS = {"pp", "pp_abs", "ci", "p_holm", "tost", "tost_holm", "sign_p", "t_p", "bare_p", "dz", "seeds",
               "verdict", "direction", "percent"}


@dataclasses.dataclass
class Problem:
    line: int
    sentence: str
    why: str


def _selection(sentence: str, ctx: Context) -> tuple[str, str]:
    objective = "worst10" if WORST10_SELECTION.search(sentence) else "mean"
    iterate = ctx.iterate
    if AVERAGED.search(sentence) and not LAST.search(sentence):
        iterate = "averaged"
    elif LAST.search(sentence) and not AVERAGED.search(sentence):
        iterate = "last"
    return objective, iterate


def _metric_near(pos: int, end: int, metrics: list[tuple[int, str]], scope: tuple[int, int]) -> str | None:
    """The metric named right after a number (within 12 characters), else right before it."""
    after = [k for p, k in metrics if end <= p <= end + 12 and scope[0] <= p < scope[1]]
    if after:
        return after[0]
    before = [k for p, k in metrics if pos - 14 <= p < pos and scope[0] <= p]
    return before[-1] if before else None


def check_sentence(sentence: str, ctx: Context, default_setting: str | None,
                   inherit: list[str] | None = None) -> tuple[list[str], list[str] | None]:
    """(the reasons the sentence fails, the subject it leaves for the next sentence's ``− B``)."""
    sentence = sentence.replace("**", "").replace("__", "")  # emphasis is not a claim
    found = items(sentence)
    ms = mentions(sentence, ctx)
    why: list[str] = []
    quoting = bool(PAPER.search(sentence))
    foreign = foreign_methods(sentence, ctx)
    claim = [i for i in found if i.kind in CLAIM_KINDS]
    if not claim and not BEST.search(sentence):
        return why, inherit
    if all(i.kind == "direction" and not i.data[1] for i in claim) and not BEST.search(sentence) \
            and not pairs(sentence, ms, inherit):
        return why, inherit  # "the table above": a direction word without a comparison is no claim
    if foreign and not quoting:
        why.append(f"names {', '.join(foreign)}, which this page has no rows for")
    if BEST.search(sentence):
        why.append("'the best method' is no one pair's claim: name the pair and its row")
    ps = pairs(sentence, ms, inherit)
    metrics = metric_spans(sentence)
    settings = setting_spans(sentence, ctx)
    objective, iterate = _selection(sentence, ctx)
    sentence_setting = {s for _, s in settings}
    if not ps:
        rule = not ms and DEFINITION.search(sentence)
        checked = set()  # a sign-test p stated of k/n seeds: its arithmetic is checked, no row needed
        for i in claim:
            if i.kind == "seeds" and i.data[1] >= 0:
                sp = [x for x in found if x.kind in ("sign_p", "bare_p")]
                for x in sp:
                    value = x.data[0] if x.kind == "sign_p" else x.data[1]
                    checked.add(id(x))
                    if not _close(value, stats.sign_test_p(i.data[1], i.data[2])):
                        why.append(f"the sign-test p of {i.data[1]}/{i.data[2]} seeds is "
                                   f"{stats.sign_test_p(i.data[1], i.data[2]):.4g}, not {value}")
        claim_nums = [i for i in claim if i.kind not in ("verdict", "direction", "percent", "seeds", "bare_p",
                                                         "p_holm") and id(i) not in checked]
        percents = [i for i in claim if i.kind == "percent"]
        for i in percents:
            near = [m for m in ms if abs(m.start - i.pos) < 80]
            if near and (_metric_near(i.pos, i.pos + len(i.text), metrics, (0, len(sentence)))
                         or re.search(r"accuracy|mean|average|worst|best", sentence[i.pos:i.pos + 30], re.I)):
                problem = _check_percent(i, near, ctx, quoting)
                if problem:
                    why.append(problem)
        ours = [i for i in claim_nums if not (quoting and i.kind in ("pp", "pp_abs"))]  # a quoted gain: the paper's
        if quoting:
            why += _check_paper(sentence, [], ctx)
        if (ours or any(i.kind in ("p_holm", "bare_p") and id(i) not in checked for i in claim)) and not rule:
            why.append("a claim with a number but no comparison (A − B) it belongs to")
        elif ms and any(i.kind == "verdict" for i in claim) and not rule and not quoting:
            why.append("a verdict without the comparison (A − B) it is about")
        elif ms and any(i.kind == "direction" and i.data[1] for i in claim):
            why.append("a strong comparative without the comparison (A − B) it is about")
        return why, inherit
    bound: set[int] = set()
    for p in ps:
        scope = (p.start, p.end)
        mine = [i for i in claim if scope[0] <= i.pos < scope[1]]
        here_settings = {s for pos, s in settings if scope[0] <= pos < scope[1]}
        setting_opts = here_settings or sentence_setting or ({default_setting} if default_setting else set())
        if not setting_opts and len(ctx.settings) <= 1:
            setting_opts = {ctx.settings[0] if ctx.settings else ""}
        scope_metrics = [k for pos, k in metrics if scope[0] <= pos < scope[1]]
        nums = [i for i in mine if i.kind in ("pp", "pp_abs", "ci", "dz")]
        ps_values = [i for i in mine if i.kind in ("p_holm", "tost", "tost_holm", "t_p", "sign_p", "seeds",
                                                   "bare_p")]
        words = [i for i in mine if i.kind in ("verdict", "direction")]
        if not (nums or ps_values or words):
            continue
        # each number's metric; the scope's metrics in order for the p-values
        metric_of: dict[int, str] = {}
        for i in nums:
            end = i.pos + len(i.text)
            prev = [x for x in nums if x.kind in ("pp", "pp_abs") and x.pos < i.pos]
            right_after = prev and i.pos - (prev[-1].pos + len(prev[-1].text)) < 12
            if i.kind == "ci" and right_after and id(prev[-1]) in metric_of:
                k = metric_of[id(prev[-1])]  # an interval right after its difference: that difference's metric
            else:
                k = _metric_near(i.pos, end, metrics, scope) or (scope_metrics[0] if len(set(scope_metrics)) == 1
                                                                  else None)
            if k is None:
                why.append(f"'{i.text}': which metric (ā, W₁₀, σ_c, ...) is not said")
                continue
            metric_of[id(i)] = k
        order = list(dict.fromkeys([metric_of[id(i)] for i in nums if id(i) in metric_of] + scope_metrics))
        if not order:
            order = ["mean_acc"] if not scope_metrics and ctx.paired and all(
                r.get("metric") == "mean_acc" for r in ctx.paired) else order
        if not order:
            why.append(f"comparison {'/'.join(p.a)} − {'/'.join(p.b)}: which metric is not said")
            continue
        rows_by: dict[str, Found | None] = {}
        for k in order:
            cands = []
            for s in setting_opts or {None}:
                cands += find_rows(ctx, p.a, p.b, k, s, objective, iterate)
            rows_by[k] = cands[0] if len(cands) == 1 else None
            if len(cands) != 1:
                what = (f"{'/'.join(p.a)} − {'/'.join(p.b)} ({METRIC_TITLE.get(k, k)}"
                        + (f", {'/'.join(sorted(x for x in setting_opts if x))}" if setting_opts else "") + ")")
                if not cands:
                    why.append(f"no row of {what} on this page under the {objective} selection"
                               + (f", {iterate} iterate" if iterate else ""))
                else:
                    why.append(f"{what} matches {len(cands)} rows: name the setting or the entries")
        for i in nums:
            k = metric_of.get(id(i))
            f = rows_by.get(k) if k else None
            if f is None:
                continue
            bound.add(id(i))
            scale = _percent(k)
            md = f.sign * _num(f.row, "mean_difference") * scale
            if i.kind == "pp":
                cited = ("-" if i.data[0] in "−-" else "") + i.data[1]
                if not _close(cited.lstrip("-"), abs(md)) or (md < 0) != cited.startswith("-") and abs(md) >= 0.005:
                    why.append(f"{i.text.strip()} {METRIC_TITLE.get(k, k)}: the row gives {md:+.2f}")
            elif i.kind == "pp_abs":
                if not _close(i.data[0], abs(md)):
                    why.append(f"{i.text.strip()} {METRIC_TITLE.get(k, k)}: the row gives {abs(md):.2f}")
            elif i.kind == "ci":
                lo, hi = _num(f.row, "ci95_low") * scale, _num(f.row, "ci95_high") * scale
                if f.sign < 0:
                    lo, hi = -hi, -lo
                got = [float(("-" if s in "−-" else "") + v) for s, v in (i.data[:2], i.data[2:])]
                texts = [("-" if s in "−-" else "") + v for s, v in (i.data[:2], i.data[2:])]
                if not all(_close(t.lstrip("-"), abs(v)) and (v < 0) == (g < 0 or abs(v) < 0.005) or
                           (abs(v) < 0.005 and _close(t.lstrip("-"), abs(v)))
                           for t, v, g in zip(texts, (lo, hi), got)):
                    why.append(f"interval {i.text} {METRIC_TITLE.get(k, k)}: the row gives [{lo:+.2f}, {hi:+.2f}]")
            elif i.kind == "dz":
                dz = f.sign * _num(f.row, "effect_dz")
                if not _close(i.data[1], abs(dz)) or (dz < 0) != (i.data[0] in "−-"):
                    why.append(f"{i.text}: the row gives d_z = {dz:+.2f}")
        # p-values: one per metric in order, or one for all
        for i in [x for x in ps_values if x.kind in ("p_holm", "tost", "tost_holm")]:
            op, values = i.data[0], list(i.data[1:])
            before = [x for x in nums if x.kind in ("pp", "pp_abs") and x.pos < i.pos and id(x) in metric_of
                      and i.pos - x.pos < 40 and "(" not in sentence[x.pos:i.pos].replace("(p", "")]
            if len(values) == 1 and before and len(order) > 1 and not any(
                    y.kind in ("p_holm", "tost", "tost_holm") and before[-1].pos < y.pos < i.pos for y in ps_values):
                targets = [(metric_of[id(before[-1])], values[0])]  # "(−6.10 pp, p_holm = 0.0013)": that number's
            elif len(values) == len(order):
                targets = list(zip(order, values))
            elif len(values) == 1:
                targets = [(k, values[0]) for k in order]
            else:
                why.append(f"'{i.text}': {len(values)} values for {len(order)} metrics")
                continue
            for k, v in targets:
                f = rows_by.get(k)
                if f is None:
                    continue
                bound.add(id(i))
                got = {"p_holm": p_adjusted, "tost": lambda r: _num(r, "tost_p"), "tost_holm": tost_adjusted}[
                    i.kind](f.row)
                if not _close(v, got, op):
                    label = {"p_holm": "p_holm", "tost": "TOST p", "tost_holm": "TOST p_holm"}[i.kind]
                    why.append(f"{label} {op} {v} ({METRIC_TITLE.get(k, k)}): the row gives {got:.3g}")
        first = rows_by.get(order[0]) if order else None
        for i in [x for x in ps_values if x.kind in ("t_p", "sign_p", "seeds", "bare_p")]:
            k = _metric_near(i.pos, i.pos + len(i.text), metrics, scope) or order[0]
            f = rows_by.get(k) or first
            if f is None:
                continue
            bound.add(id(i))
            if i.kind == "t_p":
                if not _close(i.data[0], _num(f.row, "ttest_p")):
                    why.append(f"'{i.text}': the row's t-test p is {_num(f.row, 'ttest_p'):.3g}")
            elif i.kind == "sign_p":
                if not _close(i.data[0], _num(f.row, "sign_test_p")):
                    why.append(f"'{i.text}': the row's sign-test p is {_num(f.row, 'sign_test_p'):.3g}")
            elif i.kind == "bare_p":
                why.append(f"'{i.text}': a p-value must say its test (p_holm, TOST p, t-test p, sign-test p)")
            elif i.kind == "seeds":
                problem = _check_seeds(i, f, k)
                if problem:
                    why.append(problem)
        # verdict and direction words
        for i in words:
            k = _metric_near(i.pos, i.pos + len(i.text), metrics, scope)
            targets = [rows_by.get(k)] if k and k in rows_by else [rows_by.get(x) for x in order]
            targets = [f for f in targets if f is not None]
            if not targets:
                continue
            bound.add(id(i))
            for f in targets:
                problem = _check_word(i, f, f.row.get("metric", "mean_acc"))
                if problem:
                    why.append(problem)
    unbound = [i for i in claim if id(i) not in bound and i.kind in ("pp", "pp_abs", "ci", "p_holm", "tost",
                                                                      "tost_holm", "t_p", "sign_p", "dz")
               and not (quoting and i.kind in ("pp", "pp_abs"))]  # a quoted paper's gain: checked as the paper's
    if unbound:
        why.append("not tied to a comparison of this page: " + ", ".join(f"'{i.text.strip()}'" for i in unbound))
    percents = [i for i in claim if i.kind == "percent" and id(i) not in bound]
    for i in percents:
        near = [m for m in ms if abs(m.start - i.pos) < 80]
        if near and re.search(r"ā|W₁₀|accuracy|mean|average|worst|best", sentence[i.pos:i.pos + 30], re.I):
            problem = _check_percent(i, near, ctx, quoting)
            if problem:
                why.append(problem)
    if quoting:
        why += _check_paper(sentence, [i for i in claim if id(i) in bound], ctx)
    return why, (ps[-1].a if ps else inherit)


METRIC_TITLE = {"mean_acc": "ā", "worst10_acc": "W₁₀", "std_acc": "σ_c", "best10_acc": "B₁₀", "variance": "variance",
                "jain": "Jain", "central_acc": "central"}


def _check_seeds(i: Item, f: Found, metric: str) -> str | None:
    word, k, n = i.data
    d = [f.sign * float(x) for x in (f.row.get("differences") or "").split()]
    if not d:
        return None
    if n >= 0 and n != len(d):
        return f"'{i.text}': the row has {len(d)} paired seeds"
    higher, lower = sum(x > 0 for x in d), sum(x < 0 for x in d)
    good_high = HIGHER_IS_BETTER.get(metric, True)
    if word in ("higher", "above"):
        got = higher
    elif word in ("lower", "below"):
        got = lower
    elif word == "better":
        got = higher if good_high else lower
    elif word == "worse":
        got = lower if good_high else higher
    else:
        got = higher if sum(d) > 0 else lower
    k = len(d) if k < 0 else k
    if got != k:
        return f"'{i.text}': the row gives {got}/{len(d)}"
    return None


def _check_word(i: Item, f: Found, metric: str) -> str | None:
    """A verdict word must be the row's verdict (negated: not it); a direction word must have the
    difference's sign (an improvement word: in the metric's better direction), and a strong
    comparative also needs a significant row."""
    verdict = verdict_of(f.row)
    if i.kind == "verdict":
        name, neg = i.data
        fam = f.row.get("comparison_family", "")
        holds = {"significant": verdict == "significant", "equivalent": verdict == "equivalent",
                 "inconclusive": verdict == "inconclusive",
                 "exploratory": verdict.startswith("exploratory") or fam == "exploratory"}[name]
        if holds == neg:
            return (f"'{'not ' if neg else ''}{i.text}' for {f.row.get('method')} − {f.row.get('baseline')} "
                    f"({METRIC_TITLE.get(metric, metric)}, {f.row.get('setting')}): its verdict is {verdict}"
                    + (f" (p_holm {p_adjusted(f.row):.3g}, TOST p_holm {tost_adjusted(f.row):.3g})"))
        return None
    up, strong, neg, improve = i.data
    md = f.sign * _num(f.row, "mean_difference")
    if improve and not HIGHER_IS_BETTER.get(metric, True):
        md = -md
    claimed_up = up != neg
    if md != 0 and (md > 0) != claimed_up:
        return (f"'{i.text}' ({METRIC_TITLE.get(metric, metric)}): the difference is "
                f"{f.sign * _num(f.row, 'mean_difference') * _percent(metric):+.2f}")
    if strong and not neg and verdict != "significant":
        return f"'{i.text}' claims a finding: the comparison is {verdict}"
    return None


def _check_percent(i: Item, near: list[Mention], ctx: Context, quoting: bool) -> str | None:
    """An absolute accuracy beside a method: one of that method's numbers in the page's CSVs."""
    if quoting:
        return None
    entries = {e for m in near for e in m.entries}
    values = []
    for r in ctx.other:
        if r.get("method") in entries:
            for key, v in r.items():
                if key.startswith("_") or key in ("seeds", "seed", "draw", "rounds"):
                    continue
                try:
                    x = float(v)
                except (TypeError, ValueError):
                    continue
                if math.isfinite(x):
                    values += [x, 100 * x]
    if not values:
        return f"'{i.text}': no CSV row of {'/'.join(sorted(entries))} on this page to check it against"
    cited = [i.data[0]] + ([i.data[1]] if i.data[1] else [])
    missing = [c for c in cited if not any(_close(c, v) for v in values)]
    if missing:
        return f"'{i.text}': not a number of {'/'.join(sorted(entries))} in the page's CSVs"
    return None


def _check_paper(sentence: str, ours: list[Item], ctx: Context) -> list[str]:
    """A sentence quoting a paper: it cites a table or figure, and each of its decimals that is not one
    of ours is in that paper's text."""
    decimals = [m for m in re.finditer(r"(?<![\w.])(\d+\.\d+)(?![\w.])", sentence)]
    spans = [(i.pos, i.pos + len(i.text)) for i in ours]
    theirs = [m for m in decimals if not any(a <= m.start() < b for a, b in spans)
              and not re.search(r"(?:p_holm|p|d_z)\s*[=<≤]\s*$", sentence[max(0, m.start() - 12):m.start()])]
    if not theirs:
        return []
    why = []
    if not PAPER_REF.search(sentence):
        why.append("quotes a paper's numbers without naming its table or figure")
    if not ctx.papers:
        return why + ["quotes a paper's numbers but the papers' texts (papers_dir) are not here to check"]
    which = [pid for key, pids in PAPER_IDS.items() for pid in pids
             if re.search(rf"{DISPLAY[key][0]}['’]?s? paper|paper \(?{pids[0]}|{DISPLAY[key][0]} \(paper", sentence)]
    texts = [ctx.papers[p] for p in (which or list(ctx.papers)) if p in ctx.papers]
    for m in theirs:
        if not any(m.group(1) in t for t in texts):
            why.append(f"{m.group(1)} is not in the text of " + (", ".join(f"paper {p}" for p in which)
                                                                 if which else "any of the papers' texts"))
    return why


# -- a page ------------------------------------------------------------------------------------------------
def _sections(text: str) -> list[tuple[int, str]]:
    """(line, heading text) of every markdown heading."""
    return [(no, line.lstrip("#").strip()) for no, line in enumerate(text.splitlines(), 1)
            if re.match(r"#{1,6}\s", line)]


def check_text(text: str, ctx: Context, contexts: Sequence[tuple[int, Context]] = (),
               resolve=None) -> tuple[list[Problem], list[Problem]]:
    """(problems, exemptions) of a page's text: each claim sentence that fails (see the module doc),
    and each that carries ``<!-- claim-exempt: why -->`` (not checked, counted). ``contexts``: (line,
    context) from which line on another context holds (the results index: each section its page's);
    ``resolve(sentence)``: the context of a sentence that links another result page (its rows), or None."""
    reasons: list[str] = []

    def token(m: re.Match) -> str:  # the marker moves before its sentence's end: it exempts that sentence
        reasons.append(m.group(2))
        return f"\x00{len(reasons) - 1}\x00" + (m.group(1) or "")

    # generated blocks (scripts/make_page.py: the report's tables and their boilerplate) state no prose claim
    text = re.sub(r"<!-- generated: ([\w-]+) -->.*?<!-- /generated: \1 -->",
                  lambda m: "\n" * m.group().count("\n"), text, flags=re.S)
    marked = re.sub(r"([.!?])?\s*<!--\s*claim-exempt:\s*(.*?)\s*-->", token, text, flags=re.S)
    clean = re.sub(r"<!--.*?-->", lambda m: "\n" * m.group().count("\n"), marked, flags=re.S)
    heads = _sections(text)
    problems, exemptions = [], []
    sentences = []
    marks = {}
    for no, s in stats.sentences(clean):
        found = [int(x) for x in re.findall(r"\x00(\d+)\x00", s)]
        s = re.sub(r"\x00\d+\x00", "", s).strip()
        sentences.append((no, s))
        if found:
            marks[(no, s)] = "; ".join(reasons[i] for i in found)
    last_no, subject = -1, None
    for no, s in sentences:
        if s.lstrip().startswith("#"):
            continue
        here = ctx
        for start, c in contexts:
            if no >= start:
                here = c
        if resolve is not None and (linked := resolve(s)) is not None:
            here = linked
        heading = next((h for ln, h in reversed(heads) if ln <= no), "")
        default = next((x for _, x in setting_spans(heading, here)), None) if heading else None
        if no - last_no > 3:
            subject = None
        if (no, s) in marks:
            exemptions.append(Problem(no, s, marks[(no, s)]))
            continue
        why, subject = check_sentence(s, here, default, subject)
        last_no = no
        if why:
            problems.append(Problem(no, s, "; ".join(dict.fromkeys(why))))
    return problems, exemptions


def paper_cells(text: str) -> list[tuple[int, str]]:
    """(line, cell) of every cell under a table column whose header names a paper (``paper``): the
    numbers a page quotes from the papers in its tables."""
    out, header, titles = [], None, []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header, titles = [i for i, c in enumerate(cells) if PAPER.search(c)], cells
            continue
        if all(re.fullmatch(r":?-+:?", c) for c in cells if c):
            continue
        out += [(no, f"{cells[i]} [{titles[i]}]") for i in header if i < len(cells)]  # the header's notes hold
    return out


def check_paper_tables(text: str, ctx: Context) -> list[Problem]:
    """Each quoted paper number of a table's paper column: its table or figure cited, and in that paper's
    text (:func:`papers_dir`); a cell saying it is not checked (``not checked``, ``secondary``) is
    exempt from the second only."""
    out = []
    for no, cell in paper_cells(text):
        if not re.search(r"\d+\.\d+", cell):
            continue
        why = _check_paper(cell if PAPER.search(cell) else cell + " (paper)", [], ctx)
        if re.search(r"not checked|secondary source", cell, re.I):
            why = [w for w in why if "not in the text" not in w and "are not here" not in w]
        if why:
            out.append(Problem(no, cell, "; ".join(why)))
    return out


def linked_folders(page: Path, text: str) -> list[tuple[int, list[Path]]]:
    """(line, folders) where a results index's section (a ``##`` heading) starts, with the folders of
    the result pages it links (``[x](folder/report.md)``)."""
    out = []
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines, 1) if line.startswith("## ")]
    for j, start in enumerate(starts):
        end = starts[j + 1] if j + 1 < len(starts) else len(lines) + 1
        block = "\n".join(lines[start - 1:end - 1])
        folders = []
        for target in re.findall(r"\]\(([^)#]+\.md)\)", block):
            folder = (page.parent / target).parent
            if folder != page.parent and folder.is_dir() and any(folder.glob("*.csv")):
                folders.append(folder)
        out.append((start, list(dict.fromkeys(folders))))  # none: the page's own rows again
    return out


def check_page(path: str | Path) -> tuple[list[Problem], list[Problem]]:
    """(problems, exemptions) of a results page (:func:`check_text` with :func:`page_context`); a page
    without paired rows of its own (the results index, the robustness page) checks each section, and
    each sentence linking one result page, against the rows of the pages it links."""
    path = Path(path)
    text = path.read_text()
    ctx = page_context(path, text)
    if ctx.paired:  # a result page speaks of its own rows; links elsewhere (the results index) change nothing
        problems, exempt = check_text(text, ctx)
        return problems + check_paper_tables(text, ctx), exempt
    contexts = [(line, page_context(path, text, folders) if folders else ctx)
                for line, folders in linked_folders(path, text)]
    cache: dict[Path, Context] = {}

    def resolve(sentence: str) -> Context | None:  # a sentence naming another page's rows: that page's
        folders = []
        for target in re.findall(r"\]\(([^)#]+\.md)\)", sentence):
            folder = (path.parent / target).parent
            if folder != path.parent and folder.is_dir() and any(folder.glob("*.csv")):
                folders.append(folder.resolve())
        if len(set(folders)) != 1:
            return None
        if folders[0] not in cache:
            cache[folders[0]] = page_context(path, text, folders[:1])
        return cache[folders[0]]

    problems, exempt = check_text(text, ctx, contexts, resolve)
    return problems + check_paper_tables(text, ctx), exempt
