"""``cam_cnn``: a small CNN whose Grad-CAM maps have crop / 4 cells a side.

timm's small test models downsample by 32 (``test_resnet``'s last stage is 1 x 1 on a 32 px
crop), so their Grad-CAM maps are one cell, upsampled to a constant: the outside mass is then
the background's share of the crop whatever the model reads, and the randomised-head check's
rho is undefined. ``cam_cnn`` stops downsampling at stride 4: four conv 3 x 3 -> BatchNorm ->
ReLU stages (stride 2, 2, 1, 1; 32, 64, 64, 96 channels), global average pooling and one
linear head, so its last stage (the Grad-CAM layer a timm-style model gets by default,
``stages.3``) is 8 x 8 on a 32 px crop, 16 x 16 on 64 px, with a receptive field of 23 px.
A training step costs about what ``test_resnet``'s does at 32 px (0.37 s against 0.39 s for a
batch of 64 on one thread, measured on 2 shared CPU cores, 2026-12-03). It follows timm's
model contract (``forward_features``, ``forward_head(pre_logits=)``, ``get_classifier``,
``pretrained_cfg`` with the input normalisation) and is registered with timm under the name
``cam_cnn`` when this module is imported (`register`), so that ``create_model("cam_cnn", K)``,
a run's ``arch: cam_cnn`` and a sweep's model entry work as for any timm name.

Example:
    >>> import torch
    >>> from shortcutlab.models.adapter import create_model, wrap
    >>> adapter = wrap(create_model("cam_cnn", num_classes=3)).eval()
    >>> adapter.cam_layer_name, adapter.logits(torch.rand(2, 3, 32, 32)).shape
    ('stages.3', torch.Size([2, 3]))
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["CamCNN", "NAME", "cam_cnn", "register"]

#: The timm name of the model.
NAME = "cam_cnn"

#: (out channels, stride) of each stage.
STAGES = ((32, 2), (64, 2), (64, 1), (96, 1))


class _Stage(nn.Sequential):
    """conv 3 x 3 -> BatchNorm -> ReLU (a numbered block: a cascade randomises it whole)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.ReLU(inplace=True)


class CamCNN(nn.Module):
    """The network (see the module docstring); build it with ``create_model("cam_cnn", K)``.

    Args:
        num_classes: K, the number of logits (0: no classifier, features only).
        in_chans: input channels.
    """

    def __init__(self, num_classes: int = 1000, in_chans: int = 3, **kw) -> None:
        super().__init__()
        unknown = set(kw) - {"pretrained_cfg", "pretrained_cfg_overlay", "cache_dir", "drop_rate", "drop_path_rate"}
        if unknown:
            raise TypeError(f"{NAME} takes num_classes and in_chans; got {sorted(unknown)}")
        blocks, cin, reduction, info = [], in_chans, 1, []
        for i, (cout, stride) in enumerate(STAGES):
            blocks.append(_Stage(cin, cout, stride))
            cin, reduction = cout, reduction * stride
            info.append({"num_chs": cout, "reduction": reduction, "module": f"stages.{i}"})
        self.stages = nn.Sequential(*blocks)
        self.feature_info = info
        self.num_features = self.head_hidden_size = cin
        self.global_pool = nn.AdaptiveAvgPool2d(1)
        self.num_classes = num_classes
        self.fc = nn.Linear(cin, num_classes) if num_classes > 0 else nn.Identity()
        self.pretrained_cfg = self.default_cfg = {
            "architecture": NAME, "input_size": (in_chans, 32, 32), "mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25),
            "classifier": "fc", "first_conv": "stages.0.conv", "num_classes": num_classes, "fixed_input_size": False,
        }
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def get_classifier(self) -> nn.Module:
        return self.fc

    def reset_classifier(self, num_classes: int, global_pool: str = "avg") -> None:
        self.num_classes = num_classes
        self.fc = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, 96, H / 4, W / 4)."""
        return self.stages(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.global_pool(x).flatten(1)
        return x if pre_logits else self.fc(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def cam_cnn(pretrained: bool = False, pretrained_cfg_overlay: dict | None = None, **kw) -> CamCNN:
    """timm's entry point for ``cam_cnn``: random weights, or (``pretrained``, as
    `shortcutlab.models.adapter.create_model` fine-tunes from a local file) the backbone of the
    state dict in ``pretrained_cfg_overlay["state_dict"]`` and a new classifier. Never downloads.

    Raises:
        RuntimeError: ``pretrained`` without a state dict (there are no published weights), or
            a backbone tensor of another shape (torch's "size mismatch" message).
    """
    model = CamCNN(**kw)
    if pretrained:
        state = (pretrained_cfg_overlay or {}).get("state_dict")
        if state is None:
            raise RuntimeError(f"{NAME} has no published weights; pass a local weights file to shortcutlab's create_model")
        backbone = {k: v for k, v in state.items() if not k.startswith("fc.")}
        missing, unexpected = model.load_state_dict(backbone, strict=False)
        if unexpected or any(not k.startswith("fc.") for k in missing):
            raise RuntimeError(f"{NAME}: the state dict does not fit (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model


def register() -> None:
    """Make ``cam_cnn`` a timm model name (once per process; later calls do nothing)."""
    from timm.models import is_model, register_model

    if not is_model(NAME):
        register_model(cam_cnn)
