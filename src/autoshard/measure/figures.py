"""Figures of the profile stage: single-table costs, fusion gap, repeatability, backend cross-check, stages."""

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns


def single_table_costs(singles: pd.DataFrame) -> plt.Figure:
    """Measured single-table cost against size, dim and pooling factor."""
    fig, ax = plt.subplots(1, 3, figsize=(14, 4))
    singles = singles.assign(dim=singles["dim"].astype(str))
    sns.scatterplot(data=singles, x="size_bytes", y="total_ms", hue="dim", s=12, ax=ax[0])
    ax[0].set(xscale="log", yscale="log", title="cost vs table size", xlabel="size (bytes)",
              ylabel="forward + backward (ms)")
    sns.boxplot(data=singles, x="dim", y="total_ms", ax=ax[1], color="C0")
    ax[1].set(yscale="log", title="cost vs dim", ylabel="forward + backward (ms)")
    sns.scatterplot(data=singles, x="pooling_factor", y="total_ms", hue="dim", s=12, ax=ax[2])
    ax[2].set(xscale="log", yscale="log", title="cost vs pooling factor",
              ylabel="forward + backward (ms)")
    fig.tight_layout()
    return fig


def fusion_gap(gap: pd.DataFrame) -> plt.Figure:
    """Fused shard cost against the sum of its tables' single costs."""
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    sns.scatterplot(data=gap, x="sum_of_singles_ms", y="total_ms", hue="num_tables",
                    palette="viridis", s=14, ax=ax[0])
    both = gap[["sum_of_singles_ms", "total_ms"]]
    lim = [both.min().min(), both.max().max()]
    ax[0].plot(lim, lim, "k--", lw=1, label="fused = sum")
    ax[0].set(xscale="log", yscale="log", title="fused shard cost vs sum of single-table costs",
              xlabel="sum of single-table costs (ms)", ylabel="fused cost (ms)")
    sns.boxplot(data=gap, x=pd.cut(gap["num_tables"], [1, 4, 8, 16, 32, 1000]), y="fused_over_sum",
                ax=ax[1], color="C1")
    ax[1].axhline(1.0, color="k", ls="--", lw=1)
    ax[1].set(title="fused / sum of singles by shard size", xlabel="tables in shard",
              ylabel="fused / sum")
    fig.tight_layout()
    return fig


def repeatability(rep: pd.DataFrame, target: float) -> plt.Figure:
    """Coefficient of variation of repeated shards across rounds."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    sns.histplot(rep["cv"] * 100, bins=20, ax=ax)
    ax.axvline(target * 100, color="C3", ls="--", label=f"target {target:.0%}")
    ax.axvline(rep["cv"].median() * 100, color="k", label="median")
    ax.legend()
    ax.set(title="Repeatability: CV of a shard's cost across rounds", xlabel="CV (%)")
    fig.tight_layout()
    return fig


def backend_comparison(table: pd.DataFrame, a: str, b: str) -> plt.Figure:
    """Total cost of the same shards under two backends."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    x, y = table[f"{a}_total_ms"], table[f"{b}_total_ms"]
    sns.scatterplot(x=x, y=y, hue=table["tables"], palette="viridis", ax=ax)
    lim = [min(x.min(), y.min()), max(x.max(), y.max())]
    ax.plot(lim, lim, "k--", lw=1)
    ax.set(xscale="log", yscale="log", title=f"{b} vs {a} on the same shards",
           xlabel=f"{a} forward + backward (ms)", ylabel=f"{b} forward + backward (ms)")
    fig.tight_layout()
    return fig


def device_stages(stages: pd.DataFrame, title: str) -> plt.Figure:
    """DreamShard's four stages per device, stacked."""
    from autoshard.measure.comm import STAGES

    fig, ax = plt.subplots(figsize=(7, 3.5))
    stages.set_index("device")[STAGES].plot.bar(stacked=True, ax=ax)
    ax.set(title=title, ylabel="ms", xlabel="device")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig



def comm_fit(rows: pd.DataFrame) -> plt.Figure:
    """The comm model's predicted all-to-all ms against the measured, per direction; rows need
    `predicted_ms`, `ms`, `direction`, `world` and `heldout`."""
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.5))
    for a, (direction, part) in zip(ax, rows.groupby("direction"), strict=False):
        part = part.assign(set=part["heldout"].map({True: "held out", False: "fitted"}),
                           devices=part["world"].astype(str))
        sns.scatterplot(data=part, x="ms", y="predicted_ms", hue="devices", style="set", s=18, ax=a)
        lim = [0, float(part[["ms", "predicted_ms"]].max().max()) * 1.05]
        a.plot(lim, lim, "k--", lw=1)
        a.set(title=f"{direction} all-to-all", xlabel="measured (ms)", ylabel="comm model (ms)")
    fig.tight_layout()
    return fig
