"""The trained cost model and policy as plain NumPy arrays: greedy planning without torch.

`import torch` alone takes about two seconds, longer than placing 856 tables, so the
`autoshard plan` command places with this copy of the networks when it is fresh. The
`train_rl` stage writes it (`export`) next to the checkpoints it was made from, with their
SHA-256, and `load` ignores a file that does not match them.

The steps are those of `env.ShardingEnv`, `policy.Policy` and `rl.rollout` in greedy mode:
encodings and device state in float32 as there (memory in float64), and only a device's own
row recomputed after a table lands on it. Device scores are computed in float64 and rounded
to float32 before the argmax, so devices in the same state tie exactly and the lowest index
wins. The placements are torch's (tests compare them) except where float rounding breaks a
tie the other way: torch's batched product can score identical empty devices a last bit
apart (then the plans split the tables alike under other device numbers), and devices whose
sums differ only in the last bit can tie in one and not the other (with thousands of
repeated tables: on 10,000 tiled pool tables the plans differ, at the same predicted bottleneck).
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autoshard.core.atomic import atomic_file
from autoshard.core.errors import ConfigError
from autoshard.data.features import FEATURE_COLUMNS, LOG_COLUMNS, check_features
from autoshard.placement.greedy import LookAhead, greedy, lowest

FORMAT = "autoshard-numpy-planner/1"
FILE_NAME = "planner.npz"


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ---- export (called with the torch modules; this module never imports torch) ----

def _stack(module, prefix: str, arrays: dict[str, np.ndarray]) -> list[bool]:
    """Linear layers of a (nested) Sequential of Linear and ReLU into `arrays`; returns, per
    layer, whether a ReLU follows it."""
    relu: list[bool] = []
    for leaf in module.modules():
        kind = type(leaf).__name__
        if kind == "Linear":
            arrays[f"{prefix}.{len(relu)}.weight"] = leaf.weight.detach().numpy().copy()
            arrays[f"{prefix}.{len(relu)}.bias"] = leaf.bias.detach().numpy().copy()
            relu.append(False)
        elif kind == "ReLU":
            relu[-1] = True
        elif kind != "Sequential":
            raise TypeError(f"cannot export a {kind} layer")
    return relu


def export(cost_model_path: str | Path, policy_path: str | Path, out: str | Path) -> Path:
    """Write the planner file for a cost model and a policy checkpoint (loaded with torch)."""
    from autoshard.costmodel.model import load_model
    from autoshard.rl.ppo import load_policy

    model = load_model(cost_model_path)
    if model.cfg.single_cost_input:
        raise ConfigError(f"{cost_model_path}: a cost model reading single costs has no NumPy export")
    policy = load_policy(policy_path, model)
    arrays: dict[str, np.ndarray] = {}
    for name in ("mean", "std", "scale"):
        arrays[f"cost_model.{name}"] = getattr(model, name).numpy().copy()
    arrays["policy.mean"], arrays["policy.std"] = policy.mean.numpy().copy(), policy.std.numpy().copy()
    cfg = policy.cfg
    if cfg.lookahead:
        raise ConfigError(f"{policy_path}: a lookahead policy (the fair sharder) has no NumPy export")
    layers = {"cost_model.encoder": _stack(model.encoder, "cost_model.encoder", arrays),
              "cost_model.head": _stack(model.head, "cost_model.head", arrays),
              "policy.action": _stack(policy.action, "policy.action", arrays),
              "policy.score": _stack(policy.score, "policy.score", arrays)}
    if cfg.state_encoder == "separate":
        layers["policy.encoder"] = _stack(policy.encoder, "policy.encoder", arrays)
    if cfg.use_lstm:
        for k in range(cfg.lstm_layers):
            w = {n: getattr(policy.lstm, f"{n}_l{k}").detach().numpy() for n in
                 ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
            arrays[f"policy.lstm.{k}.weight_ih"] = w["weight_ih"].copy()
            arrays[f"policy.lstm.{k}.weight_hh"] = w["weight_hh"].copy()
            arrays[f"policy.lstm.{k}.bias"] = w["bias_ih"] + w["bias_hh"]
    else:
        layers["policy.state_mlp"] = _stack(policy.state_mlp, "policy.state_mlp", arrays)
    meta = {"format": FORMAT, "feature_columns": list(FEATURE_COLUMNS), "log_columns": list(LOG_COLUMNS),
            "layers": layers, "policy": {"state_encoder": cfg.state_encoder, "use_lstm": cfg.use_lstm,
                                         "lstm_layers": cfg.lstm_layers, "use_cost_features": cfg.use_cost_features},
            "sources": {"cost_model": sha256(cost_model_path), "policy": sha256(policy_path)},
            "trained_range": model.trained_range}
    arrays["meta"] = np.array(json.dumps(meta))
    out = Path(out)
    with atomic_file(out) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
    return out


# ---- loading and the forward passes ----

@dataclass(frozen=True)
class Stack:
    """Linear layers, each optionally followed by a ReLU."""

    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]
    relu: tuple[bool, ...]

    def astype(self, dtype) -> "Stack":
        return Stack(tuple(w.astype(dtype) for w in self.weights), tuple(b.astype(dtype) for b in self.biases),
                     self.relu)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        for w, b, r in zip(self.weights, self.biases, self.relu, strict=True):
            x = x @ w.T + b
            if r:
                x = np.maximum(x, 0)
        return x


class NumpyModels:
    """The exported networks; `place` is greedy placement by the policy or by the cost model."""

    def __init__(self, arrays: dict[str, np.ndarray], meta: dict):
        self.meta, self.arrays = meta, arrays
        self.stacks = {name: Stack(tuple(arrays[f"{name}.{i}.weight"] for i in range(len(relu))),
                                   tuple(arrays[f"{name}.{i}.bias"] for i in range(len(relu))), tuple(relu))
                       for name, relu in meta["layers"].items()}
        self.log_index = [FEATURE_COLUMNS.index(c) for c in meta["log_columns"]]
        self.scale = np.float32(arrays["cost_model.scale"])
        self.trained_range: dict[str, list[float]] | None = meta.get("trained_range")  # the cost model's

    # cost model
    def _normalised(self, features: np.ndarray, who: str) -> np.ndarray:
        x = features.astype(np.float32)
        x[:, self.log_index] = np.log1p(x[:, self.log_index])
        return (x - self.arrays[f"{who}.mean"]) / self.arrays[f"{who}.std"]

    def encode(self, features: np.ndarray, who: str = "cost_model") -> np.ndarray:
        """Encodings (N, E) of raw features (N, 21) by the cost model's (or the policy's) encoder."""
        return self.stacks[f"{who}.encoder"](self._normalised(features, who))

    def cost_ms(self, pooled: np.ndarray) -> np.ndarray:
        """Predicted cost (ms) from summed encodings (..., E): softplus of the heads, times scale, summed."""
        return self._ms(self.stacks["cost_model.head"](pooled))

    def _ms(self, heads: np.ndarray) -> np.ndarray:
        """Total cost (ms) from the heads' raw outputs (..., heads): softplus, times scale, summed."""
        return (np.logaddexp(np.zeros((), heads.dtype), heads) * self.scale).sum(-1)

    def shard_costs(self, features: np.ndarray, shards: list[list[int]]) -> np.ndarray:
        """Predicted cost (ms) per shard of table indices; an empty shard costs 0."""
        enc = self.encode(check_features(features))
        pooled = np.stack([enc[s].sum(0) if len(s) else np.zeros(enc.shape[1], np.float32) for s in shards])
        return np.where([len(s) > 0 for s in shards], self.cost_ms(pooled), 0.0)

    # policy
    def _states(self, enc: np.ndarray) -> np.ndarray:
        t = len(enc)
        x = np.concatenate([enc, (np.arange(t, dtype=np.float32) / np.float32(t))[:, None]], axis=1)
        if not self.meta["policy"]["use_lstm"]:
            return self.stacks["policy.state_mlp"](x)
        for k in range(self.meta["policy"]["lstm_layers"]):
            x = self._lstm_layer(x, k)
        return x

    def _lstm_layer(self, x: np.ndarray, k: int) -> np.ndarray:
        w_hh = self.arrays[f"policy.lstm.{k}.weight_hh"]
        gates_in = x @ self.arrays[f"policy.lstm.{k}.weight_ih"].T + self.arrays[f"policy.lstm.{k}.bias"]
        hidden = w_hh.shape[1]
        h, c = np.zeros(hidden, np.float32), np.zeros(hidden, np.float32)
        out = np.empty((len(x), hidden), np.float32)
        with np.errstate(over="ignore"):  # exp(-x) overflows to inf for very negative x: sigmoid 0
            for step in range(len(x)):  # PyTorch's gate order: input, forget, cell, output
                g = gates_in[step] + w_hh @ h
                i, f, o = (1 / (1 + np.exp(-g[j * hidden:(j + 1) * hidden])) for j in (0, 1, 3))
                c = f * c + i * np.tanh(g[2 * hidden:3 * hidden])
                h = o * np.tanh(c)
                out[step] = h
        return out

    def place(self, features: np.ndarray, sizes: np.ndarray, devices: int, capacity: int, name: str = "user",
              policy: bool = True) -> np.ndarray:
        """A device per table (in the given order): the policy's greedy placement, or (`policy`
        False) greedy placement on the cost model alone."""
        # Each distinct table is encoded once: a BLAS product over many rows may round identical
        # rows differently, and tied tables and devices must stay exactly tied (as in torch).
        unique, inverse = np.unique(check_features(features), axis=0, return_inverse=True)
        enc = self.encode(unique)
        single = self.cost_ms(enc)[inverse]
        order = np.argsort(-single, kind="stable")
        steps = _Steps(enc[inverse[order]], np.asarray(sizes, np.float64)[order], devices, float(capacity), name,
                       order)
        if not policy:
            placed = self._cost_greedy(steps)
        else:
            own = None if self.meta["policy"]["state_encoder"] == "cost_model" else self.encode(unique, "policy")
            placed = self._policy_greedy(steps, None if own is None else own[inverse[order]],
                                         single[order].sum() / np.float32(devices))
        out = np.empty(len(order), np.int64)
        out[order] = placed
        return out

    def _cost_greedy(self, s: "_Steps") -> np.ndarray:
        head = self.stacks["cost_model.head"].astype(np.float64)
        w1, b1 = head.weights[0], head.biases[0]
        first = np.zeros((s.devices, len(b1)))  # device_sum @ w1.T, a device's row updated when it changes
        rest = Stack(head.weights[1:], head.biases[1:], head.relu[1:])

        def best(t: int, fits: np.ndarray) -> int:
            h = first + (s.enc[t] @ w1.T + b1)
            return lowest(self._ms(rest(np.maximum(h, 0) if head.relu[0] else h)).astype(np.float32), fits)

        def placed(t: int, k: int) -> None:
            s.add(t, k)
            first[k] = s.device_sum[k].astype(np.float64) @ w1.T

        return greedy(len(s.enc), s.rule, best, placed)

    def _policy_greedy(self, s: "_Steps", own_enc: np.ndarray | None, reference: np.float32) -> np.ndarray:
        """`own_enc`: the policy's own table encodings in placement order (None: the cost model's)."""
        cfg = self.meta["policy"]
        penc = s.enc if own_enc is None else own_enc
        states = self._states(penc).astype(np.float64)
        per_device = np.float32(len(s.enc) / s.devices)
        action, score = self.stacks["policy.action"].astype(np.float64), self.stacks["policy.score"].astype(np.float64)
        w1, b1 = score.weights[0], score.biases[0]
        hid = w1.shape[0]
        w_s, w_a, w_m = w1[:, :hid], w1[:, hid:2 * hid], w1[:, 2 * hid:]
        w2, b2 = score.weights[1][0], score.biases[1][0]
        device_enc = np.zeros((s.devices, penc.shape[1]), np.float32)
        cost = np.zeros(s.devices, np.float32)

        def action_row(k: int) -> np.ndarray:
            c = cost[k] / reference if cfg["use_cost_features"] else np.float32(0)
            used = np.float32(s.rule.memory[k] / s.rule.capacity)
            return action(np.concatenate([device_enc[k] / per_device, [c, used, 1 - used]]).astype(np.float64))

        a = np.tile(action_row(0), (s.devices, 1))  # (D, H): every device starts empty
        a_w = a @ w_a.T

        def best(t: int, fits: np.ndarray) -> int:
            st = states[t]
            z = np.maximum(st @ w_s.T + b1 + a_w + a @ (w_m * st).T, 0)
            return int(np.where(fits, (z @ w2 + b2).astype(np.float32), -np.inf).argmax())

        def placed(t: int, k: int) -> None:
            device_enc[k] += penc[t]
            s.add(t, k)
            cost[k] = self.cost_ms(s.device_sum[k])
            a[k] = action_row(k)
            a_w[k] = a[k] @ w_a.T

        return greedy(len(s.enc), s.rule, best, placed)


