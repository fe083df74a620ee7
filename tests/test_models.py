"""Model shapes and parameter counts (the papers' architectures)."""

import pytest
import torch

from client_app.models import build_model, num_parameters


def _count_linear(i, o):
    return i * o + o


@pytest.mark.parametrize(
    "name, shape, classes, params",
    [
        # 784 -> 256 -> 128 -> 10
        ("mlp", (1, 28, 28), 10, _count_linear(784, 256) + _count_linear(256, 128) + _count_linear(128, 10)),
        ("mlp", (1, 8, 8), 10, _count_linear(64, 256) + _count_linear(256, 128) + _count_linear(128, 10)),
        # convs 3->32->64->128 (3x3, bias) + GroupNorm affine (2 per channel) + head 2048->256->10
        ("cnn", (3, 32, 32), 10,
         (3 * 9 * 32 + 32) + 64 + (32 * 9 * 64 + 64) + 128 + (64 * 9 * 128 + 128) + 256
         + _count_linear(2048, 256) + _count_linear(256, 10)),
        ("resnet18", (3, 32, 32), 100, 11_220_132),
        ("resnet20", (3, 32, 32), 10, 272_474),
        ("resnet56", (3, 32, 32), 10, 855_770),
        ("resnet110", (3, 32, 32), 10, 1_730_714),
    ],
)
def test_shapes_and_counts(name, shape, classes, params):
    model = build_model(name, shape, classes)
    out = model(torch.zeros(3, *shape))
    assert out.shape == (3, classes)
    assert num_parameters(model) == params


def test_groupnorm_throughout_no_batchnorm():
    for name in ("cnn", "resnet18", "resnet20"):
        mods = list(build_model(name, (3, 32, 32), 10).modules())
        assert any(isinstance(m, torch.nn.GroupNorm) for m in mods)
        assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in mods)


def test_resnet18_stem_is_3x3_stride1_without_maxpool():
    model = build_model("resnet18", (3, 32, 32), 100)
    conv = model.stem[0]
    assert conv.kernel_size == (3, 3) and conv.stride == (1, 1)
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in model.modules())


def test_cnn_rejects_too_small_inputs():
    with pytest.raises(ValueError, match="at least 8"):
        build_model("cnn", (1, 4, 4), 10)
