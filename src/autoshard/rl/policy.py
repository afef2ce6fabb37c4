"""AutoShard's policy network: an LSTM over the placement steps, devices scored as actions.

State at step t: the current table's encoding (the cost model's encoder, frozen, or a
separate trainable one) and the step fraction t/T, through a 2-layer LSTM. Each device is
an action, represented by the sum of its tables' encodings (divided by T/D, the mean number
of tables per device) and [predicted device cost / reference load, memory used / cap,
memory left / cap]. An MLP scores [state, action, state*action] into one logit per device;
a value head reads the state and the pooled actions. Nothing is sized by T or D.

`lookahead` (the fair sharder's, not AutoShard's design) adds what the cost-model greedy sees: each
device's predicted cost after placing the current table and the bottleneck that would leave (both /
reference load), where that cost lies between the devices' lowest (0) and highest (1), and a
summary of the tables still to place (their predicted single costs / all the task's, their bytes /
the memory still free).
"""

from dataclasses import dataclass

import torch
from torch import nn

from autoshard.core.params import choice
from autoshard.costmodel.model import CostModel, transform
from autoshard.rl.env import Lookahead

ENCODERS = ("cost_model", "separate")


@dataclass(frozen=True)
class PolicyConfig:
    state_encoder: str = choice(ENCODERS)
    hidden: int
    lstm_layers: int
    use_lstm: bool           # False: an MLP on the current state (ablation)
    use_cost_features: bool  # False: actions without the cost model's estimates (ablation)
    lookahead: bool          # True: actions also see the cost after placing and the tables to come


LOOKAHEAD = 5  # action features `lookahead` adds


def mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class Policy(nn.Module):
    def __init__(self, cfg: PolicyConfig, cost_model: CostModel):
        super().__init__()
        self.cfg = cfg
        enc = cost_model.cfg.encoding
        hidden = cfg.hidden
        self.register_buffer("mean", cost_model.mean.clone())
        self.register_buffer("std", cost_model.std.clone())
        if cfg.state_encoder == "separate":
            self.encoder = nn.Sequential(mlp(len(cost_model.mean), cost_model.cfg.hidden, enc), nn.ReLU())
        if cfg.use_lstm:
            self.lstm = nn.LSTM(enc + 1, hidden, num_layers=cfg.lstm_layers, batch_first=True)
        else:
            self.state_mlp = nn.Sequential(mlp(enc + 1, hidden, hidden), nn.ReLU())
        extra = LOOKAHEAD if cfg.lookahead else 0
        self.action = nn.Sequential(mlp(enc + 3 + extra, hidden, hidden), nn.ReLU())
        self.score = mlp(3 * hidden, hidden, 1)
        self.value = mlp(3 * hidden, hidden, 1)

    def table_encodings(self, features: torch.Tensor, cost_model_encodings: torch.Tensor) -> torch.Tensor:
        """(B, T, E) encodings of the tables the policy sees."""
        if self.cfg.state_encoder == "separate":
            return self.encoder((transform(features) - self.mean) / self.std)
        return cost_model_encodings

    def states(self, encodings: torch.Tensor) -> torch.Tensor:
        """(B, T, H) state after each step's table, from the whole (action-independent) sequence."""
        b, t, _ = encodings.shape
        frac = (torch.arange(t, dtype=encodings.dtype) / t).expand(b, t)[..., None]
        x = torch.cat([encodings, frac], dim=-1)
        if self.cfg.use_lstm:
            return self.lstm(x)[0]
        return self.state_mlp(x)

    def action_features(self, device_enc: torch.Tensor, device_cost: torch.Tensor,
                        device_mem: torch.Tensor, capacity: torch.Tensor, reference: torch.Tensor,
                        tables_per_device: float, ahead: Lookahead | None = None) -> torch.Tensor:
        """(..., D, E + 3 [+ LOOKAHEAD]) device representations, scale-free in T, D and the cost
        unit; `ahead` is required by a `lookahead` policy and ignored by others."""
        cost = device_cost / reference[..., None]
        if not self.cfg.use_cost_features:
            cost = torch.zeros_like(cost)
        used = (device_mem / capacity[..., None]).float()
        parts = [device_enc / tables_per_device, cost[..., None], used[..., None], (1 - used)[..., None]]
        if self.cfg.lookahead:
            if ahead is None:
                raise ValueError("a lookahead policy needs the lookahead features")
            after = ahead.after / reference[..., None]
            now = cost.max(-1, keepdim=True).values
            low, high = after.min(-1, keepdim=True).values, after.max(-1, keepdim=True).values
            spread = (after - low) / (high - low).clamp_min(1e-6)  # 0 where greedy would place
            parts += [after[..., None], torch.maximum(after, now)[..., None], spread[..., None],
                      ahead.remaining[..., None, :].expand(*after.shape, 2).to(after.dtype)]
        return torch.cat(parts, dim=-1)

    def forward(self, state: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor, value: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Masked logits (..., D) and value (...) from states (..., H) and actions (..., D, E+3);
        `value=False` skips the value head (greedy inference needs no critic)."""
        a = self.action(actions)
        s = state[..., None, :].expand_as(a)
        logits = self.score(torch.cat([s, a, s * a], dim=-1)).squeeze(-1)
        logits = logits.masked_fill(~mask, float("-inf"))
        if not value:
            return logits, None
        pooled = torch.cat([state, a.mean(-2), a.max(-2).values], dim=-1)
        return logits, self.value(pooled).squeeze(-1)
