"""What every page writer shares: numbers as text, Markdown tables and paragraphs, and the figures
the stages saved, placed inline by the page that explains them (never listed at the end)."""

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

from autoshard.methods.registry import METHODS

WIDTH = 150  # a paragraph's lines wrap here (Markdown joins them); a table's rows may be wider
SUMMARY = "README.md"


def number(value: object) -> bool:
    """True for a finite int or float (a metrics file writes a missing figure as null)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def percent(value: float | None, digits: int = 1) -> str:
    """`value` (a fraction) as a percentage with `digits` decimals, "n/a" when there is none."""
    return f"{value:.{digits}%}" if number(value) else "n/a"


def ratio(value: float | None, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if number(value) else "n/a"


def interval(median: float | None, lo: float | None, hi: float | None, digits: int = 3) -> str:
    """"0.993 [0.981, 1.004]": a median ratio and its interval."""
    if not number(median):
        return "n/a"
    return f"{median:.{digits}f} [{ratio(lo, digits)}, {ratio(hi, digits)}]"


def side(lo: float | None, hi: float | None) -> str:
    """Where an exploratory interval lies against 1, as a mark (see LEGEND): no verdict words."""
    if not (number(lo) and number(hi)):
        return ""
    return " ↓" if hi < 1 else " ↑" if lo > 1 else ""


LEGEND = ("Cells: median ratio [95% interval, unadjusted]; ↓ the interval lies below 1 (the method's plans measured\n"
          "faster), ↑ above 1, no mark: it spans 1. Exploratory: no verdicts.")


def method_order(names: Sequence[str]) -> list[str]:
    """`names` in the registry's order (unknown names last, as given)."""
    return sorted(names, key=lambda m: METHODS.index(m) if m in METHODS else len(METHODS))


def table(rows: Sequence[dict], empty: str = "(none)") -> str:
    """Rows (values already text) as a Markdown table without padding, so that a row is only as
    wide as its cells; `empty` when there are none. A key missing from a row leaves its cell blank."""
    if not rows:
        return empty
    columns = list(dict.fromkeys(key for row in rows for key in row))

    def cells(values: Sequence[object]) -> str:
        return "| " + " | ".join(str(v).replace("|", "\\|").replace("\n", " ") for v in values) + " |"

    return "\n".join([cells(columns), "|" + "|".join("---" for _ in columns) + "|",
                      *(cells([row.get(c, "") for c in columns]) for row in rows)])


def paragraph(*sentences: str) -> str:
    """Sentences as one Markdown paragraph, wrapped at WIDTH (Markdown joins the lines)."""
    text = " ".join(s.strip() for s in sentences if s and s.strip())
    return textwrap.fill(text, WIDTH, break_long_words=False, break_on_hyphens=False)


def item(text: str) -> str:
    """One Markdown list item, wrapped at WIDTH with its continuation lines indented."""
    return textwrap.fill(text, WIDTH, initial_indent="- ", subsequent_indent="  ", break_long_words=False,
                         break_on_hyphens=False)


def heading(title: str, back: bool = True) -> str:
    """A stage page's first lines: its title and the way back to the summary."""
    return f"# {title}\n\n" + (f"[Back to the summary]({SUMMARY}). Generated from the metrics files; nothing typed by "
                               "hand.\n" if back else "")


class Figures:
    """The figures the stages saved (`reports/figures/<stage>/<name>.png`), as Markdown images for
    pages in `reports/`; each page places its own beside what they support, and `unplaced` says
    which no page showed (the build adds them to their stage's page rather than lose them)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.placed: set[tuple[str, str]] = set()

    def saved(self, stage: str) -> list[str]:
        """The names (no suffix) of the figures `stage` saved."""
        return sorted(p.stem for p in (self.root / stage).glob("*.png"))

    def inline(self, stage: str, name: str, alt: str) -> str:
        """The figure as a Markdown image line, or "" where the stage did not save it."""
        if not (self.root / stage / f"{name}.png").exists():
            return ""
        self.placed.add((stage, name))
        return f"![{alt}](figures/{stage}/{name}.png)"

    def unplaced(self, stage: str) -> list[str]:
        return [name for name in self.saved(stage) if (stage, name) not in self.placed]


def join(*blocks: str | None) -> str:
    """Markdown blocks separated by one blank line, empty ones left out, ending in one newline."""
    return "\n\n".join(b.strip("\n") for b in blocks if b and b.strip()) + "\n"