class _Steps:
    """One task placed in order: its encodings, each device's encoding sum, and the environment's
    mask as the loop's rule (`LookAhead`: room, and room for the rest)."""

    def __init__(self, enc: np.ndarray, sizes: np.ndarray, devices: int, capacity: float, name: str,
                 order: np.ndarray):
        self.enc, self.devices = enc, devices
        self.device_sum = np.zeros((devices, enc.shape[1]), np.float32)
        self.rule = LookAhead(sizes, devices, capacity, lambda t: f"task {name}: table {int(order[t])} at step {t}")

    def add(self, t: int, k: int) -> None:
        self.device_sum[k] += self.enc[t]


def load(path: str | Path, cost_model_path: str | Path, policy_path: str | Path | None,
         required: bool = False) -> NumpyModels | None:
    """The planner file at `path` if it was exported from exactly these model files, else None
    (the caller then uses torch), or with `required` an error. A file that is not a planner
    export is always an error."""
    path = Path(path)
    if not path.is_file():
        if required:
            raise ConfigError(f"{path}: NumPy planner not found (run `dvc repro train_rl`)")
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(str(arrays.pop("meta")))
    except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same clear error
        raise ConfigError(f"{path}: not a NumPy planner file ({exc.__class__.__name__}); "
                          "delete it or run `dvc repro train_rl`") from None
    if (not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("feature_columns") != FEATURE_COLUMNS
            or not isinstance(meta.get("sources"), dict)):
        raise ConfigError(f"{path}: not a NumPy planner file of this version ({FORMAT}); "
                          "delete it or run `dvc repro train_rl`")
    sources = meta["sources"]
    stale = [str(p) for p, key in ((cost_model_path, "cost_model"), (policy_path, "policy"))
             if p is not None and sources[key] != sha256(p)]
    if stale and required:
        raise ConfigError(f"{path}: exported from other model files than {' and '.join(stale)} "
                          "(run `dvc repro train_rl`)")
    return None if stale else _checked(path, arrays, meta)


def _checked(path: Path, arrays: dict[str, np.ndarray], meta: dict) -> NumpyModels:
    """The planner of a file whose arrays are finite and fit together (one table through the
    cost model runs)."""
    bad = [k for k, a in arrays.items() if a.dtype.kind == "f" and not np.isfinite(a).all()]
    if bad:
        raise ConfigError(f"{path}: array {bad[0]} holds NaN or infinite values; delete it or run "
                          "`dvc repro train_rl`")
    try:
        planner = NumpyModels(arrays, meta)
        planner.cost_ms(planner.encode(np.ones((1, len(FEATURE_COLUMNS)))))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ConfigError(f"{path}: not a usable NumPy planner file ({exc.__class__.__name__}); delete it or run "
                          "`dvc repro train_rl`") from None
    return planner
