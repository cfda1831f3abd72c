"""Draw ``docs/img/token_merging.png``, the figure of docs/token_merging.md: which patches ToMe merged.

    .venv/bin/vit-attention                       # the main job: trains the digits ViT into runs/...
    .venv/bin/python docs/img/make_token_merging_figure.py runs/vit_digits_patch2_8-*/ [--tome 3]

Rows: the first test digit of a few classes; columns: the input, then the patches grouped after each
block (patches one token covers share a colour; single patches are left as they are). The digits ViT
has 16 patches (8x8 pixels, patch 2) and 4 blocks; with r = 3 it keeps 13, 10, 7, 4 of them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import vit_attention as va
from vit_attention.analysis.merging import merge_groups
from vit_attention.analysis.render import save_merge_groups
from vit_attention.train.data import load_digits_split

OUT = Path(__file__).resolve().parent / "token_merging.png"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="the main job's run folder")
    p.add_argument("--tome", type=int, default=3, help="tokens merged per block (default 3)")
    args = p.parse_args()
    model = va.load_model(args.run).eval()
    model.set_token_merging(args.tome)
    data = load_digits_split()
    images, labels = zip(*(data.test[i] for i in range(len(data.test))))
    picks = [next(i for i, y in enumerate(labels) if int(y) == c) for c in (0, 3, 4, 7)]
    x = torch.stack([images[i] for i in picks])  # [4, 1, 8, 8] in [0, 1]
    mean, std = data.mean[0], data.std[0]
    groups = merge_groups(model, (x - mean) / std)  # per block [4, 4, 4]
    kept = [int(g[0].unique().numel()) for g in groups]
    titles = [f"after block {i} ({k} tokens)" for i, k in enumerate(kept)]
    save_merge_groups(list(x), [[g[j] for g in groups] for j in range(len(picks))], titles, OUT,
                      suptitle=f"ToMe r = {args.tome} on the digits ViT: patches one token covers share a colour")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
