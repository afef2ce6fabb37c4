"""Figures of the train_rl stage: training curves and an example placement."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd


def rl_curves(history: pd.DataFrame, heuristic_ratios: dict[str, float]) -> plt.Figure:
    """Training reward, value loss, entropy, and the validation ratio to the best heuristic."""
    fig, ax = plt.subplots(2, 2, figsize=(12, 7))
    for shape, part in history.groupby("shape"):
        ax[0, 0].plot(part["iteration"], part["reward"].rolling(10, min_periods=1).mean(), label=shape)
    ax[0, 0].set(title="reward (rolling mean, sampled rollouts)", xlabel="iteration")
    ax[0, 0].legend(title="tables x devices")
    for shape, part in history.groupby("shape"):
        ax[0, 1].plot(part["iteration"], part["value_loss"], label=shape)
        ax[1, 0].plot(part["iteration"], part["entropy"], label=shape)
    ax[0, 1].set(title="value loss", xlabel="iteration", yscale="log")
    ax[1, 0].set(title="policy entropy (per decision)", xlabel="iteration")
    val = history.dropna(subset=["val_ratio"])
    for column in [c for c in val.columns if c.startswith("val_ratio_")]:
        ax[1, 1].plot(val["iteration"], val[column], "o-", label=f"policy, {column.removeprefix('val_ratio_')}")
    for i, (name, ratio) in enumerate(sorted(heuristic_ratios.items(), key=lambda kv: kv[1])):
        ax[1, 1].axhline(ratio, ls=":", color=f"C{(i + 2) % 10}", label=name)
    ax[1, 1].set(title="validation: predicted bottleneck / best heuristic's", xlabel="iteration")
    ax[1, 1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def validation_curves(curves: dict[str, pd.DataFrame], references: dict[str, float]) -> plt.Figure:
    """Each training run's validation ratio (predicted bottleneck / best heuristic's) against the
    iteration, imitation iterations shaded, with horizontal lines for `references` (name -> ratio)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, history in curves.items():
        val = history.dropna(subset=["val_ratio"])
        ax.plot(val["iteration"], val["val_ratio"], "o-", ms=3, label=name)
        if "phase" in history and (history["phase"] == "imitation").any():
            ax.axvspan(-0.5, history.loc[history["phase"] == "imitation", "iteration"].max() + 0.5, color="0.9")
    for i, (name, ratio) in enumerate(references.items()):
        ax.axhline(ratio, ls=":", color=f"C{(i + 5) % 10}", label=name)
    ax.set(title="validation: predicted bottleneck / best heuristic's (shaded: imitation)", xlabel="iteration")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def placement_example(costs: dict[str, pd.DataFrame], title: str) -> plt.Figure:
    """Per device: the tables' predicted single costs stacked, and the fused prediction (marker).

    `costs[method]` has columns device, table, single_ms and fused_ms (per device)."""
    fig, axes = plt.subplots(1, len(costs), figsize=(6 * len(costs), 3.8), sharey=True)
    for ax, (method, frame) in zip(np.atleast_1d(axes), costs.items(), strict=True):
        bottom = frame.groupby("device")["single_ms"].cumsum() - frame["single_ms"]
        ax.bar(frame["device"], frame["single_ms"], bottom=bottom, color="C0", edgecolor="white", lw=0.5)
        fused = frame.groupby("device")["fused_ms"].first()
        ax.plot(fused.index, fused.values, "D", color="C3", label="predicted fused cost")
        ax.axhline(fused.max(), color="C3", ls=":", lw=1)
        ax.set(title=f"{method}: bottleneck {fused.max():.1f} ms", xlabel="device",
               ylabel="predicted ms (tables stacked)")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig

