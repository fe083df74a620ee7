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


# -- the CRAFT authors' models (their fed/nets.py), under their own names ----------------------
@pytest.mark.parametrize(
    "name, shape, classes, params",
    [
        # 784 -> 200 -> 200 -> 62 (FEMNIST)
        ("craft-mlp", (1, 28, 28), 62, _count_linear(784, 200) + _count_linear(200, 200) + _count_linear(200, 62)),
        # conv 5x5 3->64, 64->64 (valid), pools: 32 -> 28 -> 14 -> 10 -> 5; FC 1600 -> 384 -> 192 -> 10
        ("craft-cnn", (3, 32, 32), 10, (3 * 25 * 64 + 64) + (64 * 25 * 64 + 64) + _count_linear(1600, 384)
         + _count_linear(384, 192) + _count_linear(192, 10)),
        ("craft-cnn", (1, 28, 28), 62, (25 * 64 + 64) + (64 * 25 * 64 + 64) + _count_linear(1024, 384)
         + _count_linear(384, 192) + _count_linear(192, 62)),
        # He et al.'s CIFAR ResNets with parameter-free shortcuts: 0.27M / 0.85M / 1.7M
        ("craft-resnet20", (3, 32, 32), 10, 269_722),
        ("craft-resnet56", (3, 32, 32), 10, 853_018),
        ("craft-resnet110", (3, 32, 32), 10, 1_727_962),
    ],
)
def test_craft_models_shapes_and_counts(name, shape, classes, params):
    model = build_model(name, shape, classes)
    assert model(torch.zeros(3, *shape)).shape == (3, classes)
    assert num_parameters(model) == params


def test_craft_cnn_has_dropout_before_relu_and_no_normalisation():
    model = build_model("craft-cnn", (3, 32, 32), 10)
    assert [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)] == [0.2, 0.5]
    assert not any(isinstance(m, (torch.nn.GroupNorm, torch.nn.modules.batchnorm._BatchNorm)) for m in model.modules())
    assert model.conv1.kernel_size == (5, 5) and model.conv1.padding == (0, 0) and model.conv1.out_channels == 64
    model.train()
    x = torch.randn(2, 3, 32, 32)
    torch.manual_seed(0)
    a = model(x)
    torch.manual_seed(1)
    assert not torch.equal(a, model(x))  # dropout is live in training
    model.eval()
    assert torch.equal(model(x), model(x))


def test_craft_resnet_option_a_shortcuts_groupnorm_one_group_kaiming():
    from client_app.models import ShortcutA

    torch.manual_seed(0)
    model = build_model("craft-resnet56", (3, 32, 32), 10)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert len(norms) == 1 + 2 * 27 and all(m.num_groups == 1 for m in norms)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    # no parameter outside convolutions, GroupNorms and the classifier: the shortcuts have none
    assert all(".shortcut" not in k for k in model.state_dict())
    assert sum(isinstance(m, ShortcutA) for m in model.modules()) == 2
    # option A: every second pixel, the new channels zero
    x = torch.randn(2, 16, 8, 8)
    out = ShortcutA(16, 32, 2)(x)
    assert out.shape == (2, 32, 4, 4)
    torch.testing.assert_close(out[:, 8:24], x[:, :, ::2, ::2])
    assert out[:, :8].abs().sum() == 0 and out[:, 24:].abs().sum() == 0
    # Kaiming-normal (fan-in, gain √2) weights of the convs and the classifier
    big = model.layer3[0].conv2.weight  # 64·64·9 weights, fan-in 576
    assert float(big.std()) == pytest.approx((2.0 / 576) ** 0.5, rel=0.03)
    assert float(model.linear.weight.std()) == pytest.approx((2.0 / 64) ** 0.5, rel=0.15)


def test_craft_layer_groups_are_convs_with_their_norms_and_the_classifier():
    from strategies.craft import layer_groups

    groups = layer_groups(build_model("craft-resnet20", (3, 32, 32), 10))
    assert len(groups) == 19 + 1  # 19 convs (each with its GroupNorm) + the linear layer
    assert groups[0].keys == ("conv1.weight", "gn1.weight", "gn1.bias")
    assert groups[-1].keys == ("linear.weight", "linear.bias")
    assert [g.keys for g in layer_groups(build_model("craft-mlp", (1, 28, 28), 62))] == [
        ("fc1.weight", "fc1.bias"), ("fc2.weight", "fc2.bias"), ("fc3.weight", "fc3.bias")]


def test_craft_cnn_rejects_too_small_inputs():
    with pytest.raises(ValueError, match="at least 16"):
        build_model("craft-cnn", (1, 8, 8), 10)


@pytest.mark.parametrize("shape, classes", [((1, 1, 60), 10), ((1, 8, 8), 10), ((3, 32, 32), 100)])
def test_logreg_is_one_linear_layer_on_the_flattened_input(shape, classes):
    model = build_model("logreg", shape, classes)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 1 and num_parameters(model) == _count_linear(int(torch.tensor(shape).prod()), classes)
    x = torch.randn(4, *shape)
    out = model(x)
    assert out.shape == (4, classes)
    torch.testing.assert_close(out, x.flatten(1) @ linears[0].weight.T + linears[0].bias)
    # the authors' tf.layers.dense defaults: zero bias, Glorot-uniform weights
    assert torch.count_nonzero(linears[0].bias) == 0
    bound = (6.0 / (linears[0].in_features + classes)) ** 0.5
    assert linears[0].weight.abs().max() <= bound and linears[0].weight.abs().max() > 0.9 * bound


def test_logreg_initial_weights_are_seeded():
    from client_app.models import initial_model
    from fedcore.config import load_config

    cfg = load_config({"dataset": "synthetic", "partitioner": "natural", "model": "logreg", "num-clients": 5})
    a, b = initial_model(cfg), initial_model(cfg)
    c = initial_model(cfg.replace(seed=1))
    assert torch.equal(a.linear.weight, b.linear.weight) and not torch.equal(a.linear.weight, c.linear.weight)
    assert a.linear.in_features == 60 and a.linear.out_features == 10  # the server needs no data for the shape
    digits = initial_model(load_config({"model": "logreg"}))
    assert digits.linear.in_features == 64
