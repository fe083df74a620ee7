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
  n basic blocks, 16/32/64 channels, n = 3/9/18) with GroupNorm (groups of 8 channels) and
  1×1-conv projection shortcuts.

* ``logreg``: multinomial logistic regression, flatten → one linear layer to the classes (the
  q-FFL/FedProx authors' ``mclr``): Glorot-uniform weights and zero bias, the defaults of
  their ``tf.layers.dense`` (their L2 regulariser is never added to the loss they minimise).
  Any input shape (60 features for Synthetic, 64 for 8×8 digits).

The CRAFT authors' models (their released code, ``tum-pbs/CRAFT``, ``fed/nets.py``; paper:
Z. Wang, Q. Liu et al., *CRAFT: Conflict-Resolved Aggregation for Federated Training*, 2026), rebuilt
under their own names so that the models above keep their numbers:

* ``craft-mlp``: flatten → 200 → 200 → classes, ReLU (their FEMNIST MLP).
* ``craft-cnn``: conv 5×5 (64 channels, no padding) → ReLU → max-pool 2, twice; FC 384 with
  dropout 0.2 then ReLU; FC 192 with dropout 0.5 then ReLU; FC to classes. No normalisation
  (1600 → 384 for 32×32 inputs, 1024 → 384 for 28×28).
* ``craft-resnet20``/``craft-resnet56``/``craft-resnet110``: the CIFAR ResNets with option-A
  shortcuts (strided identity plus zero channel padding: no parameters, so CRAFT's layer
  groups are the convolutions and the classifier only), every norm a GroupNorm with one
  group, and Kaiming-normal initial weights of every conv and linear layer.
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


class LogReg(nn.Module):
    """Multinomial logistic regression: flatten → linear (logits; softmax in the loss)."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)
        nn.init.xavier_uniform_(self.linear.weight)  # tf.layers.dense: glorot_uniform kernel, zero bias
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.flatten(x, 1))


CIFAR_RESNET_DEPTHS = {"resnet20": 3, "resnet56": 9, "resnet110": 18}


# -- the CRAFT authors' models -------------------------------------------------------------------
class CraftMLP(nn.Module):
    """flatten → 200 → 200 → classes (ReLU)."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 200) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc3(torch.relu(self.fc2(x)))


class CraftCNN(nn.Module):
    """Two 5×5 convs (64 channels, valid) with ReLU and 2×2 max-pool; FC 384 and 192, each
    followed by dropout (0.2, 0.5) and then ReLU; FC to classes."""

    def __init__(self, in_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        c, h, w = in_shape
        for _ in range(2):
            h, w = (h - 4) // 2, (w - 4) // 2
        if h < 1 or w < 1:
            raise ValueError(f"craft-cnn needs inputs of at least 16×16, got {in_shape[1]}×{in_shape[2]}")
        self.conv1 = nn.Conv2d(c, 64, 5)
        self.conv2 = nn.Conv2d(64, 64, 5)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(64 * h * w, 384)
        self.fc2 = nn.Linear(384, 192)
        self.fc3 = nn.Linear(192, num_classes)
        self.dropout1 = nn.Dropout(0.2)
        self.dropout2 = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.relu(self.dropout1(self.fc1(torch.flatten(x, 1))))
        x = torch.relu(self.dropout2(self.fc2(x)))
        return self.fc3(x)


class ShortcutA(nn.Module):
    """Option-A shortcut: every second pixel, the new channels zero (no parameters)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.stride, self.low = stride, (cout - cin) // 2
        self.high = cout - cin - self.low

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        return nn.functional.pad(x, (0, 0, 0, 0, self.low, self.high))


class BlockA(nn.Module):
    """Basic block with GroupNorm(1 group) and an option-A shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.gn1 = nn.GroupNorm(1, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.gn2 = nn.GroupNorm(1, cout)
        self.shortcut: nn.Module = ShortcutA(cin, cout, stride) if (stride != 1 or cin != cout) else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.gn1(self.conv1(x)))
        out = self.gn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class CraftResNet(nn.Module):
    """CIFAR ResNet-(6n+2): 3×3 stem (16 channels), three stages of n option-A blocks
    (16/32/64 channels), global average pool, linear; Kaiming-normal conv/linear weights."""

    def __init__(self, in_channels: int, blocks: int, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 3, stride=1, padding=1, bias=False)
        self.gn1 = nn.GroupNorm(1, 16)
        layers: list[nn.Module] = []
        cin = 16
        for i, width in enumerate((16, 32, 64)):
            stage = []
            for b in range(blocks):
                stage.append(BlockA(cin, width, stride=2 if (i > 0 and b == 0) else 1))
                cin = width
            layers.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3 = layers
        self.linear = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.gn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        return self.linear(torch.flatten(nn.functional.adaptive_avg_pool2d(out, 1), 1))


def _flat_size(shape: tuple[int, ...]) -> int:
    size = 1
    for s in shape:
        size *= s
    return size


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The model ``name`` for inputs of shape C×H×W and ``num_classes`` outputs."""
    c = input_shape[0]
    if name == "mlp":
        return MLP(_flat_size(input_shape), num_classes)
    if name == "logreg":
        return LogReg(_flat_size(input_shape), num_classes)
    if name == "craft-mlp":
        return CraftMLP(_flat_size(input_shape), num_classes)
    if name == "craft-cnn":
        return CraftCNN(tuple(input_shape), num_classes)  # type: ignore[arg-type]
    if name.startswith("craft-") and name[len("craft-"):] in CIFAR_RESNET_DEPTHS:
        return CraftResNet(c, CIFAR_RESNET_DEPTHS[name[len("craft-"):]], num_classes)
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
    "synthetic": ((1, 1, 60), 10),  # 60 features as N×1×1×60 (client_app/data/synthetic.py)
}


def input_spec(cfg) -> tuple[tuple[int, ...], int]:
    """(input shape C×H×W, number of classes) of the run's dataset; with nodes that bring
    their own data (``client-data = "node"``) the run config's ``input-shape``/``num-classes``."""
    from client_app import local_data

    if local_data.is_node_mode(cfg):
        s = local_data.settings(cfg)
        if not (s.input_shape and s.num_classes):
            from fedcore.config import ConfigError

            raise ConfigError(
                "client-data='node': 'input-shape' and 'num-classes' are unknown; give them in the run config, or "
                "let the ServerApp learn them from the nodes' first QUERY (fedpcd_app.server.server_app.run_experiment)"
            )
        return s.input_shape, s.num_classes
    if cfg.dataset_path:
        from client_app.data import load_federated_data

        data = load_federated_data(cfg)
        return data.input_shape, data.num_classes
    return DATASET_META[cfg.dataset]


def initial_model(cfg) -> nn.Module:
    """The run's model with the seeded initial weights (the same for every method under
    one seed). Also the template for the model's structure (e.g. CRAFT's layer groups)."""
    from fedcore.seeding import derive_seed, seed_torch

    shape, classes = input_spec(cfg)
    seed_torch(derive_seed(cfg.seed, "init"))
    return build_model(cfg.model, shape, classes)


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
