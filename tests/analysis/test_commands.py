"""The `trace`, `info` and `docs` commands; generated docs are up to date."""

from __future__ import annotations

from pathlib import Path

import pytest

from vit_attention import list_attention
from vit_attention.analysis.docs import (
    check_docs,
    flex_page_with_table,
    generate_docs,
    mechanism_page,
    pictured_mechanisms,
    readme_with_table,
)
from vit_attention.analysis.info import model_info
from vit_attention.attention import get_attention_spec
from vit_attention.cli import main

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_trace_command(capsys):
    assert main(["trace", "vit_b_16", "--flow"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("[1, 3, 224, 224] → patch_embed → [1, 196, 768]")
    assert main(["trace", "swin_t", "--depth", "2"]) == 0
    assert "layers.3" in capsys.readouterr().out


def test_info_command(capsys):
    assert main(["info", "swin_t", "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "swin_tiny_patch4_window7_224" in out and "aliases:       swin_t" in out
    assert "28,288,354" in out and "GMACs:         9.018" in out and "[2, 1000]" in out
    assert "torchvision" in out and "layers.2" in out and "MiB" in out
    assert main(["info", "nope_model"]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_model_arg_reaches_the_model_in_summary_trace_and_info(capsys):
    """``--model-arg`` on the commands that show a model: the overridden model is what they describe (a
    shallower ViT, Swin with another mechanism), and an unknown option names itself."""
    assert main(["trace", "deit_tiny_patch16_224", "--flow", "--model-arg", "depth=2"]) == 0
    flow = capsys.readouterr().out
    assert "blocks.1 →" in flow and "blocks.2" not in flow
    assert main(["summary", "deit_tiny_patch16_224", "--meta", "--model-arg", "depth=2"]) == 0
    assert '"depth": 2' in capsys.readouterr().out
    # a --model-arg that is also an option of the command: the option given wins, no clash
    assert main(["summary", "deit_tiny_patch16_224", "--meta", "--model-arg", "img_size=64", "--img-size", "32"]) == 0
    assert "input shape:  [1, 3, 32, 32]" in capsys.readouterr().out
    assert main(["info", "deit_tiny_patch16_224", "--model-arg", "img_size=64"]) == 0
    assert "[1, 3, 64, 64]" in capsys.readouterr().out
    base = model_info("swin_t")
    nat = model_info("swin_t", attn_layer="neighborhood", attn_kwargs={"kernel_size": 7})
    assert nat.config["attn_layer"] == "neighborhood" and base.config["attn_layer"] == "window"
    assert nat.macs != base.macs  # 7x7 neighbourhoods cost other MACs than 7x7 windows (same 13x13 bias tables)
    assert main(["info", "swin_t", "--model-arg", "attn_layer=neighborhood",
                 "--model-arg", 'attn_kwargs={"kernel_size": 7}']) == 0
    assert f"GMACs:         {nat.macs / 1e9:.3f}" in capsys.readouterr().out
    assert main(["info", "swin_t", "--model-arg", "nosuch=1"]) == 2
    assert "nosuch" in capsys.readouterr().err


def test_model_info_fields():
    info = model_info("vit_base_patch16_224", batch_size=4)
    assert info.input_shape == (4, 3, 224, 224) and info.output_shapes == [(4, 1000)]
    assert sum(info.params_by_stage.values()) == info.params == 86_567_656
    assert info.macs == pytest.approx(4 * 17.58e9, rel=0.01)
    # activations grow linearly with the batch
    assert model_info("vit_base_patch16_224", batch_size=8).activation_bytes == 2 * info.activation_bytes
    assert "vit_b_16" in info.aliases
    assert model_info("deit_tiny_distilled_patch16_224").output_shapes == [(1, 1000)]  # eval: heads averaged


def test_mechanism_pages_have_every_section():
    for name in list_attention():
        page = mechanism_page(name, f"img/{name}.png")
        note = get_attention_spec(name).weights_note  # no weights: no logits in the flow, the reason instead
        for section in ("## Formula", "## Shape flow", "## Complexity", "## Attention pattern",
                        f"No picture: {note}" if note else "logits q·kᵀ"):
            assert section in page, (name, section)
        assert (f"img/{name}.png" in page) == (name in pictured_mechanisms())


def _same_picture(new: Path, old: Path) -> bool:
    """The same picture: equal bytes, or equal size with at most 1 % of the pixels off by more than 32 levels
    (another matplotlib / zlib may encode or antialias an unchanged map a little differently; another map or
    layout moves far more pixels than that)."""
    if not old.is_file():
        return False
    if new.read_bytes() == old.read_bytes():
        return True
    import numpy as np
    from PIL import Image

    a = np.asarray(Image.open(new).convert("RGB"), dtype=np.int16)
    b = np.asarray(Image.open(old).convert("RGB"), dtype=np.int16)
    return a.shape == b.shape and float((np.abs(a - b).max(axis=-1) > 32).mean()) <= 0.01


@pytest.mark.compile
def test_generated_pages_and_pictures_are_the_checkouts(tmp_path):
    """`vit-attention docs` written to a new folder (mechanism pages, index and pictures: every docs/attention/
    file) gives the checkout's pages byte for byte and its pictures (:func:`_same_picture`), and the README's
    and docs/flex.md's generated tables are current: the docs are up to date (docs/models.md: its rows are
    checked with the full-size FLOP counts in test_flops.py).
    The pictures do not depend on the thread count (float64 maps rounded before drawing, no timestamp): they
    are drawn with one thread here, the checkout's with the machine's default."""
    import torch

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        paths = generate_docs(tmp_path, images=True, models=False)
    finally:
        torch.set_num_threads(threads)
    names = {p.relative_to(tmp_path).as_posix() for p in paths}
    for mech in list_attention():
        assert f"attention/{mech}.md" in names
        assert (f"attention/img/{mech}.png" in names) == (mech in pictured_mechanisms())
    stale = [n for n in sorted(names) if not (_same_picture(tmp_path / n, DOCS / n) if n.endswith(".png")
                                              else (tmp_path / n).read_bytes() == (DOCS / n).read_bytes())]
    assert not stale, f"generated docs are stale: {stale}; regenerate with `vit-attention docs`"
    readme = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    flex = (DOCS / "flex.md").read_text(encoding="utf-8")
    assert readme_with_table(readme) == readme and flex_page_with_table(flex) == flex, "regenerate the tables"


def test_same_picture_tells_another_map_from_a_reencoding(tmp_path):
    """A picture re-encoded is the same picture; one with a patch of the map changed, or cropped, is not."""
    import numpy as np
    from PIL import Image

    src = sorted((DOCS / "attention" / "img").glob("*.png"))[0]
    img = np.asarray(Image.open(src).convert("RGB")).copy()
    Image.fromarray(img).save(tmp_path / "same.png", compress_level=1)  # other bytes, same pixels
    assert (tmp_path / "same.png").read_bytes() != src.read_bytes() and _same_picture(tmp_path / "same.png", src)
    h, w = img.shape[:2]
    changed = img.copy()
    changed[h // 4: h // 2, w // 4: w // 2] = 255 - changed[h // 4: h // 2, w // 4: w // 2]
    Image.fromarray(changed).save(tmp_path / "changed.png")
    assert not _same_picture(tmp_path / "changed.png", src)
    Image.fromarray(img[1:]).save(tmp_path / "cropped.png")
    assert not _same_picture(tmp_path / "cropped.png", src)
    assert not _same_picture(src, tmp_path / "missing.png")


def test_check_docs_names_stale_missing_pages_pictures_and_tables(tmp_path, monkeypatch):
    """``vit-attention docs --check``: a page that differs or is missing, a missing picture and a stale table."""
    import vit_attention.analysis.docs as docs

    pages = {"attention/a.md": "A\n", "attention/b.md": "B\n"}
    monkeypatch.setattr(docs, "_pages", lambda models=True, out=None: pages)
    monkeypatch.setattr(docs, "flex_page_with_table", lambda text: text.replace("old", "new"))  # its tables: above
    (tmp_path / "attention" / "img").mkdir(parents=True)
    (tmp_path / "attention" / "a.md").write_text("A\n", encoding="utf-8")
    (tmp_path / "flex.md").write_text(f"x\n{docs.FLEX_TABLE_START}\nold\n{docs.FLEX_TABLE_END}\n", encoding="utf-8")
    stale = {p.relative_to(tmp_path).as_posix() for p in check_docs(tmp_path)}
    assert stale == {"attention/b.md", "flex.md", *(f"attention/img/{n}.png" for n in pictured_mechanisms())}
    for n in pictured_mechanisms():
        (tmp_path / "attention" / "img" / f"{n}.png").write_bytes(b"png")
    (tmp_path / "attention" / "a.md").write_text("A, edited\n", encoding="utf-8")
    assert {p.name for p in check_docs(tmp_path)} == {"a.md", "b.md", "flex.md"}


def test_docs_writes_the_checkouts_docs_wherever_it_runs(tmp_path, monkeypatch, capsys):
    """`vit-attention docs` from another folder regenerates the checkout's docs/, never ./docs; outside a
    checkout it asks for --output."""
    import vit_attention.analysis.docs as docs
    from vit_attention.cli import main

    seen = []
    monkeypatch.setattr(docs, "generate_docs", lambda out, images=True: seen.append(Path(out)) or [])
    monkeypatch.chdir(tmp_path)
    assert main(["docs", "--no-images"]) == 0
    assert seen == [DOCS] and not (tmp_path / "docs").exists()
    assert main(["docs", "--output", str(tmp_path / "mine")]) == 0 and seen[-1] == tmp_path / "mine"
    monkeypatch.setattr(docs, "__file__", str(tmp_path / "site-packages" / "vit_attention" / "analysis" / "docs.py"))
    assert main(["docs"]) == 2
    assert "give --output DIR" in capsys.readouterr().err and len(seen) == 2
