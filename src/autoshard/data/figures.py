"""Figures of the synthesize stage: the pool's distributions and its reuse against the published shares."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from autoshard.data.calibration import REUSE_GROUPS, published_reuse_shares, reuse_shares


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

