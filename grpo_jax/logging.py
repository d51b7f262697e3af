"""Run logs: a console progress bar, metrics.jsonl, TensorBoard events and a PNG of the main curves.

Only process 0 writes; on other processes every method is a no-op, so the host loop calls them
unconditionally. Metrics arrive as flat dicts of Python floats (fetched once per step).
"""

import json
import pathlib

import jax

# The curves of the final plot, in panel order; a panel is drawn only if its metric was logged.
PLOT_PANELS = (
    ("reward/mean", "eval/accuracy_greedy"),
    ("accuracy", "eval/accuracy_sampled"),
    ("completion/length_mean",),
    ("clip_frac_low", "clip_frac_high"),
    ("kl_k3_mean", "entropy_mean"),
    ("grad_norm",),
)
# Shown on the progress bar.
BAR_KEYS = ("reward/mean", "accuracy", "completion/length_mean", "eval/accuracy_greedy")


class MetricsLogger:
    """Writes `out_dir/metrics.jsonl`, `out_dir/tensorboard/` and, on close, `out_dir/curves.png`."""

    def __init__(self, out_dir: str | pathlib.Path, total_steps: int, initial_step: int = 0):
        self.enabled = jax.process_index() == 0
        self.out_dir = pathlib.Path(out_dir)
        self.history: list[dict] = []
        if not self.enabled:
            return
        import tensorboardX
        import tqdm

        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = open(self.out_dir / "metrics.jsonl", "a")
        self.tb = tensorboardX.SummaryWriter(str(self.out_dir / "tensorboard"))
        self.bar = tqdm.tqdm(total=total_steps, initial=initial_step, dynamic_ncols=True)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.history.append(row)
        self.jsonl.write(json.dumps(row) + "\n")
        self.jsonl.flush()
        for k, v in metrics.items():
            self.tb.add_scalar(k, float(v), step)
        self.bar.set_postfix({k.split("/")[-1]: f"{row[k]:.3g}" for k in BAR_KEYS if k in row})
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        """Flushes everything and draws the curves of this run."""
        if not self.enabled:
            return
        self.bar.close()
        self.tb.close()
        self.jsonl.close()
        plot_curves(self.history, self.out_dir / "curves.png")


def plot_curves(history: list[dict], path: str | pathlib.Path) -> None:
    """One panel per group of `PLOT_PANELS` that has data, metric against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [[k for k in keys if any(k in r for r in history)] for keys in PLOT_PANELS]
    panels = [p for p in panels if p]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.0), squeeze=False)
    for ax, keys in zip(axes[0], panels):
        for k in keys:
            pts = [(r["step"], r[k]) for r in history if k in r]
            ax.plot(*zip(*pts), marker="." if len(pts) < 30 else None, label=k)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
