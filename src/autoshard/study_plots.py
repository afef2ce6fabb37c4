"""Figures of the transfer and ablation stages (apart from the other stages' figures, so that
changing one of these does not rerun the stages before them)."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from autoshard.plots import save_figure

__all__ = ["save_figure", "transfer_axis", "ablation_ratios", "ablation_training"]

AXIS_LABELS = {"tables": "tables per task", "devices": "devices", "unseen_ratio": "share of unseen tables"}


def transfer_axis(table: pd.DataFrame, axis: str, note: str) -> plt.Figure:
    """Median measured ratio to the best heuristic (95% bootstrap interval as a band) against one
    axis, per compared method; dashed: the cost model's predicted ratio for the same plans."""
    g = table[table["axis"] == axis]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for k, (method, m) in enumerate(g.groupby("method", sort=False)):
        m = m.sort_values("value")
        ax.plot(m["value"], m["ratio_median"], marker="o", color=f"C{k}", label=f"{method} (measured)")
        ax.fill_between(m["value"], m["ratio_lo"], m["ratio_hi"], color=f"C{k}", alpha=0.2)
        ax.plot(m["value"], m["predicted_ratio_median"], ls="--", color=f"C{k}", lw=1,
                label=f"{method} (predicted)")
    ax.axhline(1.0, color="black", lw=1)
    if axis in ("tables", "devices"):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(g["value"].unique()), [f"{v:g}" for v in sorted(g["value"].unique())])
    tasks = int(g["tasks"].min()) if len(g) else 0
    ax.set(xlabel=AXIS_LABELS[axis], ylabel="bottleneck / best heuristic's (median)",
           title=f"Transfer across {AXIS_LABELS[axis]} ({tasks}+ tasks per point; {note})")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def ablation_ratios(per_seed: pd.DataFrame, labels: dict[str, str]) -> plt.Figure:
    """Each variant's median measured ratio per seed (dots) and their mean (bar); the vertical
    line is the full method's mean."""
    order = [v for v in labels if v in set(per_seed["variant"])]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(order) + 1.4))
    means = per_seed.groupby("variant")["ratio"].mean()
    y = np.arange(len(order))[::-1]
    ax.barh(y, [means[v] for v in order], color="C0", alpha=0.35)
    for yi, v in zip(y, order, strict=True):
        values = per_seed.loc[per_seed["variant"] == v, "ratio"]
        ax.scatter(values, np.full(len(values), yi), color="C0", s=18, zorder=3)
    if "full" in means:
        ax.axvline(means["full"], color="C3", ls=":", lw=1, label="full method (mean of seeds)")
        ax.legend(fontsize=7, loc="lower right")
    ax.axvline(1.0, color="black", lw=1)
    ax.set_yticks(y, [labels[v] for v in order])
    low, high = per_seed["ratio"].min(), max(per_seed["ratio"].max(), 1.0)
    ax.set_xlim(low - 0.05 * (high - low) - 0.01, high + 0.05 * (high - low) + 0.01)
    ax.set(xlabel="measured bottleneck / best heuristic's (median over test tasks)",
           title="Ablation: one dot per seed")
    fig.tight_layout()
    return fig


def ablation_training(history: pd.DataFrame, labels: dict[str, str], window: int = 10) -> plt.Figure:
    """Training curves: the predicted bottleneck over the balanced load of sampled episodes
    (rolling mean, averaged over seeds) per variant, under each variant's own cost model."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for k, (variant, g) in enumerate(history.groupby("variant", sort=False)):
        curve = (g.sort_values("iteration").groupby("seed")["bottleneck_over_reference"]
                 .transform(lambda s: s.rolling(window, min_periods=1).mean()))
        mean = curve.groupby(g["iteration"]).mean()
        ax.plot(mean.index, mean.to_numpy(), color=f"C{k % 10}", label=labels.get(variant, variant))
    ax.set(xlabel="iteration", ylabel="predicted bottleneck / balanced load",
           title="Training (sampled episodes, each variant under its own cost model)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
