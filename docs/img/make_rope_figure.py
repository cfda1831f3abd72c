"""Draw ``docs/img/rope.png``, the figure of docs/rope.md, from the package's own RoPE tables.

    .venv/bin/python docs/img/make_rope_figure.py

Four panels, head width 64 on a 16x16 patch grid (224 px at patch 14, or 256 at patch 16):
(a) radians turned per patch step by each of the 16 bands of an axis, for the three axial conventions;
(b) cos of the angle of one x band of the RoPE-ViT axial rule over the grid (it turns along x only);
(c) the same for one pair of a RoPE-Mixed head (learned frequencies, here the paper's initialisation
with the head's direction φ = 0.6: oblique stripes); (d) the RoPE-only attention logit ``q·k`` of a
fixed query at the centre against the same key everywhere (EVA-02 rule): it depends on the offset only.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from vit_attention.attention.rope import RotaryEmbedding  # noqa: E402

HD, GRID = 64, (16, 16)
OUT = Path(__file__).resolve().parent / "rope.png"


def main() -> None:
    torch.manual_seed(3)
    nb = HD // 4
    i = torch.arange(nb, dtype=torch.float64)
    per_step = {  # radians per one-patch step along an axis, 16 patches per side
        "EVA-02 (θ 10⁴, index·16/L)": 10000.0 ** (-i / nb),
        "RoPE-ViT axial (θ 100, index)": 100.0 ** (-i / nb),
        "DINOv3 (θ 100, 2π·centre in (−1, 1))": 2 * math.pi * (2 / GRID[1]) * 100.0 ** (-i / nb),
    }
    fig, ax = plt.subplots(1, 4, figsize=(16, 3.9))
    for label, f in per_step.items():
        ax[0].semilogy(i.numpy(), f.numpy(), marker="o", ms=3, label=label)
    ax[0].axhline(math.pi, color="grey", lw=0.8, ls=":")
    ax[0].text(0.3, math.pi * 1.15, "π per patch", color="grey", fontsize=8)
    ax[0].set(xlabel="band i of an axis (hd/4 = 16 bands)", ylabel="radians per patch step",
              title="(a) axial frequencies, hd = 64")
    ax[0].legend(fontsize=7, loc="lower left")

    naver = RotaryEmbedding(HD, 1, convention="naver")
    cos, _ = naver.tables(GRID)  # [256, 64] interleaved: pair j -> channels 2j, 2j+1; x bands first
    ax[1].imshow(cos[:, 2 * 2].reshape(GRID).numpy(), cmap="RdBu", vmin=-1, vmax=1)
    ax[1].set(title="(b) RoPE-ViT axial: cos, x band 2", xlabel="x", ylabel="y")

    mixed = RotaryEmbedding(HD, 1, "mixed")  # the paper's initialisation with the head's direction φ = 0.6
    mag = 10.0 ** (-torch.arange(nb) * 4 / HD)
    phi = torch.tensor(0.6)
    with torch.no_grad():
        mixed.freqs.copy_(torch.stack([torch.cat([mag * phi.cos(), mag * (phi + math.pi / 2).cos()]),
                                       torch.cat([mag * phi.sin(), mag * (phi + math.pi / 2).sin()])])[:, None])
    cos, _ = mixed.tables(GRID)  # [1, 256, 64]
    ax[2].imshow(cos[0, :, 2 * 3].detach().reshape(GRID).numpy(), cmap="RdBu", vmin=-1, vmax=1)
    ax[2].set(title="(c) RoPE-Mixed: cos, pair 3 (φ = 0.6)", xlabel="x", ylabel="y")

    eva = RotaryEmbedding(HD, 1, convention="eva", ref_feat_shape=GRID)
    q = torch.randn(HD)
    n = GRID[0] * GRID[1]
    qs = q.expand(1, 1, n, HD).contiguous()
    rq, rk = eva(qs, qs, GRID)
    centre = (GRID[0] // 2) * GRID[1] + GRID[1] // 2
    logits = (rq[0, 0, centre] @ rk[0, 0].T) / math.sqrt(HD)
    im = ax[3].imshow(logits.reshape(GRID).numpy(), cmap="viridis")
    ax[3].plot(GRID[1] // 2, GRID[0] // 2, "r+", ms=10)
    ax[3].set(title="(d) q·k/√hd, query at + (EVA-02)", xlabel="x", ylabel="y")
    fig.colorbar(im, ax=ax[3], fraction=0.046)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
