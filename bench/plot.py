"""The benchmark's picture, one run: the DELETE-lag CDF of every contender, and each
contender's RSS over time."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLORS = {
    "unstick": "#1b9e77",
    "naive": "#d95f02",
    "kopf_native": "#7570b3",
    "podgc": "#e7298a",
    "unstick_w32": "#66a61e",
}
TARGET_ALL_GONE_S = 15.0  # issue 14: every NodeGone pod gone ≤ 15 s after eligibility


def draw(
    path: Path,
    title: str,
    lags: dict[str, list[float]],
    rss: dict[str, list[tuple[float, float]]],
) -> None:
    """`lags`: contender → DELETE lags (s); `rss`: contender → (s since strike, MiB).
    Both panels hold every contender of the one run the caller passes."""
    fig, (ax_lag, ax_rss) = plt.subplots(1, 2, figsize=(13, 5))
    for name, values in lags.items():
        if not values:
            continue
        ordered = sorted(values)
        fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
        ax_lag.step(ordered, fractions, where="post", label=name, color=COLORS.get(name))
    ax_lag.axvline(TARGET_ALL_GONE_S, color="grey", linestyle=":", linewidth=1)
    ax_lag.text(TARGET_ALL_GONE_S, 0.02, " 15 s target", color="grey", fontsize=8)
    ax_lag.set_xscale("symlog", linthresh=1.0)  # sub-second and minute-long lags side by side
    ax_lag.set_xlabel("deletionTimestamp + slack → first successful DELETE (s, symlog)")
    ax_lag.set_ylabel("fraction of NodeGone pods")
    ax_lag.set_ylim(0, 1.02)
    ax_lag.grid(alpha=0.3)
    ax_lag.legend()
    ax_lag.set_title("NodeGone pods' DELETE lag (CDF)")
    for name, series in rss.items():
        if series:
            xs, ys = zip(*series, strict=True)
            ax_rss.plot(xs, ys, label=name, color=COLORS.get(name))
    ax_rss.axvline(0, color="grey", linestyle="--", linewidth=1)
    ax_rss.set_xlabel("seconds since the stuck pods were made (dashed line)")
    ax_rss.set_ylabel("RSS of the contender process, MiB")
    ax_rss.grid(alpha=0.3)
    ax_rss.legend()
    ax_rss.set_title("memory over time")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
