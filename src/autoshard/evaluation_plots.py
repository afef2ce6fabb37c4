"""Figures of the evaluate stage (kept apart from `plots` so earlier stages do not depend on them)."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from autoshard.plots import save_figure

__all__ = ["save_figure", "method_ratios", "device_breakdown", "sharding_time", "predicted_vs_measured_ratio"]


def method_ratios(table: pd.DataFrame, targets: dict[str, float]) -> plt.Figure:
    """Median measured ratio to the best heuristic per method, with its 95% bootstrap
    interval, one panel per protocol; dotted lines mark the targets."""
    protocols = list(dict.fromkeys(table["protocol"]))
    fig, axes = plt.subplots(1, len(protocols), figsize=(5 * len(protocols), 4.6), sharex=True)
    for ax, protocol in zip(np.atleast_1d(axes), protocols, strict=True):
        g = table[table["protocol"] == protocol].iloc[::-1]
        colors = [f"C{['heuristic', 'baseline', 'rl', 'optimum'].index(k)}" for k in g["kind"]]
        error = np.vstack([g["ratio_median"] - g["ratio_lo"], g["ratio_hi"] - g["ratio_median"]])
        ax.barh(g["method"], g["ratio_median"], xerr=error, color=colors, capsize=3)
        ax.axvline(1.0, color="black", lw=1)
        for k, (name, value) in enumerate(targets.items()):
            ax.axvline(value, color="grey", ls=[":", "--"][k % 2], lw=1, label=f"{name} ({value:g})")
        ax.legend(fontsize=7, loc="lower right")
        ax.set(title=f"{protocol} ({int(g['plans'].max())} tasks)", xlabel="measured bottleneck / best heuristic's")
    fig.tight_layout()
    return fig


def device_breakdown(devices: pd.DataFrame, title: str) -> plt.Figure:
    """Per method (panel) and device: measured forward and backward compute and the analytic
    forward and backward all-to-all, stacked; the line marks the measured compute bottleneck."""
    parts = ["forward_compute_ms", "forward_comm_ms", "backward_comm_ms", "backward_compute_ms"]
    methods = list(dict.fromkeys(devices["method"]))
    cols = min(4, len(methods))
    rows = -(-len(methods) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), sharey=True, squeeze=False)
    for ax, method in zip(axes.ravel(), methods, strict=False):
        g = devices[devices["method"] == method].set_index("device")
        g[parts].plot.bar(stacked=True, ax=ax, legend=False, width=0.8)
        ax.axhline(g["compute_ms"].max(), color="C3", ls=":", lw=1)
        ax.set(title=f"{method}: {g['compute_ms'].max():.1f} ms", xlabel="device", ylabel="ms")
    for ax in axes.ravel()[len(methods):]:
        ax.axis("off")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def sharding_time(speed: pd.DataFrame) -> plt.Figure:
    """Sharding time against the number of tables, log-log."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sns.lineplot(data=speed, x="tables", y="seconds", hue="method", style="method", markers=True, dashes=False, ax=ax)
    ax.set(xscale="log", yscale="log", xlabel="tables in the task", ylabel="seconds (median, one thread)",
           title=f"Sharding time on {int(speed['devices'].iloc[0])} devices")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def predicted_vs_measured_ratio(ratios: pd.DataFrame, methods: list[str]) -> plt.Figure:
    """Per task and method: the ratio to the best heuristic as the cost model predicts it and
    as measured. Points off the diagonal are where the cost model's error decides."""
    g = ratios[ratios["method"].isin(methods)]
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    sns.scatterplot(data=g, x="predicted_ratio", y="ratio", hue="method", style="protocol", ax=ax, s=28)
    lo = float(np.nanmin(g[["predicted_ratio", "ratio"]].to_numpy())) * 0.97
    hi = float(np.nanmax(g[["predicted_ratio", "ratio"]].to_numpy())) * 1.03
    ax.plot([lo, hi], [lo, hi], color="black", lw=1)
    ax.axhline(1, color="grey", ls=":", lw=1)
    ax.axvline(1, color="grey", ls=":", lw=1)
    ax.set(xlabel="predicted ratio to the best heuristic", ylabel="measured ratio", xlim=(lo, hi), ylim=(lo, hi))
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
