"""The one figure helper every layer shares: the seaborn theme and saving a figure to disk."""

from pathlib import Path

import matplotlib.pyplot as plt
import seaborn as sns

sns.set_theme(style="whitegrid", context="notebook")


def save_figure(fig: plt.Figure, path: str | Path) -> None:
    """Save a figure as PNG (the executed notebook keeps its own copy inline)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")

