"""Figures of the study (seaborn on matplotlib); each returns its figure for the notebook."""

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from autoshard.stats import REUSE_GROUPS, published_reuse_shares, reuse_shares

sns.set_theme(style="whitegrid", context="notebook")


def save_figure(fig: plt.Figure, path: str | Path) -> None:
    """Save a figure as PNG (the executed notebook keeps its own copy inline)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def pool_distributions(features: pd.DataFrame) -> plt.Figure:
    """Rows, dims, pooling factors and skew across the pool's tables."""
    fig, ax = plt.subplots(2, 2, figsize=(11, 7))
    sns.histplot(features["rows"], log_scale=True, ax=ax[0, 0])
    ax[0, 0].set(title="hash size (rows)", xlabel="rows")
    sns.countplot(x=features["dim"], ax=ax[0, 1], color="C0")
    ax[0, 1].set(title="embedding dim", xlabel="dim")
    pf = features["pooling_factor"].clip(lower=1e-2)
    sns.histplot(pf, log_scale=True, ax=ax[1, 0])
    ax[1, 0].axvline(features["pooling_factor"].mean(), color="C3", ls="--", label="pool mean")
    ax[1, 0].legend()
    ax[1, 0].set(title="mean pooling factor (lookups per bag)", xlabel="pooling factor")
    sns.histplot(features["hot_share"], bins=30, ax=ax[1, 1])
    ax[1, 1].set(title="skew: share of lookups on the hottest 1% rows", xlabel="hot share")
    fig.tight_layout()
    return fig


def reuse_vs_published(features: pd.DataFrame) -> plt.Figure:
    """The pool's share of distinct indices by access count, next to the published shares."""
    data = pd.DataFrame({
        "access count": REUSE_GROUPS * 2,
        "share of distinct indices": np.concatenate([reuse_shares(features),
                                                     published_reuse_shares()]),
        "source": ["this pool"] * len(REUSE_GROUPS) + ["published (DLRM dataset)"] * len(REUSE_GROUPS),
    })
    fig, ax = plt.subplots(figsize=(8, 4))
    sns.barplot(data=data, x="access count", y="share of distinct indices", hue="source", ax=ax)
    ax.set(title="Index reuse: synthetic pool vs published statistics")
    fig.tight_layout()
    return fig


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
    from autoshard.costs.comm import STAGES

    fig, ax = plt.subplots(figsize=(7, 3.5))
    stages.set_index("device")[STAGES].plot.bar(stacked=True, ax=ax)
    ax.set(title=title, ylabel="ms", xlabel="device")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def training_history(history: pd.DataFrame, title: str) -> plt.Figure:
    """Train and validation loss per epoch."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(history["epoch"], history["train_loss"], label="train")
    ax.plot(history["epoch"], history["val_loss"], label="validation")
    ax.set(yscale="log", xlabel="epoch", ylabel="loss", title=title)
    ax.legend()
    fig.tight_layout()
    return fig


def predicted_vs_measured(frame: pd.DataFrame) -> plt.Figure:
    """Predicted against measured cost, one panel per estimator, seen and unseen tables."""
    grid = sns.relplot(data=frame, x="measured_ms", y="predicted_ms", hue="test set",
                       col="estimator", col_wrap=3, s=12, height=3.2, alpha=0.6)
    lo, hi = frame["measured_ms"].min(), frame["measured_ms"].max()
    for ax in grid.axes.flat:
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set(xscale="log", yscale="log")
    grid.set_titles("{col_name}")
    return grid.figure


def error_by_size(frame: pd.DataFrame) -> plt.Figure:
    """Absolute percentage error against the number of tables in the shard."""
    sizes = pd.cut(frame["num_tables"], [0, 1, 2, 4, 8, 16, 32, 1000])
    fig, ax = plt.subplots(figsize=(11, 4))
    sns.boxplot(data=frame.assign(tables=sizes.astype(str)), x="tables", y="abs_pct_error",
                hue="estimator", showfliers=False, ax=ax, order=[str(c) for c in sizes.cat.categories
                                                               if (sizes == c).any()])
    ax.set(yscale="log", ylabel="absolute error (%)", xlabel="tables in shard",
           title="Error against shard size (both test sets)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def learning_curve(curve: pd.DataFrame, noise_floor: float) -> plt.Figure:
    """Test MAPE against the number of training shards."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for column in [c for c in curve.columns if c.endswith("MAPE")]:
        ax.plot(curve["train_shards"], curve[column] * 100, "o-", label=column.removesuffix(" MAPE"))
    ax.axhline(noise_floor * 100, color="k", ls=":", label="measurement CV (noise floor)")
    ax.set(xscale="log", xlabel="training shards", ylabel="test MAPE (%)",
           title="How much profiling is enough")
    ax.legend()
    fig.tight_layout()
    return fig


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
