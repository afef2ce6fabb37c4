"""Figures of the cost-model stage: training history, predicted against measured, error by size, learning curve."""

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns


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

