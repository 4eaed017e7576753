"""One comparison's result: samples per case, rendered as a Markdown table,
raw JSON (every run, not only medians) and a PNG plot with interquartile
error bars. The README's headline tables are generated from these files."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import textwrap

from . import common


@dataclasses.dataclass
class Result:
    """Timings of several cases measured side by side in one run."""

    name: str  # file stem under results/
    title: str
    samples: dict[str, list[float]]  # case -> seconds per run
    peer: str | None = None  # ratios are "peer median / case median"
    nbytes: int | None = None  # bytes moved per run, for GiB/s
    notes: list[str] = dataclasses.field(default_factory=list)
    extra: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)  # case -> column -> text
    modules: list[str] = dataclasses.field(default_factory=list)  # distributions used, for the machine record

    def rows(self) -> list[dict[str, str]]:
        out = []
        peer_median = common.summary(self.samples[self.peer])[0] if self.samples.get(self.peer) else None
        for case, runs in self.samples.items():
            if not runs:
                out.append({"case": case, "median": "missing", **self.extra.get(case, {})})
                continue
            med, q1, q3 = common.summary(runs)
            row = {
                "case": case,
                "median": common.fmt_time(med),
                "IQR": f"{common.fmt_time(q1)} – {common.fmt_time(q3)}",
            }
            if self.nbytes:
                row["GiB/s"] = f"{self.nbytes / med / 2**30:.2f}"
            if peer_median:
                row[f"vs {self.peer}"] = f"{peer_median / med:.2f}×"
            row.update(self.extra.get(case, {}))
            out.append(row)
        return out

    def markdown(self) -> str:
        rows = self.rows()
        columns = list(dict.fromkeys(k for r in rows for k in r))
        lines = [f"### {self.title}", ""]
        lines.append("| " + " | ".join(columns) + " |")
        lines.append("|" + "---|" * len(columns))
        for r in rows:
            lines.append("| " + " | ".join(r.get(c, "") for c in columns) + " |")
        lines.extend(["", *self.notes])
        return "\n".join(lines).rstrip() + "\n"

    def series(self) -> dict[str, dict[str, list[float]]]:
        """What the plot draws: series -> bar label -> seconds per run (one series, the cases)."""
        return {"": {c: runs for c, runs in self.samples.items() if runs}}

    def plot(self, path: pathlib.Path) -> None:
        """Horizontal bars of every series (several: grouped by label, with a
        legend), medians with interquartile error bars: GiB/s when the result
        knows its bytes (higher is better), else milliseconds."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        series = self.series()
        labels = list(dict.fromkeys(label for bars in series.values() for label in bars))
        height = 0.8 / len(series)
        fig, ax = plt.subplots(figsize=(7 if len(series) == 1 else 9, 0.5 + 0.45 * len(labels) * len(series) ** 0.5))
        colors = ["#4c72b0", "#8da0cb", "#dd8452", "#55a868", "#a6d49f", "#c44e52"]
        for j, (name, bars) in enumerate(series.items()):
            ys, values, low, high = [], [], [], []
            for label, runs in bars.items():
                med, q1, q3 = common.summary(runs)
                if self.nbytes:  # IQR bounds swap under 1/x
                    v, lo, hi = (self.nbytes / t / 2**30 for t in (med, q3, q1))
                else:
                    v, lo, hi = med * 1e3, q1 * 1e3, q3 * 1e3
                ys.append(labels.index(label) + (j - (len(series) - 1) / 2) * height)
                values += [v]
                low += [v - lo]
                high += [hi - v]
            ax.barh(ys, values, height, xerr=[low, high], color=colors[j % len(colors)], capsize=3, label=name)
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.set_xlabel("GiB/s (median, IQR)" if self.nbytes else "ms (median, IQR)")
        ax.set_title(textwrap.fill(self.title, 100), fontsize=9 if len(series) > 1 else 10)
        if len(series) > 1:
            ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def save(results: list[Result], stem: str, header: str, plot: bool = True) -> pathlib.Path:
    """Write results/<stem>.md (tables), .json (every run) and one PNG per table."""
    common.RESULTS.mkdir(exist_ok=True)
    parts = [header.rstrip() + "\n"]
    modules = used_modules(results)
    raw = {"machine": common.machine(), "versions": common.versions(*modules), "results": []}
    for i, r in enumerate(results):
        parts.append(r.markdown())
        raw["results"].append(dataclasses.asdict(r))
        if plot:
            png = f"{stem}-{i}.png" if len(results) > 1 else f"{stem}.png"
            r.plot(common.RESULTS / png)
            parts.append(f"![{r.title}]({png})\n")
    parts.append(f"Machine: {machine_line(modules)}\n")
    md = common.RESULTS / f"{stem}.md"
    md.write_text("\n".join(parts))
    (common.RESULTS / f"{stem}.json").write_text(json.dumps(raw, indent=1))
    return md


def used_modules(results: list[Result]) -> list[str]:
    """zt and numpy (every comparison uses them), then each result's modules, in order."""
    return list(dict.fromkeys(["zt", "numpy", *(m for r in results for m in r.modules)]))


def machine_line(modules: list[str] | tuple[str, ...] = ("zt", "numpy")) -> str:
    """CPU, cores, memory, kernel, the bench directory's filesystem, Python and
    the version of every library in `modules`."""
    m = common.machine()
    libs = ", ".join(f"{k} {v}" for k, v in common.versions(*modules).items())
    return (
        f"{m.get('cpu', '?')}, {m.get('cores')} cores, {m.get('memory_gib')} GiB, Linux {m.get('kernel')}, "
        f"bench directory on {m.get('filesystem', '?')}, Python {m.get('python')}; {libs}"
    )


def update_readme(readme: pathlib.Path, stem: str, table_index: int = 0) -> bool:
    """Replace the text between `<!-- results:STEM -->` and `<!-- /results -->`
    in the README with the table from results/STEM.md. Returns True if found."""
    text = readme.read_text()
    source = (common.RESULTS / f"{stem}.md").read_text()
    tables = re.findall(r"(### .*?\n\n(?:\|.*\n)+)", source)
    if len(tables) <= table_index:
        return False
    pattern = re.compile(rf"(<!-- results:{re.escape(stem)}:{table_index} -->\n)(.*?)(<!-- /results -->)", re.S)
    if not pattern.search(text):
        return False
    text = pattern.sub(lambda m: m.group(1) + tables[table_index] + m.group(3), text)
    readme.write_text(text)
    return True
