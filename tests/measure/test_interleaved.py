

def test_a_batch_is_measured_again_only_where_its_drift_moves_a_ratio():
    """A round where every shard ran 10% slower moves each shard's median over three rounds only
    where that round was the median; the effect on a ratio is well below the drift, and no drift
    gives no effect."""
    import numpy as np

    from autoshard.measure.interleaved import drift_effect, round_drift

    g = np.random.default_rng(0)
    base = g.uniform(1, 10, (60, 1)) * np.exp(g.normal(0, 0.03, (60, 3)))
    steady = np.stack([base, np.zeros_like(base)], axis=2)
    slowed = steady.copy()
    slowed[:, 2, 0] *= 1.10
    assert round_drift(slowed) > 0.09 and drift_effect(slowed) < 0.06
    assert drift_effect(steady) < drift_effect(slowed)
    uniform = np.stack([np.outer(g.uniform(1, 10, 60), [1.0, 1.2, 1.1]), np.zeros((60, 3))], axis=2)
    assert round_drift(uniform) > 0.19 and drift_effect(uniform) < 1e-12, "a drift that moves all alike cancels"
