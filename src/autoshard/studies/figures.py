"""Figures of the evaluate stage (kept apart from `plots` so earlier stages do not depend on them)."""


import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns


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


def paired_ratios(per_task: pd.DataFrame) -> plt.Figure:
    """Every task's measured ratio for each compared pair (a point per task, the median as a
    bar), one panel per protocol: the spread the paired statistics summarise."""
    protocols = list(dict.fromkeys(per_task["protocol"]))
    fig, axes = plt.subplots(1, len(protocols), figsize=(6 * len(protocols), 0.5 * per_task["pair"].nunique() + 2),
                             sharex=True, squeeze=False)
    for ax, protocol in zip(axes[0], protocols, strict=True):
        g = per_task[per_task["protocol"] == protocol]
        sns.stripplot(data=g, x="ratio", y="pair", ax=ax, size=3, alpha=0.6, jitter=0.25)
        medians = g.groupby("pair", sort=False)["ratio"].median()
        ax.scatter(medians.to_numpy(), medians.index, marker="|", s=400, color="black", zorder=3)
        ax.axvline(1.0, color="grey", lw=1)
        ax.set(title=f"{protocol} ({g['task'].nunique()} tasks)", xlabel="measured bottleneck ratio (per task)",
               ylabel="")
    fig.tight_layout()
    return fig


def primary_endpoints(decided: dict[str, dict]) -> plt.Figure:
    """The headline figure: each primary endpoint's per-task ratio (the mean log ratio over the
    trained chains' replicates, a point per task), each replicate's median (a bar), the median and
    its interval (a diamond), the band of no interest (1 +- sesoi) shaded. `decided`: the endpoints
    of `endpoints.primary` (`endpoints.entries`)."""
    rows = [{"endpoint": f"{e['method']} / {e['reference']}, {e['protocol']}\n{e['verdict']}", "ratio": r}
            for e in decided.values() for r in e["per_task"].values()]
    fig, ax = plt.subplots(figsize=(7.5, 0.75 * len(decided) + 1.5))
    if not rows:
        return fig
    frame = pd.DataFrame(rows)
    order = list(dict.fromkeys(frame["endpoint"]))
    sesoi = next(iter(decided.values()))["sesoi"]
    ax.axvspan(1 - sesoi, 1 + sesoi, color="grey", alpha=0.15, label=f"1 ± sesoi ({sesoi:g})")
    sns.stripplot(data=frame, x="ratio", y="endpoint", order=order, ax=ax, size=3, alpha=0.5, jitter=0.2)
    for k, e in enumerate(decided.values()):
        medians = e.get("replicate_medians") or []
        ax.plot(medians, [k] * len(medians), "|", color="tab:red", markersize=14, mew=2,
                label="a replicate's median" if k == 0 and medians else None, zorder=2)
        if e["median_ratio"] is not None:
            spread = [[e["median_ratio"] - e["ci_low"]], [e["ci_high"] - e["median_ratio"]]]
            ax.errorbar(e["median_ratio"], k, xerr=spread, fmt="D", color="black", capsize=4, zorder=3,
                        label="median, 95% interval" if k == 0 else None)
    ax.axvline(1.0, color="black", lw=1)
    ax.set(xlabel="measured bottleneck, method / reference (per task: the mean over replicates)", ylabel="")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig
