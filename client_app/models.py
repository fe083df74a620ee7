"""The papers' models, all with GroupNorm (no BatchNorm: its running statistics are not
parameters and average badly across non-IID clients).

* ``mlp``: flatten → 256 → 128 → classes (FedPCD's Fashion-MNIST MLP, CRAFT's FEMNIST MLP);
  the input size adapts to the dataset (784 for 28×28, 64 for 8×8 digits).
* ``cnn``: FedPCD's CIFAR-10 CNN: three 3×3 convs (32/64/128 channels, padding 1), each
  followed by GroupNorm, ReLU and 2×2 max-pool; head flatten → 256 → classes (2048 → 256
  for 32×32 inputs; the head's input adapts to smaller images).
* ``resnet18``: 3×3 stride-1 stem, no initial max-pool, four stages of two basic blocks
  (64/128/256/512), GroupNorm throughout (FedPCD's CIFAR-100 model).
* ``resnet20``/``resnet56``/``resnet110``: the CIFAR ResNets of He et al. (three stages of
  n basic blocks, 16/32/64 channels, n = 3/9/18) with GroupNorm, as used by CRAFT.
"""

from __future__ import annotations

import torch
from torch import nn


def _gn(channels: int) -> nn.GroupNorm:
    """GroupNorm with groups of 8 channels (at most 32 groups, at least one)."""
    return nn.GroupNorm(num_groups=max(1, min(32, channels // 8)), num_channels=channels)


class MLP(nn.Module):
    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, 256), nn.ReLU(),
            nn.Linear(256, 128), nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    def __init__(self, in_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        c, h, w = in_shape
        layers: list[nn.Module] = []
        for out in (32, 64, 128):
            layers += [nn.Conv2d(c, out, 3, padding=1), _gn(out), nn.ReLU(), nn.MaxPool2d(2)]
            c, h, w = out, h // 2, w // 2
        if h < 1 or w < 1:
            raise ValueError(f"cnn needs inputs of at least 8×8, got {in_shape[1]}×{in_shape[2]}")
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(c * h * w, 256), nn.ReLU(), nn.Linear(256, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.gn1 = _gn(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.gn2 = _gn(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), _gn(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.gn1(self.conv1(x)))
        out = self.gn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """Stem (3×3, stride 1) → stages of basic blocks → global average pool → linear."""

    def __init__(self, in_channels: int, widths: tuple[int, ...], blocks: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, stride=1, padding=1, bias=False),
            _gn(widths[0]), nn.ReLU(),
        )
        stages: list[nn.Module] = []
        cin = widths[0]
        for i, width in enumerate(widths):
            for b in range(blocks):
                stages.append(BasicBlock(cin, width, stride=2 if (i > 0 and b == 0) else 1))
                cin = width
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.stages(self.stem(x))), 1))


CIFAR_RESNET_DEPTHS = {"resnet20": 3, "resnet56": 9, "resnet110": 18}


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The model ``name`` for inputs of shape C×H×W and ``num_classes`` outputs."""
    c = input_shape[0]
    if name == "mlp":
        in_features = 1
        for s in input_shape:
            in_features *= s
        return MLP(in_features, num_classes)
    if name == "cnn":
        return CNN(tuple(input_shape), num_classes)  # type: ignore[arg-type]
    if name == "resnet18":
        return ResNet(c, (64, 128, 256, 512), 2, num_classes)
    if name in CIFAR_RESNET_DEPTHS:
        return ResNet(c, (16, 32, 64), CIFAR_RESNET_DEPTHS[name], num_classes)
    raise ValueError(f"unknown model {name!r}")


# Input shape and classes of the known datasets: the server builds the model without
# touching the data (on a real deployment it has none).
DATASET_META = {
    "digits": ((1, 8, 8), 10),
    "mnist": ((1, 28, 28), 10),
    "fashion-mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10),
    "cifar100": ((3, 32, 32), 100),
    "femnist": ((1, 28, 28), 62),
}


def input_spec(cfg) -> tuple[tuple[int, ...], int]:
    """(input shape C×H×W, number of classes) of the run's dataset."""
    if cfg.dataset_path:
        from client_app.data import load_federated_data

        data = load_federated_data(cfg)
        return data.input_shape, data.num_classes
    return DATASET_META[cfg.dataset]


def initial_model(cfg) -> nn.Module:
    """The run's model with the seeded initial weights (the same for every method under
    one seed). Also the template for the model's structure (e.g. CRAFT's layer groups)."""
    from fedcore.seeding import derive_seed

    shape, classes = input_spec(cfg)
    torch.manual_seed(derive_seed(cfg.seed, "init"))
    return build_model(cfg.model, shape, classes)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
