"""Shapes, parameter counts and the registry of gravac.models (tiny inputs, 1 thread)."""
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from gravac.models import (MODEL_NAMES, Bottleneck, LSTMLanguageModel, ResNet, SmallCNN, VGG,
                                 build_model, detach_hidden, resnet18, resnet50, resnet101, vgg16)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_resnet18_forward_backward_shapes():
    torch.manual_seed(0)
    model = resnet18(num_classes=10)
    x = torch.randn(2, 3, 32, 32)
    out = model(x)
    assert out.shape == (2, 10)
    F.cross_entropy(out, torch.tensor([1, 7])).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.shape == p.shape, name
    assert 11.0e6 < num_params(model) < 11.4e6


def test_resnet_in_channels_and_eval_mode():
    model = resnet18(num_classes=3, in_channels=1).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 1, 32, 32)).shape == (1, 3)


@pytest.mark.parametrize("factory, lo, hi", [(resnet50, 23.0e6, 24.0e6),
                                             (resnet101, 42.0e6, 43.0e6)])
def test_bottleneck_resnet_parameter_counts(factory, lo, hi):
    model = factory(num_classes=10)
    assert isinstance(model, ResNet)
    assert lo < num_params(model) < hi


def test_vgg16_parameter_counts_and_classifier_width():
    bn = vgg16(num_classes=100)
    assert 14.8e6 < num_params(bn) < 15.8e6
    assert any(isinstance(m, nn.BatchNorm2d) for m in bn.modules())
    plain = vgg16(num_classes=100, batch_norm=False)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in plain.modules())
    assert sum(isinstance(m, nn.Conv2d) for m in plain.modules()) == 13
    wide = vgg16(num_classes=100, classifier_width=1024)
    extra = (512 * 1024 + 1024 * 1024 + 1024 * 100 + 1024 + 1024) - \
            (512 * 512 + 512 * 512 + 512 * 100 + 512 + 512)
    assert num_params(wide) - num_params(bn) == extra


def test_vgg16_forward_shape_on_tiny_batch():
    model = vgg16(num_classes=100, classifier_width=32)
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 100)
    out.sum().backward()
    assert model.features[0].weight.grad is not None


def test_lstm_forward_backward_shapes():
    torch.manual_seed(0)
    vocab, seq, batch = 50, 5, 3
    model = LSTMLanguageModel(vocab, embedding_dim=16, hidden_dim=16, num_layers=2, dropout=0.2)
    hidden = model.init_hidden(batch)
    assert [h.shape for h in hidden] == [(2, batch, 16), (2, batch, 16)]
    tokens = torch.randint(0, vocab, (seq, batch))
    logits, hidden = model(tokens, hidden)
    assert logits.shape == (seq * batch, vocab)
    assert [h.shape for h in hidden] == [(2, batch, 16), (2, batch, 16)]
    F.cross_entropy(logits, torch.randint(0, vocab, (seq * batch,))).backward()
    assert model.encoder.weight.grad is not None
    detached = detach_hidden(hidden)
    assert all(not h.requires_grad for h in detached)


def test_lstm_weight_tying():
    tied = LSTMLanguageModel(40, embedding_dim=8, hidden_dim=8)
    assert tied.decoder.weight is tied.encoder.weight
    untied = LSTMLanguageModel(40, embedding_dim=8, hidden_dim=12, tie_weights=False)
    assert untied.decoder.weight is not untied.encoder.weight
    assert untied(torch.zeros(4, 2, dtype=torch.long))[0].shape == (8, 40)


def test_lstm_tying_with_different_sizes_names_both():
    with pytest.raises(ValueError, match="embedding_dim=8.*hidden_dim=12"):
        LSTMLanguageModel(40, embedding_dim=8, hidden_dim=12, tie_weights=True)


def test_lstm_default_is_the_ptb_model_tied_by_parameter_count():
    # 2 LSTM layers of 1500 units, 1500-wide embedding, 10k words, tied input/output
    # embedding (the paper's is untied: lstm_paper). Counted independently of the code:
    # embedding V*E; per layer 4H*(in + H) weights + 2*4H biases; decoder bias V.
    V, E, H = 10_000, 1500, 1500
    expected = V * E + 4 * H * (E + H) + 8 * H + 4 * H * (H + H) + 8 * H + V
    model = LSTMLanguageModel(V)
    assert sum(p.numel() for p in model.parameters()) == expected
    assert model.drop.p == 0.65


def test_small_cnn_shapes_and_size():
    model = SmallCNN()
    out = model(torch.rand(4, 1, 8, 8))
    assert out.shape == (4, 10)
    out.sum().backward()
    assert num_params(model) < 100_000
    assert sum(p.numel() >= 1024 for p in model.parameters()) >= 2


def test_small_cnn_learns_digits_quickly():
    from gravac.data import load_digits_dataset

    torch.manual_seed(0)
    x, y = load_digits_dataset(train=True)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    first = None
    for step in range(40):
        idx = torch.arange(step * 32, step * 32 + 32) % len(y)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert loss.item() < 0.5 * first


