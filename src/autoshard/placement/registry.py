"""Every placement method of the study under one id, used alike by the stages, the reports and
the `autoshard` command, with its kind (what it is compared as) and what it needs."""

from dataclasses import dataclass

from autoshard.placement.heuristics import HEURISTICS


@dataclass(frozen=True)
class Method:
    """A placement method: `id` everywhere; `kind` heuristic | baseline | rl | optimum;
    `needs` the trained files it reads (cost model, policy); `objective`, when set, the one it
    optimises: the evaluate stage plans it only for protocols ranked by that objective."""

    id: str
    kind: str
    needs: tuple[str, ...] = ()
    summary: str = ""
    objective: str | None = None


_METHODS = (
    *(Method(h, "heuristic", summary="the prototypes' heuristic, respecting memory") for h in HEURISTICS),
    Method("torchrec", "baseline", summary="TorchRec's EmbeddingShardingPlanner, table-wise"),
    Method("cost_greedy", "baseline", ("cost_model",),
           summary="largest predicted table first onto the device with the lowest predicted cost after it"),
    Method("cost_greedy_local_search", "baseline", ("cost_model",),
           summary="cost_greedy refined by local search on the cost model"),
    Method("hybrid_greedy", "baseline", ("hybrid", "profile"),
           summary="cost_greedy on the hybrid cost model (measured single costs x a learnt fusion factor)"),
    Method("lpt_measured", "baseline", ("profile",),
           summary="LPT on the profile's measured single-table costs: largest first onto the least-loaded device"),
    Method("milp", "baseline", ("profile",),
           summary="exact min-max MILP (HiGHS) on the measured single-table costs, node- and time-limited"),
    Method("sync_greedy", "baseline", ("profile",),
           summary="largest measured single cost first onto the device with the lowest predicted synchronized-"
                   "stages cost (measured single forward/backward costs summed, comm model)",
           objective="synchronized_stages"),
    Method("sync_local_search", "baseline", ("profile",),
           summary="sync_greedy refined by moves and swaps on the predicted synchronized-stages cost",
           objective="synchronized_stages"),
    Method("sync_milp", "baseline", ("profile",),
           summary="exact MILP (HiGHS) on the predicted synchronized-stages cost (per-stage linear surrogate), "
                   "node- and time-limited", objective="synchronized_stages"),
    Method("rl_greedy", "rl", ("cost_model", "policy"), summary="the trained policy, greedy"),
    Method("rl_best_of_n", "rl", ("cost_model", "policy"),
           summary="the best of N sampled placements by predicted bottleneck"),
    Method("rl_local_search", "rl", ("cost_model", "policy"),
           summary="the greedy policy's placement refined by local search on the cost model"),
    Method("rl_sync_greedy", "rl", ("stages_model", "sync_policy", "profile"),
           summary="the policy trained on the predicted synchronized-stages cost (stage-head cost model, comm "
                   "model), greedy", objective="synchronized_stages"),
    Method("rl_sync_local_search", "rl", ("stages_model", "sync_policy", "profile"),
           summary="rl_sync_greedy's placement refined by sync_local_search's moves and swaps on the predicted "
                   "synchronized-stages cost", objective="synchronized_stages"),
    Method("exact", "optimum", ("cost_model",), summary="exhaustive search under the cost model (small tasks)"),
)
REGISTRY: dict[str, Method] = {m.id: m for m in _METHODS}
METHODS: tuple[str, ...] = tuple(REGISTRY)
KIND: dict[str, str] = {m.id: m.kind for m in _METHODS}
# Methods planned only where their objective ranks the protocol's plans: method -> objective.
OBJECTIVE: dict[str, str] = {m.id: m.objective for m in _METHODS if m.objective}
RL_METHODS: tuple[str, ...] = tuple(m.id for m in _METHODS if m.kind == "rl")
# What the `autoshard` command offers: every method that needs only the tables and the trained files.
COMMAND: tuple[str, ...] = tuple(m.id for m in _METHODS if m.kind != "optimum" and "profile" not in m.needs)
LEARNED: tuple[str, ...] = tuple(m.id for m in _METHODS if "cost_model" in m.needs and m.kind != "optimum")


def ids(kind: str) -> tuple[str, ...]:
    """The ids of every method of one kind, in registry order."""
    return tuple(m.id for m in _METHODS if m.kind == kind)
