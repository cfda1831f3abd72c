"""vit_attention: plug-and-play vision-transformer attention mechanisms and the backbones built from them.

    >>> import vit_attention as va
    >>> model = va.create_model("vit_base_patch16_224")        # timm names; torchvision aliases too
    >>> model = va.create_model("vit_base_patch16_224", pretrained=True)  # timm's weights via the HF hub cache
    >>> x = va.create_transform(va.resolve_data_config(model))(pil_image)[None]  # its eval preprocessing
    >>> attn = va.create_attention("mhsa", dim=256, num_heads=8)  # any registered mechanism
    >>> model = va.load_model("runs/<run>")       # a trained model: name, config and weights from the file
"""

from . import functional
from .attention import create_attention, list_attention
from .data import create_transform, resolve_data_config
from .layers.plug import Plug, plug
from .models import create_model, list_models
from .weights import load_model, load_weights, save_weights
from .weights.hub import list_pretrained

__version__ = "0.1.0"

__all__ = ["__version__", "create_attention", "create_model", "create_transform", "functional", "list_attention",
           "list_models", "list_pretrained", "resolve_data_config",
           "load_model", "load_weights", "save_weights",
           "Plug", "plug"]