@pytest.mark.parametrize("name, kwargs, cls", [
    ("resnet18", {"num_classes": 5}, ResNet),
    ("vgg16", {"num_classes": 10, "batch_norm": False, "classifier_width": 16}, VGG),
    ("lstm", {"vocab_size": 30, "embedding_dim": 8, "hidden_dim": 8}, LSTMLanguageModel),
    ("small_cnn", {}, SmallCNN),
])
def test_build_model(name, kwargs, cls):
    assert isinstance(build_model(name, **kwargs), cls)


def test_build_model_knows_the_names():
    assert set(MODEL_NAMES) == {"resnet18", "resnet50", "resnet101", "vgg16", "lstm", "small_cnn",
                                "wide_head_cnn", "resnet101_paper", "vgg16_paper", "lstm_paper"}


def test_wide_head_cnn_shapes_and_where_its_parameters_are():
    model = build_model("wide_head_cnn", num_classes=7, width=64)
    x = torch.rand(3, 3, 32, 32, requires_grad=False)
    out = model(x)
    assert out.shape == (3, 7)
    out.sum().backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())
    big = build_model("wide_head_cnn")            # width 1024 on 32x32: ~3.2M parameters
    total = sum(p.numel() for p in big.parameters())
    wide = big.fc1.weight.numel() + big.fc2.weight.numel()
    assert 3_000_000 < total < 3_400_000 and wide / total > 0.95
    with pytest.raises(ValueError, match="image_size must be >= 4"):
        build_model("wide_head_cnn", image_size=2)


def test_build_model_unknown_name_lists_known():
    with pytest.raises(ValueError, match="unknown model 'alexnet'.*resnet18.*small_cnn"):
        build_model("alexnet")


def test_build_model_unknown_kwarg_names_it_and_allowed():
    with pytest.raises(ValueError, match="'depth'.*allowed: num_classes, in_channels"):
        build_model("resnet18", depth=18)


def test_build_model_missing_required_kwarg():
    with pytest.raises(ValueError, match="vocab_size"):
        build_model("lstm")


def _count(name, **kwargs):
    """Parameters of a registry model, built on the meta device (no memory, no init)."""
    with torch.device("meta"):
        model = build_model(name, **kwargs)
    return sum(p.numel() for p in model.parameters())


def _conv(c_in, c_out, k, bias=False):
    return c_in * c_out * k * k + (c_out if bias else 0)


def _bn(c):
    return 2 * c


def test_the_papers_resnet101_is_torchvisions():
    """Counted from the architecture: a 7x7 stem, bottleneck stages (3, 4, 23, 3) of widths
    64-512 (x4 out, a projection where the shape changes), a 2048 x 1000 classifier;
    44,549,160 is torchvision's ``resnet101()``: Table 1's ~170 MB."""
    total = _conv(3, 64, 7) + _bn(64)
    c_in = 64
    for planes, blocks in zip((64, 128, 256, 512), (3, 4, 23, 3)):
        for b in range(blocks):
            total += _conv(c_in, planes, 1) + _bn(planes) + _conv(planes, planes, 3) + \
                _bn(planes) + _conv(planes, 4 * planes, 1) + _bn(4 * planes)
            if b == 0:                                      # stride or width changes
                total += _conv(c_in, 4 * planes, 1) + _bn(4 * planes)
            c_in = 4 * planes
    total += 2048 * 1000 + 1000
    assert _count("resnet101_paper") == total == 44_549_160
    assert total * 4 / 2**20 == pytest.approx(169.9, abs=0.05)


def test_the_papers_vgg16_is_torchvisions_vgg16_bn():
    """13 biased 3x3 convolutions with BatchNorm, a 7x7 pool and a 4096-4096-1000
    classifier: 138,365,992, torchvision's ``vgg16_bn()``: Table 1's ~528 MB."""
    total, c_in = 0, 3
    for c_out in (64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512):
        total += _conv(c_in, c_out, 3, bias=True) + _bn(c_out)
        c_in = c_out
    total += (512 * 7 * 7 * 4096 + 4096) + (4096 * 4096 + 4096) + (4096 * 1000 + 1000)
    assert _count("vgg16_paper") == total == 138_365_992
    assert total * 4 / 2**20 == pytest.approx(527.8, abs=0.05)
    assert _count("vgg16", num_classes=100) < total / 8     # the compact CIFAR one


def test_the_papers_lstm_is_untied():
    """Embedding 10k x 1500, two LSTM layers (4 gates, input and hidden weights, two
    biases each), a decoder of its own: 66,034,000, Table 1's ~252 MB."""
    v, h = 10_000, 1500
    lstm_layer = 4 * h * (h + h) + 2 * 4 * h
    total = v * h + 2 * lstm_layer + (h * v + v)
    assert _count("lstm_paper", vocab_size=v) == total == 66_034_000
    assert _count("lstm_paper", vocab_size=v, tie_weights=True) == total - h * v
    assert total * 4 / 2**20 == pytest.approx(251.9, abs=0.05)


def test_the_papers_image_models_run_on_cifar_sized_inputs():
    x = torch.randn(2, 3, 32, 32)
    assert build_model("resnet101_paper", num_classes=10)(x).shape == (2, 10)
    vgg = build_model("vgg16_paper", num_classes=100)
    vgg.eval()
    assert vgg(x).shape == (2, 100)
    with pytest.raises(ValueError, match="stem must be one of cifar, imagenet"):
        ResNet(Bottleneck, (1, 1, 1, 1), stem="vgg")
