"""reports/train_rl.md: the policy's training curve, each inference mode and heuristic against the
best heuristic on the validation tasks (predicted), the fair sharder, and the sharding speed."""

from autoshard.pipeline.report.format import Figures, heading, join, paragraph, ratio, table
from autoshard.pipeline.report.results import Results

TITLE = "Train RL: the policy on the validation tasks (predicted)"


def page(results: Results, figures: Figures) -> str | None:
    """The train_rl page's text, or None without its metrics."""
    t = results.train_rl
    if t is None:
        return None
    modes = [{"method": mode, "mean ratio to the best heuristic": ratio(value),
              "win rate": ratio(t["validation_win_rate"].get(mode), 2)}
             for mode, value in t["validation_ratio_to_best_heuristic"].items()]
    heuristics = [{"heuristic": h, "mean ratio to the best": ratio(v)}
                  for h, v in t["heuristics_ratio_to_best"].items()]
    speed = [{"what": k, "seconds": ratio(v, 4)} for k, v in t["speed_seconds"].items()]
    fair = t.get("fair")
    fair_text = "" if fair is None else paragraph(
        f"The fair learned sharder: {ratio(fair['val_ratio'])} after training against its teacher cost_greedy's "
        f"{ratio(fair['cost_greedy_val_ratio'])} and the reproduction's {ratio(fair['reproduction_val_ratio'])} "
        f"({ratio(fair['after_imitation_val_ratio'])} after imitation, {ratio(fair['unshaped_val_ratio'])} with the "
        f"terminal reward only); no worse than greedy on its own simulator: "
        f"{'yes' if fair['no_worse_than_greedy'] else '**no**'} (kept iteration {fair['kept_iteration']}; chosen on "
        "these tasks, so the evaluate stage's test tasks are the check).")
    return join(heading(TITLE),
                paragraph(f"{t['iterations']} PPO iterations. Mean predicted bottleneck over the best heuristic's on "
                          "the validation tasks (lower is better; the cost model is the simulator)."),
                figures.inline("train_rl", "training", "validation ratio during training"), table(modes),
                "## The fair sharder",
                figures.inline("train_rl", "fair_training", "the fair sharder's validation curve"),
                fair_text,
                "## Heuristics", table(heuristics),
                "## A worked example",
                figures.inline("train_rl", "placement_example", "one validation task: each device's tables"),
                "## Sharding speed", table(speed))
