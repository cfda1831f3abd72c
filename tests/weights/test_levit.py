"""LeViT checkpoint layouts (vit_attention/weights/levit.py): timm's linear files load as they are, its conv files
(``levit_conv_*``) through the converter, persisted ``attention_bias_idxs`` are dropped, tables of another grid
resampled and a classifier of another class count dropped (fixtures from tests/fixtures/make_fixtures_levit.py)."""

import pytest
import torch
from fixture_utils import assert_loads, assert_parity, load_fixture

from vit_attention import create_model
from vit_attention.attention.attention_bias import attention_bias_index
from vit_attention.weights import CheckpointMismatchError, load_weights

pytestmark = pytest.mark.parity

SMALL = dict(img_size=(80, 64), num_classes=10, embed_dim=(32, 48, 64), key_dim=8, num_heads=(2, 3, 4),
             depth=(2, 1, 1))


def _model(**overrides: object) -> torch.nn.Module:
    return create_model("levit_128s", **{**SMALL, **overrides}).eval()


def test_timm_linear_files_are_our_own_keys():
    state, t, _ = load_fixture("timm_levit")
    model = _model()
    assert set(state) == set(model.state_dict())
    assert not assert_loads(model, state, "vit_attention").notes  # nothing converted, nothing resampled
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])


def test_conv_files_are_reshaped_and_nothing_else_changes():
    state, t, _ = load_fixture("timm_levit_conv")
    conv = {k for k, v in state.items() if v.dim() == 4 and v.shape[2:] == (1, 1)}
    assert conv and all(k.startswith("stages.") and k.endswith(".linear.weight") for k in conv)
    model = _model()
    assert_loads(model, state, "timm_conv")
    own = model.state_dict()
    for k in conv:
        torch.testing.assert_close(own[k], state[k].flatten(1), rtol=0, atol=0)
    torch.testing.assert_close(own["stem.conv1.linear.weight"], state["stem.conv1.linear.weight"], rtol=0, atol=0)
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])


def test_persisted_bias_indices_are_dropped():
    """facebookresearch/LeViT and older timm files persist ``attention_bias_idxs``: dropped, rebuilt from the grid."""
    state, t, _ = load_fixture("timm_levit")
    state = dict(state)
    state["stages.0.blocks.0.attn.attention_bias_idxs"] = attention_bias_index((5, 4))
    state["stages.1.downsample.attn_downsample.attention_bias_idxs"] = attention_bias_index((5, 4), 2)
    model = _model()
    assert_loads(model, state, "timm")
    with torch.no_grad():
        assert_parity(model(t["input"]), t["output"])


def test_a_classifier_of_another_class_count_is_dropped_and_a_wrong_file_fails():
    state, _, _ = load_fixture("timm_levit")
    model = _model(num_classes=7)
    with pytest.warns(UserWarning, match="10 classes in the checkpoint and 7 in the model"):
        report = load_weights(model, state)
    assert report.ok and {"head.linear", "head_dist.linear"} <= set(report.dropped)
    with pytest.raises(CheckpointMismatchError):
        load_weights(_model(embed_dim=(32, 48, 80), num_heads=(2, 3, 5)), state)


def test_original_flat_layout_maps_position_by_position():
    """facebookresearch/LeViT's ``blocks.{k}`` list (tests/fixtures/make_fixtures_levit.py, the repository at
    3772b8e): every key lands, the persistent index is dropped, and the model reproduces the original."""
    state, t, cfg = load_fixture("original_levit")
    assert any(k.endswith("attention_bias_idxs") for k in state) and "blocks.4.kv.c.weight" in state
    model = create_model("levit_128s", img_size=cfg["img_size"], num_classes=cfg["num_classes"],
                         embed_dim=tuple(cfg["embed_dim"]), key_dim=cfg["key_dim"], num_heads=tuple(cfg["num_heads"]),
                         depth=tuple(cfg["depth"])).eval()
    assert_loads(model, {"model": state}, "original")
    own = model.state_dict()
    torch.testing.assert_close(own["stages.1.downsample.attn_downsample.q.ln.linear.weight"],
                               state["blocks.4.q.1.c.weight"], rtol=0, atol=0)
    torch.testing.assert_close(own["stages.1.downsample.mlp.ln2.bn.running_var"], state["blocks.5.m.2.bn.running_var"],
                               rtol=0, atol=0)
    torch.testing.assert_close(own["head_dist.linear.bias"], state["head_dist.l.bias"], rtol=0, atol=0)
    with torch.no_grad():
        feats = model.forward_features(t["input"])
        assert_parity(feats.reshape(2, -1, feats.shape[-1]), t["features"])
        assert_parity(model.forward_head(feats, pre_logits=True), t["pre_logits"])
        assert_parity(model(t["input"]), t["output"])


def _hf_levit(with_teacher: bool = True) -> torch.nn.Module:
    """A tiny transformers LeViT (80 px: grids 5, 3, 2) with random weights and BatchNorm statistics, eval mode."""
    import transformers as tf

    cfg = tf.LevitConfig(image_size=80, hidden_sizes=[32, 48, 64], num_attention_heads=[2, 3, 4], depths=[2, 1, 1],
                         key_dim=[8, 8, 8], num_labels=3)
    torch.manual_seed(0)
    hf = (tf.LevitForImageClassificationWithTeacher if with_teacher else tf.LevitForImageClassification)(cfg)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.1 * torch.randn_like(p))
        for m in hf.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(0.2 * torch.randn_like(m.running_mean))
                m.running_var.copy_(0.5 + torch.rand_like(m.running_var))
    return hf.eval()


@pytest.mark.parametrize("with_teacher", [True, False])
def test_transformers_folder_loads_with_its_config(with_teacher, tmp_path):
    """``save_pretrained`` of LevitForImageClassificationWithTeacher (two heads) or LevitForImageClassification (one):
    ``create_model(preset, pretrained=folder)`` reads the widths, depths, heads, classes and distillation from its
    config.json and gives transformers' logits."""
    import warnings

    hf = _hf_levit(with_teacher)
    hf.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*describes another architecture")
        model = create_model("levit_128s", pretrained=tmp_path).eval()
    cfg = model.cfg
    assert (cfg.embed_dim, cfg.num_heads, cfg.depth, cfg.key_dim, cfg.img_size) == ((32, 48, 64), (2, 3, 4),
                                                                                     (2, 1, 1), 8, 80)
    assert cfg.num_classes == 3 and cfg.distilled is with_teacher and (model.head_dist is not None) is with_teacher
    x = torch.randn(2, 3, 80, 80, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_parity(model(x), hf(pixel_values=x).logits)


def test_transformers_state_dict_converts():
    hf = _hf_levit()
    model = _model(img_size=80, num_classes=3)
    assert_loads(model, hf.state_dict(), "huggingface")
    x = torch.randn(1, 3, 80, 80)
    with torch.no_grad():
        assert_parity(model(x), hf(pixel_values=x).logits)
